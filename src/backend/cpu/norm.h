/* norm.h — fused CPU kernels for RMSNorm, LayerNorm and GroupNorm (forward saving the
 * per-row statistics, backward producing dx, dw, db in one pass over the rows).
 *
 * Conventions: x, dy [R, C] (rows outermost) contiguous f32; w, b [C] f32 or NULL.
 * Backward kernels ACCUMULATE (+=) into dx, dw, db; any of them may be NULL (not wanted).
 * dw/db are reduced deterministically: rows are cut into a fixed number of blocks that
 * depends only on R (not on the thread count), each block writes its own partial sums into
 * `partial` (mmc_cpu_norm_partial_floats() floats), and partials are added in block order,
 * so results are bitwise identical for any OMP_NUM_THREADS. */
#ifndef MMC_CPU_NORM_H
#define MMC_CPU_NORM_H
#include <stdint.h>
#include <stddef.h>

/* floats of scratch the rms/layernorm backward needs for dw and db partials */
size_t mmc_cpu_norm_partial_floats(int64_t R, int64_t C);

/* y = x * rsqrt(mean(x^2) + eps) * w; rstd [R] saved for backward. */
void mmc_cpu_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, int64_t R,
                         int64_t C, float eps);
void mmc_cpu_rmsnorm_bwd(const float *x, const float *w, const float *rstd, const float *dy,
                         float *dx, float *dw, float *partial, int64_t R, int64_t C);

/* y = (x - mean) * rstd * w + b (biased variance); mean, rstd [R] saved. */
void mmc_cpu_layernorm_fwd(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t R, int64_t C, float eps);
void mmc_cpu_layernorm_bwd(const float *x, const float *w, const float *mean, const float *rstd,
                           const float *dy, float *dx, float *dw, float *db, float *partial,
                           int64_t R, int64_t C);

/* x [N, C, S] (S = product of spatial dims), G groups of C/G channels;
 * mean, rstd [N, G]. Backward scratch `partial`: 2 * N * C floats. */
void mmc_cpu_groupnorm_fwd(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t N, int64_t C, int64_t S, int64_t G, float eps);
/* The statistics of mmc_cpu_groupnorm_fwd alone, as the per-channel affine it applies:
 * y[n, c, s] = x[n, c, s] * a[n, c] + sh[n, c] (the same arithmetic, value for value); a, sh [N, C]. */
void mmc_cpu_groupnorm_affine(const float *x, const float *w, const float *b, float *a, float *sh, int64_t N,
                              int64_t C, int64_t S, int64_t G, float eps);
void mmc_cpu_groupnorm_bwd(const float *x, const float *w, const float *mean, const float *rstd,
                           const float *dy, float *dx, float *dw, float *db, float *partial,
                           int64_t N, int64_t C, int64_t S, int64_t G);
#endif
