/* fuzz_model_config.c — libFuzzer target for the model config readers on an untrusted
 * config.json: mmc_qwen2_config_read (qwen2, and the text part of qwen2_vl / qwen2_5_vl in
 * both layouts: flat Hub fields with rope_scaling, or 5.x text_config with rope_parameters),
 * mmc_vision_config_read for both vision towers, and mmc_qwen2_vl_load, whose config checks
 * (model_type, M-RoPE default, merger width) run before it looks for weights (the scratch
 * directory has none). The same bytes are also read as a PEFT adapter_config.json
 * (mmc_lora_read_config) and as a generation_config.json (mmc_gen_config_read, then the
 * sampler and the new-token count it implies, as generate and chat use them). */
#include "mmc_infer.h"
#include "mmc_io.h"
#include "mmc_lora.h"
#include "mmc_models.h"
#include "mmc_vl.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char g_dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmc_fuzz_cfg_XXXXXX");
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_json *j = NULL;
    if (mmc_json_parse((const char *)data, size, "config.json", &j) == MMC_OK) {
        mmc_qwen2_config tc;
        mmc_vision_config vc;
        (void)mmc_qwen2_config_read(j, &tc);
        (void)mmc_vision_config_read(j, MMC_VL_QWEN2, &vc);
        (void)mmc_vision_config_read(j, MMC_VL_QWEN2_5, &vc);
        mmc_json_free(j);
    }
    write_as("config.json", data, size);
    write_as("adapter_config.json", data, size);
    mmc_qwen2_vl *m = NULL;
    if (mmc_qwen2_vl_load(g_dir, false, &m) == MMC_OK) abort(); /* no weights: cannot succeed */
    int r;
    float alpha, dropout;
    bool rs;
    (void)mmc_lora_read_config(g_dir, &r, &alpha, &dropout, &rs);
    write_as("generation_config.json", data, size);
    mmc_gen_config g;
    if (mmc_gen_config_read(g_dir, &g) == MMC_OK) {
        mmc_sampler_opts so;
        mmc_gen_config_sampler(&g, &so);
        (void)mmc_gen_config_max_new(&g, 0);
        (void)mmc_gen_config_max_new(&g, 1 << 20);
    }
    return 0;
}
