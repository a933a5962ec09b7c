/* linear.c — y = x · Wᵀ + b and its backward on top of the GEMM (gemm.h), as
 * torch.nn.functional.linear computes it. The three GEMM layouts are the ones gemm.h lists;
 * the bias is folded in by pre-filling y with b and running the GEMM with beta = 1, so the
 * output is written once. */
#include "linear.h"
#include "gemm.h"
#include "mmc.h"

#define PAR_MIN 32768

static void fill_bias(const void *b, bool b_bf16, float *y, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N > PAR_MIN)
    for (int64_t m = 0; m < M; m++) {
        float *yr = y + m * N;
        if (b_bf16) {
            const uint16_t *bb = b;
            for (int64_t n = 0; n < N; n++) yr[n] = mmc_bf16_to_f32(bb[n]);
        } else {
            const float *bf = b;
            for (int64_t n = 0; n < N; n++) yr[n] = bf[n];
        }
    }
}

void mmc_cpu_linear_fwd_packed(const float *x, const mmc_gemm_packed_b *w, const void *b, bool b_bf16,
                               float *y, int64_t M) {
    const int64_t N = mmc_gemm_packed_b_rows(w), K = mmc_gemm_packed_b_cols(w);
    if (b) fill_bias(b, b_bf16, y, M, N);
    mmc_gemm_xwt_packed(M, 1.0f, x, K, w, b ? 1.0f : 0.0f, y, N);
}

void mmc_cpu_linear_fwd(const float *x, const void *w, bool w_bf16, const void *b, bool b_bf16,
                        float *y, int64_t M, int64_t N, int64_t K, bool infer) {
    if (b) fill_bias(b, b_bf16, y, M, N);
    float beta = b ? 1.0f : 0.0f;
    if (w_bf16 && infer) mmc_gemm_bf16_infer(false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N);
    else if (w_bf16) mmc_gemm_bf16(false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N);
    else mmc_gemm_f32(false, true, M, N, K, 1.0f, x, K, w, K, beta, y, N);
}

void mmc_cpu_colsum_acc(const float *dy, float *db, int64_t M, int64_t N) {
#pragma omp parallel for schedule(static) if (M * N > PAR_MIN)
    for (int64_t n0 = 0; n0 < N; n0 += 256) {
        int64_t n1 = n0 + 256 < N ? n0 + 256 : N;
        float acc[256] = {0};
        for (int64_t m = 0; m < M; m++) {
            const float *r = dy + m * N;
#pragma omp simd
            for (int64_t n = n0; n < n1; n++) acc[n - n0] += r[n];
        }
        for (int64_t n = n0; n < n1; n++) db[n] += acc[n - n0];
    }
}

void mmc_cpu_linear_bwd(const float *x, const void *w, bool w_bf16, const float *dy, float *dx,
                        float *dw, float *db, int64_t M, int64_t N, int64_t K) {
    /* dx [M, K] += dy [M, N] · W [N, K] */
    if (dx) {
        if (w_bf16) mmc_gemm_bf16(false, false, M, K, N, 1.0f, dy, N, w, K, 1.0f, dx, K);
        else mmc_gemm_f32(false, false, M, K, N, 1.0f, dy, N, w, K, 1.0f, dx, K);
    }
    /* dW [N, K] += dyᵀ [N, M] · x [M, K] */
    if (dw) mmc_gemm_f32(true, false, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
    if (db) mmc_cpu_colsum_acc(dy, db, M, N);
}
