/* fft.c — real FFT of even length n, numpy.fft.rfft's output (the unnormalised forward DFT,
 * bins 0..n/2), for the STFT of the Whisper feature extractor (n = 400 = 2^4 * 5^2).
 *
 * The n real samples are read as m = n/2 complex ones (z[j] = x[2j] + i x[2j+1]); a complex
 * FFT of length m runs as a recursive decimation in time over m's factors (radix 4 and 2
 * written out, any other factor — 5 for Whisper — as a small DFT with table roots), and one
 * pass splits the result into the even/odd halves' spectra and combines them into bins
 * 0..n/2. All in double with twiddles from cos/sin of the exact angle, so the rounding error
 * stays near 1e-15 relative to the frame's energy (numpy's pocketfft is also double).
 * Measured against a plain O(n^2) DFT (bench_audio: "fft400"): see the README.
 */
#include "fft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FACTORS 40

typedef struct { double r, i; } cpx;

struct mmc_rfft {
    int n, m;              /* real length, complex length n/2 */
    int nfac, fac[MAX_FACTORS];
    int max_radix;
    cpx *tw;               /* [m] exp(-2 pi i j / m) */
    cpx *split;            /* [m + 1] exp(-2 pi i k / n) */
};

static inline cpx cmul(cpx a, cpx b) { return (cpx){a.r * b.r - a.i * b.i, a.r * b.i + a.i * b.r}; }

mmc_status mmc_rfft_plan(int n, mmc_rfft **out) {
    *out = NULL;
    if (n < 2 || n % 2 || n > (1 << 20)) return mmc_error(MMC_ERR_INVALID, "fft: length %d must be even, 2 to 2^20", n);
    mmc_rfft *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "fft: out of memory");
    p->n = n;
    p->m = n / 2;
    int r = p->m;
    while (r % 4 == 0) { p->fac[p->nfac++] = 4; r /= 4; }
    while (r % 2 == 0) { p->fac[p->nfac++] = 2; r /= 2; }
    for (int f = 3; r > 1;) {
        if (r % f == 0) { p->fac[p->nfac++] = f; r /= f; }
        else f += 2;
    }
    p->max_radix = 1;
    for (int k = 0; k < p->nfac; k++)
        if (p->fac[k] > p->max_radix) p->max_radix = p->fac[k];
    p->tw = malloc(sizeof(cpx) * (size_t)p->m);
    p->split = malloc(sizeof(cpx) * (size_t)(p->m + 1));
    if (!p->tw || !p->split) { mmc_rfft_free(p); return mmc_error(MMC_ERR_OOM, "fft: out of memory"); }
    for (int j = 0; j < p->m; j++) {
        double a = -2.0 * M_PI * j / p->m;
        p->tw[j] = (cpx){cos(a), sin(a)};
    }
    for (int k = 0; k <= p->m; k++) {
        double a = -2.0 * M_PI * k / n;
        p->split[k] = (cpx){cos(a), sin(a)};
    }
    *out = p;
    return MMC_OK;
}

void mmc_rfft_free(mmc_rfft *p) {
    if (!p) return;
    free(p->tw);
    free(p->split);
    free(p);
}

/* complex scratch: m outputs + m inputs + one radix's temporaries */
int mmc_rfft_work_len(const mmc_rfft *p) { return 2 * (2 * p->m + 2 * p->max_radix); }

/* out[0..len) = DFT of in[0], in[stride], ... (len = m / (stride product so far)). tw step
 * for this level: m / len. */
static void fft_rec(const mmc_rfft *p, cpx *out, const cpx *in, int len, int stride, const int *fac, cpx *tmp) {
    if (len == 1) { out[0] = in[0]; return; }
    int r = fac[0], sub = len / r, step = p->m / len;
    for (int q = 0; q < r; q++) fft_rec(p, out + q * sub, in + q * stride, sub, stride * r, fac + 1, tmp);
    const cpx *tw = p->tw;
    if (r == 2) {
        for (int k = 0; k < sub; k++) {
            cpx a = out[k], b = cmul(out[sub + k], tw[k * step]);
            out[k] = (cpx){a.r + b.r, a.i + b.i};
            out[sub + k] = (cpx){a.r - b.r, a.i - b.i};
        }
    } else if (r == 4) {
        for (int k = 0; k < sub; k++) {
            cpx a0 = out[k], a1 = cmul(out[sub + k], tw[k * step]), a2 = cmul(out[2 * sub + k], tw[2 * k * step]),
                a3 = cmul(out[3 * sub + k], tw[3 * k * step]);
            cpx s02 = {a0.r + a2.r, a0.i + a2.i}, d02 = {a0.r - a2.r, a0.i - a2.i};
            cpx s13 = {a1.r + a3.r, a1.i + a3.i}, d13 = {a1.r - a3.r, a1.i - a3.i};
            out[k] = (cpx){s02.r + s13.r, s02.i + s13.i};
            out[2 * sub + k] = (cpx){s02.r - s13.r, s02.i - s13.i};
            /* -i * d13 and +i * d13 (forward transform) */
            out[sub + k] = (cpx){d02.r + d13.i, d02.i - d13.r};
            out[3 * sub + k] = (cpx){d02.r - d13.i, d02.i + d13.r};
        }
    } else {
        int rstep = p->m / r;   /* exp(-2 pi i / r) = tw[rstep] */
        for (int k = 0; k < sub; k++) {
            for (int q = 0; q < r; q++) tmp[q] = q ? cmul(out[q * sub + k], tw[(int)(((int64_t)q * k * step) % p->m)]) : out[k];
            for (int s = 0; s < r; s++) {
                cpx acc = tmp[0];
                for (int q = 1; q < r; q++) {
                    cpx w = tw[((q * s) % r) * rstep];
                    acc.r += tmp[q].r * w.r - tmp[q].i * w.i;
                    acc.i += tmp[q].r * w.i + tmp[q].i * w.r;
                }
                out[s * sub + k] = acc;
            }
        }
    }
}

void mmc_rfft_exec(const mmc_rfft *p, const double *x, double *re, double *im, double *work) {
    int m = p->m;
    cpx *z = (cpx *)work, *Z = z + m, *tmp = Z + m;
    memcpy(z, x, sizeof(double) * (size_t)p->n);   /* z[j] = x[2j] + i x[2j+1] */
    fft_rec(p, Z, z, m, 1, p->fac, tmp);
    for (int k = 0; k <= m; k++) {
        cpx a = Z[k % m], b = Z[(m - k) % m];
        /* E = (a + conj b) / 2, O = (a - conj b) / (2i) */
        double er = 0.5 * (a.r + b.r), ei = 0.5 * (a.i - b.i);
        double or_ = 0.5 * (a.i + b.i), oi = -0.5 * (a.r - b.r);
        cpx w = p->split[k];
        re[k] = er + (or_ * w.r - oi * w.i);
        im[k] = ei + (or_ * w.i + oi * w.r);
    }
}
