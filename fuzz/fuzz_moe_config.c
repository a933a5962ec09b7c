/* fuzz_moe_config.c — libFuzzer target for the Qwen2-MoE config reader on an untrusted
 * config.json: mmc_qwen2_moe_config_read (the Qwen2 keys plus num_experts, num_experts_per_tok,
 * moe_intermediate_size, shared_expert_intermediate_size, decoder_sparse_step, mlp_only_layers,
 * norm_topk_prob, router_aux_loss_coef), then mmc_qwen2_moe_load on a scratch directory without
 * weights, whose config checks run before it looks for them (it cannot succeed). */
#include "mmc_io.h"
#include "mmc_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char g_dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmc_fuzz_moe_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_json *j = NULL;
    if (mmc_json_parse((const char *)data, size, "config.json", &j) != MMC_OK) return 0;
    mmc_qwen2_config c;
    if (mmc_qwen2_moe_config_read(j, &c) == MMC_OK) {
        for (int64_t l = 0; l < c.num_layers; l++) (void)mmc_moe_layer_sparse(c.moe, l);
        (void)mmc_moe_param_count(c.moe);
        mmc_moe_free(c.moe);
    }
    mmc_qwen2 *m = NULL;
    if (mmc_qwen2_moe_load(g_dir, j, false, NULL, &m) == MMC_OK) abort();   /* no weights: cannot succeed */
    mmc_json_free(j);
    return 0;
}
