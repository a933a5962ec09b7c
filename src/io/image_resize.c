/* image_resize.c — Pillow-exact resampling of 8-bit RGB images (mirrors Pillow's
 * libImaging/Resample.c algorithm: per-output-pixel kernel windows computed in double,
 * normalised, converted to 22-bit fixed point; a horizontal pass then a vertical pass,
 * each rounding and clamping to uint8), plus a float variant in the style of
 * torch.nn.functional.interpolate(antialias=True) used by torchvision / HF fast processors.
 */
#include "mmc_image.h"
#include "io_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

void *mmc_io_big_alloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
#ifdef MADV_HUGEPAGE
    const size_t huge = (size_t)2 << 20;
    if (p && n >= 2 * huge) {   /* the whole 2 MiB pages inside the block (glibc mmaps it) */
        uintptr_t a = ((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1), e = ((uintptr_t)p + n) & ~(uintptr_t)(huge - 1);
        if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE);
    }
#endif
    return p;
}

#define PRECISION_BITS (32 - 8 - 2)

static double bicubic(double x) {
    const double a = -0.5; /* Pillow's (and torch's antialiased) cubic */
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}
static double bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}
static double lanczos(double x) {   /* Pillow's: sinc windowed by sinc(x / 3), support 3 */
    return x >= -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0;
}

/* Kernel windows for one axis: bounds[2*o] = first input index, bounds[2*o+1] = count,
 * kk[o*ksize + j] = normalised weight. Returns ksize, or 0 on OOM. */
static int coeffs(int in_size, int out_size, mmc_resample f, int **bounds_out, double **kk_out) {
    double (*filt)(double) = f == MMC_RESAMPLE_BICUBIC ? bicubic : f == MMC_RESAMPLE_LANCZOS ? lanczos : bilinear;
    double fsupport = f == MMC_RESAMPLE_BICUBIC ? 2.0 : f == MMC_RESAMPLE_LANCZOS ? 3.0 : 1.0;
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = fsupport * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *kk = malloc(sizeof(double) * (size_t)out_size * ksize);
    int *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    if (!kk || !bounds) { free(kk); free(bounds); return 0; }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = kk + (size_t)xx * ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            double w = filt((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++) if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[2 * xx] = xmin;
        bounds[2 * xx + 1] = xmax;
    }
    *bounds_out = bounds;
    *kk_out = kk;
    return ksize;
}

/* Fixed-point weights with *prec fraction bits, each window padded with zeros to an even stride
 * (kstride): the AVX2 horizontal pass takes two taps per step. *prec < 0: torch's uint8
 * kernels' choice (ported from Pillow-SIMD), the most bits for which the axis's largest weight
 * still fits in int16; else Pillow's PRECISION_BITS. */
static int *fixed_coeffs(const double *kk, int out_size, int ksize, int kstride, int *prec) {
    if (*prec < 0) {
        double m = 0;
        for (size_t i = 0; i < (size_t)out_size * ksize; i++) m = kk[i] > m ? kk[i] : m;
        for (*prec = 0; *prec < PRECISION_BITS; ++*prec)
            if ((int)(0.5 + m * (1 << (*prec + 1))) >= (1 << 15)) break;
    }
    int *k = calloc((size_t)out_size * kstride, sizeof(int));
    if (!k) return NULL;
    for (int o = 0; o < out_size; o++)
        for (int j = 0; j < ksize; j++) {
            double v = kk[(size_t)o * ksize + j];
            k[(size_t)o * kstride + j] = v < 0 ? (int)(-0.5 + v * (1 << *prec)) : (int)(0.5 + v * (1 << *prec));
        }
    return k;
}

static inline uint8_t clip8(int v, int prec) {
    v >>= prec;
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* The integer sums are exact (as in Pillow: 32-bit, no overflow for 8-bit input), so any order
 * of the additions, SIMD included, gives Pillow's bytes. */

/* One output row of the horizontal pass: o[xx] = clip8(sum_x row[xmin + x] * k[x]) per channel.
 * row must be readable 8 bytes past its W pixels (the AVX2 path loads two pixels per tap pair). */
static void hpass_row(const uint8_t *row, uint8_t *o, int out_w, const int *bounds, const int *kh, int kstride,
                      int prec) {
#ifdef __AVX2__
    /* bytes R0 G0 B0 R1 G1 B1 -> int32 lanes [R0 G0 B0 0 R1 G1 B1 0] */
    const __m128i shuf = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i dup = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m128i bias = _mm_set1_epi32(1 << (prec - 1)), sh = _mm_cvtsi32_si128(prec);
    for (int xx = 0; xx < out_w; xx++) {
        int xmin = bounds[2 * xx], xn = bounds[2 * xx + 1];
        const int *k = kh + (size_t)xx * kstride;
        const uint8_t *p = row + (size_t)xmin * 3;
        __m256i acc = _mm256_setzero_si256();
        for (int x = 0; x < xn; x += 2) {
            __m128i px = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)(p + 3 * x)), shuf);
            __m256i kv = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(k + x))), dup);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(px), kv));
        }
        __m128i s = _mm_add_epi32(_mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1)), bias);
        s = _mm_sra_epi32(s, sh);
        s = _mm_packus_epi16(_mm_packs_epi32(s, s), s);
        uint32_t v = (uint32_t)_mm_cvtsi128_si32(s);
        memcpy(o + 3 * xx, &v, 3);
    }
#else
    for (int xx = 0; xx < out_w; xx++) {
        int xmin = bounds[2 * xx], xn = bounds[2 * xx + 1];
        const int *k = kh + (size_t)xx * kstride;
        int s0 = 1 << (prec - 1), s1 = s0, s2 = s0;
        const uint8_t *p = row + (size_t)xmin * 3;
        for (int x = 0; x < xn; x++) {
            s0 += p[3 * x] * k[x];
            s1 += p[3 * x + 1] * k[x];
            s2 += p[3 * x + 2] * k[x];
        }
        o[3 * xx] = clip8(s0, prec);
        o[3 * xx + 1] = clip8(s1, prec);
        o[3 * xx + 2] = clip8(s2, prec);
    }
#endif
}

/* One output row of the vertical pass over n bytes: o[x] = clip8(sum_y p[y * stride + x] * k[y]). */
static void vpass_row(const uint8_t *p, size_t stride, uint8_t *o, int n, const int *k, int yn, int prec) {
    int x = 0;
#ifdef __AVX2__
    const __m256i bias = _mm256_set1_epi32(1 << (prec - 1));
    const __m128i sh = _mm_cvtsi32_si128(prec);
    for (; x + 32 <= n; x += 32) {
        __m256i a0 = bias, a1 = bias, a2 = bias, a3 = bias;
        for (int y = 0; y < yn; y++) {
            const uint8_t *q = p + (size_t)y * stride + x;
            __m256i kv = _mm256_set1_epi32(k[y]);
            __m128i lo = _mm_loadu_si128((const __m128i *)q), hi = _mm_loadu_si128((const __m128i *)(q + 16));
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lo), kv));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), kv));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(hi), kv));
            a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), kv));
        }
        __m256i s01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_sra_epi32(a0, sh),
                                                                  _mm256_sra_epi32(a1, sh)), 0xD8);
        __m256i s23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_sra_epi32(a2, sh),
                                                                  _mm256_sra_epi32(a3, sh)), 0xD8);
        __m256i u8 = _mm256_permute4x64_epi64(_mm256_packus_epi16(s01, s23), 0xD8);
        _mm256_storeu_si256((__m256i *)(o + x), u8);
    }
#endif
    for (; x < n; x++) {
        int s = 1 << (prec - 1);
        for (int y = 0; y < yn; y++) s += p[(size_t)y * stride + x] * k[y];
        o[x] = clip8(s, prec);
    }
}

#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI__)
#define MMC_RESIZE_AVX512 1
/* The same sums with 16-bit weights (torch's precision keeps every weight within int16, as in
 * its own uint8 kernels), for windows of at most 8 taps: vpermb spreads a window's 8 pixels into
 * int16 pairs (R_2j R_2j+1 G_2j G_2j+1 B_2j B_2j+1 0 0 in 128-bit block j), one vpmaddwd with the
 * output pixel's weights (w16: [out][32]) gives per block [R G B 0] partial sums, and four outputs'
 * blocks are summed with lane shuffles. Integer sums: the bytes of hpass_row. */
static void hpass_row16(const uint8_t *row, uint8_t *o, int out_w, const int *bounds, const int16_t *w16, int prec) {
    /* byte 2l of int16 lane l = 8j + r: pixel 2j + (r & 1), channel r >> 1 (r < 6); the rest zero */
    static const uint8_t idx_b[64] = {
        0, 0, 3, 0, 1, 0, 4, 0, 2, 0, 5, 0, 0, 0, 0, 0, 6, 0, 9, 0, 7, 0, 10, 0, 8, 0, 11, 0, 0, 0, 0, 0,
        12, 0, 15, 0, 13, 0, 16, 0, 14, 0, 17, 0, 0, 0, 0, 0, 18, 0, 21, 0, 19, 0, 22, 0, 20, 0, 23, 0, 0, 0, 0, 0};
    const __m512i idx = _mm512_loadu_si512(idx_b);
    const __mmask64 keep = 0x0555055505550555ULL;   /* even bytes of lanes r < 6 */
    const __m512i bias = _mm512_set1_epi32(1 << (prec - 1)), zero = _mm512_setzero_si512();
    /* [R0 G0 B0 0 R1 G1 B1 0 ...] bytes -> 12 packed bytes */
    const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    int xx = 0;
#define MMC_HWIN(i)                                                                                               \
    _mm512_madd_epi16(_mm512_maskz_permutexvar_epi8(keep, idx, _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(      \
                          (__mmask32)((1ULL << (3 * bounds[2 * (i) + 1])) - 1), row + (size_t)bounds[2 * (i)] * 3))), \
                      _mm512_load_si512(w16 + (size_t)(i) * 32))
    for (; xx + 4 <= out_w; xx += 4) {
        __m512i m0 = MMC_HWIN(xx), m1 = MMC_HWIN(xx + 1), m2 = MMC_HWIN(xx + 2), m3 = MMC_HWIN(xx + 3);
        /* [m0 b0+b2, m0 b1+b3, m1 b0+b2, m1 b1+b3] and the same for m2, m3 */
        __m512i t01 = _mm512_add_epi32(_mm512_shuffle_i32x4(m0, m1, 0x44), _mm512_shuffle_i32x4(m0, m1, 0xEE));
        __m512i t23 = _mm512_add_epi32(_mm512_shuffle_i32x4(m2, m3, 0x44), _mm512_shuffle_i32x4(m2, m3, 0xEE));
        __m512i u = _mm512_add_epi32(_mm512_shuffle_i32x4(t01, t23, 0x88), _mm512_shuffle_i32x4(t01, t23, 0xDD));
        u = _mm512_max_epi32(_mm512_srai_epi32(_mm512_add_epi32(u, bias), prec), zero);
        __m128i b = _mm_shuffle_epi8(_mm512_cvtusepi32_epi8(u), pack);
        _mm_mask_storeu_epi8(o + 3 * xx, 0x0FFF, b);
    }
    for (; xx < out_w; xx++) {
        __m512i m = MMC_HWIN(xx);
        __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
        __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        q = _mm_max_epi32(_mm_srai_epi32(_mm_add_epi32(q, _mm512_castsi512_si128(bias)), prec), _mm_setzero_si128());
        _mm_mask_storeu_epi8(o + 3 * xx, 0x7, _mm_cvtusepi32_epi8(q));
    }
#undef MMC_HWIN
}

/* The vertical pass with 16-bit weights: rows taken in pairs, their bytes interleaved as int16
 * so that one vpmaddwd forms p[y] k[y] + p[y+1] k[y+1]. Integer sums: the bytes of vpass_row. */
static void vpass_row16(const uint8_t *p, size_t stride, uint8_t *o, int n, const int *k, int yn, int prec) {
    const __m512i bias = _mm512_set1_epi32(1 << (prec - 1)), zero = _mm512_setzero_si512();
    int x = 0;
    for (; x + 32 <= n; x += 32) {
        __m512i lo = bias, hi = bias;
        int y = 0;
        for (; y + 2 <= yn; y += 2) {
            const uint8_t *q = p + (size_t)y * stride + x;
            __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)q));
            __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + stride)));
            __m512i kv = _mm512_set1_epi32((int)(((uint32_t)(uint16_t)k[y + 1] << 16) | (uint16_t)k[y]));
            lo = _mm512_add_epi32(lo, _mm512_madd_epi16(_mm512_unpacklo_epi16(a, b), kv));
            hi = _mm512_add_epi32(hi, _mm512_madd_epi16(_mm512_unpackhi_epi16(a, b), kv));
        }
        if (y < yn) {   /* an odd last row, paired with zeros */
            __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p + (size_t)y * stride + x)));
            __m512i kv = _mm512_set1_epi32((int)(uint16_t)k[y]);
            lo = _mm512_add_epi32(lo, _mm512_madd_epi16(_mm512_unpacklo_epi16(a, zero), kv));
            hi = _mm512_add_epi32(hi, _mm512_madd_epi16(_mm512_unpackhi_epi16(a, zero), kv));
        }
        /* the unpacks split each 128-bit block into its low and high halves; packs puts them back */
        __m512i s = _mm512_packs_epi32(_mm512_srai_epi32(lo, prec), _mm512_srai_epi32(hi, prec));
        _mm256_storeu_si256((__m256i *)(o + x), _mm512_cvtusepi16_epi8(_mm512_max_epi16(s, zero)));
    }
    for (; x < n; x++) {
        int s = 1 << (prec - 1);
        for (int y = 0; y < yn; y++) s += p[(size_t)y * stride + x] * k[y];
        o[x] = clip8(s, prec);
    }
}

/* Per output pixel, the hpass_row16 weight vector ([out][32] int16, 64-byte aligned); NULL when
 * a window is wider than 8 taps or a weight does not fit int16. */
static int16_t *hweights16(const int *kh, int out_w, int ksize, int kstride) {
    if (ksize > 8) return NULL;
    for (size_t i = 0; i < (size_t)out_w * kstride; i++)
        if (kh[i] < INT16_MIN || kh[i] > INT16_MAX) return NULL;
    int16_t *w = aligned_alloc(64, sizeof(int16_t) * 32 * (size_t)out_w);
    if (!w) return NULL;
    for (int o = 0; o < out_w; o++)
        for (int l = 0; l < 32; l++) {
            int j = l / 8, r = l % 8, t = 2 * j + (r & 1);
            w[(size_t)o * 32 + l] = (int16_t)(r < 6 && t < ksize ? kh[(size_t)o * kstride + t] : 0);
        }
    return w;
}

static bool fits16(const int *k, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (k[i] < INT16_MIN || k[i] > INT16_MAX) return false;
    return true;
}
#endif

static mmc_status resize_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, bool torch_prec,
                            mmc_image *dst, mmc_resize_scratch *s);

mmc_status mmc_image_resize(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst) {
    return resize_u8(src, out_h, out_w, f, false, dst, NULL);
}

mmc_status mmc_image_resize_torch_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst) {
    return resize_u8(src, out_h, out_w, f, true, dst, NULL);
}

mmc_status mmc_image_resize_torch_u8_reuse(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst,
                                           mmc_resize_scratch *s) {
    if (dst->data && (dst->height != out_h || dst->width != out_w)) mmc_image_free(dst);
    return resize_u8(src, out_h, out_w, f, true, dst, s);
}

void mmc_resize_scratch_free(mmc_resize_scratch *s) {
    free(s->tmp);
    s->tmp = NULL;
    s->cap = 0;
}

/* s: NULL, or the caller's reused scratch (and dst->data, when set, is reused: out_h x out_w) */
static mmc_status resize_u8(const mmc_image *src, int out_h, int out_w, mmc_resample f, bool torch_prec,
                            mmc_image *dst, mmc_resize_scratch *s) {
    int H = src->height, W = src->width;
    if (out_h <= 0 || out_w <= 0 || H <= 0 || W <= 0)
        return mmc_error(MMC_ERR_INVALID, "image resize: bad sizes %dx%d -> %dx%d", W, H, out_w, out_h);
    bool own_dst = !(s && dst->data);
    mmc_status st = own_dst ? mmc_image_alloc(dst, out_h, out_w) : MMC_OK;
    if (st) return st;
    if (out_h == H && out_w == W) { /* Pillow returns a copy */
        memcpy(dst->data, src->data, (size_t)H * W * 3);
        return MMC_OK;
    }
    int *bh = NULL, *bv = NULL, *kh = NULL, *kv = NULL;
    double *dh = NULL, *dv = NULL;
    uint8_t *tmp = NULL, *last = NULL;
    int16_t *kh16 = NULL;
    int ksh = 0, ksv = 0;
    int need_h = out_w != W, need_v = out_h != H;
    if (need_h && !(ksh = coeffs(W, out_w, f, &bh, &dh))) goto oom;
    if (need_v && !(ksv = coeffs(H, out_h, f, &bv, &dv))) goto oom;
    int kstride = (ksh + 1) & ~1;
    int ph = torch_prec ? -1 : PRECISION_BITS, pv = ph;
    if (need_h && !(kh = fixed_coeffs(dh, out_w, ksh, kstride, &ph))) goto oom;
    if (need_v && !(kv = fixed_coeffs(dv, out_h, ksv, ksv, &pv))) goto oom;
#ifdef MMC_RESIZE_AVX512
    /* 16-bit weights where they fit (torch's precision; Pillow's 22 bits do not) */
    if (need_h) kh16 = hweights16(kh, out_w, ksh, kstride);
    bool v16 = need_v && fits16(kv, (size_t)out_h * ksv);
#endif
    /* Horizontal pass over the rows the vertical pass reads (all of them when upscaling). */
    const uint8_t *hin = src->data;
    int ybox0 = 0, ybox1 = H;
    if (need_v) {
        ybox0 = bv[0];
        ybox1 = bv[2 * (out_h - 1)] + bv[2 * (out_h - 1) + 1];
    }
    if (need_h) {
        size_t tmp_n = (size_t)(ybox1 - ybox0) * out_w * 3;
        uint8_t *hout = dst->data;
        if (need_v && s) {   /* the caller's rows, grown when too small */
            if (s->cap < tmp_n) {
                free(s->tmp);
                s->cap = 0;
                if ((s->tmp = mmc_io_big_alloc(tmp_n))) s->cap = tmp_n;
            }
            hout = s->tmp;
        } else if (need_v) {
            hout = tmp = mmc_io_big_alloc(tmp_n);
        }
        /* the image's last row, padded: hpass_row reads up to 8 bytes past a row */
        last = calloc((size_t)W * 3 + 16, 1);
        if (!hout || !last) goto oom;
        memcpy(last, src->data + (size_t)(H - 1) * W * 3, (size_t)W * 3);
        /* threads only for large images (a 12 MP photo): below a few ms of work the fork/join
         * costs more than it saves, and far more when other processes share the cores */
#pragma omp parallel for schedule(static) if ((int64_t)(ybox1 - ybox0) * out_w * ksh > ((int64_t)16 << 20))
        for (int y = ybox0; y < ybox1; y++) {
            const uint8_t *row = y == H - 1 ? last : src->data + (size_t)y * W * 3;
#ifdef MMC_RESIZE_AVX512
            if (kh16) { hpass_row16(row, hout + (size_t)(y - ybox0) * out_w * 3, out_w, bh, kh16, ph); continue; }
#endif
            hpass_row(row, hout + (size_t)(y - ybox0) * out_w * 3, out_w, bh, kh, kstride, ph);
        }
        hin = hout;
    } else {
        hin = src->data + (size_t)ybox0 * W * 3;
    }
    if (need_v) {
        int w3 = out_w * 3;
#pragma omp parallel for schedule(static) if ((int64_t)out_h * out_w * 3 * ksv > ((int64_t)24 << 20))
        for (int yy = 0; yy < out_h; yy++) {
#ifdef MMC_RESIZE_AVX512
            if (v16) {
                vpass_row16(hin + (size_t)(bv[2 * yy] - ybox0) * w3, (size_t)w3, dst->data + (size_t)yy * w3, w3,
                            kv + (size_t)yy * ksv, bv[2 * yy + 1], pv);
                continue;
            }
#endif
            vpass_row(hin + (size_t)(bv[2 * yy] - ybox0) * w3, (size_t)w3, dst->data + (size_t)yy * w3, w3,
                      kv + (size_t)yy * ksv, bv[2 * yy + 1], pv);
        }
    }
    free(bh); free(bv); free(kh); free(kv); free(dh); free(dv); free(tmp); free(last); free(kh16);
    return MMC_OK;
oom:
    free(bh); free(bv); free(kh); free(kv); free(dh); free(dv); free(tmp); free(last); free(kh16);
    if (own_dst) mmc_image_free(dst);
    return mmc_error(MMC_ERR_OOM, "image resize: out of memory (%dx%d -> %dx%d)", W, H, out_w, out_h);
}

/* Float, torch-style (interpolate antialias=True, align_corners=False): the same kernel
 * windows (torch ports Pillow's), weights in float, no rounding between the passes. */
mmc_status mmc_resize_f32(const float *src, int C, int H, int W, float *dst, int out_h, int out_w,
                          mmc_resample f) {
    if (out_h <= 0 || out_w <= 0 || H <= 0 || W <= 0 || C <= 0)
        return mmc_error(MMC_ERR_INVALID, "resize_f32: bad sizes %dx%d -> %dx%d", W, H, out_w, out_h);
    int *bh = NULL, *bv = NULL;
    double *dh = NULL, *dv = NULL;
    float *tmp = NULL;
    int ksh = coeffs(W, out_w, f, &bh, &dh), ksv = coeffs(H, out_h, f, &bv, &dv);
    tmp = malloc(sizeof(float) * (size_t)C * H * out_w);
    if (!ksh || !ksv || !tmp) {
        free(bh); free(bv); free(dh); free(dv); free(tmp);
        return mmc_error(MMC_ERR_OOM, "resize_f32: out of memory");
    }
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++) {
            const float *row = src + ((size_t)c * H + y) * W;
            float *o = tmp + ((size_t)c * H + y) * out_w;
            for (int xx = 0; xx < out_w; xx++) {
                const double *k = dh + (size_t)xx * ksh;
                float s = 0;
                for (int x = 0; x < bh[2 * xx + 1]; x++) s += row[bh[2 * xx] + x] * (float)k[x];
                o[xx] = s;
            }
        }
    for (int c = 0; c < C; c++)
        for (int yy = 0; yy < out_h; yy++) {
            const double *k = dv + (size_t)yy * ksv;
            float *o = dst + ((size_t)c * out_h + yy) * out_w;
            for (int x = 0; x < out_w; x++) {
                float s = 0;
                for (int y = 0; y < bv[2 * yy + 1]; y++)
                    s += tmp[((size_t)c * H + bv[2 * yy] + y) * out_w + x] * (float)k[y];
                o[x] = s;
            }
        }
    free(bh); free(bv); free(dh); free(dv); free(tmp);
    return MMC_OK;
}
