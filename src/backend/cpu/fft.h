/* fft.h — real FFT of any even length (mixed radix, src/backend/cpu/fft.c). A plan is
 * read-only once built, so threads share one; each call takes the caller's work buffer. */
#ifndef MMC_CPU_FFT_H
#define MMC_CPU_FFT_H

#include "mmc.h"

typedef struct mmc_rfft mmc_rfft;

/* MMC_FFT_LANES transforms at once, one per lane of a vector (GCC vector extension). */
#define MMC_FFT_LANES 8
typedef double mmc_fftv __attribute__((vector_size(8 * MMC_FFT_LANES), aligned(8 * MMC_FFT_LANES)));

/* n even, 2 <= n <= 1 << 20. */
mmc_status mmc_rfft_plan(int n, mmc_rfft **out);
void mmc_rfft_free(mmc_rfft *p);
int mmc_rfft_work_lanes(const mmc_rfft *p);   /* vectors of `work` mmc_rfft_exec_lanes needs */
/* x[n] -> X[k] = sum_j x[j] exp(-2 pi i j k / n), k = 0..n/2: re[n/2+1], im[n/2+1]
 * (numpy.fft.rfft). One transform (allocates its scratch: for tests, not hot loops). */
mmc_status mmc_rfft_exec(const mmc_rfft *p, const double *x, double *re, double *im);
/* The same for MMC_FFT_LANES inputs: lane l of x[j] is sample j of input l; re/im[n/2+1].
 * All arrays aligned to sizeof(mmc_fftv) (aligned_alloc). */
void mmc_rfft_exec_lanes(const mmc_rfft *p, const mmc_fftv *x, mmc_fftv *re, mmc_fftv *im, mmc_fftv *work);
/* log10 of each lane, for positive normal finite x (the log-mel clamps at 1e-10 first): within
 * 4e-16 relative of libm's log10, so rounded to float it almost always equals (float)log10(x). */
mmc_fftv mmc_log10_lanes(mmc_fftv x);

#endif
