/* conv.c — CPU convolution kernels: im2col / col2im, and Winograd F(4x4, 3x3) for 3x3
 * stride-1 layers (second half of the file; see conv.h and src/ops/conv.c for when each runs).
 *
 * im2col / col2im: the layout torch's CPU "slow_conv2d" uses to turn
 * nn.functional.conv2d into a GEMM, here over a group of images so the GEMMs are wide.
 * Per output row the valid output columns [ow0, ow1) (those whose input column lies inside
 * the image) are computed once, so the inner loops have no bounds tests: stride 1 is a
 * memcpy / a contiguous vector add, other strides a strided gather / scatter-add. */
#include "conv.h"
#include "gemm.h"
#include "elementwise.h"

#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* valid output columns for kernel column kj: 0 <= ow*stride - pad + kj < W */
static void ow_range(const mmc_conv_geom *g, int64_t kj, int64_t *ow0, int64_t *ow1) {
    int64_t lo = g->pad - kj;   /* need ow*stride >= lo */
    int64_t a = lo <= 0 ? 0 : (lo + g->stride - 1) / g->stride;
    int64_t hi = g->W - 1 + g->pad - kj;   /* need ow*stride <= hi */
    int64_t b = hi < 0 ? 0 : hi / g->stride + 1;
    if (b > g->Wo) b = g->Wo;
    if (a > b) a = b;
    *ow0 = a, *ow1 = b;
}

void mmc_cpu_im2col(const float *x, float *col, int64_t nb, int64_t oh0,
                    int64_t oh1, const mmc_conv_geom *g) {
    const int64_t Q = (oh1 - oh0) * g->Wo, kk = g->kh * g->kw, ldc = nb * Q, s = g->stride;
    const int64_t items = nb * g->Cin;
#pragma omp parallel for schedule(static) if (items * kk * Q > 32768)
    for (int64_t it = 0; it < items; it++) {
        const int64_t b = it % nb, ci = it / nb;   /* neighbouring items write neighbouring columns */
        const float *xc = x + (b * g->Cin + ci) * g->H * g->W;
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                float *cr = col + (ci * kk + ki * g->kw + kj) * ldc + b * Q;
                int64_t ow0, ow1;
                ow_range(g, kj, &ow0, &ow1);
                const int64_t off = kj - g->pad;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    const int64_t ih = oh * s - g->pad + ki;
                    float *restrict dst = cr + (oh - oh0) * g->Wo;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, (size_t)g->Wo * sizeof(float));
                        continue;
                    }
                    const float *restrict src = xc + ih * g->W;
                    for (int64_t ow = 0; ow < ow0; ow++) dst[ow] = 0.0f;
                    if (s == 1) {
                        if (ow1 > ow0) memcpy(dst + ow0, src + ow0 + off, (size_t)(ow1 - ow0) * sizeof(float));
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[ow * s + off];
                    }
                    for (int64_t ow = ow1; ow < g->Wo; ow++) dst[ow] = 0.0f;
                }
            }
    }
}

void mmc_cpu_col2im_acc(const float *col, float *dx, int64_t nb, int64_t oh0,
                    int64_t oh1, const mmc_conv_geom *g) {
    const int64_t Q = (oh1 - oh0) * g->Wo, kk = g->kh * g->kw, ldc = nb * Q, s = g->stride;
    const int64_t items = nb * g->Cin;
#pragma omp parallel for schedule(static) if (items * kk * Q > 32768)
    for (int64_t it = 0; it < items; it++) {
        const int64_t b = it % nb, ci = it / nb;
        float *dc = dx + (b * g->Cin + ci) * g->H * g->W;
        for (int64_t ki = 0; ki < g->kh; ki++)
            for (int64_t kj = 0; kj < g->kw; kj++) {
                const float *cr = col + (ci * kk + ki * g->kw + kj) * ldc + b * Q;
                int64_t ow0, ow1;
                ow_range(g, kj, &ow0, &ow1);
                const int64_t off = kj - g->pad;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    const int64_t ih = oh * s - g->pad + ki;
                    if (ih < 0 || ih >= g->H) continue;
                    float *restrict drow = dc + ih * g->W;
                    const float *restrict src = cr + (oh - oh0) * g->Wo;
                    if (s == 1) {
#pragma omp simd
                        for (int64_t ow = ow0; ow < ow1; ow++) drow[ow + off] += src[ow];
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) drow[ow * s + off] += src[ow];
                    }
                }
            }
    }
}

/* ------------------------------------------------------------------ Winograd F(4x4, 3x3)
 * Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (2016), points
 * {0, 1, -1, 2, -2, ∞}: a 4x4 output tile of a 3x3 stride-1 correlation is
 *   Y = Aᵀ [ Σ_c (G w_c Gᵀ) ⊙ (Bᵀ d_c B) ] A       (d_c: the 6x6 input patch of channel c)
 * so the 36 products per tile and channel pair are 36 GEMMs over the channels
 * (K x C times C x tiles), 2.25x fewer multiplies than the direct 4x4x9.
 * The weight gradient uses the same points as F(3x3, 4x4) (the dual split of the same
 * 6-point transform; see the derivation in winograd_dw): with Gy = diag(s) E4 (s the row
 * scales of G, E4 the 4-column Vandermonde rows of A) and E3 the 3-column rows of G/s,
 *   dW_c,k = E3ᵀ [ Σ_tiles (Gy dy_k Gyᵀ) ⊙ (Bᵀ x_c B) ] E3.
 * Vector code: 16 tiles at a time in the lanes of a GCC vector (AVX-512 zmm with
 * -march=native, two ymm / four xmm otherwise). */
typedef float v16 __attribute__((vector_size(64), aligned(4)));
/* Unaligned vector loads and stores through a may_alias type: one zmm move each. (memcpy of a
 * v16 was expanded by GCC 12 into two ymm moves where the tuning prefers 256-bit vectors, and a
 * zmm read of two ymm halves just stored stalls on store forwarding.) */
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));
static inline v16 ld16(const float *p) { return *(const v16u *)p; }
static inline void st16(float *p, v16 v) { *(v16u *)p = v; }
#ifdef __AVX512F__
#define WINO_MR 8
#else
#define WINO_MR 4
#endif
#define WINO_KC 256   /* channels per pass of the micro-kernel (its B panel: 32 KiB) */
/* The stride between the 36 matrices [rows][cols] of transformed tiles or products: one cache
 * line more than their size, so the 36 values of a tile (read or written together by the
 * transforms) fall in different L1 sets instead of one (sizes are multiples of 4 KiB). */
#define WINO_ES(rows, cols) ((rows) * (cols) + 16)

/* Bᵀ d: 6 -> 6 (in[i*si], out[i*so]) */
static inline void bt6(const v16 *in, int si, v16 *out, int so) {
    const v16 d0 = in[0], d1 = in[si], d2 = in[2 * si], d3 = in[3 * si], d4 = in[4 * si], d5 = in[5 * si];
    const v16 a = d4 - 4.0f * d2, b = d3 - 4.0f * d1, c = d4 - d2, e = 2.0f * (d3 - d1);
    out[0] = 4.0f * d0 - 5.0f * d2 + d4;
    out[so] = a + b;
    out[2 * so] = a - b;
    out[3 * so] = c + e;
    out[4 * so] = c - e;
    out[5 * so] = 4.0f * d1 - 5.0f * d3 + d5;
}
/* Aᵀ m: 6 -> 4 */
static inline void at4(const v16 *in, int si, v16 *out, int so) {
    const v16 m0 = in[0], m1 = in[si], m2 = in[2 * si], m3 = in[3 * si], m4 = in[4 * si], m5 = in[5 * si];
    const v16 p12 = m1 + m2, n12 = m1 - m2, p34 = m3 + m4, n34 = m3 - m4;
    out[0] = m0 + p12 + p34;
    out[so] = n12 + 2.0f * n34;
    out[2 * so] = p12 + 4.0f * p34;
    out[3 * so] = n12 + 8.0f * n34 + m5;
}
/* Gy h (dy side of the weight gradient): 4 -> 6 */
static inline void gy6(const v16 *in, int si, v16 *out, int so) {
    const v16 h0 = in[0], h1 = in[si], h2 = in[2 * si], h3 = in[3 * si];
    const v16 pe = h0 + h2, po = h1 + h3, qe = h0 + 4.0f * h2, qo = 2.0f * h1 + 8.0f * h3;
    out[0] = 0.25f * h0;
    out[so] = (pe + po) * (-1.0f / 6);
    out[2 * so] = (pe - po) * (-1.0f / 6);
    out[3 * so] = (qe + qo) * (1.0f / 24);
    out[4 * so] = (qe - qo) * (1.0f / 24);
    out[5 * so] = h3;
}

/* E3ᵀ m (the weight gradient's output side): 6 -> 3 */
static inline void e3t(const v16 *in, int si, v16 *out, int so) {
    const v16 m0 = in[0], m1 = in[si], m2 = in[2 * si], m3 = in[3 * si], m4 = in[4 * si], m5 = in[5 * si];
    const v16 p12 = m1 + m2, p34 = m3 + m4;
    out[0] = m0 + p12 + p34;
    out[so] = m1 - m2 + 2.0f * (m3 - m4);
    out[2 * so] = p12 + 4.0f * p34 + m5;
}
/* G g (weights): 3 -> 6 */
static inline void g6(const v16 *in, int si, v16 *out, int so) {
    const v16 g0 = in[0], g1 = in[si], g2 = in[2 * si], p = g0 + g2, q = g0 + 4.0f * g2;
    out[0] = 0.25f * g0;
    out[so] = (p + g1) * (-1.0f / 6);
    out[2 * so] = (p - g1) * (-1.0f / 6);
    out[3 * so] = (q + 2.0f * g1) * (1.0f / 24);
    out[4 * so] = (q - 2.0f * g1) * (1.0f / 24);
    out[5 * so] = g2;
}

/* Rows [mb * MR, +MR) of U: dst[e * lde + c * MR + i] for e < 36, c < N, i < MR */
static void wino_weight_panel(const float *w, int64_t Cout, int64_t Cin, bool bwd_data, int64_t mb, float *dst0,
                              int64_t lde) {
    const int64_t M = bwd_data ? Cin : Cout, N = bwd_data ? Cout : Cin;
    enum { NC = 16 / WINO_MR };   /* lane l: column c0 + l / WINO_MR, row mb * WINO_MR + l % WINO_MR */
    for (int64_t c0 = 0; c0 < N; c0 += NC) {
            v16 g[9], t[18], u[36];
            float *gf = (float *)g;   /* [9][16] */
#ifdef __AVX512F__
            if (Cout * Cin * 9 < INT32_MAX) {   /* 9 gathers: lane offsets from w's [r][c] pair */
                const float *base = w + (bwd_data ? c0 * Cin + mb * WINO_MR : mb * WINO_MR * Cin + c0) * 9;
                const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
                const __m512i dc = _mm512_srli_epi32(lane, WINO_MR == 8 ? 3 : 2);
                const __m512i dr = _mm512_and_si512(lane, _mm512_set1_epi32(WINO_MR - 1));
                const __m512i cin = _mm512_set1_epi32((int32_t)Cin);
                const __m512i pair = bwd_data ? _mm512_add_epi32(_mm512_mullo_epi32(dc, cin), dr)
                                              : _mm512_add_epi32(_mm512_mullo_epi32(dr, cin), dc);
                const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(pair, _mm512_set1_epi32(9)),
                                                     _mm512_set1_epi32(bwd_data ? 8 : 0));
                const bool full = (mb + 1) * WINO_MR <= M && c0 + NC <= N;
                __mmask16 ok = 0xffff;
                if (!full)
                    for (int l = 0; l < 16; l++)
                        if (mb * WINO_MR + l % WINO_MR >= M || c0 + l / WINO_MR >= N) ok &= (__mmask16)~(1u << l);
                for (int i = 0; i < 9; i++) {
                    const __m512i ii = _mm512_add_epi32(idx, _mm512_set1_epi32(bwd_data ? -i : i));
                    const __m512 v = full ? _mm512_i32gather_ps(ii, base, 4)
                                          : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), ok, ii, base, 4);
                    g[i] = (v16)v;
                }
            } else
#endif
                for (int l = 0; l < 16; l++) {
                    const int64_t c = c0 + l / WINO_MR, r = mb * WINO_MR + l % WINO_MR;
                    const bool ok = r < M && c < N;
                    const float *k = ok ? w + (bwd_data ? c * Cin + r : r * Cin + c) * 9 : NULL;
                    for (int i = 0; i < 9; i++) gf[i * 16 + l] = ok ? k[bwd_data ? 8 - i : i] : 0.0f;
                }
            for (int j = 0; j < 3; j++) g6(g + j, 3, t + j, 3);   /* columns: t [6][3] */
            for (int i = 0; i < 6; i++) g6(t + 3 * i, 1, u + 6 * i, 1);
            /* U[e][mb][c][0..MR) for the NC columns: 16 contiguous floats (fewer at N's end) */
            const size_t n = (size_t)((N - c0 < NC ? N - c0 : NC) * WINO_MR) * sizeof(float);
            float *dst = dst0 + c0 * WINO_MR;
            if (n == sizeof(v16))   /* one vector store (a variable-size copy is rep movs) */
                for (int e = 0; e < 36; e++) st16(dst + e * lde, u[e]);
            else
                for (int e = 0; e < 36; e++) memcpy(dst + e * lde, &u[e], n);
        }
}

static void wino_weight(const float *w, int64_t Cout, int64_t Cin, bool bwd_data, float *U) {
    const int64_t M = bwd_data ? Cin : Cout, N = bwd_data ? Cout : Cin, MB = (M + WINO_MR - 1) / WINO_MR;
#pragma omp parallel for schedule(static) if (Cout * Cin > 4096)
    for (int64_t mb = 0; mb < MB; mb++) wino_weight_panel(w, Cout, Cin, bwd_data, mb, U + mb * N * WINO_MR, MB * N * WINO_MR);
}

/* C[WINO_MR, 32] (+)= Ap [kc][WINO_MR] · B [kc][32] (row stride ldb), C row stride ldc: the
 * register tile of the transformed-domain GEMMs (8 x 32: 16 zmm accumulators; 4 x 32 where
 * the vectors are narrower), fed by the weight transform's packed panels and the input
 * transform's [C][tiles] rows directly, so these GEMMs pack nothing. */
#ifdef __AVX512F__
/* Intrinsics, not GCC vectors: GCC 12 moved the vector-typed B rows through the stack as two
 * 32-byte halves read back as one 64-byte load (a store-forwarding stall each k step) and kept
 * the 16 sums in memory; 0.16 of the FMA peak. Same products, same order. */
static void wino_ukr(int64_t kc, const float *restrict Ap, const float *restrict Bp, int64_t ldb,
                     float *restrict Cm, int64_t ldc, bool acc, const float *An) {
    __m512 c0[WINO_MR], c1[WINO_MR];
#pragma GCC unroll 8
    for (int i = 0; i < WINO_MR; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        if (!(k & 1)) _mm_prefetch((const char *)(An + k * WINO_MR), _MM_HINT_T0);   /* a line: 2 k steps */
        const __m512 b0 = _mm512_loadu_ps(Bp + k * ldb), b1 = _mm512_loadu_ps(Bp + k * ldb + 16);
        const float *a = Ap + k * WINO_MR;
#pragma GCC unroll 8
        for (int i = 0; i < WINO_MR; i++) {
            const __m512 ai = _mm512_set1_ps(a[i]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < WINO_MR; i++) {
        float *c = Cm + i * ldc;
        if (acc) {
            c0[i] = _mm512_add_ps(c0[i], _mm512_loadu_ps(c));
            c1[i] = _mm512_add_ps(c1[i], _mm512_loadu_ps(c + 16));
        }
        _mm512_storeu_ps(c, c0[i]);
        _mm512_storeu_ps(c + 16, c1[i]);
    }
}
#else
static void wino_ukr(int64_t kc, const float *restrict Ap, const float *restrict Bp, int64_t ldb,
                     float *restrict Cm, int64_t ldc, bool acc, const float *An) {
    v16 c0[WINO_MR], c1[WINO_MR];
    for (int i = 0; i < WINO_MR; i++) c0[i] = c1[i] = (v16){0};
    for (int64_t k = 0; k < kc; k++) {
        const v16 b0 = ld16(Bp + k * ldb), b1 = ld16(Bp + k * ldb + 16);
        const float *a = Ap + k * WINO_MR;
        for (int i = 0; i < WINO_MR; i++) {
            c0[i] += a[i] * b0;
            c1[i] += a[i] * b1;
        }
    }
    for (int i = 0; i < WINO_MR; i++) {
        v16 o0 = c0[i], o1 = c1[i];
        if (acc) {
            o0 += ld16(Cm + i * ldc), o1 += ld16(Cm + i * ldc + 16);
        }
        st16(Cm + i * ldc, o0), st16(Cm + i * ldc + 16, o1);
    }
}
#endif

/* Tile grid: tile t of image b covers output rows [4*(a0 + t / tw), +4), columns [4*(t % tw), +4)
 * (a0: the first tile row of the output window, 0 without one). */
typedef struct {
    int64_t th, tw, T, a0; /* tiles per column / row / image (in the window), first tile row */
} tgrid;
static int64_t win_row0(const mmc_wino_geom *g) { return g->row1 > 0 ? g->row0 : 0; }
static int64_t win_row1(const mmc_wino_geom *g) { return g->row1 > 0 ? g->row1 : g->Ho; }
static tgrid grid_of(const mmc_wino_geom *g) {
    tgrid r = {(win_row1(g) - win_row0(g) + 3) / 4, (g->Wo + 3) / 4, 0, win_row0(g) / 4};
    r.T = r.th * r.tw;
    return r;
}

/* Row segments: the tiles [t0, t0 + nt) of a run over B images (t = b * T + a * tw + j) cut at
 * image and tile-row ends, so each segment's tiles (a, j in [j0, j1)) lie along one row. */
typedef struct {
    int64_t b, a, j0, j1, col;   /* image, tile row, tile columns, first column in the run */
} seg;
static int64_t next_seg(const tgrid *G, int64_t t0, int64_t nt, int64_t t, seg *sg) {
    const int64_t tt = t % G->T;
    sg->b = t / G->T, sg->a = G->a0 + tt / G->tw, sg->j0 = tt % G->tw, sg->col = t - t0;
    sg->j1 = G->tw - sg->j0 < t0 + nt - t ? G->tw : sg->j0 + (t0 + nt - t);
    return t + (sg->j1 - sg->j0);
}

/* Lanes l = 0..15 of tiles 4 columns apart, from row p: D_j[l] = p[4l + j] (reads p[0, 80)).
 * Stride-4 deinterleave by two-source shuffles (vpermt2ps with AVX-512). */
typedef int v16i __attribute__((vector_size(64)));
static inline void deint(const float *p, int nj, v16 *D, int sd) {
    const v16 q0 = ld16(p), q1 = ld16(p + 16), q2 = ld16(p + 32), q3 = ld16(p + 48);
    const v16i e01 = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29};
    const v16i e23 = e01 + 2, lo = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, hi = lo + 8;
    const v16 a01 = __builtin_shuffle(q0, q1, e01), b01 = __builtin_shuffle(q2, q3, e01);
    const v16 a23 = __builtin_shuffle(q0, q1, e23), b23 = __builtin_shuffle(q2, q3, e23);
    D[0] = __builtin_shuffle(a01, b01, lo);
    D[sd] = __builtin_shuffle(a01, b01, hi);
    D[2 * sd] = __builtin_shuffle(a23, b23, lo);
    D[3 * sd] = __builtin_shuffle(a23, b23, hi);
    if (nj > 4) {   /* j = 4, 5: j = 0, 1 one tile on */
        const v16 q4 = ld16(p + 64);
        const v16i s1 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
        D[4 * sd] = __builtin_shuffle(D[0], q4, s1);
        D[5 * sd] = __builtin_shuffle(D[sd], q4, s1 + (v16i){0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
    }
}
/* The inverse for 4 outputs a tile: out[4l + j] = o_j[l], 64 floats. */
static inline void inter4(const v16 *o, int so, float *out) {
    const v16i z01 = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}, z23 = z01 + 8;
    const v16i y0 = {0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23}, y1 = y0 + 8;
    const v16 P = __builtin_shuffle(o[0], o[so], z01), P2 = __builtin_shuffle(o[0], o[so], z23);
    const v16 Q = __builtin_shuffle(o[2 * so], o[3 * so], z01), Q2 = __builtin_shuffle(o[2 * so], o[3 * so], z23);
    const v16 r0 = __builtin_shuffle(P, Q, y0), r1 = __builtin_shuffle(P, Q, y1);
    const v16 r2 = __builtin_shuffle(P2, Q2, y0), r3 = __builtin_shuffle(P2, Q2, y1);
    st16(out, r0), st16(out + 16, r1), st16(out + 32, r2), st16(out + 48, r3);
}

/* Row buffer of a segment: rows y0 .. y0 + nr - 1 of the plane (H x W), columns from x0, as
 * nr rows of L floats with zeros outside the plane (the padding, and the slack the 16-lane
 * reads run into). */
static void seg_rows(const float *plane, int64_t H, int64_t W, int64_t y0, int nr, int64_t x0, int64_t L,
                     float *buf) {
    const int64_t i0 = x0 < 0 ? -x0 : 0, i1 = W - x0 < L ? W - x0 : L;
    for (int r = 0; r < nr; r++) {
        float *br = buf + r * L;
        const int64_t y = y0 + r;
        if (y < 0 || y >= H || i1 <= i0) {
            memset(br, 0, (size_t)L * sizeof(float));
            continue;
        }
        if (i0 > 0) memset(br, 0, (size_t)i0 * sizeof(float));
        memcpy(br + i0, plane + y * W + x0 + i0, (size_t)(i1 - i0) * sizeof(float));
        if (i1 < L) memset(br + i1, 0, (size_t)(L - i1) * sizeof(float));
    }
}
/* seg_rows for the forward's input as g says how to read it (mmc_wino_geom: up2, in_scale / in_shift,
 * in_silu) for image b, channel c; plane is that channel's stored plane. */
static void seg_rows_in(const float *plane, const mmc_wino_geom *g, int64_t b, int64_t c, int64_t y0, int nr,
                        int64_t x0, int64_t L, float *buf) {
    if (!g->up2 && !g->in_scale) {
        seg_rows(plane, g->H, g->W, y0, nr, x0, L, buf);
        return;
    }
    const int64_t H = g->H, W = g->W, Ws = g->up2 ? W / 2 : W;
    const int64_t i0 = x0 < 0 ? -x0 : 0, i1 = W - x0 < L ? W - x0 : L;
    const float a = g->in_scale ? g->in_scale[b * g->C + c] : 1.0f, sh = g->in_scale ? g->in_shift[b * g->C + c] : 0.0f;
    for (int r = 0; r < nr; r++) {
        float *br = buf + r * L;
        const int64_t y = y0 + r;
        if (y < 0 || y >= H || i1 <= i0) {
            memset(br, 0, (size_t)L * sizeof(float));
            continue;
        }
        if (i0 > 0) memset(br, 0, (size_t)i0 * sizeof(float));
        if (g->up2) {
            const float *src = plane + (y >> 1) * Ws;
            for (int64_t i = i0; i < i1; i++) br[i] = src[(x0 + i) >> 1];
        } else {
            memcpy(br + i0, plane + y * W + x0 + i0, (size_t)(i1 - i0) * sizeof(float));
        }
        if (g->in_scale) {
            float *v = br + i0;
            const int64_t n = i1 - i0;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) v[j] = v[j] * a + sh;   /* as mmc_cpu_groupnorm_fwd */
            if (g->in_silu) ew_xsigmoid_f32_serial(v, v, 1.0f, n);
        }
        if (i1 < L) memset(br + i1, 0, (size_t)(L - i1) * sizeof(float));
    }
}
/* floats of a row buffer: 6 rows of 4 * (tw rounded up to 16) + 16 */
static int64_t seg_L(const tgrid *G) { return 4 * ((G->tw + 15) / 16 * 16) + 16; }

/* o[e * lde + l] = d[e][l] for l < n (whole vectors when n == 16) */
static inline void store36(float *o, int64_t lde, const v16 *d, int n) {
    if (n == 16)
        for (int e = 0; e < 36; e++) st16(o + e * lde, d[e]);
    else
        for (int e = 0; e < 36; e++)
            for (int l = 0; l < n; l++) o[e * lde + l] = d[e][l];
}

/* Bᵀ d B of the 6x6 input patches (origin 4a - pad, 4j - pad) of the segment's tiles into
 * dst[e * lde + (j - j0)], e = 0..35. */
static void seg_input_bt(const float *plane, const mmc_wino_geom *g, int64_t c, const seg *sg, int64_t L,
                         float *buf, float *dst, int64_t lde) {
    seg_rows_in(plane, g, sg->b, c, 4 * sg->a - g->pad, 6, 4 * sg->j0 - g->pad, L, buf);
    for (int64_t j = sg->j0; j < sg->j1; j += 16) {
        const int n = sg->j1 - j < 16 ? (int)(sg->j1 - j) : 16;
        v16 d[36], t[36];
        for (int r = 0; r < 6; r++) deint(buf + r * L + 4 * (j - sg->j0), 6, d + 6 * r, 1);
        for (int c = 0; c < 6; c++) bt6(d + c, 6, t + c, 6);   /* columns */
        for (int r = 0; r < 6; r++) bt6(t + 6 * r, 1, d + 6 * r, 1);   /* rows */
        store36(dst + (j - sg->j0), lde, d, n);
    }
}

/* Two ways to run the forward, picked from the shapes alone (results do not depend on the
 * thread count either way; U, the transformed weights [36][KB][C][MR], is made once per call):
 *  - units (>= 4 (image, block of tb tiles) units, e.g. a VAE's large image): threads take
 *    whole units: input transform of the block, 36 GEMMs, output transform, no barriers;
 *  - team (fewer: a small image with many channels, 512 channels at 32²): per image, the
 *    input transform of all its tiles in parallel over channels, then the 36 GEMMs as items
 *    of (e, group of output-channel blocks), then the output transform over channels.
 * The GEMMs (wino_gemms) run every block of U[e] against a 32-column panel of V[e] held in L1,
 * prefetching the next block of U[e]. */
static bool fwd_team(const mmc_wino_geom *g, int64_t B, int64_t tb) {
    const tgrid G = grid_of(g);
    return B * ((G.T + tb - 1) / tb) < 4;
}

size_t mmc_cpu_wino_fwd_floats(const mmc_wino_geom *g, int64_t B, int64_t tb, int nth) {
    const tgrid G = grid_of(g);
    const int64_t KB = (g->K + WINO_MR - 1) / WINO_MR;
    if (fwd_team(g, B, tb)) {
        const int64_t T = (G.T + 31) / 32 * 32;
        return (size_t)(36 * (KB * WINO_MR * g->C + WINO_ES(KB * WINO_MR, T) + WINO_ES(g->C, T)) +
                        nth * (WINO_KC * 32 + 6 * seg_L(&G) + 32));
    }
    return (size_t)(36 * KB * WINO_MR * g->C +
                    nth * (36 * (WINO_ES(g->C, tb) + WINO_ES(KB * WINO_MR, tb)) + WINO_KC * 32 + 6 * seg_L(&G) + 32));
}

/* Y = Aᵀ M A for output channel k of the segment's tiles, M[e] at m0 + e * lde (+ tile column) */
static void seg_output(const float *m0, int64_t lde, const seg *sg, const mmc_wino_geom *g, float bv, bool acc,
                       float *yk) {
    for (int64_t j = sg->j0; j < sg->j1; j += 16) {
        const int64_t n = sg->j1 - j < 16 ? sg->j1 - j : 16, ox = 4 * j;
        const int64_t nx = g->Wo - ox < 4 * n ? g->Wo - ox : 4 * n;   /* outputs a row */
        v16 m[36], tt[24], o[16];
        for (int e = 0; e < 36; e++) m[e] = ld16(m0 + e * lde + (j - sg->j0));
        for (int c = 0; c < 6; c++) at4(m + c, 6, tt + c, 6);   /* tt [4][6] */
        for (int i = 0; i < 4; i++) at4(tt + 6 * i, 1, o + 4 * i, 1);
        for (int i = 0; i < 4 && 4 * sg->a + i < win_row1(g); i++) {   /* rows of 4 interleaved back */
            float row[64];
            inter4(o + 4 * i, 1, row);
            float *dst = yk + (4 * sg->a + i - win_row0(g)) * g->Wo + ox;
            if (acc)
                for (int64_t q = 0; q < nx; q++) dst[q] += row[q];
            else
                for (int64_t q = 0; q < nx; q++) dst[q] = row[q] + bv;
        }
    }
}

/* dst [kc][32] = the 32 columns of src [kc rows, stride ld]: a micro-kernel B panel in one piece */
static void copy_panel32(const float *src, int64_t ld, int64_t kc, float *restrict dst) {
    for (int64_t k = 0; k < kc; k++) memcpy(dst + k * 32, src + k * ld, 32 * sizeof(float));
}

/* Mo[e] rows of output-channel blocks [kb0, kb1) = U[e] · V[e] [C, ntp] (ld: V's and Mo's row
 * stride): each 32-column panel of V[e] (kc rows) is copied to Bp, contiguous in L1, and every
 * block of U[e] (U [36][KB][C][MR], from L2) runs against it. Per output the same sums in the
 * same order (channel blocks c0 ascending) whatever the loop order or the blocks' split. */
static void wino_gemms(int e, int64_t kb0, int64_t kb1, int64_t C, int64_t KB, const float *U, const float *V,
                       int64_t ntp, int64_t ld, float *Mo, float *Bp) {
    const float *Ve = V + e * WINO_ES(C, ld);
    float *Me = Mo + e * WINO_ES(KB * WINO_MR, ld);
    for (int64_t c0 = 0; c0 < C; c0 += WINO_KC) {
        const int64_t kc = C - c0 < WINO_KC ? C - c0 : WINO_KC;
        for (int64_t s = 0; s < ntp; s += 32) {
            copy_panel32(Ve + c0 * ld + s, ld, kc, Bp);
            for (int64_t kb = kb0; kb < kb1; kb++) {
                const float *A = U + ((e * KB + kb) * C + c0) * WINO_MR;   /* the next block's A: prefetched */
                wino_ukr(kc, A, Bp, 32, Me + kb * WINO_MR * ld + s, ld, c0 > 0, kb + 1 < kb1 ? A + C * WINO_MR : A);
            }
        }
    }
}

void mmc_cpu_wino_fwd(const float *x, int64_t B, const float *w, bool bwd_data, const float *bias, bool acc,
                      float *y, const mmc_wino_geom *g, int64_t tb, float *scratch) {
    const tgrid G = grid_of(g);
    const int64_t C = g->C, K = g->K, L = seg_L(&G);
    const int64_t P = g->yplane > 0 ? g->yplane : (win_row1(g) - win_row0(g)) * g->Wo;   /* y's plane stride */
    const int64_t HWs = g->up2 ? (g->H / 2) * (g->W / 2) : g->H * g->W;   /* a stored input plane */
    const int64_t KB = (K + WINO_MR - 1) / WINO_MR, KP = KB * WINO_MR;
    const int64_t Cout = bwd_data ? C : K, Cin = bwd_data ? K : C;   /* w [Cout, Cin, 3, 3] */
    if (fwd_team(g, B, tb)) {
        /* Few tiles: the team shares one image's transformed tiles V [36][C][T] and products
         * Mo [36][KP][T]; the 36 GEMMs are items of (e, group of up to 8 output-channel blocks). */
        const int64_t T = (G.T + 31) / 32 * 32, KG = 8, groups = (KB + KG - 1) / KG;
        float *U = scratch, *V = U + 36 * KP * C, *Mo = V + 36 * WINO_ES(C, T), *priv = Mo + 36 * WINO_ES(KP, T);
        const size_t per = (size_t)(WINO_KC * 32 + 6 * L + 32);   /* per thread: Bp, row buffer */
        wino_weight(w, Cout, Cin, bwd_data, U);
        for (int64_t b = 0; b < B; b++) {
#pragma omp parallel
            {
#ifdef _OPENMP
                float *Bp = priv + (size_t)omp_get_thread_num() * per;
#else
                float *Bp = priv;
#endif
                float *buf = Bp + WINO_KC * 32 + 16;
                seg sg;
#pragma omp for schedule(dynamic, 1)
                for (int64_t c = 0; c < C; c++) {
                    for (int64_t t = b * G.T; t < (b + 1) * G.T;) {
                        t = next_seg(&G, b * G.T, G.T, t, &sg);
                        seg_input_bt(x + (b * C + c) * HWs, g, c, &sg, L, buf, V + c * T + sg.col, WINO_ES(C, T));
                    }
                    for (int e = 0; e < 36 && T > G.T; e++)
                        memset(V + e * WINO_ES(C, T) + c * T + G.T, 0, (size_t)(T - G.T) * sizeof(float));
                }
#pragma omp for schedule(dynamic, 1)
                for (int64_t it = 0; it < 36 * groups; it++) {
                    const int64_t kb0 = it % groups * KG;
                    wino_gemms((int)(it / groups), kb0, kb0 + KG < KB ? kb0 + KG : KB, C, KB, U, V, T, T, Mo, Bp);
                }
#pragma omp for schedule(dynamic, 1)
                for (int64_t k = 0; k < K; k++)
                    for (int64_t t = b * G.T; t < (b + 1) * G.T;) {
                        t = next_seg(&G, b * G.T, G.T, t, &sg);
                        seg_output(Mo + k * T + sg.col, WINO_ES(KP, T), &sg, g, bias ? bias[k] : 0.0f, acc,
                                   y + (b * K + k) * P);
                    }
            }
        }
        return;
    }
    float *U = scratch, *priv = U + 36 * KP * C;   /* U [36][KB][C][MR]; per thread: V, Mo, row buffer */
    const size_t per = (size_t)(36 * (WINO_ES(C, tb) + WINO_ES(KP, tb)) + WINO_KC * 32 + 6 * L + 32);
    const int64_t blocks = (G.T + tb - 1) / tb, units = B * blocks;
    wino_weight(w, Cout, Cin, bwd_data, U);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; u++) {
#ifdef _OPENMP
        float *V = priv + (size_t)omp_get_thread_num() * per;
#else
        float *V = priv;
#endif
        float *Mo = V + 36 * WINO_ES(C, tb), *Bp = Mo + 36 * WINO_ES(KP, tb);   /* V [36][C][tb], Mo [36][KP][tb] */
        float *buf = Bp + WINO_KC * 32 + 16;                          /* Bp [WINO_KC][32] */
        const int64_t b = u / blocks, t0 = b * G.T + (u % blocks) * tb;
        const int64_t nt = (b + 1) * G.T - t0 < tb ? (b + 1) * G.T - t0 : tb;
        const int64_t ntp = (nt + 31) / 32 * 32;   /* columns the micro-kernel reads (zero past nt) */
        seg sg;
        for (int64_t c = 0; c < C; c++) {
            for (int64_t t = t0; t < t0 + nt;) {
                t = next_seg(&G, t0, nt, t, &sg);
                seg_input_bt(x + (sg.b * C + c) * HWs, g, c, &sg, L, buf, V + c * tb + sg.col, WINO_ES(C, tb));
            }
            if (ntp > nt)
                for (int e = 0; e < 36; e++)
                    memset(V + e * WINO_ES(C, tb) + c * tb + nt, 0, (size_t)(ntp - nt) * sizeof(float));
        }
        for (int e = 0; e < 36; e++) wino_gemms(e, 0, KB, C, KB, U, V, ntp, tb, Mo, Bp);   /* Mo[e] = U[e] · V[e] */
        for (int64_t k = 0; k < K; k++)
            for (int64_t t = t0; t < t0 + nt;) {
                t = next_seg(&G, t0, nt, t, &sg);
                seg_output(Mo + k * tb + sg.col, WINO_ES(KP, tb), &sg, g, bias ? bias[k] : 0.0f, acc,
                           y + (sg.b * K + k) * P);
            }
    }
}

bool mmc_cpu_wino_fast(void) {
#ifdef __AVX512F__
    return true;
#else
    return false;   /* the 16-lane shuffles lower to scalar code: ~40x slower (measured, AVX2 build) */
#endif
}

size_t mmc_cpu_wino_dw_floats(const mmc_wino_geom *g, int64_t tc) {
    const tgrid G = grid_of(g);
    int nth = 1;
#ifdef _OPENMP
    nth = omp_get_max_threads();
#endif
    return (size_t)(36 * (g->C + g->K) * tc + 36 * g->K * g->C + nth * (6 * seg_L(&G) + 16));
}

/* dW += the weight gradient, tiles over the outputs of all B images in chunks of tc. Each
 * chunk: the transforms of x and dy (parallel over channels), then the 36 GEMMs
 * dWh[e] [K, C] += DY[e] [K, tc] · X[e] [C, tc]ᵀ (parallel over e: each e is one thread's,
 * chunks in order, so the sums do not depend on the thread count). */
void mmc_cpu_wino_dw(const float *x, const float *dy, int64_t B, float *dw, const mmc_wino_geom *g,
                     int64_t tc, float *scratch) {
    const tgrid G = grid_of(g);
    const int64_t C = g->C, K = g->K, HW = g->H * g->W, P = g->Ho * g->Wo, TT = B * G.T, L = seg_L(&G);
    float *X = scratch, *DY = X + 36 * C * tc, *Wh = DY + 36 * K * tc;   /* [36][C][tc], [36][K][tc], [36][K][C] */
    float *bufs = Wh + 36 * K * C;
#pragma omp parallel
    {
#ifdef _OPENMP
        float *buf = bufs + omp_get_thread_num() * (6 * L + 16);
#else
        float *buf = bufs;
#endif
        for (int64_t t0 = 0; t0 < TT; t0 += tc) {
            const int64_t nt = TT - t0 < tc ? TT - t0 : tc;
            seg sg;
#pragma omp for schedule(dynamic, 1)
            for (int64_t ch = 0; ch < C + K; ch++) {
                for (int64_t t = t0; t < t0 + nt;) {
                    t = next_seg(&G, t0, nt, t, &sg);
                    if (ch < C) {
                        seg_input_bt(x + (sg.b * C + ch) * HW, g, ch, &sg, L, buf,
                                     X + ch * tc + sg.col, C * tc);
                        continue;
                    }
                    /* 4x4 dy tiles (zeros past Ho / Wo) -> Gy h Gyᵀ */
                    const int64_t k = ch - C;
                    seg_rows(dy + (sg.b * K + k) * P, g->Ho, g->Wo, 4 * sg.a, 4, 4 * sg.j0, L, buf);
                    for (int64_t j = sg.j0; j < sg.j1; j += 16) {
                        const int n = sg.j1 - j < 16 ? (int)(sg.j1 - j) : 16;
                        v16 h[16], t4[24], d[36];
                        for (int r = 0; r < 4; r++) deint(buf + r * L + 4 * (j - sg.j0), 4, h + 4 * r, 1);
                        for (int c = 0; c < 4; c++) gy6(h + c, 4, t4 + c, 4);   /* t4 [6][4] */
                        for (int r = 0; r < 6; r++) gy6(t4 + 4 * r, 1, d + 6 * r, 1);
                        store36(DY + k * tc + sg.col + (j - sg.j0), K * tc, d, n);
                    }
                }
            }
#pragma omp for schedule(dynamic, 1)
            for (int e = 0; e < 36; e++)
                mmc_gemm_f32(false, true, K, C, nt, 1.0f, DY + e * K * tc, tc, X + e * C * tc, tc,
                             t0 == 0 ? 0.0f : 1.0f, Wh + e * K * C, C);
        }
    }
    /* dW[k, c] += E3ᵀ Wh E3: 6x6 -> 3x3, 16 (k, c) pairs a vector */
    const int64_t KC = K * C;
#pragma omp parallel for schedule(static) if (KC > 4096)
    for (int64_t p0 = 0; p0 < KC; p0 += 16) {
        const int n = KC - p0 < 16 ? (int)(KC - p0) : 16;
        v16 m[36], t[18], o[9];
        for (int e = 0; e < 36; e++) {
            if (n == 16) m[e] = ld16(Wh + e * KC + p0);
            else {
                m[e] = (v16){0};
                for (int l = 0; l < n; l++) m[e][l] = Wh[e * KC + p0 + l];
            }
        }
        for (int j = 0; j < 6; j++) e3t(m + j, 6, t + j, 6);   /* columns: t [3][6] */
        for (int i = 0; i < 3; i++) e3t(t + 6 * i, 1, o + 3 * i, 1);
        const float *of = (const float *)o;   /* [9][16] */
        for (int l = 0; l < n; l++)
            for (int i = 0; i < 9; i++) dw[(p0 + l) * 9 + i] += of[i * 16 + l];
    }
}
