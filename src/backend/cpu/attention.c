/* attention.c — CPU flash-attention kernels (see attention.h). Mirrors the algorithm of
 * FlashAttention-2 (Dao 2023): queries x keys tiles (BR x BC = 64 x 64), online softmax in
 * the log2 domain, logsumexp saved for backward; backward recomputes P per tile from the
 * logsumexp and uses D_i = rowsum(dO ∘ O).
 *
 * Every tile product is a small GEMM C[M, N] (+)= A[M, K] · B[K, N] run by one register-
 * blocked micro-kernel (4 rows x up to 64 columns of f32 accumulators, AVX-512). A is read
 * by broadcasts, so it may be strided either way (which spares transposing P and dS);
 * B rows must be contiguous, so K (forward) and Q, dO (backward) are transposed once per
 * call into scratch.
 *
 * Work split. Forward: one unit per (batch, query head, query tile), dynamic schedule.
 * Backward: one unit per (batch, query head) looping key tiles (outer) x query tiles
 * (inner); dK/dV of the key tile stay in L1 and are written once, dQ rows of that head are
 * owned by the unit. With grouped-query heads, each query head writes its own dK/dV slice
 * in scratch and the group is summed afterwards in head order — no atomics, and the result
 * does not depend on the thread count.
 */
#include "attention.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define BR 64 /* query rows per tile */
#define BC 64 /* keys per tile */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

static int tid_(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ------------------------------------------------------------------ micro-kernel
 * C[M, N] = (acc ? C : 0) + A · B; A(i, k) = A[i * ars + k * acs]; B row k at B + k * ldb. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void mk_block(int mr, int nv, int K, const float *A,
                                                           int64_t ars, int64_t acs, const float *B,
                                                           int64_t ldb, float *C, int64_t ldc,
                                                           bool acc, const __mmask16 *mk) {
    __m512 c[4][4];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) c[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 b[4];
        const float *bk = B + (int64_t)k * ldb;
        for (int v = 0; v < nv; v++) b[v] = _mm512_maskz_loadu_ps(mk[v], bk + 16 * v);
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[r * ars + k * acs]);
            for (int v = 0; v < nv; v++) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) {
            float *p = C + r * ldc + 16 * v;
            __m512 x = c[r][v];
            if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], p));
            _mm512_mask_storeu_ps(p, mk[v], x);
        }
}

#define MK_CASE(MR, NV) mk_block(MR, NV, K, A + (int64_t)i * ars, ars, acs, B + j, ldb, C + (int64_t)i * ldc + j, ldc, acc, mk)
static void mm(int M, int N, int K, const float *A, int64_t ars, int64_t acs, const float *B,
               int64_t ldb, float *C, int64_t ldc, bool acc) {
    for (int j = 0; j < N; j += 64) {
        int nw = imin(64, N - j), nv = (nw + 15) / 16;
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) {
            int rem = nw - 16 * v;
            mk[v] = rem >= 16 ? (__mmask16)0xFFFF : rem > 0 ? (__mmask16)((1u << rem) - 1) : 0;
        }
        int i = 0;
        for (; i + 4 <= M; i += 4) switch (nv) {
            case 1: MK_CASE(4, 1); break;
            case 2: MK_CASE(4, 2); break;
            case 3: MK_CASE(4, 3); break;
            default: MK_CASE(4, 4); break;
            }
        for (; i < M; i++) switch (nv) {
            case 1: MK_CASE(1, 1); break;
            case 2: MK_CASE(1, 2); break;
            case 3: MK_CASE(1, 3); break;
            default: MK_CASE(1, 4); break;
            }
    }
}
#undef MK_CASE

/* 2^x for x in about [-127, 127]: round, degree-7 polynomial of e^(f ln2), scalef. */
static inline __m512 exp2_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(127.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381608e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
static inline __mmask16 lanes_(int lo, int hi, int c) { /* lanes c..c+15 inside [lo, hi) */
    uint32_t m = 0xFFFF;
    int a = lo - c, b = hi - c;
    if (a > 0) m = a >= 16 ? 0 : m & ~((1u << a) - 1);
    if (b < 16) m = b <= 0 ? 0 : m & ((1u << b) - 1);
    return (__mmask16)m;
}
#else
static void mm(int M, int N, int K, const float *A, int64_t ars, int64_t acs, const float *B,
               int64_t ldb, float *C, int64_t ldc, bool acc) {
    for (int i = 0; i < M; i++) {
        float *c = C + (int64_t)i * ldc;
        if (!acc) memset(c, 0, (size_t)N * sizeof(float));
        for (int k = 0; k < K; k++) {
            float a = A[i * ars + k * acs];
            const float *b = B + (int64_t)k * ldb;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}
#endif

/* x[c] = 2^(x[c] * mul - sub) for c in [lo, hi), 0 elsewhere (c < n); returns the sum. */
static float exp2_row(float *x, int n, float mul, float sub, int lo, int hi) {
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(mul), vs = _mm512_set1_ps(sub), acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        __mmask16 ld = lanes_(0, n, c), ok = lanes_(lo, hi, c);
        __m512 v = _mm512_maskz_loadu_ps(ld, x + c);
        v = _mm512_maskz_mov_ps(ok, exp2_ps(_mm512_fmsub_ps(v, vm, vs)));
        acc = _mm512_add_ps(acc, v);
        _mm512_mask_storeu_ps(x + c, ld, v);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;
    for (int c = 0; c < n; c++) {
        float v = (c >= lo && c < hi) ? exp2f(x[c] * mul - sub) : 0.0f;
        x[c] = v;
        s += v;
    }
    return s;
#endif
}

static float max_row(const float *x, int lo, int hi) {
    float m = -INFINITY;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int c = lo & ~15; c < hi; c += 16)
        vm = _mm512_mask_max_ps(vm, lanes_(lo, hi, c), vm, _mm512_maskz_loadu_ps(lanes_(lo, hi, c), x + c));
    m = _mm512_reduce_max_ps(vm);
#else
    for (int c = lo; c < hi; c++) m = x[c] > m ? x[c] : m;
#endif
    return m;
}

static inline void scale_row(float *x, int n, float s) {
    for (int c = 0; c < n; c++) x[c] *= s;
}

static float dot(const float *a, const float *b, int n) {
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        __mmask16 m = lanes_(0, n, c);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0;
    for (int c = 0; c < n; c++) s += a[c] * b[c];
    return s;
#endif
}

/* ------------------------------------------------------------------ segments */
typedef struct { int q0, k0, nq, nk; } seg_t;

static int n_segs(const mmc_attn_args *a) { return a->cu_seqlens ? a->n_seqs : 1; }
static seg_t get_seg(const mmc_attn_args *a, int i) {
    seg_t s;
    if (a->cu_seqlens) {
        s.q0 = s.k0 = a->cu_seqlens[i];
        s.nq = s.nk = a->cu_seqlens[i + 1] - a->cu_seqlens[i];
    } else {
        s.q0 = s.k0 = 0;
        s.nq = a->T;
        s.nk = a->S;
    }
    return s;
}
/* keys [0, hi) of the segment visible to segment row r */
static inline int row_hi(const mmc_attn_args *a, const seg_t *s, int r) {
    return a->causal ? imax(0, imin(s->nk, r + s->nk - s->nq + 1)) : s->nk;
}

/* src rows (n rows, row stride ld, width w) -> dst [w][n] (row stride ldd), times mul */
static void transpose_rows(const float *src, int64_t ld, int n, int w, float *dst, int64_t ldd, float mul) {
    for (int i0 = 0; i0 < n; i0 += 16)
        for (int d0 = 0; d0 < w; d0 += 16)
            for (int i = i0; i < imin(n, i0 + 16); i++)
                for (int d = d0; d < imin(w, d0 + 16); d++)
                    dst[(int64_t)d * ldd + i] = src[(int64_t)i * ld + d] * mul;
}

/* ------------------------------------------------------------------ forward */
static size_t fwd_thread_floats(const mmc_attn_args *a) {
    return align64(sizeof(float) * ((size_t)BR * BC + (size_t)BR * a->Dv + 2 * BR + BC)) / sizeof(float);
}
static size_t n_qtiles(const mmc_attn_args *a) {
    size_t n = 0;
    for (int i = 0; i < n_segs(a); i++) n += (size_t)(get_seg(a, i).nq + BR - 1) / BR;
    return n;
}

size_t mmc_attn_fwd_scratch(const mmc_attn_args *a, int nthreads) {
    size_t kt = a->T > 1 ? align64(sizeof(float) * (size_t)a->B * a->Hkv * a->D * a->S) : 0;
    return kt + align64(sizeof(int32_t) * 2 * n_qtiles(a)) +
           sizeof(float) * fwd_thread_floats(a) * (size_t)nthreads + 64;
}

/* Decode path (one query row per head): dot products straight from K, no transpose. */
static void fwd_row(const mmc_attn_args *a, int b, int h, const seg_t *sg, int r, float *s,
                    float *o, float *out, float *lse) {
    const int G = a->Hq / a->Hkv, hk = h / G, D = a->D, Dv = a->Dv;
    const float *q = a->q + b * a->sq[0] + (int64_t)(sg->q0 + r) * a->sq[1] + h * a->sq[2];
    const float c = a->scale * LOG2E;
    float m = -INFINITY, l = 0;
    int hi = row_hi(a, sg, r);
    memset(o, 0, sizeof(float) * Dv);
    for (int k0 = 0; k0 < hi; k0 += BC) {
        int bc = imin(BC, hi - k0);
        const float *kb = a->k + b * a->sk[0] + (int64_t)(sg->k0 + k0) * a->sk[1] + hk * a->sk[2];
        for (int j = 0; j < bc; j++) s[j] = dot(q, kb + j * a->sk[1], D);
        float mx = max_row(s, 0, bc) * c, mnew = fmaxf(m, mx);
        float alpha = exp2f(m - mnew);
        l = l * alpha + exp2_row(s, bc, c, mnew, 0, bc);
        if (alpha != 1.0f) scale_row(o, Dv, alpha);
        m = mnew;
        const float *vb = a->v + b * a->sv[0] + (int64_t)(sg->k0 + k0) * a->sv[1] + hk * a->sv[2];
        mm(1, Dv, bc, s, 0, 1, vb, a->sv[1], o, Dv, true);
    }
    float *y = out + (((int64_t)b * a->T + sg->q0 + r) * a->Hq + h) * Dv;
    float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int d = 0; d < Dv; d++) y[d] = o[d] * inv;
    if (lse) lse[((int64_t)b * a->Hq + h) * a->T + sg->q0 + r] = l > 0 ? m * LN2 + logf(l) : -INFINITY;
}

/* Fork/join costs microseconds (milliseconds when the cores are oversubscribed): only
 * parallelise when the attention is big enough to pay for it. */
static inline bool par_ok(const mmc_attn_args *a) {
    return (double)a->B * a->Hq * a->T * a->S * (a->D + a->Dv) > 4e5;
}

void mmc_attn_fwd_f32(const mmc_attn_args *a, float *out, float *lse, void *scratch) {
    const int B = a->B, Hq = a->Hq, Hkv = a->Hkv, D = a->D, Dv = a->Dv, S = a->S;
    const int G = Hq / Hkv;
    char *sp = scratch;
    float *KT = NULL;                                   /* [B, Hkv, D, S] */
    if (a->T > 1) {
        KT = (float *)sp;
        sp += align64(sizeof(float) * (size_t)B * Hkv * D * S);
    }
    int32_t *tiles = (int32_t *)sp;                     /* (segment, first row) pairs */
    size_t nt = n_qtiles(a);
    sp += align64(sizeof(int32_t) * 2 * nt);
    float *thr = (float *)sp;
    size_t tf = fwd_thread_floats(a);
    {
        size_t t = 0;
        for (int i = 0; i < n_segs(a); i++)
            for (int r = 0; r < get_seg(a, i).nq; r += BR) { tiles[2 * t] = i; tiles[2 * t + 1] = r; t++; }
    }
    if (KT) {
        const int nsb = (S + 63) / 64;
#pragma omp parallel for schedule(static) if (par_ok(a))
        for (int64_t u = 0; u < (int64_t)B * Hkv * nsb; u++) {
            int b = (int)(u / ((int64_t)Hkv * nsb)), hk = (int)(u / nsb % Hkv), s0 = (int)(u % nsb) * 64;
            transpose_rows(a->k + b * a->sk[0] + (int64_t)s0 * a->sk[1] + hk * a->sk[2], a->sk[1],
                           imin(64, S - s0), D, KT + ((int64_t)b * Hkv + hk) * D * S + s0, S, 1.0f);
        }
    }
    const float c = a->scale * LOG2E;
    const int64_t nunits = (int64_t)B * Hq * (int64_t)nt;
#pragma omp parallel for schedule(dynamic, 1) if (par_ok(a))
    for (int64_t u = 0; u < nunits; u++) {
        float *s = thr + tf * (size_t)tid_();           /* [BR, BC] */
        float *o = s + BR * BC;                         /* [BR, Dv] */
        float *m = o + (size_t)BR * Dv, *l = m + BR;    /* [BR] */
        int b = (int)(u / ((int64_t)Hq * nt)), h = (int)(u / (int64_t)nt % Hq);
        size_t ti = (size_t)(u % (int64_t)nt);
        seg_t sg = get_seg(a, tiles[2 * ti]);
        int r0 = tiles[2 * ti + 1], br = imin(BR, sg.nq - r0), hk = h / G;
        if (!KT) {
            for (int r = r0; r < r0 + br; r++) fwd_row(a, b, h, &sg, r, s, o, out, lse);
            continue;
        }
        const float *q = a->q + b * a->sq[0] + (int64_t)(sg.q0 + r0) * a->sq[1] + h * a->sq[2];
        const float *kt = KT + ((int64_t)b * Hkv + hk) * D * S + sg.k0;
        const float *vb = a->v + b * a->sv[0] + (int64_t)sg.k0 * a->sv[1] + hk * a->sv[2];
        for (int r = 0; r < br; r++) { m[r] = -INFINITY; l[r] = 0; }
        memset(o, 0, sizeof(float) * (size_t)br * Dv);
        int khi = row_hi(a, &sg, r0 + br - 1);           /* last row sees the most keys */
        for (int k0 = 0; k0 < khi; k0 += BC) {
            int bc = imin(BC, khi - k0);
            mm(br, bc, D, q, a->sq[1], 1, kt + k0, S, s, BC, false);   /* S = Q Kᵀ */
            for (int r = 0; r < br; r++) {
                float *sr = s + r * BC;
                int hi = imin(bc, row_hi(a, &sg, r0 + r) - k0);
                if (hi <= 0) { memset(sr, 0, sizeof(float) * bc); continue; }
                float mnew = fmaxf(m[r], max_row(sr, 0, hi) * c);
                float alpha = exp2f(m[r] - mnew);
                l[r] = l[r] * alpha + exp2_row(sr, bc, c, mnew, 0, hi);
                if (alpha != 1.0f) scale_row(o + (size_t)r * Dv, Dv, alpha);
                m[r] = mnew;
            }
            mm(br, Dv, bc, s, BC, 1, vb + (int64_t)k0 * a->sv[1], a->sv[1], o, Dv, true); /* O += P V */
        }
        for (int r = 0; r < br; r++) {
            float *y = out + (((int64_t)b * a->T + sg.q0 + r0 + r) * Hq + h) * Dv;
            float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
            for (int d = 0; d < Dv; d++) y[d] = o[(size_t)r * Dv + d] * inv;
            if (lse)
                lse[((int64_t)b * Hq + h) * a->T + sg.q0 + r0 + r] =
                    l[r] > 0 ? m[r] * LN2 + logf(l[r]) : -INFINITY;
        }
    }
}

/* ------------------------------------------------------------------ backward */
static size_t bwd_thread_floats(const mmc_attn_args *a) {
    return align64(sizeof(float) * ((size_t)2 * BC * BR + (size_t)BC * (a->D + a->Dv))) / sizeof(float);
}

size_t mmc_attn_bwd_scratch(const mmc_attn_args *a, int nthreads, bool need_dk, bool need_dv) {
    const size_t B = a->B, Hq = a->Hq, T = a->T, S = a->S, D = a->D, Dv = a->Dv;
    const bool grp = a->Hq != a->Hkv;
    return align64(sizeof(float) * B * Hq * D * T) + align64(sizeof(float) * B * Hq * Dv * T) +
           2 * align64(sizeof(float) * B * Hq * T) +
           (grp && need_dk ? align64(sizeof(float) * B * Hq * S * D) : 0) +
           (grp && need_dv ? align64(sizeof(float) * B * Hq * S * Dv) : 0) +
           sizeof(float) * bwd_thread_floats(a) * (size_t)nthreads + 64;
}

void mmc_attn_bwd_f32(const mmc_attn_args *a, const float *out, const float *dout,
                      const float *lse, float *dq, float *dk, float *dv, void *scratch) {
    const int B = a->B, T = a->T, S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D, Dv = a->Dv;
    const int G = Hq / Hkv;
    const bool grp = G > 1;
    char *sp = scratch;
    float *QT = (float *)sp;   sp += align64(sizeof(float) * (size_t)B * Hq * D * T);  /* [B, Hq, D, T] * scale*log2e */
    float *dOT = (float *)sp;  sp += align64(sizeof(float) * (size_t)B * Hq * Dv * T); /* [B, Hq, Dv, T] */
    float *L2 = (float *)sp;   sp += align64(sizeof(float) * (size_t)B * Hq * T);      /* lse * log2e */
    float *Dd = (float *)sp;   sp += align64(sizeof(float) * (size_t)B * Hq * T);      /* rowsum(dO∘O) */
    float *dKh = NULL, *dVh = NULL;                                                     /* [B, Hq, S, D|Dv] */
    if (grp && dk) { dKh = (float *)sp; sp += align64(sizeof(float) * (size_t)B * Hq * S * D); }
    if (grp && dv) { dVh = (float *)sp; sp += align64(sizeof(float) * (size_t)B * Hq * S * Dv); }
    float *thr = (float *)sp;
    const size_t tf = bwd_thread_floats(a);
    const float c = a->scale * LOG2E;

    /* prologue: transposes, D_i, lse in log2 units */
    const int ntb = (T + 63) / 64;
#pragma omp parallel for schedule(static) if (par_ok(a))
    for (int64_t u = 0; u < (int64_t)B * Hq * ntb; u++) {
        int b = (int)(u / ((int64_t)Hq * ntb)), h = (int)(u / ntb % Hq), t0 = (int)(u % ntb) * 64;
        int n = imin(64, T - t0);
        int64_t bh = (int64_t)b * Hq + h;
        transpose_rows(a->q + b * a->sq[0] + (int64_t)t0 * a->sq[1] + h * a->sq[2], a->sq[1], n, D,
                       QT + bh * D * T + t0, T, c);
        const float *go = dout + (((int64_t)b * T + t0) * Hq + h) * Dv;
        const float *o = out + (((int64_t)b * T + t0) * Hq + h) * Dv;
        transpose_rows(go, (int64_t)Hq * Dv, n, Dv, dOT + bh * Dv * T + t0, T, 1.0f);
        for (int t = 0; t < n; t++) {
            Dd[bh * T + t0 + t] = dot(go + (int64_t)t * Hq * Dv, o + (int64_t)t * Hq * Dv, Dv);
            float x = lse[bh * T + t0 + t];
            L2[bh * T + t0 + t] = isinf(x) ? INFINITY : x * LOG2E;   /* empty row: P = 0 */
        }
    }

#pragma omp parallel for schedule(dynamic, 1) if (par_ok(a))
    for (int64_t u = 0; u < (int64_t)B * Hq; u++) {
        float *PT = thr + tf * (size_t)tid_();  /* [BC, BR] P, transposed */
        float *dST = PT + BC * BR;              /* [BC, BR] dS * scale, transposed */
        float *gk = dST + BC * BR;              /* [BC, D] */
        float *gv = gk + (size_t)BC * D;        /* [BC, Dv] */
        int b = (int)(u / Hq), h = (int)(u % Hq), hk = h / G;
        int64_t bh = (int64_t)b * Hq + h;
        for (int si = 0; si < n_segs(a); si++) {
            seg_t sg = get_seg(a, si);
            int off = sg.nk - sg.nq;
            const float *kb = a->k + b * a->sk[0] + (int64_t)sg.k0 * a->sk[1] + hk * a->sk[2];
            const float *vb = a->v + b * a->sv[0] + (int64_t)sg.k0 * a->sv[1] + hk * a->sv[2];
            const float *qb = a->q + b * a->sq[0] + (int64_t)sg.q0 * a->sq[1] + h * a->sq[2];
            const float *gob = dout + (((int64_t)b * T + sg.q0) * Hq + h) * Dv;
            const float *qt = QT + bh * D * T + sg.q0, *dot_ = dOT + bh * Dv * T + sg.q0;
            const float *l2 = L2 + bh * T + sg.q0, *dd = Dd + bh * T + sg.q0;
            for (int k0 = 0; k0 < sg.nk; k0 += BC) {
                int bc = imin(BC, sg.nk - k0);
                memset(gk, 0, sizeof(float) * (size_t)BC * D);
                memset(gv, 0, sizeof(float) * (size_t)BC * Dv);
                /* first query row that sees key k0: r + off >= k0 */
                int rfirst = a->causal ? imax(0, k0 - off) : 0;
                for (int r0 = rfirst / BR * BR; r0 < sg.nq; r0 += BR) {
                    int br = imin(BR, sg.nq - r0);
                    /* Sᵀ (log2 units) = K Qᵀ * scale*log2e ; dPᵀ = V dOᵀ */
                    mm(bc, br, D, kb + (int64_t)k0 * a->sk[1], a->sk[1], 1, qt + r0, T, PT, BR, false);
                    mm(bc, br, Dv, vb + (int64_t)k0 * a->sv[1], a->sv[1], 1, dot_ + r0, T, dST, BR, false);
                    for (int j = 0; j < bc; j++) {
                        float *p = PT + j * BR, *ds = dST + j * BR;
                        /* key k0+j visible to rows r with r0 + r + off >= k0 + j */
                        int lo = a->causal ? imax(0, imin(br, k0 + j - off - r0)) : 0;
#if defined(__AVX512F__)
                        __m512 vs = _mm512_set1_ps(a->scale);
                        for (int r = 0; r < br; r += 16) {
                            __mmask16 ld = lanes_(0, br, r), ok = lanes_(lo, br, r);
                            __m512 x = _mm512_maskz_loadu_ps(ld, p + r);
                            x = _mm512_sub_ps(x, _mm512_maskz_loadu_ps(ld, l2 + r0 + r));
                            __m512 pv = _mm512_maskz_mov_ps(ok, exp2_ps(x));
                            __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(ld, ds + r),
                                                     _mm512_maskz_loadu_ps(ld, dd + r0 + r));
                            _mm512_mask_storeu_ps(p + r, ld, pv);
                            _mm512_mask_storeu_ps(ds + r, ld, _mm512_mul_ps(_mm512_mul_ps(pv, g), vs));
                        }
#else
                        for (int r = 0; r < br; r++) {
                            float pv = r >= lo ? exp2f(p[r] - l2[r0 + r]) : 0.0f;
                            p[r] = pv;
                            ds[r] = pv * (ds[r] - dd[r0 + r]) * a->scale;
                        }
#endif
                    }
                    if (dv) mm(bc, Dv, br, PT, BR, 1, gob + (int64_t)r0 * Hq * Dv, (int64_t)Hq * Dv, gv, Dv, true);
                    if (dk) mm(bc, D, br, dST, BR, 1, qb + (int64_t)r0 * a->sq[1], a->sq[1], gk, D, true);
                    if (dq) /* dQ rows += dS K : A = (dSᵀ)ᵀ read with swapped strides */
                        mm(br, D, bc, dST, 1, BR, kb + (int64_t)k0 * a->sk[1], a->sk[1],
                           dq + (((int64_t)b * T + sg.q0 + r0) * Hq + h) * D, (int64_t)Hq * D, true);
                }
                for (int j = 0; j < bc; j++) {
                    int64_t s = sg.k0 + k0 + j;
                    if (dk) {
                        float *dst = grp ? dKh + (bh * S + s) * D : dk + (((int64_t)b * S + s) * Hkv + hk) * D;
                        const float *src = gk + (size_t)j * D;
                        if (grp) memcpy(dst, src, sizeof(float) * D);
                        else for (int d = 0; d < D; d++) dst[d] += src[d];
                    }
                    if (dv) {
                        float *dst = grp ? dVh + (bh * S + s) * Dv : dv + (((int64_t)b * S + s) * Hkv + hk) * Dv;
                        const float *src = gv + (size_t)j * Dv;
                        if (grp) memcpy(dst, src, sizeof(float) * Dv);
                        else for (int d = 0; d < Dv; d++) dst[d] += src[d];
                    }
                }
            }
        }
    }
    if (!grp) return;
    /* sum the group's per-query-head dK/dV in head order (keys outside every segment
     * cannot occur: segments tile [0, S)) */
#pragma omp parallel for schedule(static) if (par_ok(a))
    for (int64_t u = 0; u < (int64_t)B * S; u++) {
        int b = (int)(u / S), s = (int)(u % S);
        for (int hk = 0; hk < Hkv; hk++)
            for (int g = 0; g < G; g++) {
                int64_t bh = (int64_t)b * Hq + hk * G + g;
                if (dk) {
                    float *dst = dk + (((int64_t)b * S + s) * Hkv + hk) * D;
                    const float *src = dKh + (bh * S + s) * D;
                    for (int d = 0; d < D; d++) dst[d] += src[d];
                }
                if (dv) {
                    float *dst = dv + (((int64_t)b * S + s) * Hkv + hk) * Dv;
                    const float *src = dVh + (bh * S + s) * Dv;
                    for (int d = 0; d < Dv; d++) dst[d] += src[d];
                }
            }
    }
}
