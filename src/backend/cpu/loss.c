/* loss.c — cross-entropy kernels (see loss.h), the CPU counterpart of
 * torch.nn.functional.cross_entropy over a large vocabulary.
 *
 * Forward reads each row once: it walks the row in L1-sized chunks, takes the chunk max,
 * rescales the running sum when the max grows (one exp per chunk, not per element), then
 * adds exp(x - max) over the chunk, so a 151936-wide row costs one exp per logit.
 * exp is a vectorised Cephes-style polynomial with _mm512_scalef_ps (AVX-512) or expf. */
#include "loss.h"

#include <math.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define CHUNK 1024

static inline int64_t tgt_at(const void *t, bool i64, int64_t i) {
    return i64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

#if defined(__AVX512F__)
/* exp(x) for x <= ~88; relative error ~2 ulp; underflows to 0 below ~-104. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

static inline float chunk_max(const float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
    if (j < n) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                         (__mmask16)((1u << (n - j)) - 1), x + j));
    return _mm512_reduce_max_ps(m);
}
static inline float chunk_sumexp(const float *x, int64_t n, float mx) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        s0 = _mm512_add_ps(s0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm)));
        s1 = _mm512_add_ps(s1, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), vm)));
    }
    for (; j + 16 <= n; j += 16) s0 = _mm512_add_ps(s0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm)));
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm));
        s1 = _mm512_add_ps(s1, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
/* d[j] += scale * exp(x[j] - lse) */
static inline void row_softmax_acc(const float *x, float *d, int64_t n, float lse, float scale) {
    __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(scale);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + j), vl));
        _mm512_storeu_ps(d + j, _mm512_fmadd_ps(e, vs, _mm512_loadu_ps(d + j)));
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vl));
        _mm512_mask_storeu_ps(d + j, k, _mm512_fmadd_ps(e, vs, _mm512_maskz_loadu_ps(k, d + j)));
    }
}
#else
static inline float chunk_max(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}
static inline float chunk_sumexp(const float *x, int64_t n, float mx) {
    float s = 0;
    for (int64_t j = 0; j < n; j++) s += expf(x[j] - mx);
    return s;
}
static inline void row_softmax_acc(const float *x, float *d, int64_t n, float lse, float scale) {
    for (int64_t j = 0; j < n; j++) d[j] += scale * expf(x[j] - lse);
}
#endif

void mmc_cpu_xent_fwd(const float *logits, const void *targets, bool tgt_i64, int64_t ignore_index,
                      float *lse, float *row_loss, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (N * V > 65536)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V;
        float m = -INFINITY;
        double s = 0;
        for (int64_t j0 = 0; j0 < V; j0 += CHUNK) {
            int64_t n = V - j0 < CHUNK ? V - j0 : CHUNK;
            float cm = chunk_max(x + j0, n);
            if (cm > m) {
                if (s != 0) s *= exp((double)m - (double)cm);
                m = cm;
            }
            s += chunk_sumexp(x + j0, n, m);
        }
        float l = m + (float)log(s);
        lse[i] = l;
        int64_t t = tgt_at(targets, tgt_i64, i);
        row_loss[i] = t == ignore_index ? 0.0f : l - x[t];
    }
}

void mmc_cpu_xent_bwd(const float *logits, const void *targets, bool tgt_i64, int64_t ignore_index,
                      const float *lse, float scale, float *dlogits, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (N * V > 65536)
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tgt_at(targets, tgt_i64, i);
        if (t == ignore_index) continue;
        float *d = dlogits + i * V;
        row_softmax_acc(logits + i * V, d, V, lse[i], scale);
        d[t] -= scale;
    }
}
