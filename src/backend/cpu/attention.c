/* attention.c — CPU flash-attention kernels (see attention.h). Mirrors the algorithm of
 * FlashAttention-2 (Dao 2023): queries x keys tiles (BR x BC, from the caches, below), online
 * softmax in the log2 domain, logsumexp saved for backward; backward recomputes P per tile
 * from the logsumexp and uses D_i = rowsum(dO ∘ O).
 *
 * Every tile product is a small GEMM C[M, N] (+)= A[M, K] · B[K, N] run by register-blocked
 * AVX-512 micro-kernels: MR rows x NV vectors of 16 columns of f32 accumulators, the shape
 * picked from N: NV 5 x MR 5 (head_dim 80 in one 80-wide tile instead of 64 + 16, which left
 * the 16-wide rest at a quarter of the FMA rate), NV 4 x MR 6, NV 3 / 2 / 1 x MR 8; wider N in
 * 64-column panels (NV 6 x MR 4 and NV 8 x MR 3, with 6-8 B loads per k step, ran 15-20 %
 * slower than 64 + rest on Zen 5). A is read by broadcasts, so it may be strided either way
 * (which spares transposing P and dS); B rows must be contiguous, so K (forward) and Q, dO
 * (backward) are transposed once into scratch, at a padded stride (pad_ld). The epilogue
 * stores, adds, or (forward P·V) rescales C by the online softmax's per-row correction alpha
 * while adding, so O is never rescaled in a separate pass.
 *
 * exp: 2^x = 2^n · p(f), n = round(x), f = x - n in [-1/2, 1/2], p a degree-5 polynomial
 * fitted (Lawson iterations toward the minimax relative error; our fit) to 2^f: 9.2e-8
 * relative error in exact arithmetic; evaluated in f32 (Horner with FMA, then vscalefps) the
 * error is at most 1.6e-7 relative (~1.3 ulp) for x in [-126, 0], measured on a sweep at
 * spacing 2^-16 (test_ops_attention asserts 2e-7). Arguments are <= 0 (scores minus the row
 * maximum, or minus the logsumexp); below -126 the result is exactly 0.
 *
 * Tiles (mmc_attn_tiles, from the L1d and L2 per core that cpuinfo.c reads). Forward: BC
 * keys, so that one K (then V) tile, BC x max(D, Dv) floats — the B operand every row block
 * of the query tile reuses — takes at most half of L1d, capped at 64 (the width of the
 * S = Q Kᵀ register tile); BR query rows, so that the tile's Q rows, S/P and O, BR x (BC + D +
 * Dv) floats, take at most half of L2 (a multiple of 64 in [64, 512]). Backward: BR = 64 (the
 * width of the Sᵀ = K Qᵀ register tile); BC keys, so that the key tile's Pᵀ, dSᵀ and dK/dV
 * accumulators, BC x (2 BR + D + Dv) floats, fit in half of L2 beside the query tile's rows
 * (a multiple of 64 in [64, 256]). Zen 5 (48 KiB L1d, 1 MiB L2), head_dim 80: forward 512 x
 * 64, backward 64 x 256. Measured there at the vision shape (one thread, GFLOP per CPU-second,
 * loaded host, min of 5): forward BR 512: 207, 1024: 206, 256: 195, 128: 183 (BC 128: 211,
 * within the noise); backward BC 256: 205, 128: 204, BR 32: 195. MMC_ATTN_TILES=fwd_br,fwd_bc,
 * bwd_br,bwd_bc overrides. Tiles never depend
 * on the thread count (nor do results); they do depend on the caches, which moves results in
 * the last bits between machines, as the GEMM's KC does.
 *
 * Causal masks: a forward tile skips the query rows that see none of its keys, a backward
 * query tile the keys none of its rows sees, so only the diagonal band is computed masked.
 *
 * Work split. Forward: one unit per (batch, query head, query tile), dynamic schedule, the
 * costliest (causal: last) query tiles handed out first so no thread is left with a big one
 * at the end. Backward: one unit per (batch, query head), which packs its head (Qᵀ, dOᵀ, Q,
 * dO, K; O(T·D) against the O(T·S·D) products) and loops key tiles (outer) x query tiles
 * (inner); dK/dV of the key tile are accumulated in the thread's scratch and written once,
 * dQ rows of that head are owned by the unit, so nothing is accumulated twice or atomically.
 * With grouped-query heads, each query head writes its own dK/dV slice in scratch and the
 * group is summed afterwards in head order (one pass over B·Hq·S·(D + Dv) floats, ~1 % of
 * the T=2048 GQA case by its memory traffic), so the result does not depend on the thread
 * count. Folding the
 * backward's elementwise pass (P, dS) into the epilogues of K Qᵀ and V dOᵀ was tried and
 * measured no faster on Zen 5 (the exp polynomial's registers next to 24 accumulators).
 */
#include "attention.h"
#include "cpuinfo.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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

/* ------------------------------------------------------------------ tiles */
static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

mmc_attn_tiling mmc_attn_tiles(int D, int Dv, int64_t l1d, int64_t l2) {
    if (l1d <= 0) l1d = 32 << 10;
    if (l2 <= 0) l2 = 256 << 10;
    if (D < 1) D = 1;
    if (Dv < 1) Dv = 1;
    const int64_t w = D > Dv ? D : Dv;
    mmc_attn_tiling t;
    /* forward: the K tile (then the V tile) is the B operand every row block reuses: half of
     * L1d, at most the 64 keys of S = Q Kᵀ's widest register tile (4 vectors x 6 rows) */
    t.fwd_bc = (int)clamp64((l1d / 2) / (4 * w) / 16 * 16, 16, 64);
    /* Q rows, S/P and O tiles of a query tile: BR x (BC + D + Dv) floats <= L2 / 2 */
    t.fwd_br = (int)clamp64((l2 / 2) / (4 * ((int64_t)t.fwd_bc + D + Dv)) / 64 * 64, 64, 512);
    /* backward: BR is the width of the Sᵀ = K Qᵀ register tile (4 vectors); the key tile's
     * Pᵀ and dSᵀ tiles and dK/dV accumulators, BC x (2 BR + D + Dv) floats, take half of
     * L2 less the query tile's Q, dO rows and their transposes, BR x 2 (D + Dv) floats */
    t.bwd_br = 64;
    int64_t rest = l2 / 2 - 4 * (int64_t)t.bwd_br * 2 * (D + Dv);
    t.bwd_bc = (int)clamp64(rest / (4 * (2 * (int64_t)t.bwd_br + D + Dv)) / 64 * 64, 64, 256);
    return t;
}

static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static mmc_attn_tiling g_env;   /* fwd_br == 0: no override */
static void read_env(void) {
    const char *s = getenv("MMC_ATTN_TILES");
    int v[4];
    if (s && sscanf(s, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]) == 4) {
        for (int i = 0; i < 4; i++)
            if (v[i] < 1 || v[i] > 1024) return;
        g_env = (mmc_attn_tiling){v[0], v[1], v[2], v[3]};
    }
}
static mmc_attn_tiling g_forced;   /* mmc_attn_force_tiles; fwd_br == 0: none */
void mmc_attn_force_tiles(const mmc_attn_tiling *t) {
    g_forced = t ? *t : (mmc_attn_tiling){0};
}
static mmc_attn_tiling tiles(const mmc_attn_args *a) {
    if (g_forced.fwd_br) return g_forced;
    pthread_once(&g_env_once, read_env);
    if (g_env.fwd_br) return g_env;
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    return mmc_attn_tiles(a->D, a->Dv, ci->cache.l1d.size, ci->cache.l2.size);
}

/* ------------------------------------------------------------------ micro-kernels
 * C[M, N] (ep) A · B; A(i, k) = A[i * ars + k * acs]; B row k at B + k * ldb.
 * ep: EP_SET C = A·B, EP_ADD C += A·B, EP_SCALE C = alpha[i] * C + A·B. */
enum { EP_SET, EP_ADD, EP_SCALE };
#if defined(__AVX512F__)
#define MR_MAX 8
#define NV_MAX 5
static inline __attribute__((always_inline)) void ukr(const int mr, const int nv, int K, const float *A,
                                                      int64_t ars, int64_t acs, const float *B, int64_t ldb,
                                                      float *C, int64_t ldc, int ep, const float *alpha,
                                                      __mmask16 ml) {
    __m512 c[MR_MAX][NV_MAX];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) c[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m512 b[NV_MAX];
        const float *bk = B + (int64_t)k * ldb;
#pragma GCC unroll 8
        for (int v = 0; v < nv - 1; v++) b[v] = _mm512_loadu_ps(bk + 16 * v);
        b[nv - 1] = _mm512_maskz_loadu_ps(ml, bk + 16 * (nv - 1));
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            __m512 a = _mm512_set1_ps(A[r * ars + k * acs]);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        float *p = C + r * ldc;
        __m512 al = ep == EP_SCALE ? _mm512_set1_ps(alpha[r]) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            __mmask16 m = v == nv - 1 ? ml : (__mmask16)0xFFFF;
            __m512 x = c[r][v];
            if (ep == EP_ADD) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, p + 16 * v));
            else if (ep == EP_SCALE) x = _mm512_fmadd_ps(al, _mm512_maskz_loadu_ps(m, p + 16 * v), x);
            _mm512_mask_storeu_ps(p + 16 * v, m, x);
        }
    }
}

/* One column panel (NV vectors wide, the last masked by ml): MR-row tiles, then the rest. */
#define UK(R) ukr(R, NV, K, A + (int64_t)i * ars, ars, acs, B, ldb, C + (int64_t)i * ldc, ldc, ep, \
                  alpha ? alpha + i : NULL, ml)
#define PANEL(NAME, MR, NVV)                                                                        \
    static void NAME(int M, int K, const float *A, int64_t ars, int64_t acs, const float *B,        \
                     int64_t ldb, float *C, int64_t ldc, int ep, const float *alpha, __mmask16 ml) { \
        enum { NV = NVV };                                                                          \
        int i = 0;                                                                                  \
        for (; i + MR <= M; i += MR) UK(MR);                                                        \
        switch (M - i) {                                                                            \
        case 1: UK(1); break;                                                                       \
        case 2: if (MR > 2) UK(2); break;                                                           \
        case 3: if (MR > 3) UK(3); break;                                                           \
        case 4: if (MR > 4) UK(4); break;                                                           \
        case 5: if (MR > 5) UK(5); break;                                                           \
        case 6: if (MR > 6) UK(6); break;                                                           \
        case 7: if (MR > 7) UK(7); break;                                                           \
        default: break;                                                                             \
        }                                                                                           \
    }
PANEL(panel1, 8, 1)
PANEL(panel2, 8, 2)
PANEL(panel3, 8, 3)
PANEL(panel4, 6, 4)
PANEL(panel5, 5, 5)
#undef PANEL
#undef UK

static void mm(int M, int N, int K, const float *A, int64_t ars, int64_t acs, const float *B, int64_t ldb,
               float *C, int64_t ldc, int ep, const float *alpha) {
    for (int j = 0; j < N;) {
        int rem = N - j, nv = rem > 80 ? 4 : (rem + 15) / 16;
        int w = imin(rem, 16 * nv), last = w - 16 * (nv - 1);
        __mmask16 ml = last >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << last) - 1);
        const float *b = B + j;
        float *c = C + j;
        switch (nv) {
        case 1: panel1(M, K, A, ars, acs, b, ldb, c, ldc, ep, alpha, ml); break;
        case 2: panel2(M, K, A, ars, acs, b, ldb, c, ldc, ep, alpha, ml); break;
        case 3: panel3(M, K, A, ars, acs, b, ldb, c, ldc, ep, alpha, ml); break;
        case 4: panel4(M, K, A, ars, acs, b, ldb, c, ldc, ep, alpha, ml); break;
        default: panel5(M, K, A, ars, acs, b, ldb, c, ldc, ep, alpha, ml); break;
        }
        j += w;
    }
}

/* 2^x for x <= 0 (see the file comment for the error bound); x below -126 (and -inf, NaN)
 * gives exactly 0, so no subnormal P reaches the products (slow on some cores). */
static inline __m512 exp2_ps(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.326472721e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.671512812e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550733745e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402224208e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931469776e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(ok, p, n);
}
static inline __mmask16 lanes_(int lo, int hi, int c) { /* lanes c..c+15 inside [lo, hi) */
    uint32_t m = 0xFFFF;
    int a = lo - c, b = hi - c;
    if (a > 0) m = a >= 16 ? 0 : m & ~((1u << a) - 1);
    if (b < 16) m = b <= 0 ? 0 : m & ((1u << b) - 1);
    return (__mmask16)m;
}
#else
static void mm(int M, int N, int K, const float *A, int64_t ars, int64_t acs, const float *B, int64_t ldb,
               float *C, int64_t ldc, int ep, const float *alpha) {
    for (int i = 0; i < M; i++) {
        float *c = C + (int64_t)i * ldc;
        if (ep == EP_SET) memset(c, 0, (size_t)N * sizeof(float));
        else if (ep == EP_SCALE)
            for (int j = 0; j < N; j++) c[j] *= alpha[i];
        for (int k = 0; k < K; k++) {
            float a = A[i * ars + k * acs];
            const float *b = B + (int64_t)k * ldb;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}
#endif

void mmc_attn_exp2_f32(const float *x, float *y, int64_t n) {
#if defined(__AVX512F__)
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp2_ps(_mm512_maskz_loadu_ps(m, x + i)));
    }
#else
    for (int64_t i = 0; i < n; i++) y[i] = exp2f(x[i]);
#endif
}

/* x[c] = 2^(x[c] * mul - sub) for c in [lo, hi), 0 elsewhere (c < n); returns the sum. */
static float exp2_row(float *x, int n, float mul, float sub, int lo, int hi) {
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(mul), vs = _mm512_set1_ps(sub), acc = _mm512_setzero_ps();
    if (lo == 0) { /* whole vectors below hi, one masked, zeros up to n */
        int c = 0;
        for (; c + 16 <= hi; c += 16) {
            __m512 v = exp2_ps(_mm512_fmsub_ps(_mm512_loadu_ps(x + c), vm, vs));
            acc = _mm512_add_ps(acc, v);
            _mm512_storeu_ps(x + c, v);
        }
        for (; c < n; c += 16) {
            __mmask16 ld = lanes_(0, n, c), ok = lanes_(0, hi, c);
            __m512 v = _mm512_maskz_mov_ps(ok, exp2_ps(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(ok, x + c), vm, vs)));
            acc = _mm512_add_ps(acc, v);
            _mm512_mask_storeu_ps(x + c, ld, v);
        }
        return _mm512_reduce_add_ps(acc);
    }
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

/* m[r] = max(m[r], x[r]); x[r] = 2^(m_old - m_new) (0 where m_old = -inf), n rows */
static void rescale(float *m, float *x, int n) {
#if defined(__AVX512F__)
    for (int r = 0; r < n; r += 16) {
        __mmask16 k = lanes_(0, n, r);
        __m512 mo = _mm512_maskz_loadu_ps(k, m + r);
        __m512 mn = _mm512_max_ps(mo, _mm512_maskz_loadu_ps(k, x + r));
        _mm512_mask_storeu_ps(m + r, k, mn);
        _mm512_mask_storeu_ps(x + r, k, exp2_ps(_mm512_sub_ps(mo, mn)));
    }
#else
    for (int r = 0; r < n; r++) {
        float mn = fmaxf(m[r], x[r]);
        x[r] = exp2f(m[r] - mn);
        m[r] = mn;
    }
#endif
}

static float max_row(const float *x, int lo, int hi) {
    float m = -INFINITY;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    if (lo == 0) { /* whole vectors, then one masked */
        int c = 0;
        for (; c + 16 <= hi; c += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + c));
        if (c < hi) vm = _mm512_mask_max_ps(vm, lanes_(0, hi, c), vm, _mm512_maskz_loadu_ps(lanes_(0, hi, c), x + c));
        return _mm512_reduce_max_ps(vm);
    }
    for (int c = lo & ~15; c < hi; c += 16)
        vm = _mm512_mask_max_ps(vm, lanes_(lo, hi, c), vm, _mm512_maskz_loadu_ps(lanes_(lo, hi, c), x + c));
    m = _mm512_reduce_max_ps(vm);
#else
    for (int c = lo; c < hi; c++) m = x[c] > m ? x[c] : m;
#endif
    return m;
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

/* Leading dimension for a transposed panel of n columns: a multiple of 16 floats whose
 * byte stride is an odd multiple of 64 modulo 4 KiB, so the D rows a micro-kernel walks
 * through fall in different L1 sets (a stride of 4 KiB, e.g. T = 1024, put all of them in one
 * 12-way set: the B loads of S = Q Kᵀ then missed L1 every k step). */
static int64_t pad_ld(int64_t n) {
    int64_t p = (n + 15) / 16 * 16;
    return (p / 16) % 2 ? p : p + 16;
}

/* src rows (n rows, row stride ld, width w) -> dst rows (row stride ldd), contiguous copy */
static void copy_rows(const float *src, int64_t ld, int n, int w, float *dst, int64_t ldd) {
    for (int i = 0; i < n; i++) memcpy(dst + (int64_t)i * ldd, src + (int64_t)i * ld, sizeof(float) * w);
}

/* src rows (n rows, row stride ld, width w) -> dst [w][n] (row stride ldd), times mul */
static void transpose_rows(const float *src, int64_t ld, int n, int w, float *dst, int64_t ldd, float mul) {
#if defined(__AVX512F__)
    /* 16 x 16 blocks in registers: 32-bit, then 64-bit unpacks give 4 x 4 blocks per 128-bit
     * lane, two rounds of 128-bit lane shuffles finish the transpose */
    const __m512 vm = _mm512_set1_ps(mul);
    for (int i0 = 0; i0 < n; i0 += 16) {
        const int ni = imin(16, n - i0);
        const __mmask16 mi = ni == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ni) - 1);
        for (int d0 = 0; d0 < w; d0 += 16) {
            const int nd = imin(16, w - d0);
            const __mmask16 md = nd == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nd) - 1);
            __m512 r[16], t[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = i < ni ? _mm512_maskz_loadu_ps(md, src + (int64_t)(i0 + i) * ld + d0) : _mm512_setzero_ps();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) { /* u[4g + c], lane L: rows 4g..4g+3 of column 4L + c */
                __m512d a0 = _mm512_castps_pd(t[4 * g]), a1 = _mm512_castps_pd(t[4 * g + 1]);
                __m512d a2 = _mm512_castps_pd(t[4 * g + 2]), a3 = _mm512_castps_pd(t[4 * g + 3]);
                r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
                r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
                r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
                r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
            }
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
                __m512 y0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
                __m512 y1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
                t[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
                t[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
                t[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
                t[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
            }
#pragma GCC unroll 16
            for (int d = 0; d < 16; d++)
                if (d < nd) _mm512_mask_storeu_ps(dst + (int64_t)(d0 + d) * ldd + i0, mi, _mm512_mul_ps(t[d], vm));
        }
    }
#else
    for (int i0 = 0; i0 < n; i0 += 16)
        for (int d0 = 0; d0 < w; d0 += 16)
            for (int i = i0; i < imin(n, i0 + 16); i++)
                for (int d = d0; d < imin(w, d0 + 16); d++)
                    dst[(int64_t)d * ldd + i] = src[(int64_t)i * ld + d] * mul;
#endif
}

/* ------------------------------------------------------------------ forward */
static size_t fwd_thread_floats(const mmc_attn_args *a, mmc_attn_tiling t) {
    return align64(sizeof(float) * ((size_t)t.fwd_br * t.fwd_bc + (size_t)t.fwd_br * a->Dv + 3 * (size_t)t.fwd_br)) /
           sizeof(float);
}
static size_t n_qtiles(const mmc_attn_args *a, int br) {
    size_t n = 0;
    for (int i = 0; i < n_segs(a); i++) n += (size_t)(get_seg(a, i).nq + br - 1) / br;
    return n;
}

/* query tiles, costliest first (causal: the most keys), ties in sequence order */
typedef struct { int32_t seg, r0, idx; int64_t cost; } qtile_t;
static int qtile_cmp(const void *x, const void *y) {
    const qtile_t *a = x, *b = y;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* V rows copied contiguous (a strided V tile, e.g. 5 KiB apart as in [T, 16 heads, 80], falls
 * in a quarter of L1's sets) where enough query rows reuse them to repay the copy */
static bool copy_v(const mmc_attn_args *a) { return a->T >= 64; }

size_t mmc_attn_fwd_scratch(const mmc_attn_args *a, int nthreads) {
    mmc_attn_tiling t = tiles(a);
    /* K transposed [B, Hkv, D, pad_ld(S)] (not for decode) and V copied [B, Hkv, S, Dv] */
    size_t kt = a->T > 1 ? align64(sizeof(float) * (size_t)a->B * a->Hkv * a->D * pad_ld(a->S)) : 0;
    if (copy_v(a)) kt += align64(sizeof(float) * (size_t)a->B * a->Hkv * a->S * a->Dv);
    return kt + align64(sizeof(qtile_t) * n_qtiles(a, t.fwd_br)) +
           sizeof(float) * fwd_thread_floats(a, t) * (size_t)nthreads + 64;
}

/* Decode path (one query row per head): dot products straight from K, no transpose. */
static void fwd_row(const mmc_attn_args *a, int bc_, int b, int h, const seg_t *sg, int r, float *s,
                    float *o, float *out, float *lse) {
    const int G = a->Hq / a->Hkv, hk = h / G, D = a->D, Dv = a->Dv;
    const float *q = a->q + b * a->sq[0] + (int64_t)(sg->q0 + r) * a->sq[1] + h * a->sq[2];
    const float c = a->scale * LOG2E;
    float m = -INFINITY, l = 0;
    int hi = row_hi(a, sg, r);
    memset(o, 0, sizeof(float) * Dv);
    for (int k0 = 0; k0 < hi; k0 += bc_) {
        int bc = imin(bc_, hi - k0);
        const float *kb = a->k + b * a->sk[0] + (int64_t)(sg->k0 + k0) * a->sk[1] + hk * a->sk[2];
        for (int j = 0; j < bc; j++) s[j] = dot(q, kb + j * a->sk[1], D);
        float mx = max_row(s, 0, bc) * c, mnew = fmaxf(m, mx);
        float alpha = exp2f(m - mnew);
        l = l * alpha + exp2_row(s, bc, c, mnew, 0, bc);
        const float *vb = a->v + b * a->sv[0] + (int64_t)(sg->k0 + k0) * a->sv[1] + hk * a->sv[2];
        mm(1, Dv, bc, s, 0, 1, vb, a->sv[1], o, Dv, EP_SCALE, &alpha);
        m = mnew;
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
    const mmc_attn_tiling tl = tiles(a);
    const int BR = tl.fwd_br, BC = tl.fwd_bc;
    char *sp = scratch;
    const int64_t ldk = pad_ld(S);
    float *KT = NULL, *VC = NULL;                        /* [B, Hkv, D, ldk], [B, Hkv, S, Dv] */
    if (a->T > 1) {
        KT = (float *)sp;
        sp += align64(sizeof(float) * (size_t)B * Hkv * D * ldk);
    }
    if (copy_v(a)) {
        VC = (float *)sp;
        sp += align64(sizeof(float) * (size_t)B * Hkv * S * Dv);
    }
    qtile_t *tt = (qtile_t *)sp;                        /* query tiles, costliest first */
    const size_t nt = n_qtiles(a, BR);
    sp += align64(sizeof(qtile_t) * nt);
    float *thr = (float *)sp;
    const size_t tf = fwd_thread_floats(a, tl);
    {
        size_t t = 0;
        for (int i = 0; i < n_segs(a); i++) {
            seg_t sg = get_seg(a, i);
            for (int r = 0; r < sg.nq; r += BR, t++) {
                int end = imin(sg.nq, r + BR);
                tt[t] = (qtile_t){i, r, (int32_t)t, (int64_t)row_hi(a, &sg, end - 1) * (end - r)};
            }
        }
        qsort(tt, nt, sizeof *tt, qtile_cmp);
    }
    if (KT) {
        const int nsb = (S + 63) / 64;
#pragma omp parallel for schedule(static) if (par_ok(a))
        for (int64_t u = 0; u < (int64_t)B * Hkv * nsb; u++) {
            int b = (int)(u / ((int64_t)Hkv * nsb)), hk = (int)(u / nsb % Hkv), s0 = (int)(u % nsb) * 64;
            transpose_rows(a->k + b * a->sk[0] + (int64_t)s0 * a->sk[1] + hk * a->sk[2], a->sk[1],
                           imin(64, S - s0), D, KT + ((int64_t)b * Hkv + hk) * D * ldk + s0, ldk, 1.0f);
            if (VC)
                copy_rows(a->v + b * a->sv[0] + (int64_t)s0 * a->sv[1] + hk * a->sv[2], a->sv[1],
                          imin(64, S - s0), Dv, VC + (((int64_t)b * Hkv + hk) * S + s0) * Dv, Dv);
        }
    }
    const float c = a->scale * LOG2E;
    const int64_t nbh = (int64_t)B * Hq, nunits = nbh * (int64_t)nt;
#pragma omp parallel for schedule(dynamic, 1) if (par_ok(a))
    for (int64_t u = 0; u < nunits; u++) {
        float *s = thr + tf * (size_t)tid_();           /* [BR, BC] */
        float *o = s + (size_t)BR * BC;                 /* [BR, Dv] */
        float *m = o + (size_t)BR * Dv, *l = m + BR, *alpha = l + BR; /* [BR] */
        size_t ti = (size_t)(u / nbh);
        int b = (int)(u % nbh / Hq), h = (int)(u % Hq);
        seg_t sg = get_seg(a, tt[ti].seg);
        int r0 = tt[ti].r0, br = imin(BR, sg.nq - r0), hk = h / G;
        if (!KT) {
            for (int r = r0; r < r0 + br; r++) fwd_row(a, BC, b, h, &sg, r, s, o, out, lse);
            continue;
        }
        const float *q = a->q + b * a->sq[0] + (int64_t)(sg.q0 + r0) * a->sq[1] + h * a->sq[2];
        const float *kt = KT + ((int64_t)b * Hkv + hk) * D * ldk + sg.k0;
        const float *vb = VC ? VC + (((int64_t)b * Hkv + hk) * S + sg.k0) * Dv
                             : a->v + b * a->sv[0] + (int64_t)sg.k0 * a->sv[1] + hk * a->sv[2];
        const int64_t ldv = VC ? Dv : a->sv[1];
        for (int r = 0; r < br; r++) { m[r] = -INFINITY; l[r] = 0; }
        int khi = row_hi(a, &sg, r0 + br - 1);           /* last row sees the most keys */
        for (int k0 = 0; k0 < khi; k0 += BC) {
            int bc = imin(BC, khi - k0);
            /* rows before rs see none of these keys (causal): skipped, their O kept */
            int rs = a->causal ? imax(0, k0 - (sg.nk - sg.nq) - r0) : 0, nr = br - rs;
            if (k0 == 0 && rs > 0) memset(o, 0, sizeof(float) * (size_t)rs * Dv); /* see no key */
            float *s0 = s + (size_t)rs * BC;
            /* S = Q Kᵀ */
            mm(nr, bc, D, q + (int64_t)rs * a->sq[1], a->sq[1], 1, kt + k0, ldk, s0, BC, EP_SET, NULL);
            /* online softmax: new row maxima, then alpha = 2^(m_old - m_new) 16 rows at a
             * time (m_old = -inf: 0), then P = 2^(S·c - m_new) and l = l·alpha + rowsum P */
            for (int r = rs; r < br; r++)
                alpha[r] = max_row(s + (size_t)r * BC, 0, imin(bc, row_hi(a, &sg, r0 + r) - k0)) * c;
            rescale(m + rs, alpha + rs, nr);
            for (int r = rs; r < br; r++)
                l[r] = l[r] * alpha[r] +
                       exp2_row(s + (size_t)r * BC, bc, c, m[r], 0, imin(bc, row_hi(a, &sg, r0 + r) - k0));
            /* O = alpha ∘ O + P V */
            mm(nr, Dv, bc, s0, BC, 1, vb + (int64_t)k0 * ldv, ldv, o + (size_t)rs * Dv, Dv,
               k0 ? EP_SCALE : EP_SET, alpha + rs);
        }
        if (khi == 0) memset(o, 0, sizeof(float) * (size_t)br * Dv);
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
/* Per thread: the unit's head packed — Qᵀ · scale·log2e and dOᵀ [D|Dv, ldq] (B operands of
 * Sᵀ and dPᵀ), Q and dO rows [T, D|Dv] (B of dK, dV), K rows [S, D] (A of Sᵀ, B of dQ) — then
 * the Pᵀ, dSᵀ tiles [BC, BR] and the dK, dV accumulators [BC, D|Dv]. Packing costs O(T·D) per
 * head against O(T·S·D) of products and keeps every B operand at a stride L1 can hold. */
static size_t bwd_thread_floats(const mmc_attn_args *a, mmc_attn_tiling t) {
    const size_t T = a->T, S = a->S, D = a->D, Dv = a->Dv, ldq = pad_ld(a->T);
    return align64(sizeof(float) * (ldq * (D + Dv) + T * (D + Dv) + S * D + (size_t)2 * t.bwd_bc * t.bwd_br +
                                    (size_t)t.bwd_bc * (D + Dv))) / sizeof(float);
}

size_t mmc_attn_bwd_scratch(const mmc_attn_args *a, int nthreads, bool need_dk, bool need_dv) {
    const size_t B = a->B, Hq = a->Hq, T = a->T, S = a->S, D = a->D, Dv = a->Dv;
    const bool grp = a->Hq != a->Hkv;
    return 2 * align64(sizeof(float) * B * Hq * T) +
           (grp && need_dk ? align64(sizeof(float) * B * Hq * S * D) : 0) +
           (grp && need_dv ? align64(sizeof(float) * B * Hq * S * Dv) : 0) +
           sizeof(float) * bwd_thread_floats(a, tiles(a)) * (size_t)nthreads + 64;
}

void mmc_attn_bwd_f32(const mmc_attn_args *a, const float *out, const float *dout,
                      const float *lse, float *dq, float *dk, float *dv, void *scratch) {
    const int B = a->B, T = a->T, S = a->S, Hq = a->Hq, Hkv = a->Hkv, D = a->D, Dv = a->Dv;
    const int G = Hq / Hkv;
    const bool grp = G > 1;
    const mmc_attn_tiling tl = tiles(a);
    const int BR = tl.bwd_br, BC = tl.bwd_bc;
    const int64_t ldq = pad_ld(T);
    char *sp = scratch;
    float *L2 = (float *)sp;   sp += align64(sizeof(float) * (size_t)B * Hq * T);      /* lse * log2e */
    float *Dd = (float *)sp;   sp += align64(sizeof(float) * (size_t)B * Hq * T);      /* rowsum(dO∘O) */
    float *dKh = NULL, *dVh = NULL;                                                     /* [B, Hq, S, D|Dv] */
    if (grp && dk) { dKh = (float *)sp; sp += align64(sizeof(float) * (size_t)B * Hq * S * D); }
    if (grp && dv) { dVh = (float *)sp; sp += align64(sizeof(float) * (size_t)B * Hq * S * Dv); }
    float *thr = (float *)sp;
    const size_t tf = bwd_thread_floats(a, tl);
    const float c = a->scale * LOG2E;

    /* D_i, lse in log2 units */
#pragma omp parallel for schedule(static) if (par_ok(a))
    for (int64_t u = 0; u < (int64_t)B * Hq; u++) {
        int b = (int)(u / Hq), h = (int)(u % Hq);
        for (int t = 0; t < T; t++) {
            const int64_t row = (((int64_t)b * T + t) * Hq + h) * Dv;
            Dd[u * T + t] = dot(dout + row, out + row, Dv);
            float x = lse[u * T + t];
            L2[u * T + t] = isinf(x) ? INFINITY : x * LOG2E;   /* empty row: P = 0 */
        }
    }

#pragma omp parallel for schedule(dynamic, 1) if (par_ok(a))
    for (int64_t u = 0; u < (int64_t)B * Hq; u++) {
        float *QT = thr + tf * (size_t)tid_();  /* [D, ldq] Qᵀ * scale*log2e */
        float *dOT = QT + (size_t)D * ldq;      /* [Dv, ldq] */
        float *QC = dOT + (size_t)Dv * ldq;     /* [T, D] */
        float *dOC = QC + (size_t)T * D;        /* [T, Dv] */
        float *KC = dOC + (size_t)T * Dv;       /* [S, D] */
        float *PT = KC + (size_t)S * D;         /* [BC, BR] P, transposed */
        float *dST = PT + (size_t)BC * BR;      /* [BC, BR] dS * scale, transposed */
        float *gk = dST + (size_t)BC * BR;      /* [BC, D] */
        float *gv = gk + (size_t)BC * D;        /* [BC, Dv] */
        int b = (int)(u / Hq), h = (int)(u % Hq), hk = h / G;
        const int64_t bh = u;
        {
            const float *qh = a->q + b * a->sq[0] + h * a->sq[2];
            const float *goh = dout + ((int64_t)b * T * Hq + h) * Dv;
            const float *kh = a->k + b * a->sk[0] + hk * a->sk[2];
            transpose_rows(qh, a->sq[1], T, D, QT, ldq, c);
            transpose_rows(goh, (int64_t)Hq * Dv, T, Dv, dOT, ldq, 1.0f);
            copy_rows(qh, a->sq[1], T, D, QC, D);
            copy_rows(goh, (int64_t)Hq * Dv, T, Dv, dOC, Dv);
            copy_rows(kh, a->sk[1], S, D, KC, D);
        }
        for (int si = 0; si < n_segs(a); si++) {
            seg_t sg = get_seg(a, si);
            int off = sg.nk - sg.nq;
            const float *kb = KC + (int64_t)sg.k0 * D;
            const float *vb = a->v + b * a->sv[0] + (int64_t)sg.k0 * a->sv[1] + hk * a->sv[2];
            const float *qb = QC + (int64_t)sg.q0 * D, *gob = dOC + (int64_t)sg.q0 * Dv;
            const float *qt = QT + sg.q0, *dot_ = dOT + sg.q0;
            const float *l2 = L2 + bh * T + sg.q0, *dd = Dd + bh * T + sg.q0;
            for (int k0 = 0; k0 < sg.nk; k0 += BC) {
                int bc = imin(BC, sg.nk - k0);
                memset(gk, 0, sizeof(float) * (size_t)bc * D);
                memset(gv, 0, sizeof(float) * (size_t)bc * Dv);
                /* first query row that sees key k0: r + off >= k0 */
                int rfirst = a->causal ? imax(0, k0 - off) : 0;
                for (int r0 = rfirst / BR * BR; r0 < sg.nq; r0 += BR) {
                    int br = imin(BR, sg.nq - r0);
                    /* keys [k0, k0 + nb) are seen by some row of this query tile (causal) */
                    int nb = a->causal ? imin(bc, r0 + br + off - k0) : bc;
                    /* Sᵀ (log2 units) = K Qᵀ * scale*log2e ; dPᵀ = V dOᵀ */
                    mm(nb, br, D, kb + (int64_t)k0 * D, D, 1, qt + r0, ldq, PT, BR, EP_SET, NULL);
                    mm(nb, br, Dv, vb + (int64_t)k0 * a->sv[1], a->sv[1], 1, dot_ + r0, ldq, dST, BR, EP_SET, NULL);
                    /* key k0+j visible to rows r with r0 + r + off >= k0 + j */
                    const bool full = !a->causal || r0 + off >= k0 + nb - 1;
                    for (int j = 0; j < nb; j++) {
                        float *p = PT + (size_t)j * BR, *ds = dST + (size_t)j * BR;
                        int lo = full ? 0 : imax(0, imin(br, k0 + j - off - r0));
#if defined(__AVX512F__)
                        __m512 vs = _mm512_set1_ps(a->scale);
                        if (lo == 0 && (br & 15) == 0) { /* every row sees key k0+j: no masks */
                            for (int r = 0; r < br; r += 16) {
                                __m512 pv = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(p + r), _mm512_loadu_ps(l2 + r0 + r)));
                                __m512 g = _mm512_sub_ps(_mm512_loadu_ps(ds + r), _mm512_loadu_ps(dd + r0 + r));
                                _mm512_storeu_ps(p + r, pv);
                                _mm512_storeu_ps(ds + r, _mm512_mul_ps(_mm512_mul_ps(pv, g), vs));
                            }
                            continue;
                        }
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
                    if (dv) mm(nb, Dv, br, PT, BR, 1, gob + (int64_t)r0 * Dv, Dv, gv, Dv, EP_ADD, NULL);
                    if (dk) mm(nb, D, br, dST, BR, 1, qb + (int64_t)r0 * D, D, gk, D, EP_ADD, NULL);
                    if (dq) /* dQ rows += dS K : A = (dSᵀ)ᵀ read with swapped strides */
                        mm(br, D, nb, dST, 1, BR, kb + (int64_t)k0 * D, D,
                           dq + (((int64_t)b * T + sg.q0 + r0) * Hq + h) * D, (int64_t)Hq * D, EP_ADD, NULL);
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
