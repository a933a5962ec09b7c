/* matvec.c — y = x · Wᵀ for the few rows of a batched decode step, W read once (matvec.h).
 *
 * The serving engine's decode step multiplies B rows (one per running sequence, B <= 64) by each
 * weight. The GEMM's matvec path (gemm.c, M <= 4) streams all of W once per group of 4 rows, so a
 * 16-row step read every weight 4 times from memory (bench_serve_step, f32 weights, 1 thread: a
 * 16-row step cost 5x a single-row one). Here a unit of W's rows is cut into R = 4 stretches
 * (R long sequential streams, as gemm.c does, for the hardware prefetchers); at each step the R
 * current rows of W — R·K weights, in L1/L2 after the first use — are multiplied by every group of
 * 4 rows of x in turn: W comes from memory once, x [M, K] stays in L2.
 *
 * Bitwise contract: each y[m, n] is accumulated exactly as gemm.c's mv_tb_body accumulates it —
 * f32: one zmm accumulator, fmadd over k in steps of 16, the last partial 16 masked; bf16: per full
 * 32-block, the even-k half (the low 16 bits of each lane, shifted up) then the odd-k half (masked
 * high bits) against x de-interleaved per 32-block (16 evens, then 16 odds), the rest in 16s widened
 * by a shift; then _mm512_reduce_add_ps, alpha (1) times that, plus beta · y. The order over k is
 * the same whatever the blocking, so a row's result does not depend on which other rows share the
 * step nor on the thread count. AVX-512 only (mmc_matvec_rows_ok): the other GEMM kernels sum in
 * another order, and there the caller keeps the GEMM. */
#include "matvec.h"
#include "gemm.h"
#include "mmc.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
enum { R = 4, MG = 4 };   /* rows of W in flight; rows of x per register block */
#ifndef KC
#define KC 512            /* k per chunk (a multiple of 32): 4 rows of W and M rows of x, in L1 / L2 */
#endif

bool mmc_matvec_rows_ok(void) { return !strcmp(mmc_gemm_kernel_name(), "avx512"); }

typedef struct {
    int64_t M, N, K;
    const float *x;   /* [M, K]; bf16 W: each full 32-block of k de-interleaved */
    const void *w;
    bool b16;
    float beta;
    float *y;
} mv_args;

/* rows w[r] (R of them) times x rows [m0, m0 + MM) over k in [k0, k1), the accumulators carried in
 * st between calls (a chunk of K at a time, so that the chunk of W and of x stay in L1; the sums are
 * the same as in one pass: the same accumulator sees the same k in the same order). k0 is a multiple
 * of KC (of 32), k1 = min(k0 + KC, K); the bf16 32-blocks run while a whole block fits in K, then the
 * 16s, as in gemm.c. */
T512 __attribute__((always_inline)) static inline void block(const int MM, const bool b16, const mv_args *a,
                                                             int64_t m0, const void *const *w, int64_t k0,
                                                             int64_t k1, __m512 st[MG][R]) {
    const int64_t K = a->K, k16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - k16)) - 1u);
    const __m512i hi_mask = _mm512_set1_epi32((int)0xFFFF0000u);
    const float *x = a->x + m0 * K;
    __m512 acc[MG][R];
    for (int m = 0; m < MM; m++)
        for (int r = 0; r < R; r++) acc[m][r] = k0 == 0 ? _mm512_setzero_ps() : st[m][r];
    int64_t k = k0;
    if (b16) {
        for (; k + 32 <= k1; k += 32) {
            __m512i wv[R];
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)((const uint16_t *)w[r] + k) + 2048, _MM_HINT_T0);
                wv[r] = _mm512_loadu_si512((const void *)((const uint16_t *)w[r] + k));
            }
            for (int m = 0; m < MM; m++) {
                __m512 xe = _mm512_loadu_ps(x + m * K + k), xo = _mm512_loadu_ps(x + m * K + k + 16);
                for (int r = 0; r < R; r++) {
                    acc[m][r] = _mm512_fmadd_ps(xe, _mm512_castsi512_ps(_mm512_slli_epi32(wv[r], 16)), acc[m][r]);
                    acc[m][r] = _mm512_fmadd_ps(xo, _mm512_castsi512_ps(_mm512_and_si512(wv[r], hi_mask)), acc[m][r]);
                }
            }
        }
    }
    for (; k < k1; k += 16) {
        const __mmask16 mk = k < k16 ? (__mmask16)0xFFFF : tail;
        __m512 bv[R];
        for (int r = 0; r < R; r++) {
            if (!b16 && (k & 31) == 0) _mm_prefetch((const char *)((const float *)w[r] + k) + 2048, _MM_HINT_T0);
            bv[r] = b16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                              _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, (const uint16_t *)w[r] + k)), 16))
                        : _mm512_maskz_loadu_ps(mk, (const float *)w[r] + k);
        }
        for (int m = 0; m < MM; m++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * K + k);
            for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(xv, bv[r], acc[m][r]);
        }
    }
    for (int m = 0; m < MM; m++)
        for (int r = 0; r < R; r++) st[m][r] = acc[m][r];
}

T512 static void block_any(int MM, bool b16, const mv_args *a, int64_t m0, const void *const *w, int64_t k0,
                           int64_t k1, __m512 st[MG][R]) {
    switch (MM * 2 + (b16 ? 1 : 0)) {
    case 2: block(1, false, a, m0, w, k0, k1, st); break;
    case 3: block(1, true, a, m0, w, k0, k1, st); break;
    case 4: block(2, false, a, m0, w, k0, k1, st); break;
    case 5: block(2, true, a, m0, w, k0, k1, st); break;
    case 6: block(3, false, a, m0, w, k0, k1, st); break;
    case 7: block(3, true, a, m0, w, k0, k1, st); break;
    case 8: block(4, false, a, m0, w, k0, k1, st); break;
    default: block(4, true, a, m0, w, k0, k1, st); break;
    }
}

/* W rows [n0, n1): R stretches of G rows, step j takes row j of each; K in chunks of KC, each chunk
 * against every group of x rows (W's chunk, R x KC, and x's, M x KC, stay in L1 / L2) */
T512 static void unit(const mv_args *a, int64_t n0, int64_t n1) {
    const int64_t G = (n1 - n0 + R - 1) / R, esz = a->b16 ? 2 : 4, K = a->K;
    const int64_t ngrp = (a->M + MG - 1) / MG;
    __m512 st[MMC_MV_ROWS_MAX / MG][MG][R];
    for (int64_t j = 0; j < G; j++) {
        const void *w[R];
        int64_t row[R];
        for (int r = 0; r < R; r++) {
            row[r] = n0 + r * G + j;
            const int64_t rr = row[r] < n1 ? row[r] : n0 + j;   /* past the end: re-read, discarded */
            w[r] = (const char *)a->w + rr * K * esz;
        }
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            const int64_t k1 = k0 + KC < K ? k0 + KC : K;
            for (int64_t g = 0; g < ngrp; g++) {
                const int64_t m0 = g * MG;
                block_any(a->M - m0 < MG ? (int)(a->M - m0) : MG, a->b16, a, m0, w, k0, k1, st[g]);
            }
        }
        for (int64_t g = 0; g < ngrp; g++) {
            const int64_t m0 = g * MG;
            const int MM = a->M - m0 < MG ? (int)(a->M - m0) : MG;
            for (int m = 0; m < MM; m++)
                for (int r = 0; r < R; r++) {
                    if (row[r] >= n1) continue;
                    float *c = a->y + (m0 + m) * a->N + row[r];
                    const float v = 1.0f * _mm512_reduce_add_ps(st[g][m][r]);
                    *c = a->beta == 0.0f ? v : v + a->beta * *c;
                }
        }
    }
}

void mmc_matvec_rows(int64_t M, int64_t N, int64_t K, const float *x, const void *w, bool w_bf16, float beta,
                     float *y) {
    MMC_CHECK(M >= 1 && M <= MMC_MV_ROWS_MAX && N >= 1 && K >= 1 && (beta == 0.0f || beta == 1.0f) &&
                  mmc_matvec_rows_ok(),
              "mmc_matvec_rows: M = %lld (1..%d), N = %lld, K = %lld, beta %g (0 or 1), kernel %s (avx512 only)",
              (long long)M, MMC_MV_ROWS_MAX, (long long)N, (long long)K, (double)beta, mmc_gemm_kernel_name());
    float *xd = NULL;
    if (w_bf16) {   /* each full 32-block of k de-interleaved: 16 evens, then 16 odds (gemm.c's layout) */
        xd = malloc(sizeof(float) * (size_t)(M * K));
        MMC_CHECK(xd, "mmc_matvec_rows: out of memory (%lld x %lld)", (long long)M, (long long)K);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                const int64_t d = (k | 31) < K ? (k & ~(int64_t)31) + ((k & 1) ? 16 : 0) + ((k & 31) >> 1) : k;
                xd[m * K + d] = x[m * K + k];
            }
    }
    mv_args a = {M, N, K, xd ? xd : x, w, w_bf16, beta, y};
    /* units of R-multiple rows, ~256 KiB of W each, at least 16 units when N allows; handed out
     * dynamically (a shared machine stalls threads; who computes a unit does not change it) */
    const double row_bytes = (double)K * (w_bf16 ? 2 : 4);
    int64_t grain = (int64_t)(256.0 * 1024.0 / row_bytes) / 8 * 8, g16 = N / 16 / 8 * 8;
    if (grain > g16) grain = g16;
    if (grain < 8) grain = 8;
    const int64_t units = (N + grain - 1) / grain;
    int nth = (row_bytes * (double)N < 256 * 1024 || omp_in_parallel()) ? 1 : omp_get_max_threads();
    if (nth > units) nth = (int)units;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (int64_t u = 0; u < units; u++) {
        const int64_t n0 = u * grain, n1 = n0 + grain < N ? n0 + grain : N;
        unit(&a, n0, n1);
    }
    free(xd);
}
