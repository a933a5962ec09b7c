/* qmatvec.h — decode-time products with quantised weights, read directly (no f32 copy of W):
 *
 *   y[m, n] = sum_k x[m, k] · dequant(W)[n, k]      for M <= MMC_QMV_MAX_M rows of x
 *
 * int8: W [N, K] int8 with one f32 scale per output row (dequant = q · scale[n]);
 * NF4:  bitsandbytes' layout (mmc_quant.h: blocks of 64 along the flattened matrix, 4-bit
 *       codes, high nibble first, one absmax per block, optionally double-quantised); the
 *       direct kernel needs K % 64 == 0 so that blocks never straddle rows.
 * The kernel follows the GEMM's choice (mmc_gemm_kernel_name / mmc_gemm_set_kernel): AVX-512,
 * AVX2 or generic C, so tests force each path the same way as for the GEMM. Threads (OpenMP)
 * split N in row units; each y[m, n] is computed by one thread with a fixed k order, so the
 * result does not depend on the thread count. */
#ifndef MMC_CPU_QMATVEC_H
#define MMC_CPU_QMATVEC_H

#include <stdbool.h>
#include <stdint.h>

#define MMC_QMV_MAX_M 4

struct mmc_nf4;

/* x [M, K] contiguous, q [N, K], scale [N], y [M, N] (written, not accumulated). */
void mmc_qmv_int8(int64_t M, int64_t N, int64_t K, const float *x, const int8_t *q, const float *scale,
                  float *y);
/* x [M, K] contiguous, y [M, N]; q->cols % 64 == 0 (mmc_qmv_nf4_ok). */
void mmc_qmv_nf4(int64_t M, const float *x, const struct mmc_nf4 *q, float *y);
bool mmc_qmv_nf4_ok(const struct mmc_nf4 *q);
/* The AVX-512 NF4 kernel: NULL / "default" the byte-offset one, "lut" the previous one (vpmovzxbd
 * widening; kept to measure against: bench_qmatvec, or MMC_QMV_NF4=lut for a whole run); -1 for
 * another name. Not thread-safe. */
int mmc_qmv_set_nf4_kernel(const char *name);
/* The path the next call runs: "avx512", "avx2" or "generic". */
const char *mmc_qmv_kernel_name(void);

#endif
