/* fft.c — real FFT of even length n, numpy.fft.rfft's output (the unnormalised forward DFT,
 * bins 0..n/2), for the STFT of the Whisper feature extractor (n = 400 = 2^4 * 5^2).
 *
 * The n real samples are read as m = n/2 complex ones (z[j] = x[2j] + i x[2j+1], the input
 * array itself seen as complex: no copy); a complex FFT of length m runs as a recursive
 * decimation in time over m's factors (radix 2, 3, 4 and 5 written out, any other prime as a
 * small DFT with table roots), and one pass splits the result into the even/odd halves'
 * spectra and combines them into bins 0..n/2. MMC_FFT_LANES transforms run side by side in
 * one vector (GCC vector extensions: the STFT's frames are independent, so each arithmetic
 * instruction serves 8 frames on AVX-512).
 * All in double with twiddles from cos/sin of the exact angle, so the rounding error
 * stays near 1e-15 relative to the frame's energy (numpy's pocketfft is also double).
 * Measured against a plain O(n^2) DFT (bench_audio: "fft400"): see the README.
 */
#include "fft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FACTORS 40
#define MAX_RADIX 1024   /* a larger prime factor of n/2 is refused: the plan would be O(n^2) */

typedef struct { double r, i; } cpx;        /* a twiddle */
typedef mmc_fftv V;                          /* one value of MMC_FFT_LANES independent transforms */
typedef struct { V r, i; } vcpx;
_Static_assert(sizeof(vcpx) == 2 * sizeof(V), "vcpx must be two packed vectors (the input is read as vcpx)");

struct mmc_rfft {
    int n, m;              /* real length, complex length n/2 */
    int nfac, fac[MAX_FACTORS];
    int max_radix;
    cpx *tw;               /* [m] exp(-2 pi i j / m) */
    cpx *split;            /* [m + 1] exp(-2 pi i k / n) */
};

static inline vcpx cmul(vcpx a, cpx b) { return (vcpx){a.r * b.r - a.i * b.i, a.r * b.i + a.i * b.r}; }

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
    if (p->max_radix > MAX_RADIX) {
        int f = p->max_radix;
        mmc_rfft_free(p);
        return mmc_error(MMC_ERR_UNSUPPORTED, "fft: length %d has the prime factor %d (at most %d supported); use a "
                         "length with small factors", n, f, MAX_RADIX);
    }
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

/* vectors of scratch for mmc_rfft_exec_lanes: the m complex outputs (the inputs are read in place) */
int mmc_rfft_work_lanes(const mmc_rfft *p) { return 2 * p->m; }

/* In place: a[0..r) <- its r-point DFT (forward). Radix 2, 3, 4, 5 written out; any other
 * factor (a prime above 5) from the root table. */
static inline __attribute__((always_inline)) void butterfly(const mmc_rfft *p, int r, vcpx *a) {
    switch (r) {
    case 2: {
        vcpx x = a[0], y = a[1];
        a[0] = (vcpx){x.r + y.r, x.i + y.i};
        a[1] = (vcpx){x.r - y.r, x.i - y.i};
        return;
    }
    case 3: {
        const double c = -0.5, s = 0.86602540378443864676;   /* cos, sin of 2 pi / 3 */
        vcpx t = {a[1].r + a[2].r, a[1].i + a[2].i}, d = {a[1].r - a[2].r, a[1].i - a[2].i};
        vcpx b = {a[0].r + c * t.r, a[0].i + c * t.i};
        a[0] = (vcpx){a[0].r + t.r, a[0].i + t.i};
        a[1] = (vcpx){b.r + s * d.i, b.i - s * d.r};
        a[2] = (vcpx){b.r - s * d.i, b.i + s * d.r};
        return;
    }
    case 4: {
        vcpx s02 = {a[0].r + a[2].r, a[0].i + a[2].i}, d02 = {a[0].r - a[2].r, a[0].i - a[2].i};
        vcpx s13 = {a[1].r + a[3].r, a[1].i + a[3].i}, d13 = {a[1].r - a[3].r, a[1].i - a[3].i};
        a[0] = (vcpx){s02.r + s13.r, s02.i + s13.i};
        a[2] = (vcpx){s02.r - s13.r, s02.i - s13.i};
        a[1] = (vcpx){d02.r + d13.i, d02.i - d13.r};   /* d02 - i d13 */
        a[3] = (vcpx){d02.r - d13.i, d02.i + d13.r};   /* d02 + i d13 */
        return;
    }
    case 5: {
        const double c1 = 0.30901699437494742410, c2 = -0.80901699437494742410;   /* cos 2pi/5, cos 4pi/5 */
        const double s1 = 0.95105651629515357212, s2 = 0.58778525229247312917;    /* sin 2pi/5, sin 4pi/5 */
        vcpx t1 = {a[1].r + a[4].r, a[1].i + a[4].i}, t2 = {a[2].r + a[3].r, a[2].i + a[3].i};
        vcpx t3 = {a[1].r - a[4].r, a[1].i - a[4].i}, t4 = {a[2].r - a[3].r, a[2].i - a[3].i};
        vcpx b1 = {a[0].r + c1 * t1.r + c2 * t2.r, a[0].i + c1 * t1.i + c2 * t2.i};
        vcpx b2 = {a[0].r + c2 * t1.r + c1 * t2.r, a[0].i + c2 * t1.i + c1 * t2.i};
        vcpx u = {s1 * t3.r + s2 * t4.r, s1 * t3.i + s2 * t4.i}, v = {s2 * t3.r - s1 * t4.r, s2 * t3.i - s1 * t4.i};
        a[0] = (vcpx){a[0].r + t1.r + t2.r, a[0].i + t1.i + t2.i};
        a[1] = (vcpx){b1.r + u.i, b1.i - u.r};   /* b1 - i u */
        a[4] = (vcpx){b1.r - u.i, b1.i + u.r};
        a[2] = (vcpx){b2.r + v.i, b2.i - v.r};
        a[3] = (vcpx){b2.r - v.i, b2.i + v.r};
        return;
    }
    default: {
        vcpx t[r];
        int rstep = p->m / r;   /* exp(-2 pi i / r) = tw[rstep] */
        for (int s = 0; s < r; s++) {
            vcpx acc = a[0];
            for (int q = 1, e = s; q < r; q++, e = e + s >= r ? e + s - r : e + s) {
                cpx w = p->tw[e * rstep];
                acc.r += a[q].r * w.r - a[q].i * w.i;
                acc.i += a[q].r * w.i + a[q].i * w.r;
            }
            t[s] = acc;
        }
        for (int s = 0; s < r; s++) a[s] = t[s];
    }
    }
}

/* out[0..len) = DFT of in[0], in[stride], ... in[(len-1) stride] (decimation in time over
 * fac[]). The last factor is a leaf: its DFT is taken straight from the strided input. Each
 * radix gets its own loop with a fixed-size temporary, so the butterfly is inlined with its
 * constants and the copies stay in registers (no memcpy calls, no 128 KB stack arrays). */
#define LEAF(R) do { vcpx a[R]; for (int q = 0; q < (R); q++) a[q] = in[q * stride]; \
                     butterfly(p, (R), a); for (int q = 0; q < (R); q++) out[q] = a[q]; } while (0)
#define LEVEL(R) do { for (int k = 0; k < sub; k++) { vcpx a[R]; \
        a[0] = out[k]; \
        for (int q = 1; q < (R); q++) a[q] = cmul(out[q * sub + k], tw[q * k * step]);   /* q k < len: no wrap */ \
        butterfly(p, (R), a); \
        for (int q = 0; q < (R); q++) out[q * sub + k] = a[q]; } } while (0)

/* (GCC would turn the copies out of a[] into memcpy calls: 9 % of the log-mel's time) */
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void fft_rec(const mmc_rfft *p, vcpx *out, const vcpx *in, int len, int stride, const int *fac) {
    int r = fac[0], sub = len / r, step = p->m / len;
    if (sub == 1) {
        switch (r) {
        case 2: LEAF(2); break;
        case 3: LEAF(3); break;
        case 4: LEAF(4); break;
        case 5: LEAF(5); break;
        default: LEAF(r);
        }
        return;
    }
    for (int q = 0; q < r; q++) fft_rec(p, out + q * sub, in + q * stride, sub, stride * r, fac + 1);
    const cpx *tw = p->tw;
    switch (r) {
    case 2: LEVEL(2); break;
    case 3: LEVEL(3); break;
    case 4: LEVEL(4); break;
    case 5: LEVEL(5); break;
    default: LEVEL(r);
    }
}

/* x[n]: lane l of x[j] is sample j of transform l. */
void mmc_rfft_exec_lanes(const mmc_rfft *p, const mmc_fftv *x, mmc_fftv *re, mmc_fftv *im, mmc_fftv *work) {
    int m = p->m;
    vcpx *Z = (vcpx *)work;
    const vcpx *z = (const vcpx *)x;   /* z[j] = x[2j] + i x[2j+1]: vcpx is {x[2j], x[2j+1]} in memory */
    if (m == 1) Z[0] = z[0];
    else fft_rec(p, Z, z, m, 1, p->fac);
    for (int k = 0; k <= m; k++) {
        vcpx a = Z[k < m ? k : 0], b = Z[k ? m - k : 0];
        /* E = (a + conj b) / 2, O = (a - conj b) / (2i) */
        V er = 0.5 * (a.r + b.r), ei = 0.5 * (a.i - b.i);
        V or_ = 0.5 * (a.i + b.i), oi = -0.5 * (a.r - b.r);
        cpx w = p->split[k];
        re[k] = er + (or_ * w.r - oi * w.i);
        im[k] = ei + (or_ * w.i + oi * w.r);
    }
}

/* One transform: lane 0 of the lane version (for tests and odd callers; the feature extractor
 * runs MMC_FFT_LANES frames per call). */
mmc_status mmc_rfft_exec(const mmc_rfft *p, const double *x, double *re, double *im) {
    int n = p->n, nf = n / 2 + 1;
    mmc_fftv *xv = aligned_alloc(sizeof(mmc_fftv), sizeof(mmc_fftv) * (size_t)(n + 2 * nf + 4 * p->m));
    if (!xv) return mmc_error(MMC_ERR_OOM, "fft: out of memory");
    mmc_fftv *rv = xv + n, *iv = rv + nf, *w = iv + nf;
    for (int j = 0; j < n; j++) { xv[j] = (mmc_fftv){0}; xv[j][0] = x[j]; }
    mmc_rfft_exec_lanes(p, xv, rv, iv, w);
    for (int k = 0; k < nf; k++) { re[k] = rv[k][0]; im[k] = iv[k][0]; }
    free(xv);
    return MMC_OK;
}

/* log10 of MMC_FFT_LANES doubles at once (libm's log10 is a call per value: for the 128-bin
 * log-mel of 30 s, 384000 calls took as long as the FFT). x = 2^e m with m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...) with s = (m - 1) / (m + 1), |s| <= 0.1716: the
 * series' 11th term is below 2^-53 of the first, so the sum is as exact as double rounding allows;
 * log10 x = e log10(2) + log(m) log10(e). */
typedef int64_t VI __attribute__((vector_size(8 * MMC_FFT_LANES)));

mmc_fftv mmc_log10_lanes(mmc_fftv x) {
    VI b = (VI)x;
    VI e = ((b >> 52) & 0x7ff) - 1023;
    V m = (V)((b & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);   /* [1, 2) */
    VI big = m > 1.41421356237309504880;                              /* -1 where m > sqrt 2 */
    m = (V)(((VI)(m * 0.5) & big) | ((VI)m & ~big));
    e -= big;
    V s = (m - 1.0) / (m + 1.0), z = s * s;
    V poly = (V){0} + 2.0 / 21;
    poly = poly * z + 2.0 / 19;
    poly = poly * z + 2.0 / 17;
    poly = poly * z + 2.0 / 15;
    poly = poly * z + 2.0 / 13;
    poly = poly * z + 2.0 / 11;
    poly = poly * z + 2.0 / 9;
    poly = poly * z + 2.0 / 7;
    poly = poly * z + 2.0 / 5;
    poly = poly * z + 2.0 / 3;
    V lnm = 2.0 * s + s * z * poly;
    return __builtin_convertvector(e, V) * 0.30102999566398119521 + lnm * 0.43429448190325182765;
}
