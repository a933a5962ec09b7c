/* matvec.h — the batched decode's linears: y = x · Wᵀ (+ y) for a few rows of x (one per running
 * sequence, up to MMC_MV_ROWS_MAX), reading W [N, K] (f32 or bf16, as stored) once for all of them.
 *
 * Every output is summed exactly as the GEMM's matvec path (gemm.c, M <= 4 on the AVX-512 kernel)
 * sums it for that row alone — the same 16-lane accumulator, the same k order, the same reduction —
 * so a row decoded in a batch is bit for bit the row decoded alone (the serving engine's invariant,
 * test_kv_paged). Only the loop order differs: a few rows of W at a time, each multiplied by every row
 * of x while it sits in L1/L2, instead of one pass over all of W per group of 4 rows of x. */
#ifndef MMC_CPU_MATVEC_H
#define MMC_CPU_MATVEC_H

#include <stdbool.h>
#include <stdint.h>

#define MMC_MV_ROWS_MAX 64

/* Whether mmc_matvec_rows runs here: the GEMM's kernel is AVX-512 (the path whose sums it repeats). */
bool mmc_matvec_rows_ok(void);
/* x [M, K] contiguous (1 <= M <= MMC_MV_ROWS_MAX), w [N, K] contiguous (bf16 when w_bf16), y [M, N]:
 * y = x · wᵀ when beta is 0, y = x · wᵀ + y when beta is 1 (a bias written there first). */
void mmc_matvec_rows(int64_t M, int64_t N, int64_t K, const float *x, const void *w, bool w_bf16, float beta,
                     float *y);

#endif
