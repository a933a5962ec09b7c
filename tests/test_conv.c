/* test_conv.c — mmc_conv2d's algorithms (src/ops/conv.c, src/backend/cpu/conv.c) against a
 * direct convolution summed in double: im2col + GEMM (MMC_CONV_ALGO=gemm) and Winograd
 * F(4x4, 3x3) (=winograd: forward, backward-data as a forward over dy with the flipped
 * kernels, backward-weight as F(3x3, 4x4) on the same points), for y, dx, dW and db, on odd
 * sizes, padding 0 / 1 / 2 / 3, stride 2 (Winograd does not apply: the GEMM path runs),
 * partial 4x4 tiles, rows of more than 16 tiles, frozen x / w, no bias, many blocks and
 * weight-gradient chunks (MMC_CONV_WINO_TB / _TC small), the team mode of small images
 * (threads take (e, channel group) GEMMs), more than 256 input channels (the micro-kernel's
 * channel passes accumulate), and bitwise the same results on 1 and 2 threads.
 * (mmc_conv2d has no groups or dilation.)
 *
 * Tolerances: max |got - want| / max(|want|, 1e-3) over each tensor.
 *   GEMM: 1e-5 (fp32 sums of up to Cin*9 products).
 *   Winograd: 1e-4. Measured here (printed at the end): y, dx, dW <= 6.4e-6, against
 *   <= 1.2e-6 for the GEMM (the transforms' constants 1/4, 1/6, 1/24 and 4, 5, 8 cost about
 *   half a decimal digit against the direct sum; fp32 throughout, weight transform included).
 * The default (auto) picks Winograd for 3x3 stride-1 layers with >= 16 channels each way;
 * the VAE / UNet fixture tests (test_autoencoder_kl, test_sdxl_*, test_sd3*) run it at 1e-4. */
#include "test_util.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    int64_t B, Cin, H, W, Cout;
    int stride, pad;
    bool bias, gx, gw;
    const char *tb, *tc;   /* MMC_CONV_WINO_TB / _TC for this case (NULL: default) */
} ccase;

static void direct(const ccase *c, const float *x, const float *w, const float *b, const float *dy,
                   double *y, double *dx, double *dw, double *db, int64_t Ho, int64_t Wo) {
    for (int64_t n = 0; n < c->B; n++)
        for (int64_t o = 0; o < c->Cout; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    const int64_t yi = ((n * c->Cout + o) * Ho + oh) * Wo + ow;
                    double s = b ? b[o] : 0, g = dy[yi];
                    if (db) db[o] += g;
                    for (int64_t ci = 0; ci < c->Cin; ci++)
                        for (int64_t ki = 0; ki < 3; ki++)
                            for (int64_t kj = 0; kj < 3; kj++) {
                                const int64_t ih = oh * c->stride - c->pad + ki, iw = ow * c->stride - c->pad + kj;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                const int64_t xi = ((n * c->Cin + ci) * c->H + ih) * c->W + iw;
                                const int64_t wi = ((o * c->Cin + ci) * 3 + ki) * 3 + kj;
                                s += (double)x[xi] * w[wi];
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                    y[yi] = s;
                }
}

static double max_rel(const float *got, const double *want, int64_t n) {
    double m = 0, scale = 1e-3;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(got[i] - want[i]) / scale);
    return m;
}

static void setenv_or_unset(const char *k, const char *v) {
    if (v) setenv(k, v, 1);
    else unsetenv(k);
}

static double g_worst[2][3];   /* [algo][y, dx, dW]: the largest error seen */

static void run_case(size_t k, const ccase *c) {
    const int64_t Ho = (c->H + 2 * c->pad - 3) / c->stride + 1, Wo = (c->W + 2 * c->pad - 3) / c->stride + 1;
    const int64_t nx = c->B * c->Cin * c->H * c->W, nw = c->Cout * c->Cin * 9, ny = c->B * c->Cout * Ho * Wo;
    mmc_tensor *x = randn_param(200 + k, 4, MMC_SHAPE(c->B, c->Cin, c->H, c->W), 1);
    mmc_tensor *w = randn_param(300 + k, 4, MMC_SHAPE(c->Cout, c->Cin, 3, 3), 0.2f);
    mmc_tensor *b = c->bias ? randn_param(400 + k, 1, MMC_SHAPE(c->Cout), 1) : NULL;
    if (!c->gx) x->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    if (!c->gw) w->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    float *dy = malloc((size_t)ny * sizeof(float));
    mmc_rng r;
    mmc_rng_init(&r, 500 + k);
    mmc_rng_uniform(&r, dy, ny, -1, 1);
    double *y = calloc((size_t)ny, sizeof(double)), *dx = calloc((size_t)nx, sizeof(double));
    double *dw = calloc((size_t)nw, sizeof(double)), *db = calloc((size_t)c->Cout, sizeof(double));
    direct(c, x->data, w->data, b ? b->data : NULL, dy, y, dx, dw, b ? db : NULL, Ho, Wo);
    setenv_or_unset("MMC_CONV_WINO_TB", c->tb);
    setenv_or_unset("MMC_CONV_WINO_TC", c->tc);
    float *res[2][2][4] = {{{NULL}}};   /* [algo][threads - 1][y, dx, dW, db] */
    static const char *algos[2] = {"gemm", "winograd"};
    for (int al = 0; al < 2; al++)
        for (int th = 1; th <= 2; th++) {
#ifdef _OPENMP
            omp_set_num_threads(th);
#else
            if (th == 2) continue;
#endif
            setenv("MMC_CONV_ALGO", algos[al], 1);
            mmc_ctx *ctx = mmc_ctx_new();
            mmc_tensor *out = mmc_conv2d(ctx, x, w, b, c->stride, c->pad);
            memcpy(mmc_grad(ctx, out)->data, dy, (size_t)ny * sizeof(float));
            mmc_set_grad_enabled(ctx, false);
            mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
            const double tol = al ? 1e-4 : 1e-5;
            const double e[3] = {max_rel(out->data, y, ny), x->grad ? max_rel(x->grad->data, dx, nx) : 0,
                                 w->grad ? max_rel(w->grad->data, dw, nw) : 0};
            CHECKF(e[0] < tol, "case %zu %s: y error %.3g", k, algos[al], e[0]);
            CHECK((x->grad != NULL) == c->gx && (w->grad != NULL) == c->gw);
            CHECKF(e[1] < tol, "case %zu %s: dx error %.3g", k, algos[al], e[1]);
            CHECKF(e[2] < tol, "case %zu %s: dW error %.3g", k, algos[al], e[2]);
            if (b) CHECKF(max_rel(b->grad->data, db, c->Cout) < 1e-5, "case %zu %s: db", k, algos[al]);
            for (int q = 0; q < 3; q++) g_worst[al][q] = fmax(g_worst[al][q], e[q]);
            const mmc_tensor *got[4] = {out, x->grad, w->grad, b ? b->grad : NULL};
            for (int q = 0; q < 4; q++)
                if (got[q]) {
                    res[al][th - 1][q] = malloc(mmc_nbytes(got[q]));
                    memcpy(res[al][th - 1][q], got[q]->data, mmc_nbytes(got[q]));
                }
            mmc_ctx_free(ctx);
            mmc_tensor *ts[3] = {x, w, b};
            for (int q = 0; q < 3; q++)
                if (ts[q]) mmc_tensor_free(ts[q]->grad), ts[q]->grad = NULL;
        }
    const size_t bytes[4] = {(size_t)ny * 4, (size_t)nx * 4, (size_t)nw * 4, (size_t)c->Cout * 4};
    bool differs = false;   /* Winograd ran (its rounding differs from the GEMM's somewhere) */
    for (int q = 0; q < 4; q++) {
        for (int al = 0; al < 2; al++)
            if (res[al][0][q] && res[al][1][q])
                CHECKF(memcmp(res[al][0][q], res[al][1][q], bytes[q]) == 0,
                       "case %zu %s: output %d differs between 1 and 2 threads", k, algos[al], q);
        if (q < 3 && res[0][0][q] && res[1][0][q]) differs |= memcmp(res[0][0][q], res[1][0][q], bytes[q]) != 0;
    }
    if (c->stride == 1) CHECKF(differs, "case %zu: MMC_CONV_ALGO=winograd gave the GEMM's bits: not taken?", k);
    else CHECKF(!differs, "case %zu: stride 2 must run the GEMM path under either setting", k);
    for (int al = 0; al < 2; al++)
        for (int t = 0; t < 2; t++)
            for (int q = 0; q < 4; q++) free(res[al][t][q]);
    unsetenv("MMC_CONV_ALGO"), unsetenv("MMC_CONV_WINO_TB"), unsetenv("MMC_CONV_WINO_TC");
    free(dy), free(y), free(dx), free(dw), free(db);
    mmc_tensor_free(x), mmc_tensor_free(w), mmc_tensor_free(b);
}

int main(void) {
    const ccase cases[] = {
        {2, 5, 9, 11, 7, 1, 1, true, true, true, NULL, NULL},        /* odd sizes; 3 tiles a row */
        {1, 3, 23, 70, 9, 1, 0, true, true, true, NULL, NULL},       /* pad 0; 17 tiles a row (> 16 lanes) */
        {3, 16, 13, 6, 20, 1, 2, false, true, true, NULL, NULL},     /* pad 2 (dx: pad 0); Cout % 8 != 0 */
        {1, 24, 37, 41, 40, 1, 1, true, true, true, "32", "32"},     /* many blocks and dW chunks */
        {3, 6, 10, 9, 12, 1, 1, true, true, true, "32", "48"},       /* chunks across images */
        {1, 20, 8, 9, 136, 1, 1, true, true, true, NULL, NULL},      /* 1 block: team mode (channel panels) */
        {2, 20, 5, 6, 24, 1, 1, true, true, true, NULL, NULL},       /* team mode over 2 images */
        {2, 3, 3, 5, 4, 1, 1, true, true, true, NULL, NULL},         /* Ho = 3: partial tiles only */
        {2, 8, 12, 12, 8, 1, 1, false, false, true, NULL, NULL},     /* x frozen: no dx */
        {2, 8, 12, 12, 8, 1, 1, true, true, false, NULL, NULL},      /* w frozen: no dW */
        {1, 4, 11, 10, 5, 1, 3, true, true, true, NULL, NULL},       /* pad 3: dx by GEMM, y / dW Winograd */
        {2, 4, 17, 19, 6, 2, 1, true, true, true, NULL, NULL},       /* stride 2: GEMM path */
        {1, 64, 32, 32, 64, 1, 1, true, true, true, NULL, NULL},     /* a VAE-like layer, default blocks */
        {1, 300, 6, 7, 12, 1, 1, true, true, true, NULL, NULL},      /* team mode, Cin > 256: two channel passes */
        {4, 260, 9, 10, 10, 1, 1, true, true, true, NULL, NULL},     /* units, Cin > 256; dx: Cout > 256 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) run_case(k, &cases[k]);
    printf("test_conv: largest error vs the direct sum: GEMM y %.2g dx %.2g dW %.2g; "
           "Winograd F(4x4,3x3) y %.2g dx %.2g dW %.2g\n",
           g_worst[0][0], g_worst[0][1], g_worst[0][2], g_worst[1][0], g_worst[1][1], g_worst[1][2]);
    return test_done("test_conv");
}
