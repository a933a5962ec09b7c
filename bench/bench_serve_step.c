/* bench_serve_step.c — the serving engine's decode step in-process, by CPU time: what batching gains
 * per token of work, whatever share of the cores a loaded host gives the process (issue 18's goal of
 * 16 clients >= 4x the single stream, measured without the HTTP side).
 *
 * A model directory (bench_serve_model's Qwen2ForCausalLM; f32 or bf16 weights as stored), its decoder
 * linears optionally quantised (int8 / nf4: mmc_qwen2_quantize, as `--quantize`). B sequences get a
 * prompt of PROMPT_LEN tokens each (packed prefill into a paged KV pool, as mmc serve does), then
 * STEPS batched decode steps (mmc_qwen2_decode_batch, B rows per step, the engine's call); the time of
 * one step is the best of those steps on the calling thread's CPU-time clock (run it with
 * OMP_NUM_THREADS=1: every OpenMP region then runs on this thread, so its CPU time is all the work).
 * Prints one line per B:
 *   MODE B step-ms ms-per-token tokens-per-CPU-second gain-over-B=1
 * gain = (B / step(B)) / (1 / step(1)): the throughput per unit of CPU of B clients over one (B = 1 given
 * first; else "-").
 * usage: bench_serve_step DIR MODE STEPS PROMPT_LEN B...   (MODE: f32 / bf16 as stored, int8, nf4)
 * Without arguments (bench/run.sh runs every build/bench_* so) it says what it is and exits 0. */
#include "mmc_infer.h"
#include "mmc_models.h"
#include "mmc_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "bench_serve_step: batched decode step CPU time (usage: bench_serve_step DIR f32|bf16|int8|nf4 "
                        "STEPS PROMPT_LEN B...); nothing to measure alone\n");
        return 0;
    }
    const char *dir = argv[1], *mode_s = argv[2];
    const int steps = atoi(argv[3]), plen = atoi(argv[4]);
    mmc_quant_mode mode = MMC_WQ_NONE;
    if (strcmp(mode_s, "f32") && strcmp(mode_s, "bf16") && mmc_quant_mode_parse(mode_s, &mode)) goto fail;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_qwen2 *m = NULL;
    if (mmc_json_load(path, &cfg) || mmc_qwen2_load(dir, cfg, false, &m)) goto fail;
    mmc_json_free(cfg);
    int64_t before = 0, after = 0;
    if (mode != MMC_WQ_NONE && mmc_qwen2_quantize(m, mode, NULL, &before, &after)) goto fail;
    mmc_decoder d = mmc_qwen2_decoder(m);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    double t1 = 0;
    for (int a = 5; a < argc; a++) {
        const int B = atoi(argv[a]);
        if (B < 1 || B > 256) {
            fprintf(stderr, "bench_serve_step: B = %s, want 1..256\n", argv[a]);
            return 1;
        }
        const int64_t bs = 16, per = (plen + steps + 1 + bs - 1) / bs;
        mmc_kv_pool pool;
        if (mmc_kv_pool_init(&pool, d.n_layers, d.kv_heads, d.head_dim, bs, per * B)) goto fail;
        mmc_kv_seq *seq = calloc((size_t)B, sizeof *seq);
        mmc_kv_seq **act = malloc(sizeof *act * (size_t)B);
        int32_t *toks = malloc(sizeof *toks * (size_t)B * (size_t)plen), *tk = malloc(sizeof *tk * (size_t)B);
        const int32_t **ids = malloc(sizeof *ids * (size_t)B);
        int64_t *n = malloc(sizeof *n * (size_t)B), *pos = malloc(sizeof *pos * (size_t)B);
        if (!seq || !act || !toks || !tk || !ids || !n || !pos) {
            fprintf(stderr, "bench_serve_step: out of memory\n");
            return 1;
        }
        for (int s = 0; s < B; s++) {
            for (int t = 0; t < plen; t++) toks[s * plen + t] = (int32_t)((s * 131 + t * 37 + 5) % 1000);
            ids[s] = toks + s * plen, n[s] = plen, act[s] = &seq[s];
        }
        float *lg;
        mmc_ctx_reset(ctx);
        if (mmc_qwen2_prefill_packed(ctx, m, ids, n, B, &pool, act, &lg)) goto fail;
        for (int s = 0; s < B; s++) tk[s] = (int32_t)((s * 7 + 11) % 1000);
        double best = 1e30;
        for (int k = 0; k < steps; k++) {
            for (int s = 0; s < B; s++) {
                if (!mmc_kv_seq_reserve(&pool, &seq[s], seq[s].len + 1)) {
                    fprintf(stderr, "bench_serve_step: KV pool too small\n");
                    return 1;
                }
                pos[s] = seq[s].len;
            }
            mmc_ctx_reset(ctx);
            double t0 = cpu_now();
            if (mmc_qwen2_decode_batch(ctx, m, tk, pos, B, &pool, act, &lg)) goto fail;
            double dt = cpu_now() - t0;
            if (dt < best) best = dt;
            for (int s = 0; s < B; s++) {   /* greedy: each row's argmax is its next token */
                const float *r = lg + (int64_t)s * d.vocab_size;
                int64_t bi = 0;
                for (int64_t v = 1; v < d.vocab_size; v++) if (r[v] > r[bi]) bi = v;
                tk[s] = (int32_t)bi;
            }
        }
        if (B == 1) t1 = best;
        if (t1 > 0) printf("%s %d %.3f %.3f %.1f %.2f\n", mode_s, B, best * 1e3, best * 1e3 / B, B / best, B * t1 / best);
        else printf("%s %d %.3f %.3f %.1f -\n", mode_s, B, best * 1e3, best * 1e3 / B, B / best);
        fflush(stdout);
        for (int s = 0; s < B; s++) mmc_kv_seq_free(&pool, &seq[s]);
        mmc_kv_pool_free(&pool);
        free(seq), free(act), free(toks), free(tk), free(ids), free(n), free(pos);
    }
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
    return 0;
fail:
    fprintf(stderr, "bench_serve_step: %s\n", mmc_last_error());
    return 1;
}
