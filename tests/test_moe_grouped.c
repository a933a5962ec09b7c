/* test_moe_grouped.c — the grouped expert op (src/nn/moe_experts.c over
 * src/backend/cpu/gemm_grouped.c) against the per-expert loop of mmc_linear / mmc_swiglu it
 * replaces, output and every gradient (x and each expert's three weights), on 2 threads:
 *  - 8 experts of 96 x 64 with uneven row blocks (one expert empty, one of a single row, the
 *    largest 150 rows): big enough that the driver splits the work over the threads in panels;
 *  - a small case (under the driver's threshold: the plain loop on one thread);
 *  - bf16 weights (their gradients f32), as a bf16 training run holds them.
 * Tolerance: 1e-5 relative to each tensor's largest entry (the same GEMMs; only the summation
 * of dx over gate and up and the panel split may differ in rounding). Also the raw driver
 * against mmc_gemm_f32 per group for the three transposes training uses. */
#include "test_util.h"
#include "gemm.h"
#include "gemm_grouped.h"
#include "mmc_nn.h"
#include "mmc_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double rel_diff(const float *a, const float *b, int64_t n) {
    double mx = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
        if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
    }
    return mx > 0 ? d / mx : d;
}

static void run_case(const char *name, int64_t E, const int64_t *counts, int64_t C, int64_t I, bool bf16) {
    mmc_rng r;
    mmc_rng_init(&r, 7);
    int64_t M = 0;
    for (int64_t e = 0; e < E; e++) M += counts[e];
    mmc_linear_w *lw = calloc((size_t)(3 * E), sizeof *lw);
    for (int64_t e = 0; e < 3 * E; e++) {
        const bool down = e >= 2 * E;
        mmc_tensor *w = mmc_tensor_new(MMC_F32, 2, down ? MMC_SHAPE(C, I) : MMC_SHAPE(I, C));
        mmc_rng_normal(&r, w->data, mmc_numel(w), 0, 0.05f);
        if (bf16) {
            mmc_tensor *h = mmc_tensor_new(MMC_BF16, 2, w->shape);
            mmc_convert(h->data, MMC_BF16, w->data, MMC_F32, mmc_numel(w));
            mmc_tensor_free(w);
            w = h;
        }
        w->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        lw[e].w = w;
        lw[e].out_features = w->shape[0], lw[e].in_features = w->shape[1];
    }
    mmc_linear_w *g = lw, *u = lw + E, *d = lw + 2 * E;
    mmc_tensor *x = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(M, C)), *dy = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(M, C));
    mmc_rng_normal(&r, x->data, mmc_numel(x), 0, 1);
    mmc_rng_normal(&r, dy->data, mmc_numel(dy), 0, 1);
    x->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    CHECK(mmc_moe_experts_grouped_ok(g, u, d, E));
    float *out[2], *grads[2][1 + 3 * 64];
    for (int pass = 0; pass < 2; pass++) {   /* 0: grouped, 1: the loop */
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *y;
        if (!pass) {
            y = mmc_moe_experts_swiglu(ctx, x, counts, E, g, u, d);
        } else {
            mmc_tensor *ys[64];
            int n = 0;
            int64_t off = 0;
            for (int64_t e = 0; e < E; e++) {
                if (!counts[e]) continue;
                mmc_tensor *seg = mmc_contiguous(ctx, mmc_narrow(ctx, x, 0, off, counts[e]));
                ys[n++] = mmc_nn_linear(ctx, mmc_swiglu(ctx, mmc_nn_linear(ctx, seg, &g[e]), mmc_nn_linear(ctx, seg, &u[e])), &d[e]);
                off += counts[e];
            }
            y = n == 1 ? ys[0] : mmc_concat(ctx, ys, n, 0);
        }
        out[pass] = malloc(mmc_nbytes(y));
        memcpy(out[pass], y->data, mmc_nbytes(y));
        memcpy(mmc_grad(ctx, y)->data, dy->data, mmc_nbytes(dy));
        mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
        grads[pass][0] = malloc(mmc_nbytes(x->grad));
        memcpy(grads[pass][0], x->grad->data, mmc_nbytes(x->grad));
        memset(x->grad->data, 0, mmc_nbytes(x->grad));
        for (int64_t e = 0; e < 3 * E; e++) {
            mmc_tensor *gw = lw[e].w->grad;
            const size_t bytes = (size_t)mmc_numel(lw[e].w) * sizeof(float);
            grads[pass][1 + e] = calloc(1, bytes);
            if (gw) { memcpy(grads[pass][1 + e], gw->data, bytes); memset(gw->data, 0, bytes); }
        }
        mmc_ctx_free(ctx);
    }
    double wy = rel_diff(out[0], out[1], M * C), wx = rel_diff(grads[0][0], grads[1][0], M * C), ww = 0;
    for (int64_t e = 0; e < 3 * E; e++) {
        double v = rel_diff(grads[0][1 + e], grads[1][1 + e], mmc_numel(lw[e].w));
        if (v > ww) ww = v;
    }
    printf("%-22s rows %4lld: y %.2e, dx %.2e, dW %.2e (relative to the largest entry)\n", name, (long long)M, wy, wx, ww);
    CHECKF(wy <= 1e-5 && wx <= 1e-5 && ww <= 1e-5, "%s: grouped vs loop y %.3g dx %.3g dW %.3g", name, wy, wx, ww);
    /* an expert no row reached gets a zero gradient, not garbage */
    for (int64_t e = 0; e < E; e++)
        if (!counts[e]) {
            double s = 0;
            for (int64_t i = 0; i < mmc_numel(g[e].w); i++) s += fabs(grads[0][1 + e][i]);
            CHECKF(s == 0, "%s: empty expert %lld got a gradient", name, (long long)e);
        }
    for (int pass = 0; pass < 2; pass++) {
        free(out[pass]);
        for (int64_t e = 0; e < 1 + 3 * E; e++) free(grads[pass][e]);
    }
    for (int64_t e = 0; e < 3 * E; e++) mmc_tensor_free(lw[e].w);
    free(lw);
    mmc_tensor_free(x);
    mmc_tensor_free(dy);
}

static void driver_case(bool ta, bool tb) {
    mmc_rng r;
    mmc_rng_init(&r, 11);
    enum { G = 5 };
    const int64_t Ms[G] = {37, 0, 130, 1, 64}, N = 200, K = 96;
    mmc_gemm_group gr[G];
    float *A[G], *B[G], *C1[G], *C2[G];
    for (int i = 0; i < G; i++) {
        A[i] = malloc(sizeof(float) * (size_t)(Ms[i] * K + 1));
        B[i] = malloc(sizeof(float) * (size_t)(N * K));
        C1[i] = malloc(sizeof(float) * (size_t)(Ms[i] * N + 1));
        C2[i] = malloc(sizeof(float) * (size_t)(Ms[i] * N + 1));
        mmc_rng_normal(&r, A[i], Ms[i] * K, 0, 1);
        mmc_rng_normal(&r, B[i], N * K, 0, 1);
        mmc_rng_normal(&r, C1[i], Ms[i] * N, 0, 1);
        memcpy(C2[i], C1[i], sizeof(float) * (size_t)(Ms[i] * N));
        gr[i] = (mmc_gemm_group){Ms[i], N, K, A[i], ta ? Ms[i] : K, B[i], tb ? K : N, C1[i], N};
    }
    mmc_gemm_grouped(ta, tb, 0.5f, 1.0f, false, gr, G);
    double worst = 0;
    for (int i = 0; i < G; i++) {
        if (Ms[i]) mmc_gemm_f32(ta, tb, Ms[i], N, K, 0.5f, A[i], ta ? Ms[i] : K, B[i], tb ? K : N, 1.0f, C2[i], N);
        double v = rel_diff(C1[i], C2[i], Ms[i] * N);
        if (v > worst) worst = v;
        free(A[i]); free(B[i]); free(C1[i]); free(C2[i]);
    }
    CHECKF(worst <= 1e-6, "grouped driver (trans_a %d, trans_b %d) differs from mmc_gemm_f32 by %.3g", ta, tb, worst);
}

int main(void) {
    driver_case(false, true);
    driver_case(false, false);
    driver_case(true, false);
    const int64_t big[8] = {40, 0, 150, 1, 77, 64, 33, 90}, small[3] = {3, 0, 5};
    run_case("8 experts f32", 8, big, 64, 96, false);
    run_case("3 experts f32 (small)", 3, small, 16, 24, false);
    run_case("8 experts bf16", 8, big, 64, 96, true);
    return test_done("test_moe_grouped");
}
