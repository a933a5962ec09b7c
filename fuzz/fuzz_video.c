/* fuzz_video.c — libFuzzer target for the video entry point: mmc_video_open_mem (FFmpeg
 * demuxing from memory through a custom AVIOContext, the packet scan that builds the frame
 * index), mmc_video_read (keyframe seek or sequential decode, swscale to RGB24), then frame
 * sampling and the Qwen2-VL video preprocessing on what was decoded. Frames are capped at
 * 2^18 pixels here (a header may claim 16384x16384) so one input cannot exhaust memory. */
#include "mmc_video.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_video *v = NULL;
    if (mmc_video_open_mem(data, size, "fuzz", &v) != MMC_OK) return 0;
    const mmc_video_info *in = mmc_video_get_info(v);
    if ((int64_t)in->width * in->height <= (1 << 18)) {
        mmc_qwen2vl_video_proc p;
        mmc_qwen2vl_video_proc_default(&p);
        p.do_sample_frames = true;
        p.fps = 2;
        p.min_frames = 2;
        p.max_frames = 4;
        p.proc.video_min_pixels = 28 * 28;
        p.proc.video_max_pixels = 28 * 28 * 4;
        int64_t *idx = NULL;
        int n = 0;
        if (mmc_qwen2vl_video_sample(&p, in->total_frames, in->fps, &idx, &n) == MMC_OK && n > 0 && n <= 8) {
            mmc_image fr[8];
            if (mmc_video_read(v, idx, n, fr) == MMC_OK) {
                mmc_vlproc_out o;
                if (mmc_qwen2vl_video_preprocess(&p, fr, n, &o) == MMC_OK) mmc_vlproc_out_free(&o);
                for (int i = 0; i < n; i++) mmc_image_free(&fr[i]);
            }
            /* and backwards: a seek to the first frame after reading later ones */
            int64_t first = 0;
            if (mmc_video_read(v, &first, 1, fr) == MMC_OK) mmc_image_free(&fr[0]);
        }
        free(idx);
    }
    mmc_video_close(v);
    return 0;
}
