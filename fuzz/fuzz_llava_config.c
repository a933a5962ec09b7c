/* fuzz_llava_config.c — libFuzzer target for the LLaVA family's config readers on untrusted bytes:
 * as config.json through mmc_llava_load (model_type llava / llava_next / llava_onevision, text and
 * vision sections, image_grid_pinpoints, vision_aspect_ratio; the scratch directory has no weights,
 * so it cannot succeed) and as processor_config.json / preprocessor_config.json through
 * mmc_llava_next_proc_load_dir for both variants. An accepted processor config is then used as a
 * run would use it: the placeholder counts of a few image sizes and, when its sizes are small
 * enough for a fuzzer, the anyres preprocessing of a tiny image alone and of two in one prompt. */
#include "mmc_image.h"
#include "mmc_io.h"
#include "mmc_llava.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char g_dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmc_fuzz_llava_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    return 0;
}

static void write_as(const char *name, const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
}

static void use_proc(const mmc_llava_next_proc *p) {
    static const int64_t sizes[][2] = {{1, 1}, {30, 40}, {151, 97}, {4000, 3000}, {20, 5000}};
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int multi = 0; multi < 2; multi++)
            (void)mmc_llava_next_image_tokens(p, sizes[i][0], sizes[i][1], multi);
    const mmc_clip_proc *b = &p->base;
    int64_t big = b->shortest_edge > b->size_h ? b->shortest_edge : b->size_h;
    if (b->size_w > big) big = b->size_w;
    if (b->crop_h > big) big = b->crop_h;
    if (b->crop_w > big) big = b->crop_w;
    for (int i = 0; i < p->n_pinpoints; i++)
        for (int k = 0; k < 2; k++) big = p->pinpoints[i][k] > big ? p->pinpoints[i][k] : big;
    if (big > 256) return;
    uint8_t px[3 * 40 * 30];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 7);
    mmc_image img[2] = {{.width = 40, .height = 30, .data = px}, {.width = 30, .height = 40, .data = px}};
    int64_t sz[2][2];
    mmc_tensor *t = NULL;
    if (mmc_llava_next_preprocess(p, img, 1, false, &t, sz) == MMC_OK) mmc_tensor_free(t);
    t = NULL;
    if (mmc_llava_next_preprocess(p, img, 2, true, &t, sz) == MMC_OK) mmc_tensor_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_as("config.json", data, size);
    mmc_llava *m = NULL;
    if (mmc_llava_load(g_dir, &m) == MMC_OK) abort();   /* no weights: cannot succeed */
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    unlink(path);
    static const char *const names[2] = {"processor_config.json", "preprocessor_config.json"};
    for (int k = 0; k < 2; k++) {
        write_as(names[k], data, size);
        for (int ov = 0; ov < 2; ov++) {
            mmc_llava_next_proc p;
            mmc_llava_next_proc_default(&p, NULL);
            if (ov) {   /* LlavaOnevisionImageProcessor's defaults, a small pinpoint set */
                p.onevision = true;
                p.base.shortest_edge = 0, p.base.size_h = p.base.size_w = 24, p.base.do_center_crop = false;
            } else {
                p.base.shortest_edge = p.base.crop_h = p.base.crop_w = 30;
            }
            p.pinpoints[0][0] = p.pinpoints[0][1] = ov ? 48 : 60;
            p.pinpoints[1][0] = ov ? 24 : 30, p.pinpoints[1][1] = ov ? 72 : 90;
            p.n_pinpoints = 2;
            if (mmc_llava_next_proc_load_dir(g_dir, &p, NULL, 0) == MMC_OK) use_proc(&p);
        }
        snprintf(path, sizeof path, "%s/%s", g_dir, names[k]);
        unlink(path);
    }
    return 0;
}
