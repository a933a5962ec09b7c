/* bench_moe.c — one Qwen2-MoE decoder layer (attention + sparse MoE block; Qwen1.5-MoE-A2.7B's
 * proportions at a quarter of the width: hidden 512, 8 heads, 16 experts of 352 picked top-4, a
 * shared expert of 1408) at seq 512, fp32: forward + backward and the inference forward, as
 * tokens/s; and the same for the MoE block alone (router, routed experts, gated shared expert).
 * Each case runs the routed experts both ways, alternating in this process: grouped GEMMs (the
 * default, src/nn/moe_experts.c) and the per-expert loop (mmc_moe_set_grouped(0)); the loop's
 * figures are printed as "<case>_loop" (no peer) and the grouped / loop ratio on stderr.
 * Peer: bench/peer_moe.py runs transformers' Qwen2MoeDecoderLayer / Qwen2MoeSparseMoeBlock
 * (sdpa, the eager experts implementation) with the same shapes and threads. */
#include "bench_util.h"
#include "mmc_models.h"

#include <string.h>
#include <time.h>

static const char *k_cfg =
    "{\"model_type\": \"qwen2_moe\", \"vocab_size\": 16, \"hidden_size\": 512, \"intermediate_size\": 1408,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 8, \"num_key_value_heads\": 8,"
    " \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
    " \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 352,"
    " \"shared_expert_intermediate_size\": 1408, \"decoder_sparse_step\": 1, \"norm_topk_prob\": false}";

typedef struct {
    mmc_ctx *ctx;
    mmc_qwen2 *m;
    mmc_tensor *x, *cos, *sin;
} args_t;

static void block_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    mmc_tensor *y = mmc_moe_block_forward(a->ctx, a->m->layers[0].moe, a->x);
    mmc_tensor *g = mmc_grad(a->ctx, y);
    float *gd = g->data;
    for (int64_t i = 0; i < mmc_numel(g); i++) gd[i] = 1.0f;
    bool prev = mmc_set_grad_enabled(a->ctx, false);
    mmc_backward_range(a->ctx, 0, mmc_tape_len(a->ctx));
    mmc_set_grad_enabled(a->ctx, prev);
}

static void block_fwd(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    bool prev = mmc_set_grad_enabled(a->ctx, false);
    mmc_moe_block_forward(a->ctx, a->m->layers[0].moe, a->x);
    mmc_set_grad_enabled(a->ctx, prev);
}

/* fn timed with grouped expert GEMMs and with the loop, alternating in rounds (grouped, loop,
 * grouped, ...) until secs have passed and at least 6 rounds; the fastest call of each (on a
 * shared host the minimum is the figure least disturbed by other processes) */
static const char *g_only;
/* CPU seconds of the whole process (every thread): robust to other processes on a shared host,
 * where wall time measures the scheduler more than the code */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void ab(const char *name, bench_fn fn, args_t *a, double secs) {
    if (g_only && !strstr(name, g_only)) return;
    double best[2] = {1e30, 1e30}, cpu[2] = {1e30, 1e30};
    fn(a);
    const double start = mmc_now();
    for (int round = 0; round < 6 || mmc_now() - start < secs; round++)
        for (int g = 1; g >= 0; g--) {
            mmc_moe_set_grouped(g);
            double t0 = mmc_now(), c0 = cpu_now();
            fn(a);
            double s = mmc_now() - t0, c = cpu_now() - c0;
            if (s < best[g]) best[g] = s;
            if (c < cpu[g]) cpu[g] = c;
        }
    fprintf(stderr, "%s: process CPU time, all threads: grouped %.1f ms, loop %.1f ms (loop / grouped %.2f)\n", name,
            cpu[1] * 1e3, cpu[0] * 1e3, cpu[0] / cpu[1]);
    mmc_moe_set_grouped(1);
    const int64_t T = a->x->shape[1];
    char loop[128];
    snprintf(loop, sizeof loop, "%s_loop", name);
    bench_report(name, (double)T / best[1], "tok/s", 1);
    bench_report_info(loop, (double)T / best[0], "tok/s");
    fprintf(stderr, "%s: grouped %.1f ms, loop %.1f ms (grouped %.2fx the loop's tok/s)\n", name, best[1] * 1e3,
            best[0] * 1e3, best[0] / best[1]);
}

static void step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    mmc_attn_opts o = {.causal = true};
    mmc_tensor *y = mmc_qwen2_layer_forward(a->ctx, &a->m->cfg, &a->m->layers[0], a->x, a->cos, a->sin, &o, NULL, 0);
    mmc_tensor *g = mmc_grad(a->ctx, y);
    float *gd = g->data;
    for (int64_t i = 0; i < mmc_numel(g); i++) gd[i] = 1.0f;
    bool prev = mmc_set_grad_enabled(a->ctx, false);
    mmc_backward_range(a->ctx, 0, mmc_tape_len(a->ctx));
    mmc_set_grad_enabled(a->ctx, prev);
}

static void fwd(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    bool prev = mmc_set_grad_enabled(a->ctx, false);
    mmc_tensor *x = mmc_new(a->ctx, MMC_F32, 3, a->x->shape);
    memcpy(x->data, a->x->data, mmc_nbytes(x));
    mmc_attn_opts o = {.causal = true};
    mmc_qwen2_layer_forward_infer(a->ctx, &a->m->cfg, &a->m->layers[0], x, a->cos, a->sin, &o, NULL, 0);
    mmc_set_grad_enabled(a->ctx, prev);
}

int main(int argc, char **argv) {
    g_only = argc > 1 ? argv[1] : NULL;   /* a case-name substring: run only those */
    const int64_t T = 512, C = 512;
    mmc_json *j = NULL;
    args_t a = {.ctx = mmc_ctx_new()};
    if (mmc_json_parse(k_cfg, strlen(k_cfg), "bench_moe", &j) || mmc_qwen2_moe_new(j, 1, NULL, &a.m)) {
        fprintf(stderr, "%s\n", mmc_last_error());
        return 1;
    }
    mmc_json_free(j);
    a.x = mmc_tensor_new(MMC_F32, 3, MMC_SHAPE(1, T, C));
    mmc_rng r;
    mmc_rng_init(&r, 3);
    mmc_rng_normal(&r, a.x->data, mmc_numel(a.x), 0, 1);
    a.x->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    mmc_ctx *tctx = mmc_ctx_new();
    mmc_tensor *pos = mmc_new(tctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_rope_table_1d(tctx, pos, 64, 1e6, &a.cos, &a.sin);
    ab("block_qwen2_moe_fwd_bwd_T512", step, &a, 5.0);
    ab("block_qwen2_moe_fwd_T512", fwd, &a, 3.0);
    ab("block_qwen2_moe_sparse_fwd_bwd_T512", block_step, &a, 5.0);
    ab("block_qwen2_moe_sparse_fwd_T512", block_fwd, &a, 3.0);
    mmc_ctx_free(tctx);
    mmc_ctx_free(a.ctx);
    mmc_qwen2_free(a.m);
    mmc_tensor_free(a.x);
    return 0;
}
