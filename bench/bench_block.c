/* bench_block.c — one Qwen2-style decoder block (Qwen2-0.5B shapes: hidden 896, 14 heads /
 * 2 KV heads, head dim 64, intermediate 4864) forward + backward at seq 512, fp32, as
 * tokens/s, plus the memory the step adds on top of the weights (step_mem) and the peak over
 * the start-up baseline (peak_mem; bench_mem_baseline, the peer the same). Peer: bench/peer_block.py
 * runs transformers' Qwen2DecoderLayer (sdpa) with the same shapes and threads. */
#include "bench_util.h"
#include "mmc_models.h"

#include <string.h>

typedef struct {
    mmc_ctx *ctx;
    mmc_qwen2 *m;
    mmc_tensor *x, *cos, *sin;
    int64_t T;
} args_t;

static void step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    mmc_attn_opts o = {.causal = true};
    mmc_tensor *y = mmc_qwen2_layer_forward(a->ctx, &a->m->cfg, &a->m->layers[0], a->x, a->cos, a->sin,
                                            &o, NULL, 0);
    mmc_tensor *g = mmc_grad(a->ctx, y);
    float *gd = g->data;
    for (int64_t i = 0; i < mmc_numel(g); i++) gd[i] = 1.0f;
    bool prev = mmc_set_grad_enabled(a->ctx, false);
    mmc_backward_range(a->ctx, 0, mmc_tape_len(a->ctx));
    mmc_set_grad_enabled(a->ctx, prev);
}

static double rss_now_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) { kb = atof(line + 6); break; }
    if (f) fclose(f);
    return kb / 1024.0;
}

int main(void) {
    mmc_qwen2_config c = {.vocab_size = 16, .hidden_size = 896, .intermediate_size = 4864,
                          .num_layers = 1, .num_heads = 14, .num_kv_heads = 2, .head_dim = 64,
                          .max_position_embeddings = 4096, .rms_norm_eps = 1e-6,
                          .rope_theta = 1e6, .qkv_bias = true};
    double base0 = bench_mem_baseline();
    args_t a = {.ctx = mmc_ctx_new(), .T = 512};
    if (mmc_qwen2_new(&c, 1, &a.m)) { fprintf(stderr, "%s\n", mmc_last_error()); return 1; }
    for (int l = 0; l < 1; l++) {   /* non-zero biases like a trained model */
        mmc_qwen2_layer *L = &a.m->layers[l];
        mmc_rng r;
        mmc_rng_init(&r, 7);
        mmc_rng_normal(&r, L->q.b->data, mmc_numel(L->q.b), 0, 0.1f);
    }
    a.x = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, a.T, c.hidden_size));
    mmc_rng r;
    mmc_rng_init(&r, 3);
    mmc_rng_normal(&r, a.x->data, mmc_numel(a.x), 0, 1);
    a.x->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    mmc_ctx *tctx = mmc_ctx_new();
    mmc_tensor *pos = mmc_new(tctx, MMC_I64, 1, MMC_SHAPE(a.T));
    for (int64_t t = 0; t < a.T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_rope_table_1d(tctx, pos, 64, c.rope_theta, &a.cos, &a.sin);
    double base = rss_now_mib();
    double sec = bench_time(step, &a, 5.0, 3);
    double peak = bench_peak_rss_mib();
    bench_report("block_qwen2_0.5b_fwd_bwd_T512", (double)a.T / sec, "tok/s", 1);
    bench_report("block_qwen2_0.5b_step_mem_MiB", peak - base, "MiB", 0);
    bench_report("block_qwen2_0.5b_peak_mem_MiB", peak - base0, "MiB", 0);
    bench_report_info("block_qwen2_0.5b_rss_baseline_MiB", base0, "MiB");
    fprintf(stderr, "block fwd+bwd: %.1f ms/step, arena peak %.1f MiB, RSS growth %.1f MiB\n",
            sec * 1e3, mmc_arena_peak(mmc_ctx_arena(a.ctx)) / 1048576.0, peak - base);
    mmc_ctx_free(tctx);
    mmc_ctx_free(a.ctx);
    mmc_qwen2_free(a.m);
    mmc_tensor_free(a.x);
    return 0;
}
