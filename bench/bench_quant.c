/* bench_quant.c — mmc's side of bench/bench_quant.sh: single-stream greedy decode tok/s of a model
 * directory (bench_serve_model's Qwen2ForCausalLM) with its decoder linears in f32 (as loaded), int8 or
 * NF4 (mmc_qwen2_quantize, what `--quantize` does at load), or, as mode bf16, a directory whose weights are bf16
 * (bench_serve_model ... bf16; decoded as loaded, against llama.cpp's bf16 / f16 GGUFs). As bench/bench_quant_llama.py does for
 * llama.cpp: a prompt of PROMPT_LEN fixed ids ((i * 37 + 5) % 1000) is prefilled, then NTOK tokens are
 * decoded one at a time (each step: the decoder's decode of one token and the argmax of its logits);
 * tok/s = NTOK / the decode time, best of ROUNDS; with MMC_BENCH_CPU_CLOCK=1 the time is this thread's CPU
 * time (run it with OMP_NUM_THREADS=1: the work a token costs, whatever share of the cores a loaded host
 * gives the process). Prints one line per mode:
 *   MODE tok/s weight-bytes-of-the-decoder-linears
 * usage: bench_quant DIR NTOK ROUNDS PROMPT_LEN MODE...   (MODE: f32, int8, nf4; bf16 for a bf16 DIR)
 * Without arguments (bench/run.sh runs every build/bench_* so) it says what it is and exits 0. */
#include "mmc_infer.h"
#include "mmc_models.h"
#include "mmc_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool g_cpu_clock;
static double clk(void) {
    if (!g_cpu_clock) return mmc_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int argmax(const float *v, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return (int)b;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "bench_quant: a helper of bench/bench_quant.sh (usage: bench_quant DIR NTOK ROUNDS PROMPT_LEN "
                        "f32|int8|nf4...); nothing to measure alone\n");
        return 0;
    }
    const char *dir = argv[1];
    g_cpu_clock = getenv("MMC_BENCH_CPU_CLOCK") && atoi(getenv("MMC_BENCH_CPU_CLOCK"));
    int ntok = atoi(argv[2]), rounds = atoi(argv[3]), plen = atoi(argv[4]);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (int a = 5; a < argc; a++) {
        mmc_quant_mode mode = MMC_WQ_NONE;
        const bool dense = !strcmp(argv[a], "f32") || !strcmp(argv[a], "bf16");
        if (!dense && mmc_quant_mode_parse(argv[a], &mode)) goto fail;
        mmc_json *cfg = NULL;
        mmc_qwen2 *m = NULL;
        if (mmc_json_load(path, &cfg) || mmc_qwen2_load(dir, cfg, false, &m)) goto fail;
        mmc_json_free(cfg);
        int64_t before = 0, after = 0;
        if (mode != MMC_WQ_NONE && mmc_qwen2_quantize(m, mode, NULL, &before, &after)) goto fail;
        if (mode == MMC_WQ_NONE) {   /* the dense decoder linears as loaded */
            mmc_module_list ml = {0};
            if (mmc_qwen2_linears(m, "", &ml)) goto fail;
            for (int i = 0; i < ml.n; i++) {
                after += mmc_nbytes(ml.mods[i]->w);
                if ((ml.mods[i]->w->dtype == MMC_BF16) != !strcmp(argv[a], "bf16")) {
                    fprintf(stderr, "bench_quant: mode %s but %s holds %s weights (bench_serve_model DIR ... bf16 writes "
                                    "bf16 ones)\n", argv[a], dir, mmc_dtype_name(ml.mods[i]->w->dtype));
                    return 1;
                }
            }
            mmc_module_list_free(&ml);
        }
        mmc_decoder dec = mmc_qwen2_decoder(m);
        int32_t *prompt = malloc(sizeof(int32_t) * (size_t)plen);
        for (int i = 0; i < plen; i++) prompt[i] = (int32_t)((i * 37 + 5) % 1000);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        double best = 1e30;
        for (int r = 0; r < rounds; r++) {
            mmc_kv_cache kv;
            if (mmc_kv_cache_init(&kv, dec.n_layers, 1, dec.kv_heads, dec.head_dim, plen + ntok + 1)) goto fail;
            float *lg = NULL;
            mmc_ctx_reset(ctx);
            if (dec.prefill(ctx, dec.self, prompt, plen, &kv, &lg)) goto fail;
            int tok = argmax(lg, dec.vocab_size);
            double t0 = clk();
            for (int t = 0; t < ntok; t++) {
                mmc_ctx_reset(ctx);
                if (dec.decode(ctx, dec.self, tok, &kv, &lg)) goto fail;
                tok = argmax(lg, dec.vocab_size);
            }
            double dt = clk() - t0;
            if (dt < best) best = dt;
            mmc_kv_cache_free(&kv);
        }
        printf("%s %.6g %lld\n", argv[a], ntok / best, (long long)after);
        fflush(stdout);
        mmc_ctx_free(ctx);
        free(prompt);
        mmc_qwen2_free(m);
    }
    return 0;
fail:
    fprintf(stderr, "bench_quant: %s\n", mmc_last_error());
    return 1;
}
