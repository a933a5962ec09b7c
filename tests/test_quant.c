/* test_quant.c — weight-only int8 and NF4 inference kernels (mmc_quant.h, qmatvec.c).
 *
 * Parts avx512 / avx2 / generic force the kernel (mmc_gemm_set_kernel, as test_gemm does) and
 * check, for M = 1..4 (the direct matvec) and M = 7 (dequantised tiles + GEMM):
 *   y = x · dequant(W)ᵀ + b  against a float64 reference over the dequantised matrix,
 *   per element |y - ref| <= 1e-5 · Σ_k |x_k · w_nk| + 1e-6 (f32 accumulation over K <= 2112
 *   stays near sqrt(K)·2^-24 of that sum; a wrong code, scale or lane is ~1e-2 of it);
 * int8 quantisation itself: round half to even at scale 1, the clamp, a zero row; NF4 with and
 * without double quantisation; K not a multiple of 16 / 64 (int8 tails, NF4's tile fallback);
 * the backward (dx) of both through the tiles. Each kernel part also runs nf4_direct_suite: the direct
 * NF4 matvec (both AVX-512 kernels) on chunk / tail / double-quant shapes, M = 1..4 and 1-2 threads,
 * within the same bound of float64, and each row bit for bit what it gets alone.
 * Part model: logit drift of `--quantize int8|nf4` against the same model in f32 on the tiny
 * fixtures (Qwen2-VL, Qwen2.5-VL, Llama, Qwen2; text prompt of 12 tokens): the f32 model's
 * greedy continuation of 8 tokens is fed to both (prefill through the tile GEMM, decode
 * through the direct matvec) and max |logit - logit_f32| over those 9 positions must stay
 * within the stated bounds (relative to max |logit_f32|); the greedy tokens of both are
 * printed with the length of the common prefix. */
#include "test_util.h"
#include "mmc_infer.h"
#include "mmc_models.h"
#include "mmc_nn.h"
#include "mmc_quant.h"
#include "mmc_vl.h"
#include "../src/backend/cpu/gemm.h"
#include "../src/backend/cpu/qmatvec.h"

#include <omp.h>

/* y [M, N] vs float64 x · wdᵀ + b over the dequantised wd [N, K] */
static void check_linear(const char *what, const mmc_tensor *y, const float *x, const float *wd, const float *b,
                         int64_t M, int64_t N, int64_t K) {
    const float *yd = y->data;
    double worst = 0;
    int64_t bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = b ? b[n] : 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[m * K + k] * (double)wd[n * K + k];
                s += p;
                mag += fabs(p);
            }
            double tol = 1e-5 * mag + 1e-6, e = fabs(yd[m * N + n] - s);
            if (!(e <= tol)) bad++;
            if (e / tol > worst) worst = e / tol;
        }
    CHECKF(bad == 0, "%s [M %lld, N %lld, K %lld] (%s): %lld elements over the bound, worst %.3g x the bound", what,
           (long long)M, (long long)N, (long long)K, mmc_qmv_kernel_name(), (long long)bad, worst);
}

/* w [N, K] quantised as fmt (0 int8, 1 NF4, 2 NF4 + double quant) into a linear's base; wd (may be
 * NULL) gets the dequantised matrix. False if it failed (counted). */
static bool quantize_fmt(int fmt, const mmc_tensor *w, mmc_linear_w *l, float *wd) {
    const int64_t N = w->shape[0], K = w->shape[1];
    *l = (mmc_linear_w){.out_features = N, .in_features = K};
    if (fmt == 0) CHECK_OK(mmc_q8_quantize(w->data, N, K, &l->q8));
    else CHECK_OK(mmc_nf4_quantize(w->data, N, K, fmt == 2, &l->q));
    if (!l->q8 && !l->q) return false;
    if (wd && l->q8) mmc_q8_dequantize_rows(l->q8, 0, N, wd);
    if (wd && l->q) mmc_nf4_dequantize_rows(l->q, NULL, 0, N, wd);
    return true;
}

static void kernel_suite(void) {
    const int64_t shapes[][2] = {{200, 2112}, {37, 100}, {64, 128}, {9, 64}, {300, 33}};
    const int64_t Ms[] = {1, 2, 3, 4, 7};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1];
        mmc_tensor *w = randn_param(100 + si, 2, MMC_SHAPE(N, K), 0.05f);
        mmc_tensor *b = randn_param(200 + si, 1, MMC_SHAPE(N), 0.1f);
        float *wd = malloc(sizeof(float) * (size_t)(N * K));
        for (int fmt = 0; fmt < 3; fmt++) {   /* int8, NF4, NF4 + double quant */
            const char *name = fmt == 0 ? "int8" : fmt == 1 ? "nf4" : "nf4+dq";
            mmc_linear_w base;
            if (fmt && (N * K) % 2) continue;
            if (!quantize_fmt(fmt, w, &base, wd)) continue;
            /* dequantised weights near the originals: int8 within half a step of each row's
             * scale, NF4 within the widest gap of its levels (0.16 of the block absmax) */
            double dmax = 0;
            for (int64_t i = 0; i < N * K; i++) dmax = fmax(dmax, fabs((double)((float *)w->data)[i] - wd[i]));
            CHECKF(dmax <= (fmt == 0 ? 0.5001 / 127 : 0.17) * max_abs(w), "%s: max |w - dequant(w)| %g", name, dmax);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                mmc_tensor *x = randn_param(300 + mi, 2, MMC_SHAPE(M, K), 1.0f);
                mmc_ctx *ctx = mmc_ctx_new();
                mmc_set_grad_enabled(ctx, false);
                mmc_linear_w l = base;
                l.b = (mi & 1) ? b : NULL;
                mmc_tensor *y = mmc_nn_linear(ctx, x, &l);
                check_linear(name, y, x->data, wd, l.b ? b->data : NULL, M, N, K);
                mmc_ctx_free(ctx);
                mmc_tensor_free(x);
            }
            mmc_linear_quant_free(&base);
        }
        free(wd);
        mmc_tensor_free(w);
        mmc_tensor_free(b);
    }
}

/* The direct NF4 matvec (mmc_qmv_nf4) on the kernel part forced, each AVX-512 variant (the
 * byte-offset kernel and the previous LUT one), against float64 over the dequantised matrix (the
 * check_linear bound), on shapes that hit each path: one chunk of 128, several, a trailing block of 64
 * (K % 128 == 64), K = 64 (the trailing block alone), a row count that is not a multiple of the 4 rows in
 * flight, double quantisation with more than 64 blocks a row (scales on the heap), and a weight of
 * 1088 x 520 (276 KiB: split over 2 threads). Also bitwise: each row of x gives the same y whatever M
 * (the serving engine's 4-row groups rely on it) and whatever the thread count (1 or 2). */
static void nf4_direct_suite(void) {
    const int64_t shapes[][2] = {{1, 128}, {5, 192}, {13, 256}, {67, 640}, {33, 320}, {7, 64}, {9, 4160}, {520, 1088}};
    const bool avx512 = !strcmp(mmc_qmv_kernel_name(), "avx512");
    const int nt0 = omp_get_max_threads();
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1];
        mmc_tensor *w = randn_param(700 + si, 2, MMC_SHAPE(N, K), 0.05f);
        mmc_tensor *x = randn_param(800 + si, 2, MMC_SHAPE(4, K), 1.0f);
        const float *xs = x->data;
        float *wd = malloc(sizeof(float) * (size_t)(N * K)), *y1 = malloc(sizeof(float) * (size_t)(4 * N)),
              *y = malloc(sizeof(float) * (size_t)(4 * N));
        for (int dq = 0; dq < 2; dq++) {
            mmc_nf4 *q = NULL;
            CHECK_OK(mmc_nf4_quantize(w->data, N, K, dq, &q));
            if (!q) continue;
            CHECK(mmc_qmv_nf4_ok(q));
            mmc_nf4_dequantize_rows(q, NULL, 0, N, wd);
            for (int var = 0; var < (avx512 ? 2 : 1); var++) {
                CHECK(mmc_qmv_set_nf4_kernel(var ? "lut" : NULL) == 0);
                /* each row of x alone (M = 1, one thread): the reference rows */
                omp_set_num_threads(1);
                for (int m = 0; m < 4; m++) mmc_qmv_nf4(1, xs + m * K, q, y1 + m * N);
                int64_t bad = 0, diff = 0;
                double worst = 0;
                for (int m = 0; m < 4; m++)
                    for (int64_t n = 0; n < N; n++) {
                        double s = 0, mag = 0;
                        for (int64_t k = 0; k < K; k++) {
                            const double p = (double)xs[m * K + k] * (double)wd[n * K + k];
                            s += p;
                            mag += fabs(p);
                        }
                        const double tol = 1e-5 * mag + 1e-6, e = fabs(y1[m * N + n] - s);
                        bad += !(e <= tol);
                        if (e / tol > worst) worst = e / tol;
                    }
                for (int nt = 1; nt <= (nt0 < 2 ? nt0 : 2); nt++) {
                    omp_set_num_threads(nt);
                    for (int M = 1; M <= 4; M++) {
                        for (int64_t i = 0; i < M * N; i++) y[i] = NAN;   /* every output must be written */
                        mmc_qmv_nf4(M, xs, q, y);
                        for (int64_t i = 0; i < M * N; i++) diff += memcmp(&y[i], &y1[i], sizeof(float)) != 0;
                    }
                }
                omp_set_num_threads(nt0);
                CHECKF(bad == 0, "NF4 matvec%s (%s, %s) [N %lld, K %lld]: %lld outputs over 1e-5 of sum|x w|, worst %.3g x",
                       dq ? " + double quant" : "", mmc_qmv_kernel_name(), var ? "lut" : "default", (long long)N,
                       (long long)K, (long long)bad, worst);
                CHECKF(diff == 0, "NF4 matvec%s (%s, %s) [N %lld, K %lld]: %lld outputs differ between M = 1..4 / 1-2 "
                       "threads and the row alone", dq ? " + double quant" : "", mmc_qmv_kernel_name(),
                       var ? "lut" : "default", (long long)N, (long long)K, (long long)diff);
            }
            mmc_qmv_set_nf4_kernel(NULL);
            mmc_nf4_free(q);
        }
        CHECK(mmc_qmv_set_nf4_kernel("nf5") == -1);
        free(wd); free(y1); free(y);
        mmc_tensor_free(w);
        mmc_tensor_free(x);
    }
}

/* int8 rounding: a row with absmax 127 has scale 1, so codes are round_half_even(w) */
static void test_int8_rounding(void) {
    const float row[8] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.49f, -126.6f, 1.5f};
    const int8_t want[8] = {127, 2, 4, -2, 0, 0, -127, 2};
    float w[16] = {0};
    memcpy(w, row, sizeof row);   /* row 1: all zero */
    mmc_q8 *q = NULL;
    CHECK_OK(mmc_q8_quantize(w, 2, 8, &q));
    if (!q) return;
    CHECK(q->scale[0] == 1.0f && q->scale[1] == 0.0f);
    int bad = 0;
    for (int k = 0; k < 8; k++) bad += q->q[k] != want[k] || q->q[8 + k] != 0;
    CHECKF(bad == 0, "%d int8 codes differ from round-half-even", bad);
    CHECK(mmc_q8_bytes(q) == 16 + 2 * sizeof(float));
    mmc_q8_free(q);
    CHECK_ERR(mmc_q8_quantize(w, 0, 8, &q), MMC_ERR_SHAPE);
    mmc_quant_mode mode;
    CHECK_ERR(mmc_quant_mode_parse("int4", &mode), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "int8, nf4"));
    CHECK(mmc_quant_mode_parse("nf4", &mode) == MMC_OK && mode == MMC_WQ_NF4);
}

/* a LoRA adapter on a quantised base: y = x·dequant(W)ᵀ + scale · (x·Aᵀ)·Bᵀ, both formats, decode and tiles */
static void test_lora_on_top(void) {
    const int64_t N = 96, K = 128, r = 4;
    mmc_tensor *w = randn_param(51, 2, MMC_SHAPE(N, K), 0.05f);
    mmc_tensor *A = randn_param(52, 2, MMC_SHAPE(r, K), 0.1f), *B = randn_param(53, 2, MMC_SHAPE(N, r), 0.1f);
    mmc_lora lo = {.A = A, .B = B, .scale = 0.5f};
    for (int fmt = 0; fmt < 2; fmt++)
        for (int64_t M = 1; M <= 7; M += 6) {
            mmc_linear_w base;
            if (!quantize_fmt(fmt, w, &base, NULL)) continue;
            mmc_tensor *x = randn_param(54, 2, MMC_SHAPE(M, K), 1.0f);
            mmc_ctx *ctx = mmc_ctx_new();
            mmc_set_grad_enabled(ctx, false);
            mmc_linear_w ad = base;
            ad.lora = &lo;
            mmc_tensor *want = mmc_add(ctx, mmc_nn_linear(ctx, x, &base),
                                       mmc_scale(ctx, mmc_linear(ctx, mmc_linear(ctx, x, A, NULL), B, NULL), 0.5f));
            CHECK_CLOSE(mmc_nn_linear(ctx, x, &ad), want, 1e-6, 0, "LoRA on a quantised base (1e-6)");
            mmc_ctx_free(ctx);
            mmc_tensor_free(x);
            mmc_linear_quant_free(&base);
        }
    mmc_tensor_free(w); mmc_tensor_free(A); mmc_tensor_free(B);
}

/* dx = dy · dequant(W) through the tiles (x requires grad), against float64 */
static void test_backward(void) {
    const int64_t M = 3, N = 300, K = 128;
    mmc_tensor *w = randn_param(41, 2, MMC_SHAPE(N, K), 0.05f);
    float *wd = malloc(sizeof(float) * (size_t)(N * K));
    for (int fmt = 0; fmt < 2; fmt++) {
        mmc_linear_w l;
        if (!quantize_fmt(fmt, w, &l, wd)) continue;
        mmc_tensor *x = randn_param(42, 2, MMC_SHAPE(M, K), 1.0f);
        x->flags |= MMC_REQUIRES_GRAD;
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *y = mmc_nn_linear(ctx, x, &l);
        mmc_backward(ctx, mmc_sum(ctx, y));   /* dy = 1: dx[m, k] = Σ_n wd[n, k] */
        const float *dx = x->grad ? x->grad->data : NULL;
        CHECK(dx != NULL);
        int64_t bad = 0;
        for (int64_t m = 0; dx && m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double s = 0, mag = 0;
                for (int64_t n = 0; n < N; n++) { s += wd[n * K + k]; mag += fabs(wd[n * K + k]); }
                bad += !(fabs(dx[m * K + k] - s) <= 1e-5 * mag + 1e-6);
            }
        CHECKF(bad == 0, "%s backward: %lld of dx over 1e-5 of Σ|w|", fmt ? "nf4" : "int8", (long long)bad);
        mmc_ctx_free(ctx);
        mmc_tensor_free(x);
        mmc_linear_quant_free(&l);
    }
    free(wd);
    mmc_tensor_free(w);
}

/* ---- logit drift on the tiny fixtures */
typedef struct {
    const char *name, *dir;
    mmc_qwen2 *lm;          /* the language model (quantised in place) */
    mmc_qwen2_vl *vlm;      /* Qwen2-VL / 2.5-VL (owns lm) */
    mmc_qwen2_vl_request req;
    mmc_decoder dec;
} drift_model;

static bool drift_load(drift_model *d) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", d->dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(p, &cfg);
    const char *mt = "?";
    if (!st) mmc_json_str(cfg, "model_type", "?", &mt);
    if (!st && !strncmp(mt, "qwen2_", 6)) {
        st = mmc_qwen2_vl_load(d->dir, false, &d->vlm);
        if (!st) {
            d->lm = d->vlm->lm;
            d->req = (mmc_qwen2_vl_request){.m = d->vlm};
            d->dec = mmc_qwen2_vl_decoder(&d->req);
        }
    } else if (!st) {
        st = !strcmp(mt, "llama") ? mmc_llama_load(d->dir, cfg, false, &d->lm) : mmc_qwen2_load(d->dir, cfg, false, &d->lm);
        if (!st) d->dec = mmc_qwen2_decoder(d->lm);
        d->dec.max_positions = 64;   /* Llama's fixture says 8; the drift prompt + path is 20 */
    }
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load %s: %s\n", d->dir, mmc_last_error()); g_fail++; }
    return !st;
}

static void drift_free(drift_model *d) {
    if (d->vlm) mmc_qwen2_vl_free(d->vlm);
    else mmc_qwen2_free(d->lm);
    d->lm = NULL;
    d->vlm = NULL;
}

enum { DRIFT_PROMPT = 12, DRIFT_NEW = 8 };

/* logits [DRIFT_NEW + 1, V]: the prompt's last position, then each of path's tokens fed */
static float *drift_logits(const mmc_decoder *dec, const int32_t *prompt, const int32_t *path) {
    const int64_t V = dec->vocab_size;
    float *out = calloc((size_t)(V * (DRIFT_NEW + 1)), sizeof(float));
    mmc_kv_cache kv;
    CHECK_OK(mmc_kv_cache_init(&kv, dec->n_layers, 1, dec->kv_heads, dec->head_dim, DRIFT_PROMPT + DRIFT_NEW));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    float *lg = NULL;
    CHECK_OK(dec->prefill(ctx, dec->self, prompt, DRIFT_PROMPT, &kv, &lg));
    if (lg) memcpy(out, lg, sizeof(float) * (size_t)V);
    for (int t = 0; t < DRIFT_NEW && lg; t++) {
        mmc_ctx_reset(ctx);
        lg = NULL;
        CHECK_OK(dec->decode(ctx, dec->self, path[t], &kv, &lg));
        if (lg) memcpy(out + (t + 1) * V, lg, sizeof(float) * (size_t)V);
    }
    mmc_ctx_free(ctx);
    mmc_kv_cache_free(&kv);
    return out;
}

static void greedy(const mmc_decoder *dec, const int32_t *prompt, int32_t *out) {
    mmc_gen_opts go = {.max_new_tokens = DRIFT_NEW};
    mmc_sampler_defaults(&go.sampler);
    int n = 0;
    CHECK_OK(mmc_generate(dec, prompt, DRIFT_PROMPT, &go, out, &n));
    for (; n < DRIFT_NEW; n++) out[n] = -1;
}

static void test_drift(void) {
    /* bounds on max |logit - logit_f32| / max |logit_f32| (measured: see the printed lines) */
    /* (measured here: int8 <= 0.017, nf4 <= 0.29 on the random tiny Qwen2-VL fixtures, whose
     * hidden size of 64 leaves NF4 one block per row; Llama and Qwen2 drift far less) */
    const double bound[2] = {0.03, 0.4};   /* int8, nf4 */
    drift_model ms[] = {{.name = "Qwen2-VL", .dir = "tests/fixtures/qwen2_vl/q2_hub"},
                        {.name = "Qwen2.5-VL", .dir = "tests/fixtures/qwen2_vl/q25_hub"},
                        {.name = "Llama", .dir = "tests/fixtures/llama/default"},
                        {.name = "Qwen2", .dir = "tests/fixtures/qwen2/tiny"}};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        drift_model *d = &ms[i];
        if (!drift_load(d)) continue;
        const int64_t V = d->dec.vocab_size;
        int32_t prompt[DRIFT_PROMPT], ref_tok[DRIFT_NEW], q_tok[DRIFT_NEW];
        for (int t = 0; t < DRIFT_PROMPT; t++) prompt[t] = (int32_t)((t * 37 + 5) % 250);   /* ordinary tokens (the fixtures' specials are above) */
        greedy(&d->dec, prompt, ref_tok);
        for (int t = 0; t < DRIFT_NEW; t++) if (ref_tok[t] < 0) ref_tok[t] = 0;
        float *ref = drift_logits(&d->dec, prompt, ref_tok);
        double ref_max = 0;
        for (int64_t j = 0; j < V * (DRIFT_NEW + 1); j++) ref_max = fmax(ref_max, fabs(ref[j]));
        for (int mode = MMC_WQ_INT8; mode <= MMC_WQ_NF4; mode++) {
            if (mode != MMC_WQ_INT8) { drift_free(d); if (!drift_load(d)) break; }
            int n_lin = 0;
            int64_t before = 0, after = 0;
            CHECK_OK(mmc_qwen2_quantize(d->lm, mode, &n_lin, &before, &after));
            CHECK(n_lin == 7 * d->lm->cfg.num_layers && after < before);
            float *got = drift_logits(&d->dec, prompt, ref_tok);
            double dmax = 0;
            for (int64_t j = 0; j < V * (DRIFT_NEW + 1); j++) dmax = fmax(dmax, fabs((double)got[j] - ref[j]));
            greedy(&d->dec, prompt, q_tok);
            int same = 0;
            while (same < DRIFT_NEW && q_tok[same] == ref_tok[same]) same++;
            const char *mn = mmc_quant_mode_name((mmc_quant_mode)mode);
            printf("drift %-10s %-4s max|logit diff| %.4g (max|logit| %.3g, rel %.4f); greedy %d/%d tokens as f32:",
                   d->name, mn, dmax, ref_max, dmax / ref_max, same, DRIFT_NEW);
            for (int t = 0; t < DRIFT_NEW; t++) printf(" %d%s", q_tok[t], q_tok[t] == ref_tok[t] ? "" : "*");
            printf("\n");
            CHECKF(dmax <= bound[mode - 1] * ref_max, "%s %s: logit drift %.4g > %.2f x max|logit| %.3g", d->name, mn,
                   dmax, bound[mode - 1], ref_max);
            free(got);
        }
        free(ref);
        drift_free(d);
    }
}

int main(int argc, char **argv) {
    const char *kernels[3] = {"avx512", "avx2", "generic"};
    const char *native = mmc_gemm_kernel_name();
    for (int ki = 0; ki < 3; ki++) {
        if (!test_part(argc, argv, kernels[ki])) continue;
        if (mmc_gemm_set_kernel(kernels[ki]) != 0) {
            test_skip("test_quant", "kernel %s: this CPU lacks its instructions", kernels[ki]);
            continue;
        }
        kernel_suite();
        nf4_direct_suite();
        mmc_gemm_set_kernel(native);
    }
    if (test_part(argc, argv, "format")) {
        test_int8_rounding();
        test_backward();
        test_lora_on_top();
    }
    if (test_part(argc, argv, "model")) test_drift();
    return test_done("test_quant");
}
