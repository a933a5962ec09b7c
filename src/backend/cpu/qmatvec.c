/* qmatvec.c — decode matvecs that read quantised weights directly (qmatvec.h).
 *
 * Decode multiplies one token (M = 1, a few with batching) by every weight once, so the time
 * is the time to stream W from memory: the kernels keep the weights in their stored width
 * and widen them in registers.
 *   int8   16 weights per step: vpmovsxbd (int8 -> int32), vcvtdq2ps, one FMA per row of x;
 *          the per-row scale multiplies the finished dot product.
 *   NF4    AVX-512: the 16 NF4 levels are one zmm, looked up with vpermps from codes put in
 *          the lanes by loads at byte offsets (nf4b_*, below); the block scales multiply each
 *          128-weight chunk's sum. AVX2 and the previous AVX-512 kernel (nf4_unit_avx512, kept
 *          for A/B: MMC_QMV_NF4=lut): per block of 64 (32 bytes) the levels times the block's
 *          absmax are the LUT; 16 bytes widen to 16 lanes (vpmovzxbd), the high nibbles (even
 *          elements) and the low nibbles (odd elements) index the LUT with vpermps, and the two
 *          halves multiply x de-interleaved per 32-element chunk (16 evens, then 16 odds); AVX2
 *          does two 8-wide permutes + a blend on bit 3 of the code.
 * R rows of W are in flight at once (int8 and the LUT kernel: 8 for M = 1, else 4; NF4: 4) for
 * memory-level parallelism;
 * rows are handed to threads in units of at least 8 rows, dynamically (a shared machine
 * stalls threads; results do not depend on who computes a unit). */
#include "qmatvec.h"
#include "gemm.h"
#include "mmc.h"
#include "mmc_quant.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define T256 __attribute__((target("avx2,fma")))
#define NF4_MAX_BLOCKS 1024
#ifndef NF4_R
#define NF4_R(M) ((M) == 1 ? 8 : 4)   /* NF4 rows in flight */
#endif
#ifndef Q8_PF
#define Q8_PF 1024   /* software prefetch distance per row, bytes (0: none) */
#endif
#ifndef NF4_PF
#define NF4_PF 512
#endif
#ifndef Q8_R
#define Q8_R(M) ((M) == 1 ? 8 : 4)
#endif   /* K <= 65536 for the direct NF4 kernel (row scales on the stack) */

typedef enum { QK_GENERIC, QK_AVX2, QK_AVX512 } qkernel;

static qkernel pick(void) {
    const char *k = mmc_gemm_kernel_name();
    return !strcmp(k, "avx512") ? QK_AVX512 : !strcmp(k, "avx2") ? QK_AVX2 : QK_GENERIC;
}

const char *mmc_qmv_kernel_name(void) { return mmc_gemm_kernel_name(); }

/* Split [0, N) into units of `grain` rows (a multiple of 8, about 256 KiB of weights, at
 * least 16 units when N allows) and run fn over them on up to all threads. */
typedef void (*unit_fn)(const void *ctx, int64_t n0, int64_t n1);
static void for_units(int64_t N, double row_bytes, const void *ctx, unit_fn fn) {
    int64_t grain = (int64_t)((256.0 * 1024.0) / row_bytes) / 8 * 8, g16 = N / 16 / 8 * 8;
    if (grain > g16) grain = g16;
    if (grain < 8) grain = 8;
    int64_t units = (N + grain - 1) / grain;
    int nth = (row_bytes * (double)N < 256 * 1024 || omp_in_parallel()) ? 1 : omp_get_max_threads();
    if (nth > units) nth = (int)units;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t n0 = u * grain, n1 = n0 + grain < N ? n0 + grain : N;
        fn(ctx, n0, n1);
    }
}

T256 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ------------------------------------------------------------------ int8 */
typedef struct {
    int M;
    int64_t N, K;
    const float *x;
    const int8_t *q;
    const float *scale;
    float *y;
} q8_args;

T512 __attribute__((always_inline)) static inline void q8_body_avx512(const int M, const q8_args *a, int64_t n0,
                                                                      int64_t n1) {
    enum { RMAX = 8 };
    const int R = Q8_R(M);
    const int64_t K = a->K, N = a->N, k16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - k16)) - 1u);
    /* the unit is cut into R stretches of G rows; step j reads row j of each: R long sequential
     * streams (what the hardware prefetchers follow), as gemm.c's bf16 matvec does */
    const int64_t G = (n1 - n0 + R - 1) / R;
    for (int64_t j = 0; j < G; j++) {
        int64_t row[RMAX];
        const int8_t *w[RMAX];
        __m512 acc[MMC_QMV_MAX_M][RMAX];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            row[r] = n0 + r * G + j;
            w[r] = a->q + (row[r] < n1 ? row[r] : n0 + j) * K;   /* past the end: re-read, discarded */
            #pragma GCC unroll 8
            for (int m = 0; m < M; m++) acc[m][r] = _mm512_setzero_ps();
        }
        int64_t k = 0;
        for (; k + 64 <= k16; k += 64) {
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                if (Q8_PF) _mm_prefetch((const char *)(w[r] + k) + Q8_PF, _MM_HINT_T0);
            #pragma GCC unroll 8
            for (int j = 0; j < 64; j += 16) {
                __m512 b[RMAX];
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    b[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w[r] + k + j))));
                #pragma GCC unroll 8
                for (int m = 0; m < M; m++) {
                    __m512 xv = _mm512_loadu_ps(a->x + m * K + k + j);
                    #pragma GCC unroll 8
                    for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(xv, b[r], acc[m][r]);
                }
            }
        }
        for (; k < K; k += 16) {
            const __mmask16 mk = k < k16 ? (__mmask16)0xFFFF : tail;
            __m512 b[RMAX];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                b[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, w[r] + k)));
            #pragma GCC unroll 8
            for (int m = 0; m < M; m++) {
                __m512 xv = _mm512_maskz_loadu_ps(mk, a->x + m * K + k);
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(xv, b[r], acc[m][r]);
            }
        }
        #pragma GCC unroll 8
        for (int m = 0; m < M; m++)
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                if (row[r] < n1) a->y[m * N + row[r]] = a->scale[row[r]] * _mm512_reduce_add_ps(acc[m][r]);
    }
}

T512 static void q8_unit_avx512(const void *ctx, int64_t n0, int64_t n1) {
    const q8_args *a = ctx;
    switch (a->M) {
    case 1: q8_body_avx512(1, a, n0, n1); break;
    case 2: q8_body_avx512(2, a, n0, n1); break;
    case 3: q8_body_avx512(3, a, n0, n1); break;
    default: q8_body_avx512(4, a, n0, n1); break;
    }
}

T256 static void q8_unit_avx2(const void *ctx, int64_t n0, int64_t n1) {
    const q8_args *a = ctx;
    enum { R = 4 };
    const int M = a->M;
    const int64_t K = a->K, N = a->N, k8 = K & ~(int64_t)7;
    for (int64_t n = n0; n < n1; n += R) {
        const int nr = n1 - n < R ? (int)(n1 - n) : R;
        const int8_t *w[R];
        __m256 acc[MMC_QMV_MAX_M][R];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            w[r] = a->q + (n + (r < nr ? r : 0)) * K;
            #pragma GCC unroll 8
            for (int m = 0; m < MMC_QMV_MAX_M; m++) acc[m][r] = _mm256_setzero_ps();
        }
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 b[R];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                b[r] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w[r] + k))));
            #pragma GCC unroll 8
            for (int m = 0; m < M; m++) {
                __m256 xv = _mm256_loadu_ps(a->x + m * K + k);
                #pragma GCC unroll 8
                for (int r = 0; r < R; r++) acc[m][r] = _mm256_fmadd_ps(xv, b[r], acc[m][r]);
            }
        }
        #pragma GCC unroll 8
        for (int m = 0; m < M; m++)
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                float s = hsum256(acc[m][r]);
                for (int64_t k = k8; k < K; k++) s += a->x[m * K + k] * (float)w[r][k];
                a->y[m * N + n + r] = a->scale[n + r] * s;
            }
    }
}

/* plain C: 16 partial sums per dot so compilers vectorise */
static void q8_unit_generic(const void *ctx, int64_t n0, int64_t n1) {
    const q8_args *a = ctx;
    const int64_t K = a->K;
    for (int64_t n = n0; n < n1; n++)
        for (int m = 0; m < a->M; m++) {
            const float *x = a->x + m * K;
            const int8_t *w = a->q + n * K;
            float part[16] = {0};
            int64_t k = 0;
            for (; k + 16 <= K; k += 16)
                for (int j = 0; j < 16; j++) part[j] += x[k + j] * (float)w[k + j];
            for (; k < K; k++) part[k & 15] += x[k] * (float)w[k];
            float s = 0;
            for (int j = 0; j < 16; j++) s += part[j];
            a->y[m * a->N + n] = a->scale[n] * s;
        }
}

void mmc_qmv_int8(int64_t M, int64_t N, int64_t K, const float *x, const int8_t *q, const float *scale,
                  float *y) {
    MMC_CHECK(M >= 1 && M <= MMC_QMV_MAX_M, "mmc_qmv_int8: M = %lld, 1..%d rows of x", (long long)M, MMC_QMV_MAX_M);
    q8_args a = {(int)M, N, K, x, q, scale, y};
    qkernel k = pick();
    for_units(N, (double)K, &a, k == QK_AVX512 ? q8_unit_avx512 : k == QK_AVX2 ? q8_unit_avx2 : q8_unit_generic);
}

/* ------------------------------------------------------------------ NF4 */
typedef struct {
    int M;
    int64_t K;
    const float *x;    /* avx2 / avx512: de-interleaved per 32-chunk; generic: as given */
    const mmc_nf4 *q;
    float *y;
} nf4_args;

/* Block scales of row n (double quantisation resolved into buf [K/64]) or straight from q->absmax. */
static const float *nf4_row_scales(const mmc_nf4 *q, int64_t n, float *buf) {
    const int64_t nb = q->cols / MMC_NF4_BLOCK;
    if (!q->double_quant) return q->absmax + n * nb;
    mmc_nf4_absmax_range(q, n * nb, nb, buf);
    return buf;
}

T512 __attribute__((always_inline)) static inline void nf4_body_avx512(const int M, const nf4_args *a, int64_t n0,
                                                                       int64_t n1, float *buf) {
    enum { RMAX = 8 };
    const int R = NF4_R(M);
    const mmc_nf4 *q = a->q;
    const int64_t K = a->K, N = q->rows, nb = K / MMC_NF4_BLOCK;
    const __m512 lut = _mm512_loadu_ps(mmc_nf4_levels());
    /* R stretches of G rows, step j reads row j of each (long sequential streams, as for int8) */
    const int64_t G = (n1 - n0 + R - 1) / R;
    for (int64_t j = 0; j < G; j++) {
        int64_t row[RMAX];
        const float *sc[RMAX];
        const uint8_t *c[RMAX];
        __m512 acc[MMC_QMV_MAX_M][RMAX];
        #pragma GCC unroll 8
        for (int m = 0; m < MMC_QMV_MAX_M; m++)
            #pragma GCC unroll 8
            for (int r = 0; r < RMAX; r++) acc[m][r] = _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            row[r] = n0 + r * G + j;
            const int64_t rr = row[r] < n1 ? row[r] : n0 + j;   /* past the end: re-read, discarded */
            sc[r] = nf4_row_scales(q, rr, buf + r * nb);
            c[r] = q->codes + rr * (K / 2);
        }
        for (int64_t b = 0; b < nb; b++) {
            __m512 L[RMAX];
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                if (NF4_PF) _mm_prefetch((const char *)(c[r] + b * 32) + NF4_PF, _MM_HINT_T0);
                L[r] = _mm512_mul_ps(lut, _mm512_set1_ps(sc[r][b]));
            }
            #pragma GCC unroll 8
            for (int h = 0; h < 2; h++) {
                const int64_t k = b * MMC_NF4_BLOCK + h * 32;
                __m512 xe[MMC_QMV_MAX_M], xo[MMC_QMV_MAX_M];
#pragma GCC unroll 8
                for (int m = 0; m < M; m++) {
                    xe[m] = _mm512_loadu_ps(a->x + m * K + k);
                    xo[m] = _mm512_loadu_ps(a->x + m * K + k + 16);
                }
                /* one row at a time: its two weight vectors die after M FMAs each (registers) */
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c[r] + k / 2)));
                    __m512 we = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), L[r]);
                    __m512 wo = _mm512_permutexvar_ps(v, L[r]);
#pragma GCC unroll 8
                    for (int m = 0; m < M; m++) {
                        acc[m][r] = _mm512_fmadd_ps(xe[m], we, acc[m][r]);
                        acc[m][r] = _mm512_fmadd_ps(xo[m], wo, acc[m][r]);
                    }
                }
            }
        }
        for (int m = 0; m < M; m++)
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                if (row[r] < n1) a->y[m * N + row[r]] = _mm512_reduce_add_ps(acc[m][r]);
    }
}

/* The AVX-512 NF4 kernel. Per 64-byte chunk of a row (128 weights, two blocks) four loads at byte
 * offsets o = 0..3 put byte 4i + o in the low byte of dword lane i; vpermps reads the low four bits
 * of each lane, so the low nibbles index the LUT as loaded and the high nibbles after one shift: 8
 * lookups + 4 shifts per 128 weights, the widening done by the load ports (the LUT kernel below
 * spends a vpmovzxbd per 32 weights on the shuffle port that the lookups need). The LUT holds the
 * bare levels; lanes 0-7 are the chunk's first block and lanes 8-15 its second, so each row's chunk
 * sum is multiplied by (absmax[b] x 8, absmax[b + 1] x 8) once, after the 128 products. x comes
 * permuted to match (nf4_permute_x); a trailing block (K % 128 == 64) takes the LUT kernel's steps. */
/* Rows in flight and the software prefetch distance per row (bytes), from a sweep on the Intel VM
 * (8192 x 4096 from DRAM, 1 thread, M = 1..4): 4 rows / 1 KiB read 0.91 of the DRAM probe at M = 1,
 * 8 rows / 512 B (the LUT kernel's) 0.85, 2 rows 0.83; M = 2..4 are FMA-bound and also best at 4. */
#ifndef NF4B_R
#define NF4B_R(M) 4
#endif
#ifndef NF4B_PF
#define NF4B_PF 1024
#endif
T512 __attribute__((always_inline)) static inline void nf4b_chunk(const int M, const int R, const float *x, int64_t K,
                                                                  const uint8_t *const *p, const float *const *sc,
                                                                  int64_t ch, bool last, __m512 lut,
                                                                  __m512 tot[MMC_QMV_MAX_M][8]) {
    __m512 part[MMC_QMV_MAX_M][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        if (NF4B_PF) _mm_prefetch((const char *)(p[r] + ch * 64) + NF4B_PF, _MM_HINT_T0);
#pragma GCC unroll 4
    for (int o = 0; o < 4; o++) {
        __m512 xl[MMC_QMV_MAX_M], xh[MMC_QMV_MAX_M];
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
            xl[m] = _mm512_loadu_ps(x + m * K + ch * 128 + o * 32);
            xh[m] = _mm512_loadu_ps(x + m * K + ch * 128 + o * 32 + 16);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            /* the last chunk of a row: the bytes past it are not read (the row may end the buffer) */
            const __m512i v = last && o ? _mm512_maskz_loadu_epi8(~0ULL >> o, p[r] + ch * 64 + o)
                                        : _mm512_loadu_si512((const void *)(p[r] + ch * 64 + o));
            const __m512 wl = _mm512_permutexvar_ps(v, lut), wh = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
#pragma GCC unroll 4
            for (int m = 0; m < M; m++) {
                part[m][r] = o ? _mm512_fmadd_ps(xl[m], wl, part[m][r]) : _mm512_mul_ps(xl[m], wl);
                part[m][r] = _mm512_fmadd_ps(xh[m], wh, part[m][r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(sc[r][2 * ch]), 0xFF00, _mm512_set1_ps(sc[r][2 * ch + 1]));
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) tot[m][r] = _mm512_fmadd_ps(part[m][r], s, tot[m][r]);
    }
}

/* nf4_row_scales for the AVX-512 kernel: double-quantised scales resolved 16 blocks at a time (a
 * gather of the 8-bit codes' levels in the dynamic map; the second-level scale is one or two
 * broadcasts, a group being 256 blocks), the product rounded before the offset is added as
 * bitsandbytes (and mmc_nf4_absmax_range) do: the same floats as the scalar loop, which cost the
 * kernel a third of its speed at K = 2048. */
T512 __attribute__((optimize("fp-contract=off"))) static const float *nf4_row_scales_avx512(const mmc_nf4 *q, int64_t n,
                                                                                            float *buf, const float *dyn) {
    const int64_t nb = q->cols / MMC_NF4_BLOCK, b0 = n * nb;
    if (!q->double_quant) return q->absmax + b0;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 off = _mm512_set1_ps(q->offset);
    for (int64_t i = 0; i < nb; i += 16) {
        const int64_t len = nb - i < 16 ? nb - i : 16, g0 = (b0 + i) / MMC_NF4_DQ_BLOCK,
                      g1 = (b0 + i + len - 1) / MMC_NF4_DQ_BLOCK;
        const __mmask16 mk = (__mmask16)((1u << len) - 1u);
        const __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mk, q->qabsmax + b0 + i));
        const __m512 lv = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mk, c, dyn, 4);
        __m512 a2 = _mm512_set1_ps(q->absmax2[g0]);
        if (g1 != g0)   /* lanes from g1 * 256 - (b0 + i) on are the next group's */
            a2 = _mm512_mask_mov_ps(a2, _mm512_cmpge_epi32_mask(iota, _mm512_set1_epi32((int)(g1 * MMC_NF4_DQ_BLOCK - b0 - i))),
                                    _mm512_set1_ps(q->absmax2[g1]));
        _mm512_mask_storeu_ps(buf + i, mk, _mm512_add_ps(_mm512_mul_ps(lv, a2), off));
    }
    return buf;
}

T512 __attribute__((always_inline)) static inline void nf4b_body_avx512(const int M, const nf4_args *a, int64_t n0,
                                                                        int64_t n1, float *buf) {
    const int R = NF4B_R(M);
    const mmc_nf4 *q = a->q;
    const int64_t K = a->K, N = q->rows, nb = K / MMC_NF4_BLOCK, nch = K / 128;
    const __m512 lut = _mm512_loadu_ps(mmc_nf4_levels());
    const float *dyn = mmc_dynamic_map();
    const int64_t G = (n1 - n0 + R - 1) / R;   /* R stretches of G rows (long sequential streams) */
    for (int64_t j = 0; j < G; j++) {
        int64_t row[8];
        const float *sc[8];
        const uint8_t *c[8];
        __m512 tot[MMC_QMV_MAX_M][8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            row[r] = n0 + r * G + j;
            const int64_t rr = row[r] < n1 ? row[r] : n0 + j;   /* past the end: re-read, discarded */
            sc[r] = nf4_row_scales_avx512(q, rr, buf + r * nb, dyn);
            c[r] = q->codes + rr * (K / 2);
#pragma GCC unroll 4
            for (int m = 0; m < M; m++) tot[m][r] = _mm512_setzero_ps();
        }
        for (int64_t ch = 0; ch + 1 < nch; ch++) nf4b_chunk(M, R, a->x, K, c, sc, ch, false, lut, tot);
        if (nch) nf4b_chunk(M, R, a->x, K, c, sc, nch - 1, true, lut, tot);
        if (nb & 1) {   /* the trailing block: x de-interleaved per 32 (16 evens, 16 odds) as for the LUT kernel */
            const int64_t b = nb - 1;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512 L = _mm512_mul_ps(lut, _mm512_set1_ps(sc[r][b]));
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const int64_t k = b * MMC_NF4_BLOCK + h * 32;
                    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c[r] + k / 2)));
                    const __m512 we = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), L), wo = _mm512_permutexvar_ps(v, L);
#pragma GCC unroll 4
                    for (int m = 0; m < M; m++) {
                        tot[m][r] = _mm512_fmadd_ps(_mm512_loadu_ps(a->x + m * K + k), we, tot[m][r]);
                        tot[m][r] = _mm512_fmadd_ps(_mm512_loadu_ps(a->x + m * K + k + 16), wo, tot[m][r]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int m = 0; m < M; m++)
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                if (row[r] < n1) a->y[m * N + row[r]] = _mm512_reduce_add_ps(tot[m][r]);
    }
}

/* The double-quantised row scales' buffer of an AVX-512 unit (8 rows of K / 64 blocks): buf (8 x 64
 * floats, K <= 4096) or, past that, the heap (*heap, freed by the caller). */
static float *nf4_scale_buf(const nf4_args *a, float *buf, float **heap) {
    const int64_t need = a->q->double_quant ? 8 * (a->K / MMC_NF4_BLOCK) : 0;
    *heap = need > 8 * 64 ? malloc(sizeof(float) * (size_t)need) : NULL;
    MMC_CHECK(need <= 8 * 64 || *heap, "NF4 matvec: out of memory");
    return *heap ? *heap : buf;
}

T512 static void nf4b_unit_avx512(const void *ctx, int64_t n0, int64_t n1) {
    const nf4_args *a = ctx;
    float buf[8 * 64], *heap;
    float *bp = nf4_scale_buf(a, buf, &heap);
    switch (a->M) {
    case 1: nf4b_body_avx512(1, a, n0, n1, bp); break;
    case 2: nf4b_body_avx512(2, a, n0, n1, bp); break;
    case 3: nf4b_body_avx512(3, a, n0, n1, bp); break;
    default: nf4b_body_avx512(4, a, n0, n1, bp); break;
    }
    free(heap);
}

T512 static void nf4_unit_avx512(const void *ctx, int64_t n0, int64_t n1) {
    const nf4_args *a = ctx;
    float buf[8 * 64], *heap;
    float *bp = nf4_scale_buf(a, buf, &heap);
    switch (a->M) {
    case 1: nf4_body_avx512(1, a, n0, n1, bp); break;
    case 2: nf4_body_avx512(2, a, n0, n1, bp); break;
    case 3: nf4_body_avx512(3, a, n0, n1, bp); break;
    default: nf4_body_avx512(4, a, n0, n1, bp); break;
    }
    free(heap);
}

/* 8 codes (lanes 0..15 in bits 0..3) -> the scaled levels: two 8-entry permutes, bit 3 picks */
T256 static inline __m256 nf4_lookup8(__m256i idx, __m256 lo, __m256 hi) {
    __m256 p0 = _mm256_permutevar8x32_ps(lo, idx), p1 = _mm256_permutevar8x32_ps(hi, idx);
    return _mm256_blendv_ps(p0, p1, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

T256 static void nf4_unit_avx2(const void *ctx, int64_t n0, int64_t n1) {
    const nf4_args *a = ctx;
    const mmc_nf4 *q = a->q;
    const int M = a->M;
    const int64_t K = a->K, N = q->rows, nb = K / MMC_NF4_BLOCK;
    float *buf = malloc(sizeof(float) * (size_t)nb);
    MMC_CHECK(buf, "NF4 matvec: out of memory");
    const __m256 lut_lo = _mm256_loadu_ps(mmc_nf4_levels()), lut_hi = _mm256_loadu_ps(mmc_nf4_levels() + 8);
    for (int64_t n = n0; n < n1; n++) {
        const float *sc = nf4_row_scales(q, n, buf);
        const uint8_t *c = q->codes + n * (K / 2);
        __m256 acc[MMC_QMV_MAX_M];
        #pragma GCC unroll 8
        for (int m = 0; m < MMC_QMV_MAX_M; m++) acc[m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const __m256 s = _mm256_set1_ps(sc[b]);
            const __m256 lo = _mm256_mul_ps(lut_lo, s), hi = _mm256_mul_ps(lut_hi, s);
            for (int64_t k = b * MMC_NF4_BLOCK; k < (b + 1) * MMC_NF4_BLOCK; k += 32)
                for (int part = 0; part < 2; part++) {   /* bytes k/2 + 8*part: x[k + 8*part ..] evens, x[k + 16 + 8*part ..] odds */
                    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + k / 2 + 8 * part)));
                    __m256 we = nf4_lookup8(_mm256_srli_epi32(v, 4), lo, hi), wo = nf4_lookup8(v, lo, hi);
                    #pragma GCC unroll 8
                    for (int m = 0; m < M; m++) {
                        const float *x = a->x + m * K + k + 8 * part;
                        acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x), we, acc[m]);
                        acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), wo, acc[m]);
                    }
                }
        }
        #pragma GCC unroll 8
        for (int m = 0; m < M; m++) a->y[m * N + n] = hsum256(acc[m]);
    }
    free(buf);
}

static void nf4_unit_generic(const void *ctx, int64_t n0, int64_t n1) {
    const nf4_args *a = ctx;
    const mmc_nf4 *q = a->q;
    const float *lv = mmc_nf4_levels();
    const int64_t K = a->K, N = q->rows, nb = K / MMC_NF4_BLOCK;
    float *buf = malloc(sizeof(float) * (size_t)nb);
    MMC_CHECK(buf, "NF4 matvec: out of memory");
    for (int64_t n = n0; n < n1; n++) {
        const float *sc = nf4_row_scales(q, n, buf);
        const uint8_t *c = q->codes + n * (K / 2);
        for (int m = 0; m < a->M; m++) {
            const float *x = a->x + m * K;
            float part[16] = {0};
            for (int64_t b = 0; b < nb; b++) {
                float lut[16];
                for (int j = 0; j < 16; j++) lut[j] = lv[j] * sc[b];
                for (int64_t i = b * 32; i < b * 32 + 32; i += 8)
                    for (int j = 0; j < 8; j++) {
                        part[2 * j] += x[2 * (i + j)] * lut[c[i + j] >> 4];
                        part[2 * j + 1] += x[2 * (i + j) + 1] * lut[c[i + j] & 15];
                    }
            }
            float s = 0;
            for (int j = 0; j < 16; j++) s += part[j];
            a->y[m * N + n] = s;
        }
    }
    free(buf);
}

bool mmc_qmv_nf4_ok(const mmc_nf4 *q) {
    return q->cols % MMC_NF4_BLOCK == 0 && q->cols / MMC_NF4_BLOCK <= NF4_MAX_BLOCKS;
}

/* 0: the byte-offset kernel (default), 1: the LUT kernel (the previous one, kept for A/B: also
 * MMC_QMV_NF4=lut in the environment, read at the first call), -1: not chosen yet */
static int g_nf4_lut = -1;
int mmc_qmv_set_nf4_kernel(const char *name) {
    if (!name || !strcmp(name, "default") || !strcmp(name, "bytes")) g_nf4_lut = 0;
    else if (!strcmp(name, "lut")) g_nf4_lut = 1;
    else return -1;
    return 0;
}

/* x [M, K] into the order the AVX kernels read (xd [M, K]):
 *   LUT (AVX2, AVX-512 "lut") and a trailing block: per 32, the 16 even elements then the 16 odd ones;
 *   byte-offset (AVX-512): per 128 (64 bytes of codes), vector q = 2 o + h, lane i holds the element
 *   of byte 4 i + o's low nibble (h = 0: 2 (4 i + o) + 1) or high nibble (h = 1: 2 (4 i + o)). */
static void nf4_permute_x(int64_t M, int64_t K, const float *x, float *xd, bool bytes) {
    const int64_t k128 = bytes ? K / 128 * 128 : 0;
    for (int64_t m = 0; m < M; m++) {
        const float *xs = x + m * K;
        float *xo = xd + m * K;
        for (int64_t c = 0; c < k128; c += 128)
            for (int o = 0; o < 4; o++)
                for (int h = 0; h < 2; h++)
                    for (int i = 0; i < 16; i++) xo[c + (2 * o + h) * 16 + i] = xs[c + 2 * (4 * i + o) + (h ? 0 : 1)];
        for (int64_t k = k128; k < K; k++) xo[(k & ~(int64_t)31) + ((k & 1) ? 16 : 0) + ((k & 31) >> 1)] = xs[k];
    }
}

void mmc_qmv_nf4(int64_t M, const float *x, const mmc_nf4 *q, float *y) {
    MMC_CHECK(M >= 1 && M <= MMC_QMV_MAX_M && mmc_qmv_nf4_ok(q),
              "mmc_qmv_nf4: M = %lld (1..%d), K = %lld (a multiple of 64, at most %d)", (long long)M,
              MMC_QMV_MAX_M, (long long)q->cols, MMC_NF4_BLOCK * NF4_MAX_BLOCKS);
    const int64_t K = q->cols;
    qkernel kk = pick();
    if (g_nf4_lut < 0) {
        const char *e = getenv("MMC_QMV_NF4");
        g_nf4_lut = e && !strcmp(e, "lut");
    }
    const bool bytes = kk == QK_AVX512 && !g_nf4_lut;
    float *xd = NULL;
    if (kk != QK_GENERIC) {
        xd = malloc(sizeof(float) * (size_t)(M * K));
        MMC_CHECK(xd, "NF4 matvec: out of memory");
        nf4_permute_x(M, K, x, xd, bytes);
    }
    nf4_args a = {(int)M, K, xd ? xd : x, q, y};
    for_units(q->rows, (double)K / 2, &a,
              bytes ? nf4b_unit_avx512 : kk == QK_AVX512 ? nf4_unit_avx512 : kk == QK_AVX2 ? nf4_unit_avx2 : nf4_unit_generic);
    free(xd);
}
