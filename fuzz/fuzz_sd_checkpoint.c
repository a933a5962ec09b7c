/* fuzz_sd_checkpoint.c — libFuzzer target for the readers of the files users download for Stable Diffusion
 * 1.x / SDXL beside diffusers folders: single-file LDM / SGM checkpoints (src/diffusion/single_file.c) and kohya /
 * A1111 LoRA files (src/diffusion/lora_kohya.c). The input is a safetensors image; its names go through both
 * key mappings: the single file's components mapped with the fixture UNet / VAE configs (every view's first and
 * last byte touched, so ASan checks the q/k/v splits and reshapes stay inside the buffer), the LoRA matched
 * against the fixture SDXL UNet's linears and merged into its CLIP-G text encoder. */
#include "mmc_diffusion.h"
#include "mmc_encoders.h"

#include <stdlib.h>
#include <string.h>

static mmc_unet *g_unet;
static mmc_clip_text *g_te2;
static mmc_vae_config g_vae_cfg;
volatile uint8_t g_sink;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = MMC_SOURCE_DIR "/tests/fixtures/sdxl";
    char path[1024];
    mmc_json *j = NULL;
    snprintf(path, sizeof path, "%s/vae/config.json", dir);
    if (mmc_json_load(path, &j) || mmc_vae_config_read(j, path, &g_vae_cfg)) goto fail;
    mmc_json_free(j);
    snprintf(path, sizeof path, "%s/unet", dir);
    if (mmc_unet_load(path, false, &g_unet)) goto fail;
    snprintf(path, sizeof path, "%s/text_encoder_2", dir);
    if (mmc_clip_text_load(path, &g_te2)) goto fail;
    return 0;
fail:
    fprintf(stderr, "fuzz_sd_checkpoint: cannot load the fixture pipeline: %s\n", mmc_last_error());
    abort();
}

static void touch(mmc_st *v) {
    uint8_t acc = 0;
    for (int i = 0; i < mmc_st_count(v); i++) {
        const mmc_st_entry *e = mmc_st_at(v, i);
        if (e->nbytes) acc ^= ((const uint8_t *)e->data)[0] ^ ((const uint8_t *)e->data)[e->nbytes - 1];
    }
    g_sink = acc;
    mmc_st_close(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);   /* a copy, so reads past `size` hit ASan's redzone */
    if (!buf) return 0;
    memcpy(buf, data, size);
    mmc_st *st = NULL;
    mmc_single_file *sf = NULL;
    mmc_st *v = NULL;
    if (mmc_st_open_memory(buf, size, "fuzz", &st) == MMC_OK && mmc_single_file_open_st(st, "fuzz", &sf) == MMC_OK) {
        if (mmc_single_file_unet(sf, mmc_unet_cfg(g_unet), &v) == MMC_OK) touch(v);
        if (mmc_single_file_vae(sf, &g_vae_cfg, &v) == MMC_OK) touch(v);
        for (int t = 0; t < 2; t++)
            if (mmc_single_file_text_encoder(sf, t, &v) == MMC_OK) touch(v);
        mmc_single_file_free(sf);
    }
    mmc_kohya_lora *k = NULL;
    st = NULL;
    if (mmc_st_open_memory(buf, size, "fuzz", &st) == MMC_OK && mmc_kohya_lora_open_st(st, "fuzz", 1.0f, &k) == MMC_OK) {
        mmc_module_list ml = {0};
        mmc_lora_set *s = NULL;
        if (mmc_unet_linears(g_unet, &ml) == MMC_OK && mmc_kohya_lora_unet(k, &ml, g_unet, &s) == MMC_OK)
            mmc_lora_free(s);
        mmc_module_list_free(&ml);
        (void)mmc_kohya_lora_merge_clip(k, 2, g_te2);
        mmc_kohya_lora_free(k);
    }
    free(buf);
    return 0;
}
