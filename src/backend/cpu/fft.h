/* fft.h — real FFT of any even length (mixed radix, src/backend/cpu/fft.c). A plan is
 * read-only once built, so threads share one; each call takes the caller's work buffer. */
#ifndef MMC_CPU_FFT_H
#define MMC_CPU_FFT_H

#include "mmc.h"

typedef struct mmc_rfft mmc_rfft;

/* n even, 2 <= n <= 1 << 20. */
mmc_status mmc_rfft_plan(int n, mmc_rfft **out);
void mmc_rfft_free(mmc_rfft *p);
int mmc_rfft_work_len(const mmc_rfft *p);   /* doubles of `work` one call needs */
/* x[n] -> X[k] = sum_j x[j] exp(-2 pi i j k / n), k = 0..n/2: re[n/2+1], im[n/2+1]
 * (numpy.fft.rfft). */
void mmc_rfft_exec(const mmc_rfft *p, const double *x, double *re, double *im, double *work);

#endif
