/* elementwise.c — CPU kernels for elementwise maps, activations (GELU erf/tanh, QuickGELU,
 * SiLU, SwiGLU), row softmax, deterministic sums and strided copies.
 *
 * Formulas mirror PyTorch's CPU kernels (aten/src/ATen/native/cpu/Activation.cpp):
 * gelu = 0.5 x (1 + erf(x / sqrt 2)), gelu_tanh = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))),
 * with 1 + tanh(u) evaluated as 2 sigmoid(2u) (no cancellation, same value to ~1 ulp).
 *
 * With AVX-512 the maps run 16 lanes at a time with masked tails. exp is the Cephes
 * range-reduction + degree-6 polynomial (~1 ulp) scaled with vscalefps (handles overflow
 * and underflow). erf is a piecewise degree-7 polynomial over 16 intervals of width 1/4 on
 * [0, 4) (coefficients least-squares fitted in double on Chebyshev nodes, per interval,
 * around the interval midpoint; max abs error 6e-8 when evaluated in f32), selected per lane
 * with vpermps; erf(|x| >= 4) = 1 in f32. Without AVX-512 the scalar code calls libm.
 *
 * Large arrays are split into fixed-size blocks run by OpenMP; every reduction sums fixed
 * blocks in a fixed order, so results do not depend on the thread count. */
#include "elementwise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define BLK 8192                 /* elements per parallel block of a map */
#define PAR_MIN (1 << 15)        /* below this many elements, stay on one thread */

static const float SQRT1_2 = 0.70710678118654752f;
static const float INV_SQRT_2PI = 0.39894228040143268f;
static const float SQRT_2_PI = 0.79788456080286536f; /* sqrt(2/pi) */
static const float GELU_C = 0.044715f;

float ew_erf_ref(float x) { return erff(x); }

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

#if defined(__AVX512F__)
static const float ERF_C0[16] = {1.403162032e-01f, 4.041168988e-01f, 6.232408881e-01f, 7.840750813e-01f, 8.883882165e-01f, 9.481700659e-01f, 9.784437418e-01f, 9.919900298e-01f, 9.973459840e-01f, 9.992170334e-01f, 9.997946024e-01f, 9.999521375e-01f, 9.999901056e-01f, 9.999982119e-01f, 9.999997020e-01f, 9.999999404e-01f};
static const float ERF_C1[16] = {1.110885262e+00f, 9.803528190e-01f, 7.634995580e-01f, 5.247450471e-01f, 3.182739615e-01f, 1.703597754e-01f, 8.047226071e-02f, 3.354582936e-02f, 1.234082039e-02f, 4.006478004e-03f, 1.147875097e-03f, 2.902282868e-04f, 6.475868577e-05f, 1.275174054e-05f, 2.215920176e-06f, 3.398223782e-07f};
static const float ERF_C2[16] = {-1.388606578e-01f, -3.676322997e-01f, -4.771872163e-01f, -4.591519237e-01f, -3.580582142e-01f, -2.342446893e-01f, -1.307674199e-01f, -6.289842725e-02f, -2.622424252e-02f, -9.515384212e-03f, -3.013172187e-03f, -8.344064699e-04f, -2.023709967e-04f, -4.303717651e-05f, -8.032729966e-06f, -1.316817361e-06f};
static const float ERF_C3[16] = {-3.587233722e-01f, -2.348762006e-01f, -5.567184836e-02f, 9.292359650e-02f, 1.624523252e-01f, 1.579377055e-01f, 1.148406193e-01f, 6.744109094e-02f, 3.303740546e-02f, 1.373053249e-02f, 4.890426062e-03f, 1.502536004e-03f, 4.000198387e-04f, 9.258298815e-05f, 1.867376341e-05f, 3.288496146e-06f};
static const float ERF_C4[16] = {6.870539486e-02f, 1.665799767e-01f, 1.764578223e-01f, 1.123971194e-01f, 2.797512710e-02f, -3.049931303e-02f, -4.971868545e-02f, -4.226031527e-02f, -2.636124939e-02f, -1.313339546e-02f, -5.414305255e-03f, -1.881718985e-03f, -5.575400428e-04f, -1.418712345e-04f, -3.116243170e-05f, -5.930713996e-06f};
static const float ERF_C5[16] = {1.041798070e-01f, 4.547529668e-02f, -2.741192281e-02f, -6.721454114e-02f, -6.132353470e-02f, -3.060662188e-02f, -2.135504503e-03f, 1.146243326e-02f, 1.249560062e-02f, 8.357531391e-03f, 4.217943642e-03f, 1.713270089e-03f, 5.769510753e-04f, 1.637651731e-04f, 3.958807793e-05f, 8.207343853e-06f};
static const float ERF_C6[16] = {-2.248836122e-02f, -4.975650087e-02f, -4.113639519e-02f, -1.042486355e-02f, 1.534914877e-02f, 2.202830091e-02f, 1.439652219e-02f, 4.149623215e-03f, -1.778267440e-03f, -3.095475258e-03f, -2.245699987e-03f, -1.144288923e-03f, -4.557891807e-04f, -1.481258514e-04f, -4.015907689e-05f, -9.204693015e-06f};
static const float ERF_C7[16] = {-2.383780852e-02f, -5.454434548e-03f, 1.378284395e-02f, 1.848155446e-02f, 9.594084695e-03f, -1.363872550e-03f, -6.134768482e-03f, -4.915592726e-03f, -1.879364951e-03f, 1.114369079e-04f, 6.754984497e-04f, 5.279938923e-04f, 2.673715935e-04f, 1.029342166e-04f, 3.187280163e-05f, 8.158473975e-06f};

#define S1(v) _mm512_set1_ps(v)
static inline __m512 v_keep_nan(__m512 x, __m512 y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}
static inline __m512 v_exp(__m512 x0) {
    __m512 x = _mm512_min_ps(_mm512_max_ps(x0, S1(-104.0f)), S1(89.0f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, S1(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, S1(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, S1(-2.12194440e-4f), r);
    __m512 p = S1(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, S1(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, S1(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, S1(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, S1(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, S1(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, S1(1.0f)));
    return v_keep_nan(x0, _mm512_scalef_ps(y, fx));
}
static inline __m512 v_sigmoid(__m512 x) {
    return _mm512_div_ps(S1(1.0f), _mm512_add_ps(S1(1.0f), v_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
static inline __m512 v_erf(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 axc = _mm512_min_ps(ax, S1(3.9999998f));
    __m512i idx = _mm512_cvttps_epi32(_mm512_mul_ps(axc, S1(4.0f)));
    __m512 mid = _mm512_fmadd_ps(_mm512_cvtepi32_ps(idx), S1(0.25f), S1(0.125f));
    __m512 t = _mm512_sub_ps(axc, mid);
    __m512 p = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C7));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C6)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C5)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C4)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C3)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C2)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C1)));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_loadu_ps(ERF_C0)));
    p = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, S1(4.0f), _CMP_GE_OQ), p, S1(1.0f));
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    p = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(p), sign));
    return v_keep_nan(x, p);
}
static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}
#endif

/* Run body(i0, i1) over [0, n) in blocks, in parallel when n is large. */
#define PAR_BLOCKS(n, ...)                                                         \
    do {                                                                            \
        int64_t nb_ = ((n) + BLK - 1) / BLK;                                        \
        _Pragma("omp parallel for schedule(static) if ((n) >= PAR_MIN)")            \
        for (int64_t b_ = 0; b_ < nb_; b_++) {                                      \
            int64_t i0 = b_ * BLK, i1 = i0 + BLK < (n) ? i0 + BLK : (n);            \
            __VA_ARGS__;                                                            \
        }                                                                           \
    } while (0)

/* ------------------------------------------------------------- binary maps */
void ew_add_f32(float *y, const float *a, const float *b, int64_t n) {
    PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) y[i] = a[i] + b[i]; });
}
void ew_mul_f32(float *y, const float *a, const float *b, int64_t n) {
    PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) y[i] = a[i] * b[i]; });
}
void ew_scale_f32(float *y, const float *x, float s, int64_t n) {
    PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) y[i] = x[i] * s; });
}
void ew_axpy_acc_f32(float *dst, const float *src, float s, int64_t n) {
    if (s == 1.0f) PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) dst[i] += src[i]; });
    else PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) dst[i] += s * src[i]; });
}
void ew_mul_acc_f32(float *dst, const float *a, const float *b, int64_t n) {
    PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) dst[i] += a[i] * b[i]; });
}
void ew_add_scalar_acc_f32(float *dst, float s, int64_t n) {
    PAR_BLOCKS(n, { for (int64_t i = i0; i < i1; i++) dst[i] += s; });
}

/* ------------------------------------------------------------- bias broadcast */
void ew_add_bias_f32(float *y, const float *a, const float *b, int64_t R, int64_t C) {
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *ar = a + r * C;
        float *yr = y + r * C;
        for (int64_t c = 0; c < C; c++) yr[c] = ar[c] + b[c];
    }
}
void ew_mul_bias_f32(float *y, const float *a, const float *b, int64_t R, int64_t C) {
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *ar = a + r * C;
        float *yr = y + r * C;
        for (int64_t c = 0; c < C; c++) yr[c] = ar[c] * b[c];
    }
}
void ew_mul_bias_acc_f32(float *ga, const float *g, const float *b, int64_t R, int64_t C) {
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *gr = g + r * C;
        float *gar = ga + r * C;
        for (int64_t c = 0; c < C; c++) gar[c] += gr[c] * b[c];
    }
}
/* Bias-add backward in one sweep of g, row-major (sequential reads): fixed chunks of RCH
 * rows each sum into their own double row of partials, then the partials are added in
 * chunk order — the same result for any thread count. The column sum of the strided
 * path below reads g a second time, in 256-byte pieces one row apart. */
#define RCH 32
#define CBLK 64
void ew_add_bias_bwd_acc_f32(float *gf, float *gb, const float *g, int64_t R, int64_t C) {
    const int64_t nch = (R + RCH - 1) / RCH;
    /* small or narrow (and if there is no room for the partials): the two passes */
    const int one_pass = gb && C >= 16 && R * C >= PAR_MIN && nch >= 2;
    double *part = one_pass ? malloc((size_t)(nch * C) * sizeof *part) : NULL;
    if (!part) {
        if (gf) ew_axpy_acc_f32(gf, g, 1.0f, R * C);
        if (gb) ew_colsum_acc_f32(gb, g, NULL, R, C);
        return;
    }
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int64_t ch = 0; ch < nch; ch++) {
            double *restrict p = part + ch * C;
            const int64_t r0 = ch * RCH, r1 = r0 + RCH < R ? r0 + RCH : R;
            for (int64_t c = 0; c < C; c++) p[c] = 0.0;
            for (int64_t r = r0; r < r1; r++) {
                const float *restrict gr = g + r * C;
                if (gf) {
                    float *restrict fr = gf + r * C;
                    for (int64_t c = 0; c < C; c++) {
                        fr[c] += gr[c];
                        p[c] += (double)gr[c];
                    }
                } else {
                    for (int64_t c = 0; c < C; c++) p[c] += (double)gr[c];
                }
            }
        }
        #pragma omp for schedule(static)
        for (int64_t c0 = 0; c0 < C; c0 += CBLK) {
            const int64_t c1 = c0 + CBLK < C ? c0 + CBLK : C;
            for (int64_t c = c0; c < c1; c++) {
                double s = 0.0;
                for (int64_t ch = 0; ch < nch; ch++) s += part[ch * C + c];
                gb[c] += (float)s;
            }
        }
    }
    free(part);
}

/* Column sums: each column block is owned by one iteration, rows summed in order in
 * double, so the result is independent of the thread count. */
void ew_colsum_acc_f32(float *gb, const float *g, const float *a, int64_t R, int64_t C) {
    int64_t nb = (C + CBLK - 1) / CBLK;
    if (nb == 1 && C < 16 && R * C >= PAR_MIN) {
        /* narrow bias (e.g. a scalar): split rows into fixed chunks, reduce in order */
        enum { NCH = 64 };
        double part[NCH][16];
        int64_t per = (R + NCH - 1) / NCH;
        #pragma omp parallel for schedule(static)
        for (int ch = 0; ch < NCH; ch++) {
            double acc[16] = {0};
            int64_t r0 = ch * per, r1 = r0 + per < R ? r0 + per : R;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = 0; c < C; c++)
                    acc[c] += (double)g[r * C + c] * (a ? (double)a[r * C + c] : 1.0);
            memcpy(part[ch], acc, sizeof acc);
        }
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int ch = 0; ch < NCH; ch++) s += part[ch][c];
            gb[c] += (float)s;
        }
        return;
    }
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t bi = 0; bi < nb; bi++) {
        int64_t c0 = bi * CBLK, w = C - c0 < CBLK ? C - c0 : CBLK;
        double acc[CBLK];
        for (int64_t j = 0; j < w; j++) acc[j] = 0;
        for (int64_t r = 0; r < R; r++) {
            const float *gr = g + r * C + c0;
            if (a) {
                const float *ar = a + r * C + c0;
                for (int64_t j = 0; j < w; j++) acc[j] += (double)(gr[j] * ar[j]);
            } else {
                for (int64_t j = 0; j < w; j++) acc[j] += (double)gr[j];
            }
        }
        for (int64_t j = 0; j < w; j++) gb[c0 + j] += (float)acc[j];
    }
}

/* ------------------------------------------------------------- activations */
#if defined(__AVX512F__)
/* SIMD map over [i0, i1): load x (and optional second input) into vx, compute, store */
#define SIMD_MAP(i0, i1, ...)                                                       \
    for (int64_t i = (i0); i < (i1); i += 16) {                                     \
        __mmask16 m = tail_mask((i1) - i);                                          \
        __VA_ARGS__;                                                                \
    }
#endif

static void ew_gelu_f32_blk(float *y, const float *x, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 e = v_erf(_mm512_mul_ps(v, S1(SQRT1_2)));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(S1(0.5f), v), _mm512_add_ps(S1(1.0f), e)));
    });
#else
    for (int64_t i = i0; i < i1; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
#endif
}
void ew_gelu_f32(float *y, const float *x, int64_t n) {
    PAR_BLOCKS(n, ew_gelu_f32_blk(y, x, i0, i1));
}
static void ew_gelu_bwd_acc_f32_blk(float *gx, const float *x, const float *g, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 cdf = _mm512_mul_ps(S1(0.5f), _mm512_add_ps(S1(1.0f), v_erf(_mm512_mul_ps(v, S1(SQRT1_2)))));
        __m512 pdf = _mm512_mul_ps(S1(INV_SQRT_2PI), v_exp(_mm512_mul_ps(S1(-0.5f), _mm512_mul_ps(v, v))));
        __m512 d = _mm512_fmadd_ps(v, pdf, cdf);
        __m512 acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, g + i), d, _mm512_maskz_loadu_ps(m, gx + i));
        _mm512_mask_storeu_ps(gx + i, m, acc);
    });
#else
    for (int64_t i = i0; i < i1; i++) {
        float v = x[i], cdf = 0.5f * (1.0f + erff(v * SQRT1_2));
        float pdf = INV_SQRT_2PI * expf(-0.5f * v * v);
        gx[i] += g[i] * (cdf + v * pdf);
    }
#endif
}
void ew_gelu_bwd_acc_f32(float *gx, const float *x, const float *g, int64_t n) {
    PAR_BLOCKS(n, ew_gelu_bwd_acc_f32_blk(gx, x, g, i0, i1));
}

static void ew_gelu_tanh_f32_blk(float *y, const float *x, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 u = _mm512_mul_ps(S1(SQRT_2_PI), _mm512_fmadd_ps(_mm512_mul_ps(S1(GELU_C), v), _mm512_mul_ps(v, v), v));
        __m512 s = v_sigmoid(_mm512_add_ps(u, u));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, s));
    });
#else
    for (int64_t i = i0; i < i1; i++) {
        float v = x[i], u = SQRT_2_PI * (v + GELU_C * v * v * v);
        y[i] = v * sigmoidf_(2.0f * u);
    }
#endif
}
void ew_gelu_tanh_f32(float *y, const float *x, int64_t n) {
    PAR_BLOCKS(n, ew_gelu_tanh_f32_blk(y, x, i0, i1));
}
static void ew_gelu_tanh_bwd_acc_f32_blk(float *gx, const float *x, const float *g, int64_t i0, int64_t i1) {
    /* y = x s, s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3c x^2) */
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 v2 = _mm512_mul_ps(v, v);
        __m512 u = _mm512_mul_ps(S1(SQRT_2_PI), _mm512_fmadd_ps(_mm512_mul_ps(S1(GELU_C), v), v2, v));
        __m512 s = v_sigmoid(_mm512_add_ps(u, u));
        __m512 du = _mm512_mul_ps(S1(SQRT_2_PI), _mm512_fmadd_ps(S1(3.0f * GELU_C), v2, S1(1.0f)));
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(S1(2.0f), v), _mm512_mul_ps(s, _mm512_sub_ps(S1(1.0f), s)));
        __m512 d = _mm512_fmadd_ps(t, du, s);
        __m512 acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, g + i), d, _mm512_maskz_loadu_ps(m, gx + i));
        _mm512_mask_storeu_ps(gx + i, m, acc);
    });
#else
    for (int64_t i = i0; i < i1; i++) {
        float v = x[i], u = SQRT_2_PI * (v + GELU_C * v * v * v), s = sigmoidf_(2.0f * u);
        float d = s + 2.0f * v * s * (1.0f - s) * SQRT_2_PI * (1.0f + 3.0f * GELU_C * v * v);
        gx[i] += g[i] * d;
    }
#endif
}
void ew_gelu_tanh_bwd_acc_f32(float *gx, const float *x, const float *g, int64_t n) {
    PAR_BLOCKS(n, ew_gelu_tanh_bwd_acc_f32_blk(gx, x, g, i0, i1));
}

static void ew_xsigmoid_f32_blk(float *y, const float *x, float k, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, v_sigmoid(_mm512_mul_ps(S1(k), v))));
    });
#else
    for (int64_t i = i0; i < i1; i++) y[i] = x[i] * sigmoidf_(k * x[i]);
#endif
}
void ew_xsigmoid_f32(float *y, const float *x, float k, int64_t n) {
    PAR_BLOCKS(n, ew_xsigmoid_f32_blk(y, x, k, i0, i1));
}
void ew_xsigmoid_f32_serial(float *y, const float *x, float k, int64_t n) { ew_xsigmoid_f32_blk(y, x, k, 0, n); }
static void ew_xsigmoid_bwd_acc_f32_blk(float *gx, const float *x, const float *g, float k, int64_t i0, int64_t i1) {
    /* d/dx x s(kx) = s + k x s (1 - s) */
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 s = v_sigmoid(_mm512_mul_ps(S1(k), v));
        __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(S1(k), v), s), _mm512_sub_ps(S1(1.0f), s), s);
        __m512 acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, g + i), d, _mm512_maskz_loadu_ps(m, gx + i));
        _mm512_mask_storeu_ps(gx + i, m, acc);
    });
#else
    for (int64_t i = i0; i < i1; i++) {
        float s = sigmoidf_(k * x[i]);
        gx[i] += g[i] * (s + k * x[i] * s * (1.0f - s));
    }
#endif
}
void ew_xsigmoid_bwd_acc_f32(float *gx, const float *x, const float *g, float k, int64_t n) {
    PAR_BLOCKS(n, ew_xsigmoid_bwd_acc_f32_blk(gx, x, g, k, i0, i1));
}

static void ew_swiglu_f32_blk(float *y, const float *gate, const float *up, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 u = _mm512_maskz_loadu_ps(m, up + i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(v, v_sigmoid(v)), u));
    });
#else
    for (int64_t i = i0; i < i1; i++) y[i] = gate[i] * sigmoidf_(gate[i]) * up[i];
#endif
}
void ew_swiglu_f32(float *y, const float *gate, const float *up, int64_t n) {
    PAR_BLOCKS(n, ew_swiglu_f32_blk(y, gate, up, i0, i1));
}
static void ew_swiglu_bwd_acc_f32_blk(float *ggate, float *gup, const float *gate, const float *up, const float *g, int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
    SIMD_MAP(i0, i1, {
        __m512 v = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 gy = _mm512_maskz_loadu_ps(m, g + i);
        __m512 s = v_sigmoid(v);
        __m512 silu = _mm512_mul_ps(v, s);
        if (gup) _mm512_mask_storeu_ps(gup + i, m, _mm512_fmadd_ps(gy, silu, _mm512_maskz_loadu_ps(m, gup + i)));
        if (ggate) {
            __m512 u = _mm512_maskz_loadu_ps(m, up + i);
            __m512 d = _mm512_fmadd_ps(silu, _mm512_sub_ps(S1(1.0f), s), s);
            _mm512_mask_storeu_ps(ggate + i, m, _mm512_fmadd_ps(_mm512_mul_ps(gy, u), d, _mm512_maskz_loadu_ps(m, ggate + i)));
        }
    });
#else
    for (int64_t i = i0; i < i1; i++) {
        float v = gate[i], s = sigmoidf_(v), silu = v * s;
        if (gup) gup[i] += g[i] * silu;
        if (ggate) ggate[i] += g[i] * up[i] * (s + silu * (1.0f - s));
    }
#endif
}
void ew_swiglu_bwd_acc_f32(float *ggate, float *gup, const float *gate, const float *up,
                           const float *g, int64_t n) {
    PAR_BLOCKS(n, ew_swiglu_bwd_acc_f32_blk(ggate, gup, gate, up, g, i0, i1));
}

/* ------------------------------------------------------------- softmax */
static void softmax_row(float *y, const float *x, int64_t C) {
#if defined(__AVX512F__)
    __m512 vm = S1(-INFINITY);
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 m = tail_mask(C - i);
        vm = _mm512_mask_max_ps(vm, m, vm, _mm512_maskz_loadu_ps(m, x + i));
    }
    float mx = _mm512_reduce_max_ps(vm);
    if (mx == -INFINITY) mx = 0.0f;   /* all -inf row: exp(-inf) = 0 -> 0/0 = nan, as torch */
    __m512 vs = _mm512_setzero_ps(), vmx = S1(mx);
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 m = tail_mask(C - i);
        __m512 e = v_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx));
        e = _mm512_maskz_mov_ps(m, e);
        vs = _mm512_add_ps(vs, e);
        _mm512_mask_storeu_ps(y + i, m, e);
    }
    __m512 inv = S1(1.0f / _mm512_reduce_add_ps(vs));
    for (int64_t i = 0; i < C; i += 16) {
        __mmask16 m = tail_mask(C - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv));
    }
#else
    float mx = -INFINITY;
    for (int64_t i = 0; i < C; i++) mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) mx = 0.0f;
    double s = 0;
    for (int64_t i = 0; i < C; i++) { y[i] = expf(x[i] - mx); s += y[i]; }
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < C; i++) y[i] *= inv;
#endif
}
void ew_softmax_f32(float *y, const float *x, int64_t R, int64_t C) {
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t r = 0; r < R; r++) softmax_row(y + r * C, x + r * C, C);
}
void ew_softmax_bwd_acc_f32(float *gx, const float *y, const float *g, int64_t R, int64_t C) {
    #pragma omp parallel for schedule(static) if (R * C >= PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *yr = y + r * C, *gr = g + r * C;
        float *gxr = gx + r * C;
#if defined(__AVX512F__)
        __m512 vd = _mm512_setzero_ps();
        for (int64_t i = 0; i < C; i += 16) {
            __mmask16 m = tail_mask(C - i);
            vd = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, yr + i), _mm512_maskz_loadu_ps(m, gr + i), vd);
        }
        __m512 dot = S1(_mm512_reduce_add_ps(vd));
        for (int64_t i = 0; i < C; i += 16) {
            __mmask16 m = tail_mask(C - i);
            __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, yr + i), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, gr + i), dot));
            _mm512_mask_storeu_ps(gxr + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, gxr + i), t));
        }
#else
        double d = 0;
        for (int64_t i = 0; i < C; i++) d += (double)yr[i] * gr[i];
        float dot = (float)d;
        for (int64_t i = 0; i < C; i++) gxr[i] += yr[i] * (gr[i] - dot);
#endif
    }
}

/* ------------------------------------------------------------- sums */
static double sum_block(const float *x, int64_t n) {
#if defined(__AVX512F__)
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(x + i)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8)));
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < n; i++) s += x[i];
    return s;
#else
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) { s[0] += x[i]; s[1] += x[i + 1]; s[2] += x[i + 2]; s[3] += x[i + 3]; }
    for (; i < n; i++) s[0] += x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
#endif
}
double ew_sum_f64(const float *x, int64_t n) {
    enum { NCH = 64 };   /* fixed chunk count: the order of additions never depends on threads */
    double part[NCH];
    int64_t per = (n + NCH - 1) / NCH;
    #pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int ch = 0; ch < NCH; ch++) {
        int64_t i0 = ch * per, i1 = i0 + per < n ? i0 + per : n;
        part[ch] = i0 < i1 ? sum_block(x + i0, i1 - i0) : 0.0;
    }
    double s = 0;
    for (int ch = 0; ch < NCH; ch++) s += part[ch];
    return s;
}

/* ------------------------------------------------------------- strided layout */
static inline void copy_elems(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t esz) {
    if (ds == 1 && ss == 1) { memcpy(d, s, (size_t)n * esz); return; }
    switch (esz) {
    case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i * ds] = ((const uint32_t *)s)[i * ss]; break;
    case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i * ds] = ((const uint16_t *)s)[i * ss]; break;
    case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)d)[i * ds] = ((const uint64_t *)s)[i * ss]; break;
    default: for (int64_t i = 0; i < n; i++) memcpy(d + i * ds * esz, s + i * ss * esz, esz); break;
    }
}

void ew_strided_copy(void *dst, const int64_t *dst_stride, const void *src,
                     const int64_t *src_stride, const int64_t *shape, int ndim, size_t esz) {
    if (ndim == 0) { memcpy(dst, src, esz); return; }
    int64_t inner = shape[ndim - 1], outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    if (inner == 0) return;
    #pragma omp parallel for schedule(static) if (outer * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, doff = 0, soff = 0;
        for (int d = ndim - 2; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            doff += idx * dst_stride[d];
            soff += idx * src_stride[d];
        }
        copy_elems((char *)dst + doff * (int64_t)esz, dst_stride[ndim - 1],
                   (const char *)src + soff * (int64_t)esz, src_stride[ndim - 1], inner, esz);
    }
}

void ew_strided_add_acc_f32(float *dst, const int64_t *dst_stride, const float *src,
                            const int64_t *shape, int ndim) {
    if (ndim == 0) { dst[0] += src[0]; return; }
    int64_t inner = shape[ndim - 1], outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t ds = dst_stride[ndim - 1];
    /* parallel over outer rows: distinct rows of a view never alias in its base */
    #pragma omp parallel for schedule(static) if (outer * inner >= PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, doff = 0;
        for (int d = ndim - 2; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            doff += idx * dst_stride[d];
        }
        float *dr = dst + doff;
        const float *sr = src + o * inner;
        if (ds == 1) for (int64_t i = 0; i < inner; i++) dr[i] += sr[i];
        else for (int64_t i = 0; i < inner; i++) dr[i * ds] += sr[i];
    }
}
