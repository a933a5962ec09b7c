/* fuzz_wan_config.c — libFuzzer target for what a WanPipeline folder and a prompt bring in:
 * the same bytes read as a transformer config.json (mmc_wan_config_read), a UMT5 / T5 config
 * (mmc_t5_config_read), and a scheduler_config.json (mmc_nsched_config_read; when it is accepted,
 * the scheduler is built, set to a few step counts and stepped over a tiny sample, as the pipeline
 * does); and as a prompt through Wan's prompt_clean (HTML entities, whitespace). */
#include "mmc_encoders.h"
#include "mmc_io.h"
#include "mmc_wan_t2v.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_json *j = NULL;
    if (mmc_json_parse((const char *)data, size, "config.json", &j) == MMC_OK) {
        mmc_wan_config wc;
        mmc_t5_config tc;
        mmc_nsched_config sc;
        (void)mmc_wan_config_read(j, "transformer/config.json", &wc);
        (void)mmc_t5_config_read(j, "text_encoder/config.json", &tc);
        if (mmc_nsched_config_read(j, "scheduler_config.json", &sc) == MMC_OK && sc.num_train_timesteps <= 2000) {
            mmc_nsched s;
            if (mmc_nsched_init(&sc, &s) == MMC_OK) {
                static const int ns[3] = {1, 3, 8};
                float x[6] = {0.5f, -1, 2, 0, 0.25f, -0.75f}, mo[6] = {0.1f, 0.2f, -0.3f, 0.4f, -0.5f, 0.6f};
                for (int k = 0; k < 3; k++)
                    if (mmc_nsched_set_timesteps(&s, ns[k]) == MMC_OK)
                        for (int i = 0; i < s.n; i++)
                            if (mmc_nsched_step(&s, i, mo, x, 6, mo) != MMC_OK) break;
                mmc_nsched_free(&s);
            }
        }
        mmc_json_free(j);
    }
    char *text = malloc(size + 1), *out = malloc(size * 4 + 16);
    if (text && out) {
        memcpy(text, data, size);
        text[size] = 0;
        mmc_wan_prompt_clean(text, out, size * 4 + 16);
        mmc_wan_prompt_clean(text, out, 7);   /* a small buffer truncates, never overflows */
    }
    free(text), free(out);
    return 0;
}
