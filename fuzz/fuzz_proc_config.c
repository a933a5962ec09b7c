/* fuzz_proc_config.c — libFuzzer target for the image/video processor config reader
 * (mmc_qwen2vl_proc_load) on an untrusted preprocessor_config.json, or a 5.x
 * processor_config.json with the image processor nested (video settings come from the same
 * reader; generation_config.json is fuzzed by fuzz_model_config). An accepted config is
 * then used the way a run would: smart_resize of a few sizes and, when its pixel budget is
 * small enough for a fuzzer, the preprocessing of a tiny image and a two-frame video, so
 * values that pass the reader but break the processor show up here. */
#include "fuzz_util.h"
#include "mmc_image.h"
#include "mmc_vlproc.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_input_file(data, size, "preprocessor_config.json", path, sizeof path);
    if (fd < 0) return 0;
    mmc_qwen2vl_proc p;
    mmc_qwen2vl_proc_default(&p);
    if (mmc_qwen2vl_proc_load(path, &p) == MMC_OK) {
        static const int sizes[][2] = {{1, 1}, {28, 28}, {37, 501}, {4000, 3000}, {20, 5000}};
        int64_t factor = (int64_t)p.patch_size * p.merge_size;
        for (unsigned i = 0; i < sizeof sizes / sizeof *sizes && factor < (1 << 20); i++) {
            int h, w;
            (void)mmc_qwen2vl_smart_resize(sizes[i][0], sizes[i][1], (int)factor, p.min_pixels, p.max_pixels, &h, &w);
        }
        /* video sizes are not read from the file: keep their budget fuzzer-sized too */
        if (p.video_max_pixels > (1 << 16)) p.video_max_pixels = 1 << 16;
        if (p.video_min_pixels > p.video_max_pixels) p.video_min_pixels = p.video_max_pixels;
        if (p.max_pixels <= (1 << 16) && p.patch_size <= 64 && p.temporal_patch_size <= 8) {
            uint8_t px[3 * 40 * 30];
            for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 7);
            mmc_image img[2] = {{.width = 40, .height = 30, .data = px}, {.width = 40, .height = 30, .data = px}};
            mmc_vlproc_out o = {0};
            if (mmc_qwen2vl_preprocess_images(&p, img, 1, &o) == MMC_OK) mmc_vlproc_out_free(&o);
            memset(&o, 0, sizeof o);
            if (mmc_qwen2vl_preprocess_video(&p, img, 2, &o) == MMC_OK) mmc_vlproc_out_free(&o);
        }
    }
    close(fd);
    return 0;
}
