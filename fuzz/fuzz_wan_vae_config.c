/* fuzz_wan_vae_config.c — libFuzzer target for the AutoencoderKLWan config reader on an untrusted
 * config.json: mmc_wan_vae_config_read on the parsed bytes (dim_mult, temperal_downsample,
 * latents_mean / latents_std lengths, the Wan2.2 keys it refuses), then mmc_wan_vae_load on a folder
 * holding those bytes as config.json and no weights, which must fail (after the config checks) without
 * crashing; and the 4k + 1 frame check on a count taken from the input. */
#include "mmc_diffusion.h"
#include "mmc_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmc_fuzz_wanvae_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_json *j = NULL;
    if (mmc_json_parse((const char *)data, size, "config.json", &j) == MMC_OK) {
        mmc_wan_vae_config c;
        if (mmc_wan_vae_config_read(j, "config.json", &c) == MMC_OK) {
            if (c.levels < 1 || c.levels > MMC_WAN_VAE_MAX_LEVELS || c.z_dim < 1 || c.z_dim > MMC_WAN_VAE_MAX_Z) abort();
        }
        mmc_json_free(j);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    mmc_wan_vae *v = NULL;
    if (mmc_wan_vae_load(g_dir, &v) == MMC_OK) abort();   /* no weights: cannot succeed */
    int64_t frames = 0;
    memcpy(&frames, data, size < sizeof frames ? size : sizeof frames);
    (void)mmc_wan_check_frames(frames);
    return 0;
}
