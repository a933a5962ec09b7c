/* gemm_ref.c — the plain triple-loop GEMM: slow, obviously correct, the oracle that the
 * packed kernels in gemm.c are tested against. Accumulates in double. */
#include "gemm.h"
#include "mmc.h"

static inline float ld_a(bool t, const float *A, int64_t lda, int64_t m, int64_t k) {
    return t ? A[k * lda + m] : A[m * lda + k];
}

void mmc_gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)ld_a(ta, A, lda, m, k) * (tb ? B[n * ldb + k] : B[k * ldb + n]);
            float prev = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
            C[m * ldc + n] = (float)(alpha * acc) + prev;
        }
}

void mmc_gemm_ref_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)ld_a(ta, A, lda, m, k) *
                       mmc_bf16_to_f32(tb ? B[n * ldb + k] : B[k * ldb + n]);
            float prev = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
            C[m * ldc + n] = (float)(alpha * acc) + prev;
        }
}
