/* gemm.c — placeholder dispatch to the reference GEMM until the packed AVX-512/AVX2
 * kernels land (see gemm.h). */
#include "gemm.h"

void mmc_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc) {
    mmc_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void mmc_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                   float *C, int64_t ldc) {
    mmc_gemm_ref_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
const char *mmc_gemm_kernel_name(void) { return "reference"; }
