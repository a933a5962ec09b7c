/* linear.h — dense-layer kernels shared by the linear, patch-embed and conv2d ops:
 * y = x · Wᵀ + b and its backward, on raw row-major buffers, W f32 or bf16. */
#ifndef MMC_CPU_LINEAR_H
#define MMC_CPU_LINEAR_H
#include <stdbool.h>
#include <stdint.h>

/* x [M, K], w [N, K] (bf16 when w_bf16), b [N] (f32, bf16 when b_bf16, or NULL) -> y [M, N].
 * infer: no gradient will flow (grad mode off), so bf16 weights may take the opt-in
 * AVX512_BF16 kernel (mmc_gemm_bf16_infer); training forwards pass false (exact path). */
void mmc_cpu_linear_fwd(const float *x, const void *w, bool w_bf16, const void *b, bool b_bf16,
                        float *y, int64_t M, int64_t N, int64_t K, bool infer);
/* The same forward on a pre-packed weight (gemm.h's mmc_gemm_pack_b, [N, K]): x [M, K] -> y [M, N]. */
struct mmc_gemm_packed_b;
void mmc_cpu_linear_fwd_packed(const float *x, const struct mmc_gemm_packed_b *w, const void *b, bool b_bf16,
                               float *y, int64_t M);
/* Accumulating backward; each of dx [M, K], dw [N, K], db [N] may be NULL (not wanted). */
void mmc_cpu_linear_bwd(const float *x, const void *w, bool w_bf16, const float *dy, float *dx,
                        float *dw, float *db, int64_t M, int64_t N, int64_t K);
/* db[n] += sum_m dy[m, n]: columns split over threads, each summed in row order, so the
 * result is the same for any thread count. */
void mmc_cpu_colsum_acc(const float *dy, float *db, int64_t M, int64_t N);
#endif
