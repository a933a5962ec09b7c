/* gemm.c — blocked, packed GEMM (GotoBLAS/BLIS structure) for mmc_gemm_f32/_bf16.
 *
 * Loop nest (Goto's algorithm, row-major C):
 *   jc over N in NC blocks            B block  [KC, NC] packed once per (jc, pc), shared
 *    pc over K in KC blocks           → NR-wide micro-panels: Bp[k][0..NR)
 *     ic over M in MC blocks          A block  [MC, KC] packed per thread
 *      jr over NR panels, ir over MR panels:  micro-kernel  C[MR, NR] (+)= Ap · Bp
 * The micro-kernel keeps the MR×NR tile of C in vector registers (AVX-512: 14×32 in 28 zmm,
 * AVX2: 6×16 in 12 ymm, generic C: 4×16), picked at run time with __builtin_cpu_supports;
 * each kernel is compiled with a target attribute so the library runs on any x86-64.
 * On Intel the AVX-512 kernel also prefetches its B micro-panel into L1 (ukr_avx512_14x32_bpf).
 * bf16 B (weights) is widened to f32 while packing, so the bf16 GEMM runs the f32 kernel; only
 * inference GEMMs (mmc_gemm_bf16_infer) may, when MMC_GEMM_BF16=dot / --bf16-matmul asks, run a
 * bf16-product kernel instead (A rounded to bf16: opt-in): AMX tiles (ukr_amx_32x32) where the
 * CPU and the OS offer them, else vdpbf16ps with AVX512_BF16.
 * MC/KC/NC are derived at start-up from the CPU's caches (cpuinfo.c), per kernel.
 * Edge tiles are computed into a small stack tile (packing pads with zeros) and merged.
 *
 * Threads (OpenMP), two ways (gemm_packed; MMC_GEMM_SPLIT forces one):
 *   slices  (GEMMs over several B blocks) each thread runs the whole loop nest on its own cell
 *           of a pm × pn grid of C (whole MR tiles × whole NR panels, the grid that packs the
 *           fewest elements per thread) with its own A and B buffers: no barrier at all;
 *   shared  (one B block) B panels are packed cooperatively, then the compute is handed out
 *           dynamically as (MC row block × chunk of NR panels) items, each thread packing A
 *           into its own buffer; row blocks are whole-N items except in the last round, which
 *           is split so no thread idles; a barrier after each phase.
 * While a block computes, each item prefetches its share of the source of the B block packed
 * next, so packing reads caches instead of waiting on DRAM.
 * Blocking never depends on the thread count and each C tile is computed the same way by
 * whichever thread takes it, with a fixed K order, so results are bit-identical for any
 * number of threads and either way of splitting.
 *
 * Small M (M <= 4, decode / matvec) skips packing: B is streamed once, parallel over N, as
 * a few long sequential streams per thread (what the hardware prefetchers follow best).
 * Packing buffers are per calling thread (_Thread_local), grown once and then reused.
 */
#include "gemm.h"
#include "cpuinfo.h"
#include "mmc.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef void (*ukr_fn)(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                       float *restrict C, int64_t ldc, float alpha, float beta);
typedef struct {
    const char *name;
    int mr, nr;          /* register tile */
    int elem_bytes;      /* bytes per packed element (blocking model input) */
    int panel_level;     /* cache level the B micro-panel lives in (cpuinfo.c's model) */
    int64_t mc, kc, nc;  /* cache blocks (mc % mr == 0, nc % nr == 0), set by init_blocking */
    ukr_fn ukr;
    /* or NULL: the first rows (< mr) of a tile into T [rows, nr], alpha 1 and beta 0, each
     * element summed as ukr sums it (bitwise); for the last, partial row tile */
    void (*ukr_rows)(int rows, int64_t kc, const float *restrict Ap, const float *restrict Bp, float *restrict T);
} kdesc;

/* ------------------------------------------------------------------ micro-kernels */

/* C[i, j] = alpha * acc + beta * C (C not read when beta == 0). Portable: GCC vector
 * extensions, lowered to whatever vector width the target has (SSE2 at least on x86-64). */
typedef float v16f __attribute__((vector_size(64), aligned(4)));
static void ukr_generic_4x16(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                             float *restrict C, int64_t ldc, float alpha, float beta) {
    v16f acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
    for (int64_t k = 0; k < kc; k++) {
        const float *a = Ap + k * 4;
        v16f b = *(const v16f *)(Bp + k * 16);
        acc0 += a[0] * b;
        acc1 += a[1] * b;
        acc2 += a[2] * b;
        acc3 += a[3] * b;
    }
    v16f acc[4] = {acc0, acc1, acc2, acc3};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 16; j++)
            C[i * ldc + j] = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * C[i * ldc + j];
}

__attribute__((target("avx2,fma")))
static void ukr_avx2_6x16(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                          float *restrict C, int64_t ldc, float alpha, float beta) {
    __m256 c0[6], c1[6];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) c0[i] = c1[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            __m256 a = _mm256_broadcast_ss(Ap + i);
            c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
        }
        Ap += 6;
        Bp += 16;
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f) {
            _mm256_storeu_ps(c, _mm256_mul_ps(va, c0[i]));
            _mm256_storeu_ps(c + 8, _mm256_mul_ps(va, c1[i]));
        } else {
            _mm256_storeu_ps(c, _mm256_fmadd_ps(va, c0[i], _mm256_mul_ps(vb, _mm256_loadu_ps(c))));
            _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(va, c1[i], _mm256_mul_ps(vb, _mm256_loadu_ps(c + 8))));
        }
    }
}

#define MR512 14
/* k steps before the end of the f32 micro-kernel's loop at which it prefetches its C tile:
 * measured on Zen 5 (1 thread, alternating with OpenBLAS in one process) ~1 % faster than at the
 * start, where the lines left L1 again during a long K */
#define UKR_CPF 128
#define SMALL_M 4 /* M <= SMALL_M: the unpacked matvec path */
/* One body for both variants (bpf: the B prefetch below, a compile-time constant). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline))
static inline void ukr_avx512_14x32_body(const bool bpf_on, int64_t kc, const float *restrict Ap,
                                         const float *restrict Bp, float *restrict C, int64_t ldc,
                                         float alpha, float beta, int64_t bpf) {
    __m512 c0[MR512], c1[MR512];
#pragma GCC unroll 14
    for (int i = 0; i < MR512; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    /* the C tile (2 lines per row) is prefetched UKR_CPF k steps before the end, where it is
     * read (beta != 0) or written: prefetched at the start, it left L1 again during a long K */
    const int64_t kpf = kc > UKR_CPF ? kc - UKR_CPF : 0;
    for (int64_t k = 0; k < kc; k++) {
        if (k == kpf)
#pragma GCC unroll 14
            for (int i = 0; i < MR512; i++) {
                _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(C + i * ldc + 31), _MM_HINT_T0);
            }
        __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);
        if (bpf_on) {
            _mm_prefetch((const char *)(Bp + bpf), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + bpf + 16), _MM_HINT_T0);
        }
        _mm_prefetch((const char *)(Ap + 8 * MR512), _MM_HINT_T0);
#pragma GCC unroll 14
        for (int i = 0; i < MR512; i++) {
            __m512 a = _mm512_set1_ps(Ap[i]);
            c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
        Ap += MR512;
        Bp += 32;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    if (beta == 0.0f) {
#pragma GCC unroll 14
        for (int i = 0; i < MR512; i++) {
            _mm512_storeu_ps(C + i * ldc, _mm512_mul_ps(va, c0[i]));
            _mm512_storeu_ps(C + i * ldc + 16, _mm512_mul_ps(va, c1[i]));
        }
    } else {
#pragma GCC unroll 14
        for (int i = 0; i < MR512; i++) {
            float *c = C + i * ldc;
            _mm512_storeu_ps(c, _mm512_fmadd_ps(va, c0[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c))));
            _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, c1[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c + 16))));
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
static void ukr_avx512_14x32(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                             float *restrict C, int64_t ldc, float alpha, float beta) {
    ukr_avx512_14x32_body(false, kc, Ap, Bp, C, ldc, alpha, beta, 0);
}

/* The same kernel with the B micro-panel's lines prefetched into L1 a few k steps ahead (two
 * 64-byte lines per k step). Where the B micro-panel (KC x 32 floats, 128 KiB at KC = 1024)
 * lives in L2, each k step misses L1 on both B lines; Zen's L1 prefetcher keeps up with that
 * stream, Intel's does not: on the Intel VM (1 thread, CPU time, three alternations) x·Wᵀ ran
 * at 164-177 GFLOP/s against 147-157 plain, dy·W +2-8 %, dyᵀ·x +6-8 %. Chosen for the AVX-512
 * kernel by vendor (MMC_GEMM_UKR=plain|bpf overrides); results are the same bits (prefetches
 * change no arithmetic). */
static int g_ukr_bpf = 8; /* k steps ahead (MMC_GEMM_BPF) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
static void ukr_avx512_14x32_bpf(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                                 float *restrict C, int64_t ldc, float alpha, float beta) {
    ukr_avx512_14x32_body(true, kc, Ap, Bp, C, ldc, alpha, beta, 32 * (int64_t)g_ukr_bpf);
}

/* The f32 kernel for the first `rows` rows of a tile only: a partial row tile (M not a multiple
 * of 14) costs its rows, not 14. A 16-sequence decode step of the serving engine is 14 + 2 rows,
 * and the full kernel on the 2-row tile spent 12 of its 28 rows' FMAs on padding. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline))
static inline void ukr_avx512_rows_body(const int rows, int64_t kc, const float *restrict Ap,
                                        const float *restrict Bp, float *restrict T, int64_t bpf) {
    __m512 c0[MR512], c1[MR512];
    for (int i = 0; i < rows; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);
        if (bpf) { /* as ukr_avx512_14x32_bpf: the B micro-panel streams from L2 on Intel */
            _mm_prefetch((const char *)(Bp + bpf), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + bpf + 16), _MM_HINT_T0);
            _mm_prefetch((const char *)(Ap + 8 * MR512), _MM_HINT_T0);
        }
        for (int i = 0; i < rows; i++) {
            __m512 a = _mm512_set1_ps(Ap[i]);
            c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
        Ap += MR512;
        Bp += 32;
    }
    for (int i = 0; i < rows; i++) {
        _mm512_storeu_ps(T + i * 32, c0[i]);
        _mm512_storeu_ps(T + i * 32 + 16, c1[i]);
    }
}

static kdesc K_AVX512; /* defined with the other kernels below */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
static void ukr_avx512_rows(int rows, int64_t kc, const float *restrict Ap, const float *restrict Bp,
                            float *restrict T) {
    /* the B prefetch of the full tile's kernel where that one prefetches (Intel): without it the
     * 8-row tile of M = 512 waited on L2 for B: 4-7 % of x·Wᵀ's profile for 1.6 % of its work; 3-5 % with it */
    const int64_t bpf = K_AVX512.ukr == ukr_avx512_14x32_bpf ? 32 * (int64_t)g_ukr_bpf : 0;
    switch (rows) {   /* constant row counts: the accumulators stay in registers */
#define ROWS_CASE(r) case r: ukr_avx512_rows_body(r, kc, Ap, Bp, T, bpf); break;
    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) ROWS_CASE(7)
    ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12) ROWS_CASE(13)
#undef ROWS_CASE
    default: MMC_CHECK(false, "gemm: %d rows for a partial tile", rows);
    }
}

/* bf16 weights on CPUs with AVX512_BF16, for inference GEMMs only (mmc_gemm_bf16_infer; opt-in:
 * MMC_GEMM_BF16=dot or mmc_gemm_set_bf16_dot; training and backward stay on the exact path):
 * vdpbf16ps multiplies bf16 pairs and adds both products to an f32 lane, so A (activations)
 * must be rounded to bf16 too. Packed A holds, per k pair and row, the 32-bit pair
 * (A[i][2p], A[i][2p+1]); packed B, per k pair, 32 such pairs (one per column) in two zmm.
 * Per pair step: 2 loads, 14 broadcasts, 28 vdpbf16ps = 896 multiply-adds, twice the f32
 * kernel's per instruction. Results differ from the exact-product f32 path by the rounding
 * of A (relative 2^-9 per element; see tests/test_gemm.c and the README for measured errors),
 * which is why it is not the default. kc counts k (not pairs); an odd tail pairs with zero. */
#define TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
TBF16 static void ukr_bf16dot_14x32(int64_t kc, const float *restrict Ap_, const float *restrict Bp_,
                                    float *restrict C, int64_t ldc, float alpha, float beta) {
    const uint32_t *restrict Ap = (const uint32_t *)Ap_;
    const uint32_t *restrict Bp = (const uint32_t *)Bp_;
    __m512 c0[MR512], c1[MR512];
#pragma GCC unroll 14
    for (int i = 0; i < MR512; i++) {
        c0[i] = c1[i] = _mm512_setzero_ps();
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + i * ldc + 31), _MM_HINT_T0);
    }
    const int64_t kp = (kc + 1) / 2;
    for (int64_t k = 0; k < kp; k++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512((const void *)Bp);
        __m512bh b1 = (__m512bh)_mm512_load_si512((const void *)(Bp + 16));
        _mm_prefetch((const char *)(Ap + 8 * MR512), _MM_HINT_T0);
#pragma GCC unroll 14
        for (int i = 0; i < MR512; i++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)Ap[i]);
            c0[i] = _mm512_dpbf16_ps(c0[i], a, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], a, b1);
        }
        Ap += MR512;
        Bp += 32;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 14
    for (int i = 0; i < MR512; i++) {
        float *c = C + i * ldc;
        if (beta == 0.0f) {
            _mm512_storeu_ps(c, _mm512_mul_ps(va, c0[i]));
            _mm512_storeu_ps(c + 16, _mm512_mul_ps(va, c1[i]));
        } else {
            _mm512_storeu_ps(c, _mm512_fmadd_ps(va, c0[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c))));
            _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, c1[i], _mm512_mul_ps(vb, _mm512_loadu_ps(c + 16))));
        }
    }
}

/* bf16 weights on CPUs with AMX (Intel Sapphire Rapids and later), under the same opt-in as the
 * vdpbf16ps kernel (MMC_GEMM_BF16=dot picks it first where the CPU has it; =amx forces it): the
 * same contract, A rounded to bf16, products of bf16 pairs summed in f32. TDPBF16PS multiplies a
 * 16×32 bf16 tile of A by a 16-pair × 16-column tile of B and adds into a 16×16 f32 tile:
 * 8192 multiply-adds per instruction. The register tile is 32×32 of C in four accumulator tiles
 * (tmm0 C[0:16, 0:16], tmm1 C[0:16, 16:32], tmm2 C[16:32, 0:16], tmm3 C[16:32, 16:32]); per step
 * of 32 k, two A tiles (tmm4 rows 0-15, tmm5 rows 16-31) and two B tiles (tmm6 columns 0-15,
 * tmm7 columns 16-31) are loaded and multiplied four ways.
 * Packed A per 32-row panel: [k step t][row i][16 pairs] (t of 32 k: 2 KiB, the two A tiles back
 * to back with a 64-byte row stride). Packed B is the vdpbf16ps kernel's panel, [pair q][32
 * columns] (128-byte rows: the two B tiles are its left and right halves). Both are zero-padded
 * to whole steps of 32 k (kslots), so the kernel never reconfigures its tiles. The tile
 * configuration is per thread: loaded on a thread's first AMX call and released (tile data
 * dropped, so context switches stop saving it) when the thread's share of the GEMM ends. */
#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#define MR_AMX 32
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;
static _Thread_local bool tl_amx_configured;

TAMX static void amx_configure(void) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    tl_amx_configured = true;
}
TAMX static void amx_release(void) {
    if (tl_amx_configured) {
        _tile_release();
        tl_amx_configured = false;
    }
}

/* C = alpha * (the accumulator tiles tmm0-3, a 32x32 block) + beta * C: stored straight when alpha = 1,
 * beta = 0, else through a staging block (beta = 0 never reads C). */
TAMX static void amx_store_c(float *restrict C, int64_t ldc, float alpha, float beta) {
    if (alpha == 1.0f && beta == 0.0f) {
        const int64_t s = ldc * (int64_t)sizeof(float);
        _tile_stored(0, C, s);
        _tile_stored(1, C + 16, s);
        _tile_stored(2, C + 16 * ldc, s);
        _tile_stored(3, C + 16 * ldc + 16, s);
        return;
    }
    float T[MR_AMX * 32] __attribute__((aligned(64)));
    _tile_stored(0, T, 128);
    _tile_stored(1, T + 16, 128);
    _tile_stored(2, T + 512, 128);
    _tile_stored(3, T + 528, 128);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < MR_AMX; i++) {
        float *c = C + i * ldc;
        const __m512 t0 = _mm512_load_ps(T + 32 * i), t1 = _mm512_load_ps(T + 32 * i + 16);
        if (beta == 0.0f) {
            _mm512_storeu_ps(c, _mm512_mul_ps(va, t0));
            _mm512_storeu_ps(c + 16, _mm512_mul_ps(va, t1));
        } else if (alpha == 1.0f && beta == 1.0f) {
            _mm512_storeu_ps(c, _mm512_add_ps(t0, _mm512_loadu_ps(c)));
            _mm512_storeu_ps(c + 16, _mm512_add_ps(t1, _mm512_loadu_ps(c + 16)));
        } else {
            _mm512_storeu_ps(c, _mm512_fmadd_ps(va, t0, _mm512_mul_ps(vb, _mm512_loadu_ps(c))));
            _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, t1, _mm512_mul_ps(vb, _mm512_loadu_ps(c + 16))));
        }
    }
}

TAMX static void ukr_amx_32x32(int64_t kc, const float *restrict Ap_, const float *restrict Bp_,
                               float *restrict C, int64_t ldc, float alpha, float beta) {
    if (!tl_amx_configured) amx_configure();
    const char *Ap = (const char *)Ap_, *Bp = (const char *)Bp_;
    const int64_t steps = (kc + 31) / 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < steps; t++) {
        _tile_loadd(4, Ap, 64);
        _tile_loadd(6, Bp, 128);
        _tile_loadd(7, Bp + 64, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, Ap + 1024, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        Ap += 2048;
        Bp += 2048;
    }
    amx_store_c(C, ldc, alpha, beta);
}

/* ---- bf16x3: f32 x f32 GEMMs on AMX at near-f32 precision (MMC_MATMUL_PRECISION=high; opt-in).
 * Each f32 operand x is split into two bf16: hi = bf16(x) (nearest-even) and lo = bf16(x - hi)
 * (x - hi is exact in f32). With u = 2^-8 (bf16's unit roundoff), |x - hi| <= u|x| and
 * |x - hi - lo| <= u^2|x|, so a·b = ah·bh + ah·bl + al·bh + d with
 *   |d| = |al·bl + ah·rb + ra·b + al·rb| <= (3 + 3u) u^2 |a||b|   (ra, rb: the residuals a-ah-al, b-bh-bl),
 * about 4.6e-5 |a||b| at worst, against f32's u_f32 = 2^-24 per product and plain bf16's ~2u = 2^-7.
 * The three bf16 products are exact in f32 and are summed by TDPBF16PS into the f32 tiles, so a C
 * element's error is at most sum_k |d_k| plus the f32 summation of 3K terms (gamma_3K ~ 3K 2^-24
 * of sum |a||b| in the worst case, ~sqrt(3K) 2^-24 typically); measured in tests/test_gemm_bf16x3.c.
 * Rounding errors of independent elements have random signs, so the measured error is well below
 * the worst case (README "bf16x3"). Cost: three tile products per 32-k step where the bf16 kernel
 * does one, on the same 32x32 register tile as ukr_amx_32x32 (tmm0-3 accumulate C; tmm4/5 hold two
 * 16-row A tiles, tmm6/7 two 16-column B tiles): per step, Ahi·Bhi, Ahi·Blo, Alo·Bhi, with ten tile
 * loads for twelve products. Packed A per 32-row panel: [k step t][hi | lo][row i][16 pairs] (4 KiB a
 * step); packed B: [k step t][hi | lo][pair q][32 columns] (4 KiB a step): 4 bytes per element, as
 * the f32 kernel's panels. "medium" (bf16x1) uses ukr_amx_32x32 itself on hi parts only: the
 * K_AMX layout, packed from f32 by the same functions. */
TAMX static void ukr_bf16x3_32x32(int64_t kc, const float *restrict Ap_, const float *restrict Bp_,
                                  float *restrict C, int64_t ldc, float alpha, float beta) {
    if (!tl_amx_configured) amx_configure();
    const char *Ap = (const char *)Ap_, *Bp = (const char *)Bp_;
    const int64_t steps = (kc + 31) / 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < steps; t++) {
        _tile_loadd(4, Ap, 64);          /* A hi rows 0-15 */
        _tile_loadd(6, Bp, 128);         /* B hi columns 0-15 */
        _tile_loadd(7, Bp + 64, 128);    /* B hi columns 16-31 */
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, Ap + 1024, 64);   /* A hi rows 16-31 */
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(6, Bp + 2048, 128);  /* B lo */
        _tile_loadd(7, Bp + 2112, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, Ap + 2048, 64);   /* A lo */
        _tile_loadd(6, Bp, 128);         /* B hi again */
        _tile_loadd(7, Bp + 64, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, Ap + 3072, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        Ap += 4096;
        Bp += 4096;
    }
    amx_store_c(C, ldc, alpha, beta);
}

/* Cache blocks (mc, kc, nc) are not constants: init_blocking derives them from this machine's
 * caches (cpuinfo.c's model; on Zen 5 it gives the 84 / 1024 / 2048 measured best there).
 * KC is the one blocking choice that changes results (the f32 summation order); MC and NC do
 * not. The bf16-dot kernel packs 2-byte elements, so the same bytes hold twice the rows. */
static kdesc K_AVX512 = {"avx512", MR512, 32, 4, 2, 0, 0, 0, ukr_avx512_14x32, ukr_avx512_rows};
static kdesc K_BF16DOT = {"avx512_bf16", MR512, 32, 2, 2, 0, 0, 0, ukr_bf16dot_14x32, NULL};
static kdesc K_AMX = {"amx_bf16", MR_AMX, 32, 2, 2, 0, 0, 0, ukr_amx_32x32, NULL};
static kdesc K_AVX2 = {"avx2", 6, 16, 4, 1, 0, 0, 0, ukr_avx2_6x16, NULL};
static kdesc K_GENERIC = {"generic", 4, 16, 4, 1, 0, 0, 0, ukr_generic_4x16, NULL};
/* f32 x f32 GEMMs under MMC_MATMUL_PRECISION=high (bf16x3) / medium (bf16x1; ukr_bf16x3_32x32) */
static kdesc K_BF16X3 = {"amx_bf16x3", MR_AMX, 32, 4, 2, 0, 0, 0, ukr_bf16x3_32x32, NULL};
static kdesc K_BF16X1 = {"amx_bf16x1", MR_AMX, 32, 2, 2, 0, 0, 0, ukr_amx_32x32, NULL};
static kdesc *const g_all[] = {&K_AVX512, &K_BF16DOT, &K_AMX, &K_AVX2, &K_GENERIC, &K_BF16X3, &K_BF16X1};
static inline bool kd_split(const kdesc *k) { return k == &K_BF16X3 || k == &K_BF16X1; }
static void init_matmul_precision(void);

static const kdesc *g_kernel;
/* packed inference bf16 GEMMs on bf16 products: 0 no (exact), 1 K_BF16DOT, 2 K_AMX */
static int g_bf16_dot;
/* How a team shares a packed GEMM (gemm_packed): -1 auto, 0 "slices", 1 "shared"
 * (MMC_GEMM_SPLIT) */
static int g_split = -1;
static const char *g_blocking_source = "model";
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

static int env_int(const char *name, int def) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : def;
}

static bool cpu_avx512(void) {
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    return ci->avx512f && ci->avx512bw && ci->avx512vl && ci->avx512dq && ci->fma;
}
static bool cpu_bf16dot(void) { return cpu_avx512() && mmc_cpu_info_get()->avx512_bf16; }

/* AMX: the CPU has it, the OS saves its state (cpuinfo.c reads XCR0) and Linux lets this process
 * use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once for the whole process). */
static bool g_amx_permitted;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static void amx_ask_permission(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    g_amx_permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
}
static bool cpu_amx(void) {
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    if (!(cpu_bf16dot() && ci->amx_tile && ci->amx_bf16)) return false;
    pthread_once(&g_amx_once, amx_ask_permission);
    return g_amx_permitted;
}

static void set_blocks(kdesc *k, int64_t mc, int64_t kc, int64_t nc) {
    if (mc > 0) k->mc = (mc + k->mr - 1) / k->mr * k->mr;
    if (kc > 0) k->kc = k->elem_bytes == 2 ? (kc + 1) / 2 * 2 : kc; /* pairs: k blocks start even */
    if (kc > 0 && (k == &K_AMX || kd_split(k))) k->kc = (kc + 31) / 32 * 32; /* whole tile steps */
    if (nc > 0) k->nc = (nc + k->nr - 1) / k->nr * k->nr;
}

/* Blocking of every kernel from the caches, then the tuning hooks: MMC_GEMM_BLOCKING=mc,kc,nc
 * and the single MMC_GEMM_MC / _KC / _NC (which win over it). Fixed for the process. */
static void init_blocking(void) {
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    for (size_t i = 0; i < sizeof g_all / sizeof g_all[0]; i++) {
        kdesc *k = g_all[i];
        mmc_gemm_tile t = {k->mr, k->nr, k->elem_bytes, k->panel_level};
        mmc_gemm_blocking b;
        MMC_CHECK(mmc_gemm_blocking_derive(&ci->cache, &t, &b) == MMC_OK, "gemm: %s", mmc_last_error());
        k->mc = b.mc, k->kc = b.kc, k->nc = b.nc;
    }
    K_AMX.kc = K_AMX.kc < 32 ? 32 : K_AMX.kc / 32 * 32;
    K_BF16X3.kc = K_BF16X3.kc < 32 ? 32 : K_BF16X3.kc / 32 * 32;
    K_BF16X1.kc = K_BF16X1.kc < 32 ? 32 : K_BF16X1.kc / 32 * 32;
    const char *bl = getenv("MMC_GEMM_BLOCKING");
    if (bl && *bl) {
        long long mc, kc, nc;
        char tail;
        if (sscanf(bl, "%lld,%lld,%lld%c", &mc, &kc, &nc, &tail) == 3 && mc > 0 && kc > 0 && nc > 0 &&
            mc <= 1 << 16 && kc <= 1 << 16 && nc <= 1 << 20) {
            for (size_t i = 0; i < sizeof g_all / sizeof g_all[0]; i++) set_blocks(g_all[i], mc, kc, nc);
            g_blocking_source = "MMC_GEMM_BLOCKING";
        } else {
            fprintf(stderr, "mmc: ignoring MMC_GEMM_BLOCKING='%s' (want mc,kc,nc: three positive integers)\n", bl);
        }
    }
    int mc = env_int("MMC_GEMM_MC", 0), kc = env_int("MMC_GEMM_KC", 0), nc = env_int("MMC_GEMM_NC", 0);
    if (mc > 0 || kc > 0 || nc > 0) {
        for (size_t i = 0; i < sizeof g_all / sizeof g_all[0]; i++) set_blocks(g_all[i], mc, kc, nc);
        g_blocking_source = "MMC_GEMM_MC/KC/NC";
    }
    const char *sp = getenv("MMC_GEMM_SPLIT");
    if (sp && strcmp(sp, "shared") == 0) g_split = 1;
    else if (sp && strcmp(sp, "slices") == 0) g_split = 0;
    else if (sp && *sp && strcmp(sp, "auto") != 0)
        fprintf(stderr, "mmc: ignoring MMC_GEMM_SPLIT='%s' (want auto, slices or shared)\n", sp);
    const char *uk = getenv("MMC_GEMM_UKR");
    if (!strcmp(ci->vendor, "GenuineIntel")) K_AVX512.ukr = ukr_avx512_14x32_bpf;
    if (uk && !strcmp(uk, "plain")) K_AVX512.ukr = ukr_avx512_14x32;
    else if (uk && !strcmp(uk, "bpf")) K_AVX512.ukr = ukr_avx512_14x32_bpf;
    else if (uk && *uk)
        fprintf(stderr, "mmc: ignoring MMC_GEMM_UKR='%s' (want plain or bpf)\n", uk);
    if (env_int("MMC_GEMM_BPF", 0) > 0) g_ukr_bpf = env_int("MMC_GEMM_BPF", 0);
    const char *bf = getenv("MMC_GEMM_BF16");
    if (bf && *bf && strcmp(bf, "f32") != 0) {
        const int mode = strcmp(bf, "dot") == 0 ? (cpu_amx() ? 2 : 1) : strcmp(bf, "amx") == 0 ? 2
                         : strcmp(bf, "avx512_bf16") == 0 ? 1 : -1;
        if (mode < 0)
            fprintf(stderr, "mmc: ignoring MMC_GEMM_BF16='%s' (want dot, amx, avx512_bf16 or f32)\n", bf);
        else if (mode == 2 && !cpu_amx())
            fprintf(stderr, "mmc: MMC_GEMM_BF16=%s ignored: this CPU (or the OS) offers no AMX\n", bf);
        else if (mode == 1 && !cpu_bf16dot())
            fprintf(stderr, "mmc: MMC_GEMM_BF16=%s ignored: this CPU lacks AVX512_BF16\n", bf);
        else
            g_bf16_dot = mode;
    }
    init_matmul_precision();
}

static const kdesc *kernel(void) {
    pthread_once(&g_init_once, init_blocking);
    const kdesc *k = __atomic_load_n(&g_kernel, __ATOMIC_ACQUIRE);
    if (k) return k;
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    const bool avx2 = ci->avx2 && ci->fma;
    const char *force = getenv("MMC_GEMM_KERNEL");
    if (force && strcmp(force, "generic") == 0) k = &K_GENERIC;
    else if (force && strcmp(force, "avx2") == 0 && avx2) k = &K_AVX2;
    else if (cpu_avx512()) k = &K_AVX512;
    else if (avx2) k = &K_AVX2;
    else k = &K_GENERIC;
    __atomic_store_n(&g_kernel, k, __ATOMIC_RELEASE);
    return k;
}

/* The kernel a packed GEMM runs: the bf16-dot kernel for an inference GEMM with bf16 B when it
 * is switched on and the AVX-512 kernel is the one chosen (a forced avx2/generic stays). */
static const kdesc *kernel_for(bool b16_infer) {
    const kdesc *k = kernel();
    if (!b16_infer || k != &K_AVX512) return k;
    const int mode = __atomic_load_n(&g_bf16_dot, __ATOMIC_RELAXED);
    return mode == 2 ? &K_AMX : mode == 1 ? &K_BF16DOT : k;
}

/* ---- MMC_MATMUL_PRECISION: the kernel of f32 x f32 packed GEMMs (see ukr_bf16x3_32x32).
 * 0 highest (f32, the default), 1 high (bf16x3 on AMX), 2 medium (bf16x1 on AMX, and bf16-weight
 * inference GEMMs on bf16 products as --bf16-matmul). Without AMX, high and medium keep f32 GEMMs
 * on the f32 kernel; a forced avx2 / generic kernel stays, as kernel_for's rule. */
static int g_f32_prec;
static const char *const g_prec_names[] = {"highest", "high", "medium"};

static int prec_parse(const char *name) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, g_prec_names[i])) return i;
    return -1;
}

static int prec_apply(int p) {
    __atomic_store_n(&g_f32_prec, p, __ATOMIC_RELAXED);
    if (p == 2 && cpu_bf16dot()) __atomic_store_n(&g_bf16_dot, cpu_amx() ? 2 : 1, __ATOMIC_RELAXED);
    return p == 0 || cpu_amx() ? 0 : 1;
}

static void init_matmul_precision(void) { /* from init_blocking: MMC_MATMUL_PRECISION */
    const char *e = getenv("MMC_MATMUL_PRECISION");
    if (!e || !*e) return;
    const int p = prec_parse(e);
    if (p < 0) fprintf(stderr, "mmc: ignoring MMC_MATMUL_PRECISION='%s' (want highest, high or medium)\n", e);
    else if (prec_apply(p) > 0)
        fprintf(stderr, "mmc: MMC_MATMUL_PRECISION=%s: this CPU (or the OS) offers no AMX; f32 GEMMs stay f32\n", e);
}

/* The kernel of a packed f32 x f32 GEMM under the precision in effect. */
static const kdesc *kernel_f32(void) {
    const kdesc *k = kernel();
    const int p = __atomic_load_n(&g_f32_prec, __ATOMIC_RELAXED);
    if (p == 0 || k != &K_AVX512 || !cpu_amx()) return k;
    return p == 1 ? &K_BF16X3 : &K_BF16X1;
}

int mmc_gemm_set_matmul_precision(const char *name) {
    pthread_once(&g_init_once, init_blocking);
    const int p = name ? prec_parse(name) : -1;
    return p < 0 ? -1 : prec_apply(p);
}

const char *mmc_gemm_matmul_precision(void) {
    pthread_once(&g_init_once, init_blocking);
    return g_prec_names[__atomic_load_n(&g_f32_prec, __ATOMIC_RELAXED)];
}

/* 4-byte slots per row of a packed panel for kc values of k: one per k (f32), one per k pair
 * (bf16 pairs). Packed panels are laid out back to back with this stride. */
static inline int64_t kslots(const kdesc *kd, int64_t kc) {
    if (kd == &K_AMX) return (kc + 31) / 32 * 16; /* pairs, zero-padded to whole tile steps */
    if (kd_split(kd)) return (kc + 31) / 32 * (kd == &K_BF16X3 ? 32 : 16); /* hi (and lo) pairs */
    return kd->elem_bytes == 2 ? (kc + 1) / 2 : kc;
}

const char *mmc_gemm_kernel_name(void) { return kernel()->name; }

int mmc_gemm_set_kernel(const char *name) {
    const kdesc *k = NULL;
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    pthread_once(&g_init_once, init_blocking);
    if (strcmp(name, "generic") == 0) k = &K_GENERIC;
    else if (strcmp(name, "avx2") == 0 && ci->avx2 && ci->fma) k = &K_AVX2;
    else if (strcmp(name, "avx512") == 0 && cpu_avx512()) k = &K_AVX512;
    if (!k) return -1;
    __atomic_store_n(&g_kernel, k, __ATOMIC_RELEASE);
    return 0;
}

int mmc_gemm_set_bf16_dot(bool on) {
    pthread_once(&g_init_once, init_blocking);
    if (on && !cpu_bf16dot()) return -1;
    __atomic_store_n(&g_bf16_dot, on ? (cpu_amx() ? 2 : 1) : 0, __ATOMIC_RELAXED);
    return 0;
}

int mmc_gemm_set_bf16_kernel(const char *name) {
    pthread_once(&g_init_once, init_blocking);
    int mode = -1;
    if (strcmp(name, "f32") == 0) mode = 0;
    else if (strcmp(name, "avx512_bf16") == 0 && cpu_bf16dot()) mode = 1;
    else if (strcmp(name, "amx_bf16") == 0 && cpu_amx()) mode = 2;
    if (mode < 0) return -1;
    __atomic_store_n(&g_bf16_dot, mode, __ATOMIC_RELAXED);
    return 0;
}

static void describe(const kdesc *k, mmc_gemm_path *p) {
    p->kernel = k->name;
    p->mr = k->mr, p->nr = k->nr;
    p->mc = k->mc, p->kc = k->kc, p->nc = k->nc;
}

void mmc_gemm_describe(mmc_gemm_info *out) {
    const kdesc *k = kernel();
    describe(k, &out->f32);
    out->f32_b_prefetch = k == &K_AVX512 && K_AVX512.ukr == ukr_avx512_14x32_bpf ? g_ukr_bpf : 0;
    describe(k, &out->bf16);
    describe(kernel_for(true), &out->bf16_infer);
    out->bf16_dot = kernel_for(true) == &K_BF16DOT || kernel_for(true) == &K_AMX;
    out->bf16_dot_available = cpu_bf16dot();
    out->amx_available = cpu_amx();
    out->small_m = SMALL_M;
    out->small_m_kernel = k == &K_AVX512 ? "avx512" : "generic";
    out->blocking_source = g_blocking_source;
    out->split = g_split < 0 ? "auto" : g_split == 0 ? "slices" : "shared";
    describe(kernel_f32(), &out->f32_matmul);
    out->matmul_precision = g_prec_names[__atomic_load_n(&g_f32_prec, __ATOMIC_RELAXED)];
}

/* ------------------------------------------------------------------ buffers */

#define MAX_THREADS 256
typedef struct {
    float *b;              /* [KC, NC] packed B block, shared by the team */
    size_t b_cap;
    float *a[MAX_THREADS]; /* [MC, KC] packed A block per team thread */
    size_t a_cap;
    float *bt[MAX_THREADS]; /* [KC, <= NC] packed B block of team threads 1.. (sliced GEMMs;
                             * thread 0 uses b) */
    size_t bt_cap;
    float *v;              /* small-M: A copied contiguous [M, K] */
    size_t v_cap;
    bool registered;       /* the thread-exit destructor knows this thread's buffers */
} bufs;
static _Thread_local bufs tl_bufs;

/* A thread that ends (a server's connection or engine thread, an OpenMP pool torn down) frees its
 * packing buffers: a pthread key's destructor runs at thread exit, before its TLS goes. */
static pthread_key_t g_bufs_key;
static pthread_once_t g_bufs_once = PTHREAD_ONCE_INIT;
static void bufs_release(void *p) {
    bufs *t = p;
    free(t->b);
    for (int i = 0; i < MAX_THREADS; i++) free(t->a[i]), free(t->bt[i]);
    free(t->v);
    memset(t, 0, sizeof *t);
}
static void bufs_key_init(void) { MMC_CHECK(pthread_key_create(&g_bufs_key, bufs_release) == 0, "gemm: pthread_key_create"); }
static bufs *my_bufs(void) {
    bufs *t = &tl_bufs;
    if (!t->registered) {
        pthread_once(&g_bufs_once, bufs_key_init);
        pthread_setspecific(g_bufs_key, t);
        t->registered = true;
    }
    return t;
}

static float *grow(float *p, size_t *cap, size_t need_floats) {
    if (need_floats <= *cap) return p;
    free(p);
    size_t bytes = (need_floats * sizeof(float) + 63) / 64 * 64;
    p = aligned_alloc(64, bytes);
    MMC_CHECK(p, "gemm: out of memory for %zu-byte packing buffer", bytes);
    *cap = need_floats;
    return p;
}

/* Packing buffers of the calling thread for a team of nth: A blocks per thread, and either one
 * shared B block (bt_cols == 0) or one B block of up to bt_cols columns per thread. */
static void ensure_bufs(const kdesc *kd, int nth, int64_t bt_cols) {
    bufs *t = my_bufs();
    size_t need_a = (size_t)kd->mc * kslots(kd, kd->kc), need_b = (size_t)kslots(kd, kd->kc) * kd->nc;
    if (bt_cols < 0) {
        /* B pre-packed (mmc_gemm_pack_b): no B buffer */
    } else if (bt_cols > 0) { /* team thread 0 packs into b, the others into bt[i] */
        size_t need_bt = (size_t)kslots(kd, kd->kc) * (size_t)bt_cols;
        t->b = grow(t->b, &t->b_cap, need_bt);
        if (need_bt > t->bt_cap) {
            for (int i = 0; i < MAX_THREADS; i++) { free(t->bt[i]); t->bt[i] = NULL; }
            t->bt_cap = need_bt;
        }
        for (int i = 1; i < nth; i++)
            if (!t->bt[i]) {
                size_t cap = 0;
                t->bt[i] = grow(NULL, &cap, t->bt_cap);
            }
    } else {
        t->b = grow(t->b, &t->b_cap, need_b);
    }
    if (need_a > t->a_cap) {
        for (int i = 0; i < MAX_THREADS; i++) { free(t->a[i]); t->a[i] = NULL; }
        t->a_cap = need_a;
    }
    for (int i = 0; i < nth; i++)
        if (!t->a[i]) {
            size_t cap = 0;
            t->a[i] = grow(NULL, &cap, need_a);
        }
}

/* ------------------------------------------------------------------ packing */

/* ---- AVX-512 packing: 16×16 in-register transposes for the two transposing layouts */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* r[i] = row i (16 floats) -> r[k] = column k (16 rows). Unpack within 128-bit lanes, then
 * a 4×4 transpose of the lanes with shuffle_f32x4. */
T512 static inline void tr16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* 16 values of row `src` from element offset k (mask for the tail), f32 or bf16 widened. */
T512 static inline __m512 ld16(const void *src, bool b16, int64_t off, __mmask16 m) {
    if (b16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)src + off)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)src + off);
}

#ifndef PACK_PF_K
#define PACK_PF_K 64 /* elements: 4 steps of 16 ahead (measured on Zen 5, 1 thread: +6 % on a
                        * packing-bound GEMM from L3, +8 % from DRAM; a second, L2 prefetch
                        * further ahead added nothing) */
#endif
/* Transposing pack: `rows` (<= width <= 16) source rows, row i at element offset base_i =
 * row0 + i*ld, k in [k0, k0+kc); writes dst[k*stride + i] for i < width (zeros past rows). */
T512 static void pack_tr_avx512(const void *src, bool b16, int64_t row0, int64_t ld, int rows,
                                int width, int64_t k0, int64_t kc, float *dst, int64_t stride) {
    const __mmask16 wm = (__mmask16)((1u << width) - 1u);
    const int esz = b16 ? 2 : 4;
    for (int64_t kb = 0; kb < kc; kb += 16) {
        const int ke = kc - kb < 16 ? (int)(kc - kb) : 16;
        const __mmask16 km = (__mmask16)((1u << ke) - 1u);
        /* the rows' lines PACK_PF_K elements ahead: `rows` strided streams, each read one line
         * per step, are more than the hardware prefetchers follow (the loads stalled here) */
        if (kb + PACK_PF_K < kc)
            for (int i = 0; i < rows; i++)
                _mm_prefetch((const char *)src + (row0 + i * ld + k0 + kb + PACK_PF_K) * esz, _MM_HINT_T0);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? ld16(src, b16, row0 + i * ld + k0 + kb, km) : _mm512_setzero_ps();
        tr16(r);
        for (int k = 0; k < ke; k++) _mm512_mask_storeu_ps(dst + (kb + k) * stride, wm, r[k]);
    }
}

/* Transposed A (stored [K, M]): a panel's MR values at each k are contiguous in the source;
 * one masked 16-lane copy per k, panels written sequentially. */
T512 static void pack_a_t_avx512(const float *A, int64_t lda, int64_t m0, int64_t mc, int64_t k0,
                                 int64_t kc, float *restrict Ap) {
    const int mr = MR512;
    const __mmask16 full = (__mmask16)((1u << mr) - 1u);
    /* k outer: each source row's mc values are read once, contiguously, and dealt out to the
     * panels; the row 8 ahead is prefetched (the stride defeats the hardware prefetchers).
     * Measured on Zen 5 (dyᵀ·x, 1 thread): its share of the time 3.9-5.3 % -> 2.6-2.9 %. */
    const int64_t seg = mc * (int64_t)sizeof(float);
    for (int64_t k = 0; k < kc; k++) {
        const float *src = A + (k0 + k) * lda + m0;
        if (k + 8 < kc)
            for (int64_t o = 0; o < seg + 63; o += 64) _mm_prefetch((const char *)(src + 8 * lda) + o, _MM_HINT_T0);
        for (int64_t p = 0; p < mc; p += mr) {
            const int64_t rows = mc - p < mr ? mc - p : mr;
            const __mmask16 m = (__mmask16)((1u << rows) - 1u);
            _mm512_mask_storeu_ps(Ap + p * kc + k * mr, full, _mm512_maskz_loadu_ps(m, src + p));
        }
    }
}

/* ---- bf16-dot packing: 32-bit (even k, odd k) bf16 pairs; an odd last k pairs with 0 */

/* A (f32) rows [m0, m0+mc) × k [k0, k0+kc) as MR-row panels of pairs, Ap[p][q][i] =
 * (A[i][k0+2q], A[i][k0+2q+1]) rounded to bf16 (nearest-even). [M, K]: 32 k of each row
 * converted by vcvtne2ps2bf16 into 16 pairs, then a 16×16 transpose of the 32-bit pairs. */
TBF16 static void pack_a_dot(bool ta, const float *A, int64_t lda, int64_t m0, int64_t mc, int64_t k0,
                             int64_t kc, float *Ap_) {
    uint32_t *Ap = (uint32_t *)Ap_;
    const int mr = MR512;
    const __mmask16 wm = (__mmask16)((1u << mr) - 1u);
    for (int64_t p = 0; p < mc; p += mr) {
        const int rows = mc - p < mr ? (int)(mc - p) : mr;
        uint32_t *dst = Ap + p * ((kc + 1) / 2); /* panels of MR rows × (kc+1)/2 pairs, back to back */
        if (ta) { /* A stored [K, M]: the panel's rows are contiguous at each k */
            for (int64_t q = 0; q < (kc + 1) / 2; q++) {
                const float *lo = A + (k0 + 2 * q) * lda + m0 + p, *hi = 2 * q + 1 < kc ? lo + lda : NULL;
                for (int i = 0; i < mr; i++)
                    dst[q * mr + i] = i >= rows ? 0u
                                                : (uint32_t)mmc_f32_to_bf16(lo[i]) |
                                                      (uint32_t)(hi ? mmc_f32_to_bf16(hi[i]) : 0) << 16;
            }
            continue;
        }
        for (int64_t kb = 0; kb < kc; kb += 32) {
            const int ke = kc - kb < 32 ? (int)(kc - kb) : 32;
            const __mmask16 mlo = ke >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ke) - 1u);
            const __mmask16 mhi = ke <= 16 ? 0 : ke == 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ke - 16)) - 1u);
            __m512 r[16];
            for (int i = 0; i < 16; i++) {
                if (i < rows) {
                    const float *src = A + (m0 + p + i) * lda + k0 + kb;
                    __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(mhi, src + 16), _mm512_maskz_loadu_ps(mlo, src));
                    r[i] = _mm512_castsi512_ps((__m512i)h);
                } else {
                    r[i] = _mm512_setzero_ps();
                }
            }
            tr16(r);
            for (int q = 0; q < (ke + 1) / 2; q++) _mm512_mask_storeu_ps(dst + (kb / 2 + q) * mr, wm, r[q]);
        }
    }
}

/* One NR=32 panel of bf16 B, columns [n0, n0+cols) × k [k0, k0+kc): Bp[q][j] = (op(B)[k0+2q][j],
 * op(B)[k0+2q+1][j]), zero past cols, and zero pair rows from (kc+1)/2 up to ks (the panel's rows,
 * kslots: the AMX kernel's whole tile steps). [N, K] rows already hold k pairs side by side: 16×16
 * transposes of 32-bit words. [K, N]: rows 2q and 2q+1 widened to 32 bits and interleaved. */
TBF16 static void pack_b_dot(bool tb, const uint16_t *B, int64_t ldb, int64_t n0, int64_t cols, int64_t k0,
                             int64_t kc, int64_t ks, float *Bp_) {
    uint32_t *Bp = (uint32_t *)Bp_;
    const int nr = 32;
    if (ks > (kc + 1) / 2) memset(Bp + (kc + 1) / 2 * nr, 0, (size_t)(ks - (kc + 1) / 2) * nr * sizeof(uint32_t));
    for (int g = 0; g < nr; g += 16) {
        const int w = cols - g > 16 ? 16 : cols - g > 0 ? (int)(cols - g) : 0;
        if (tb) {
            for (int64_t kb = 0; kb < kc; kb += 32) {
                const int ke = kc - kb < 32 ? (int)(kc - kb) : 32;
                const __mmask32 km = ke == 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << ke) - 1u);
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = i < w ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(km, B + (n0 + g + i) * ldb + k0 + kb))
                                 : _mm512_setzero_ps();
                tr16(r);
                for (int q = 0; q < (ke + 1) / 2; q++) _mm512_store_ps((float *)(Bp + (kb / 2 + q) * nr + g), r[q]);
            }
        } else {
            const __mmask16 m = (__mmask16)((1u << w) - 1u);
            for (int64_t q = 0; q < (kc + 1) / 2; q++) {
                const uint16_t *lo = B + (k0 + 2 * q) * ldb + n0 + g;
                __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo));
                if (2 * q + 1 < kc)
                    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + ldb)), 16));
                _mm512_store_si512((void *)(Bp + q * nr + g), v);
            }
        }
    }
}

/* ---- AMX packing (see ukr_amx_32x32): A as [k step][row][16 pairs] per 32-row panel */

/* A (f32) rows [m0, m0+mc) × k [k0, k0+kc), rounded to bf16 (nearest-even), zero past the rows
 * and past kc up to the whole step. [M, K]: 32 k of a row are one vcvtne2ps2bf16. */
TBF16 static void pack_a_amx(bool ta, const float *A, int64_t lda, int64_t m0, int64_t mc, int64_t k0,
                             int64_t kc, float *Ap_) {
    uint16_t *Ap = (uint16_t *)Ap_;
    const int64_t steps = (kc + 31) / 32;
    for (int64_t p = 0; p < mc; p += MR_AMX) {
        const int rows = mc - p < MR_AMX ? (int)(mc - p) : MR_AMX;
        uint16_t *dst = Ap + p * steps * 32; /* panels of 32 rows × steps × 32 bf16 */
        for (int64_t t = 0; t < steps; t++) {
            const int ke = kc - 32 * t < 32 ? (int)(kc - 32 * t) : 32;
            uint16_t *d = dst + t * MR_AMX * 32;
            if (ta) { /* A stored [K, M]: op(A)[m, k] = A[k*lda + m] */
                for (int i = 0; i < MR_AMX; i++)
                    for (int q = 0; q < 32; q++)
                        d[i * 32 + q] = i < rows && q < ke ? mmc_f32_to_bf16(A[(k0 + 32 * t + q) * lda + m0 + p + i]) : 0;
                continue;
            }
            const __mmask16 mlo = ke >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ke) - 1u);
            const __mmask16 mhi = ke <= 16 ? 0 : ke == 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ke - 16)) - 1u);
            for (int i = 0; i < MR_AMX; i++) {
                __m512i v = _mm512_setzero_si512();
                if (i < rows) {
                    const float *src = A + (m0 + p + i) * lda + k0 + 32 * t;
                    v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(mhi, src + 16), _mm512_maskz_loadu_ps(mlo, src));
                }
                _mm512_store_si512((void *)(d + i * 32), v);
            }
        }
    }
}

/* ---- bf16x3 / bf16x1 packing (see ukr_bf16x3_32x32): f32 split into hi = bf16(x) and
 * lo = bf16(x - hi) (parts 2) or hi alone (parts 1, the K_AMX layout). A non-finite hi (inf, NaN)
 * gets lo 0, so inf·b stays inf instead of inf - inf = NaN. */
TBF16 static inline void split16(__m512 x, __m256i *h, __m256i *l) {
    const __m256i hb = (__m256i)_mm512_cvtneps_pbh(x);
    const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hb), 16));
    const __mmask16 fin = (__mmask16)~_mm512_fpclass_ps_mask(hf, 0x99); /* not NaN / inf */
    *h = hb;
    *l = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(fin, x, hf));
}
/* 32 consecutive f32 (k order; lanes past the masks read as 0) as 32 hi and 32 lo bf16 */
TBF16 static inline void split32(const float *src, __mmask16 mlo, __mmask16 mhi, __m512i *h, __m512i *l) {
    __m256i h0, l0, h1, l1;
    split16(_mm512_maskz_loadu_ps(mlo, src), &h0, &l0);
    split16(_mm512_maskz_loadu_ps(mhi, src + 16), &h1, &l1);
    *h = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
    *l = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
}
static inline void split_masks(int ke, __mmask16 *mlo, __mmask16 *mhi) {
    *mlo = ke >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ke) - 1u);
    *mhi = ke <= 16 ? 0 : ke == 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ke - 16)) - 1u);
}

/* A (f32) rows [m0, m0+mc) × k [k0, k0+kc) as 32-row panels [step][part][row][32 bf16], zero past
 * the rows and past kc up to the whole step. */
TBF16 static void pack_a_split(int parts, bool ta, const float *A, int64_t lda, int64_t m0, int64_t mc, int64_t k0,
                               int64_t kc, float *Ap_) {
    uint16_t *Ap = (uint16_t *)Ap_;
    const int64_t steps = (kc + 31) / 32;
    for (int64_t p = 0; p < mc; p += MR_AMX) {
        const int rows = mc - p < MR_AMX ? (int)(mc - p) : MR_AMX;
        uint16_t *dst = Ap + p * steps * 32 * parts;
        for (int64_t t = 0; t < steps; t++) {
            const int ke = kc - 32 * t < 32 ? (int)(kc - 32 * t) : 32;
            uint16_t *d = dst + t * MR_AMX * 32 * parts;
            if (ta) { /* A stored [K, M]: per k pair, 16 rows' values are contiguous at k and k+1: split,
                       * interleaved into pairs (one vector per pair, a lane per row), 16×16 transposed */
                for (int g = 0; g < MR_AMX; g += 16) {
                    const int w = rows - g > 16 ? 16 : rows - g > 0 ? rows - g : 0;
                    const __mmask16 m = w == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
                    __m512 ph[16], pl[16];
                    for (int q = 0; q < 16; q++) {
                        __m512i vh = _mm512_setzero_si512(), vl = _mm512_setzero_si512();
                        for (int o = 0; o < 2; o++) {
                            const int kk = 2 * q + o;
                            if (kk >= ke) break;
                            __m256i h, l;
                            split16(_mm512_maskz_loadu_ps(m, A + (k0 + 32 * t + kk) * lda + m0 + p + g), &h, &l);
                            vh = _mm512_or_si512(vh, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16 * o));
                            vl = _mm512_or_si512(vl, _mm512_slli_epi32(_mm512_cvtepu16_epi32(l), 16 * o));
                        }
                        ph[q] = _mm512_castsi512_ps(vh);
                        pl[q] = _mm512_castsi512_ps(vl);
                    }
                    tr16(ph);
                    if (parts == 2) tr16(pl);
                    for (int i = 0; i < 16; i++) {
                        _mm512_storeu_ps((float *)(d + (g + i) * 32), ph[i]);
                        if (parts == 2) _mm512_storeu_ps((float *)(d + MR_AMX * 32 + (g + i) * 32), pl[i]);
                    }
                }
                continue;
            }
            __mmask16 mlo, mhi;
            split_masks(ke, &mlo, &mhi);
            for (int i = 0; i < MR_AMX; i++) {
                __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
                if (i < rows) split32(A + (m0 + p + i) * lda + k0 + 32 * t, mlo, mhi, &h, &l);
                _mm512_storeu_si512((void *)(d + i * 32), h);
                if (parts == 2) _mm512_storeu_si512((void *)(d + MR_AMX * 32 + i * 32), l);
            }
        }
    }
}

/* One 32-column panel of f32 B, columns [n0, n0+cols) × k [k0, k0+kc), as [step][part][pair q][32
 * columns] of (even k, odd k) bf16 pairs, zero past cols and past kc up to the whole step. B [N, K]
 * (tb): 32 k of each column split, then 16×16 transposes of the 32-bit pairs; B [K, N]: rows 2q and
 * 2q+1 split, widened and interleaved. */
TBF16 static void pack_b_split(int parts, bool tb, const float *B, int64_t ldb, int64_t n0, int64_t cols, int64_t k0,
                               int64_t kc, float *Bp_) {
    uint32_t *Bp = (uint32_t *)Bp_;
    const int64_t steps = (kc + 31) / 32;
    for (int64_t t = 0; t < steps; t++) {
        const int ke = kc - 32 * t < 32 ? (int)(kc - 32 * t) : 32;
        uint32_t *dh = Bp + t * 512 * parts, *dl = dh + 512;
        for (int g = 0; g < 32; g += 16) {
            const int w = cols - g > 16 ? 16 : cols - g > 0 ? (int)(cols - g) : 0;
            if (tb) {
                __mmask16 mlo, mhi;
                split_masks(ke, &mlo, &mhi);
                __m512 rh[16], rl[16];
                for (int i = 0; i < 16; i++) {
                    __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
                    if (i < w) split32(B + (n0 + g + i) * ldb + k0 + 32 * t, mlo, mhi, &h, &l);
                    rh[i] = _mm512_castsi512_ps(h);
                    rl[i] = _mm512_castsi512_ps(l);
                }
                tr16(rh);
                if (parts == 2) tr16(rl);
                for (int q = 0; q < 16; q++) {
                    _mm512_storeu_ps((float *)(dh + q * 32 + g), rh[q]);
                    if (parts == 2) _mm512_storeu_ps((float *)(dl + q * 32 + g), rl[q]);
                }
            } else {
                const __mmask16 m = w == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
                for (int q = 0; q < 16; q++) {
                    __m512i vh = _mm512_setzero_si512(), vl = _mm512_setzero_si512();
                    for (int o = 0; o < 2; o++) {
                        const int64_t k = 32 * t + 2 * q + o;
                        if (k >= kc) break;
                        __m256i h, l;
                        split16(_mm512_maskz_loadu_ps(m, B + (k0 + k) * ldb + n0 + g), &h, &l);
                        vh = _mm512_or_si512(vh, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16 * o));
                        vl = _mm512_or_si512(vl, _mm512_slli_epi32(_mm512_cvtepu16_epi32(l), 16 * o));
                    }
                    _mm512_storeu_si512((void *)(dh + q * 32 + g), vh);
                    if (parts == 2) _mm512_storeu_si512((void *)(dl + q * 32 + g), vl);
                }
            }
        }
    }
}

/* Pack rows [m0, m0+mc) × k [k0, k0+kc) of op(A) into MR-row panels: Ap[p][k][i]. */
static void pack_a(const kdesc *kd, bool ta, const float *A, int64_t lda, int64_t m0, int64_t mc,
                   int64_t k0, int64_t kc, float *restrict Ap) {
    const int mr = kd->mr;
    if (kd_split(kd)) {
        pack_a_split(kd == &K_BF16X3 ? 2 : 1, ta, A, lda, m0, mc, k0, kc, Ap);
        return;
    }
    if (kd == &K_BF16DOT) {
        pack_a_dot(ta, A, lda, m0, mc, k0, kc, Ap);
        return;
    }
    if (kd == &K_AMX) {
        pack_a_amx(ta, A, lda, m0, mc, k0, kc, Ap);
        return;
    }
    if (ta && kd == &K_AVX512) {
        pack_a_t_avx512(A, lda, m0, mc, k0, kc, Ap);
        return;
    }
    for (int64_t p = 0; p < mc; p += mr) {
        int64_t rows = mc - p < mr ? mc - p : mr;
        float *dst = Ap + p * kc;
        if (ta) { /* A stored [K, M]: op(A)[m, k] = A[k*lda + m] — contiguous in m */
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + (k0 + k) * lda + m0 + p;
                float *d = dst + k * mr;
                int64_t i = 0;
                for (; i < rows; i++) d[i] = src[i];
                for (; i < mr; i++) d[i] = 0.0f;
            }
        } else if (kd == &K_AVX512) { /* A stored [M, K]: transpose 14 rows in registers */
            pack_tr_avx512(A, false, (m0 + p) * lda, lda, (int)rows, mr, k0, kc, dst, mr);
        } else {  /* A stored [M, K]: row i is contiguous in k */
            int64_t i = 0;
            for (; i < rows; i++) {
                const float *src = A + (m0 + p + i) * lda + k0;
                for (int64_t k = 0; k < kc; k++) dst[k * mr + i] = src[k];
            }
            for (; i < mr; i++)
                for (int64_t k = 0; k < kc; k++) dst[k * mr + i] = 0.0f;
        }
    }
}

static inline float ldb_val(const void *B, bool b16, int64_t idx) {
    return b16 ? mmc_bf16_to_f32(((const uint16_t *)B)[idx]) : ((const float *)B)[idx];
}

/* Pack NR-column panel starting at column n0 (width cols <= NR) × k [k0, k0+kc) of op(B)
 * into Bp[k][j] (zero-padded to NR). B is f32 or bf16 (widened here). */
static void pack_b_panel(const kdesc *kd, bool tb, const void *B, bool b16, int64_t ldb,
                         int64_t n0, int64_t cols, int64_t k0, int64_t kc, float *restrict Bp) {
    const int nr = kd->nr;
    if (kd_split(kd)) {
        MMC_CHECK(!b16, "gemm: %s packs f32 B only", kd->name);
        pack_b_split(kd == &K_BF16X3 ? 2 : 1, tb, (const float *)B, ldb, n0, cols, k0, kc, Bp);
        return;
    }
    if (kd == &K_BF16DOT || kd == &K_AMX) {
        pack_b_dot(tb, (const uint16_t *)B, ldb, n0, cols, k0, kc, kslots(kd, kc), Bp);
        return;
    }
    if (tb && kd == &K_AVX512) { /* B stored [N, K]: two 16-row transposes per panel */
        for (int g = 0; g < nr; g += 16) {
            int rows = cols - g > 16 ? 16 : cols - g > 0 ? (int)(cols - g) : 0;
            pack_tr_avx512(B, b16, (n0 + g) * ldb, ldb, rows, 16, k0, kc, Bp + g, nr);
        }
    } else if (tb) { /* B stored [N, K]: op(B)[k, n] = B[n*ldb + k] — row j contiguous in k.
               * Transposed in k-blocks of 16 so the destination block (16 × NR) stays in L1
               * and each source row contributes one cache line per block. */
        for (int64_t kb = 0; kb < kc; kb += 16) {
            const int64_t ke = kc - kb < 16 ? kc - kb : 16;
            int64_t j = 0;
            for (; j < cols; j++) {
                int64_t base = (n0 + j) * ldb + k0 + kb;
                float *d = Bp + kb * nr + j;
                if (b16) {
                    const uint16_t *src = (const uint16_t *)B + base;
                    for (int64_t k = 0; k < ke; k++) d[k * nr] = mmc_bf16_to_f32(src[k]);
                } else {
                    const float *src = (const float *)B + base;
                    for (int64_t k = 0; k < ke; k++) d[k * nr] = src[k];
                }
            }
            for (; j < nr; j++)
                for (int64_t k = 0; k < ke; k++) Bp[(kb + k) * nr + j] = 0.0f;
        }
    } else {  /* B stored [K, N]: contiguous in n */
        for (int64_t k = 0; k < kc; k++) {
            int64_t base = (k0 + k) * ldb + n0;
            float *d = Bp + k * nr;
            int64_t j = 0;
            if (b16) {
                const uint16_t *src = (const uint16_t *)B + base;
                for (; j < cols; j++) d[j] = mmc_bf16_to_f32(src[j]);
            } else {
                const float *src = (const float *)B + base;
                for (; j < cols; j++) d[j] = src[j];
            }
            for (; j < nr; j++) d[j] = 0.0f;
        }
    }
}

/* pack_b_rows for the AVX-512 kernel (NR = 32): per k, each panel's 32 values are two 16-lane
 * copies (masked at the block's last columns; bf16 widened by a shift). */
T512 static void pack_b_rows_avx512(const void *B, bool b16, int64_t ldb, int64_t jc, int64_t nc,
                                    int64_t p0, int64_t p1, int64_t k0, int64_t kc, float *Bp) {
    const int nr = 32;
    const int64_t esz = b16 ? 2 : 4, seg = (p1 - p0) * nr * esz;
    for (int64_t k = 0; k < kc; k++) {
        const int64_t base = (k0 + k) * ldb + jc;
        if (k + 8 < kc) { /* rows 8 ahead: the source stride defeats the hardware prefetch */
            const char *ahead = (const char *)B + ((k0 + k + 8) * ldb + jc + p0 * nr) * esz;
            for (int64_t o = 0; o < seg; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
        }
        for (int64_t p = p0; p < p1; p++) {
            float *d = Bp + p * nr * kc + k * nr;
            const int64_t c0 = p * nr, cols = nc - c0 < nr ? nc - c0 : nr;
            const __mmask16 m0 = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
            const __mmask16 m1 = cols >= 32 ? (__mmask16)0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1u);
            _mm512_store_ps(d, ld16(B, b16, base + c0, m0));
            _mm512_store_ps(d + 16, ld16(B, b16, base + c0 + 16, m1));
        }
    }
}

/* B stored [K, N] (not transposed): panels [p0, p1) of the block starting at column jc
 * (nc columns), k in [k0, k0+kc); per k the source row segment is read contiguously. */
static void pack_b_rows(const kdesc *kd, const void *B, bool b16, int64_t ldb, int64_t jc,
                        int64_t nc, int64_t p0, int64_t p1, int64_t k0, int64_t kc, float *Bp) {
    const int nr = kd->nr;
    if (kd_split(kd)) {
        MMC_CHECK(!b16, "gemm: %s packs f32 B only", kd->name);
        for (int64_t p = p0; p < p1; p++) {
            const int64_t c0 = p * nr, cols = nc - c0 < nr ? nc - c0 : nr;
            pack_b_split(kd == &K_BF16X3 ? 2 : 1, false, (const float *)B, ldb, jc + c0, cols, k0, kc,
                         Bp + p * nr * kslots(kd, kc));
        }
        return;
    }
    if (kd == &K_BF16DOT || kd == &K_AMX) {
        for (int64_t p = p0; p < p1; p++) {
            const int64_t c0 = p * nr, cols = nc - c0 < nr ? nc - c0 : nr;
            float *bp = Bp + p * nr * kslots(kd, kc);
            pack_b_dot(false, (const uint16_t *)B, ldb, jc + c0, cols, k0, kc, kslots(kd, kc), bp);
        }
        return;
    }
    const int64_t esz = b16 ? 2 : 4, seg = (p1 - p0) * nr * esz; /* bytes per source row */
    if (kd == &K_AVX512) {
        pack_b_rows_avx512(B, b16, ldb, jc, nc, p0, p1, k0, kc, Bp);
        return;
    }
    for (int64_t k = 0; k < kc; k++) {
        const int64_t base = (k0 + k) * ldb + jc;
        if (k + 8 < kc) { /* rows 8 ahead: the source stride defeats the hardware prefetch */
            const char *ahead = (const char *)B + ((k0 + k + 8) * ldb + jc + p0 * nr) * esz;
            for (int64_t o = 0; o < seg; o += 64) __builtin_prefetch(ahead + o, 0, 3);
        }
        for (int64_t p = p0; p < p1; p++) {
            float *restrict d = Bp + p * nr * kc + k * nr;
            const int64_t c0 = p * nr, cols = nc - c0 < nr ? nc - c0 : nr;
            int64_t j = 0;
            if (b16) {
                const uint16_t *restrict src = (const uint16_t *)B + base + c0;
                for (; j < cols; j++) d[j] = mmc_bf16_to_f32(src[j]);
            } else {
                const float *restrict src = (const float *)B + base + c0;
                for (; j < cols; j++) d[j] = src[j];
            }
            for (; j < nr; j++) d[j] = 0.0f;
        }
    }
}

/* ------------------------------------------------------------------ small M (matvec) */

/* C[m, n] = alpha * dot(a[m, :], B row n) + beta*C for trans_b (B [N, K]); a is [M, K]
 * contiguous. Rows of B are streamed once; 4 rows at a time for memory-level parallelism. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline))
static inline void mv_tb_body(const int M, int64_t n0, int64_t n1, int64_t K, float alpha, const float *a,
                              const void *B, bool b16, int64_t ldb, float beta, float *C, int64_t ldc) {
    /* R rows of B in flight (R*M accumulators in registers): 8 for M <= 2, else 4. The
     * range is cut into R contiguous stretches of G rows and step j reads row j of each
     * stretch: R long sequential streams (each stretch is contiguous when ldb == K), which
     * the hardware prefetchers follow, instead of R short rows that restart every step. */
    enum { RMAX = 8 };
    const int R = M <= 2 ? 8 : 4;
    const int64_t G = (n1 - n0 + R - 1) / R;
    const int64_t k16 = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - k16)) - 1u);
    const __m512i hi_mask = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int64_t j = 0; j < G; j++) {
        __m512 acc[4][RMAX];
        const float *bf[RMAX];
        const uint16_t *bh[RMAX];
        bool valid[RMAX];
        for (int m = 0; m < M; m++)
            for (int r = 0; r < R; r++) acc[m][r] = _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            const int64_t want = n0 + r * G + j;
            valid[r] = want < n1;
            const int64_t row = valid[r] ? want : n0 + j; /* past the end: re-read, discarded */
            bf[r] = (const float *)B + row * ldb;
            bh[r] = (const uint16_t *)B + row * ldb;
        }
        int64_t k = 0;
        if (b16) {
            /* 32 bf16 per 64-byte load: the low half of each 32-bit lane widened by a shift
             * (even k), the high half by a mask (odd k); `a` holds each 32-block of k
             * de-interleaved to match (evens, then odds — see gemm_small_m) */
            for (; k + 32 <= K; k += 32) {
                __m512i w[RMAX];
                /* each row's line 2 KiB ahead: measured on Zen 5, 1 thread, against a read of the
                 * same buffer alternated with it, 30-31 -> 35-37 GB/s (0.95 -> 1.06-1.12 of that
                 * read); the f32 loop below, half the work per byte, gained nothing from it */
                for (int r = 0; r < R; r++) {
                    _mm_prefetch((const char *)(bh[r] + k) + 2048, _MM_HINT_T0);
                    w[r] = _mm512_loadu_si512((const void *)(bh[r] + k));
                }
                for (int m = 0; m < M; m++) {
                    __m512 xe = _mm512_loadu_ps(a + m * K + k), xo = _mm512_loadu_ps(a + m * K + k + 16);
                    for (int r = 0; r < R; r++) {
                        acc[m][r] = _mm512_fmadd_ps(xe, _mm512_castsi512_ps(_mm512_slli_epi32(w[r], 16)), acc[m][r]);
                        acc[m][r] = _mm512_fmadd_ps(xo, _mm512_castsi512_ps(_mm512_and_si512(w[r], hi_mask)), acc[m][r]);
                    }
                }
            }
        }
        /* remaining k in 16s (f32: all of K), last partial 16 masked */
        for (; k < K; k += 16) {
            const __mmask16 mk = k < k16 ? (__mmask16)0xFFFF : tail;
            __m512 bv[RMAX];
            for (int r = 0; r < R; r++)
                bv[r] = b16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, bh[r] + k)), 16))
                            : _mm512_maskz_loadu_ps(mk, bf[r] + k);
            for (int m = 0; m < M; m++) {
                __m512 x = _mm512_maskz_loadu_ps(mk, a + m * K + k);
                for (int r = 0; r < R; r++) acc[m][r] = _mm512_fmadd_ps(x, bv[r], acc[m][r]);
            }
        }
        float sum[4][RMAX];
        for (int m = 0; m < M; m++)
            for (int r = 0; r < R; r++) sum[m][r] = _mm512_reduce_add_ps(acc[m][r]);
        for (int m = 0; m < M; m++)
            for (int r = 0; r < R; r++) {
                if (!valid[r]) continue;
                float s = alpha * sum[m][r];
                float *c = C + m * ldc + n0 + r * G + j;
                *c = beta == 0.0f ? s : s + beta * *c;
            }
    }
}

/* Non-transposed B [K, N]: column block [n0, n1) of 64, rows of B streamed in k. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"), always_inline))
static inline void mv_nb_body(const int M, int64_t n0, int64_t n1, int64_t K, float alpha, const float *a,
                         const void *B, bool b16, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t n = n0; n < n1; n += 64) {
        int64_t w = n1 - n < 64 ? n1 - n : 64;
        __mmask16 mk[4];
        for (int v = 0; v < 4; v++) {
            int64_t c = w - 16 * v;
            mk[v] = c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? 0 : (__mmask16)((1u << c) - 1u);
        }
        __m512 acc[4][4];
        for (int m = 0; m < 4; m++)
            for (int v = 0; v < 4; v++) acc[m][v] = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k++) {
            __m512 b[4];
            for (int v = 0; v < 4; v++) {
                if (b16)
                    b[v] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                               _mm256_maskz_loadu_epi16(mk[v], (const uint16_t *)B + k * ldb + n + 16 * v)), 16));
                else
                    b[v] = _mm512_maskz_loadu_ps(mk[v], (const float *)B + k * ldb + n + 16 * v);
            }
            for (int m = 0; m < M; m++) {
                __m512 x = _mm512_set1_ps(a[m * K + k]);
                for (int v = 0; v < 4; v++) acc[m][v] = _mm512_fmadd_ps(x, b[v], acc[m][v]);
            }
        }
        __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
        for (int m = 0; m < M; m++)
            for (int v = 0; v < 4; v++) {
                if (!mk[v]) continue;
                float *c = C + m * ldc + n + 16 * v;
                __m512 r = _mm512_mul_ps(va, acc[m][v]);
                if (beta != 0.0f) r = _mm512_add_ps(r, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mk[v], c)));
                _mm512_mask_storeu_ps(c, mk[v], r);
            }
    }
}

/* Instantiate the bodies for constant M (1..4) and B dtype so accumulators stay in registers. */
#define MV_INST(body, name)                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))                              \
    static void name(int M, int64_t n0, int64_t n1, int64_t K, float alpha, const float *a,        \
                     const void *B, bool b16, int64_t ldb, float beta, float *C, int64_t ldc) {    \
        switch (M * 2 + (b16 ? 1 : 0)) {                                                           \
        case 2: body(1, n0, n1, K, alpha, a, B, false, ldb, beta, C, ldc); break;                  \
        case 3: body(1, n0, n1, K, alpha, a, B, true, ldb, beta, C, ldc); break;                   \
        case 4: body(2, n0, n1, K, alpha, a, B, false, ldb, beta, C, ldc); break;                  \
        case 5: body(2, n0, n1, K, alpha, a, B, true, ldb, beta, C, ldc); break;                   \
        case 6: body(3, n0, n1, K, alpha, a, B, false, ldb, beta, C, ldc); break;                  \
        case 7: body(3, n0, n1, K, alpha, a, B, true, ldb, beta, C, ldc); break;                   \
        case 8: body(4, n0, n1, K, alpha, a, B, false, ldb, beta, C, ldc); break;                  \
        default: body(4, n0, n1, K, alpha, a, B, true, ldb, beta, C, ldc); break;                  \
        }                                                                                          \
    }
MV_INST(mv_tb_body, mv_tb_avx512)
MV_INST(mv_nb_body, mv_nb_avx512)
#undef MV_INST

/* Generic small-M kernels (plain C, 16 partial sums per dot so compilers vectorize). */
static void mv_tb_generic(int M, int64_t n0, int64_t n1, int64_t K, float alpha, const float *a,
                          const void *B, bool b16, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t n = n0; n < n1; n++)
        for (int m = 0; m < M; m++) {
            float part[16] = {0};
            const float *x = a + m * K;
            int64_t k = 0;
            for (; k + 16 <= K; k += 16)
                for (int j = 0; j < 16; j++) part[j] += x[k + j] * ldb_val(B, b16, n * ldb + k + j);
            for (; k < K; k++) part[k & 15] += x[k] * ldb_val(B, b16, n * ldb + k);
            float s = 0;
            for (int j = 0; j < 16; j++) s += part[j];
            s *= alpha;
            float *c = C + m * ldc + n;
            *c = beta == 0.0f ? s : s + beta * *c;
        }
}

static void mv_nb_generic(int M, int64_t n0, int64_t n1, int64_t K, float alpha, const float *a,
                          const void *B, bool b16, int64_t ldb, float beta, float *C, int64_t ldc) {
    for (int64_t n = n0; n < n1; n += 64) {
        int64_t w = n1 - n < 64 ? n1 - n : 64;
        float acc[4][64] = {{0}};
        for (int64_t k = 0; k < K; k++)
            for (int m = 0; m < M; m++) {
                float x = a[m * K + k];
                for (int64_t j = 0; j < w; j++) acc[m][j] += x * ldb_val(B, b16, k * ldb + n + j);
            }
        for (int m = 0; m < M; m++)
            for (int64_t j = 0; j < w; j++) {
                float *c = C + m * ldc + n + j;
                float s = alpha * acc[m][j];
                *c = beta == 0.0f ? s : s + beta * *c;
            }
    }
}

static void gemm_small_m(const kdesc *kd, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t lda, const void *B, bool b16,
                         int64_t ldb, float beta, float *C, int64_t ldc) {
    /* a: op(A) as contiguous [M, K] (copied when transposed or strided) */
    const float *a = A;
    const bool wide = kd == &K_AVX512;
    /* AVX-512 bf16 x·Wᵀ: each full 32-block of k de-interleaved (16 evens, then 16 odds) */
    const bool deint = wide && tb && b16;
    if (ta || (M > 1 && lda != K) || deint) {
        bufs *t = my_bufs();
        t->v = grow(t->v, &t->v_cap, (size_t)(M * K));
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                int64_t d = k;
                if (deint && (k | 31) < K) d = (k & ~(int64_t)31) + ((k & 1) ? 16 : 0) + ((k & 31) >> 1);
                t->v[m * K + d] = ta ? A[k * lda + m] : A[m * lda + k];
            }
        a = t->v;
    }
    /* work units: rows of B (tb, ~1 MiB each) / 64-column strips (!tb), handed
     * out dynamically (a shared machine stalls threads; the result does not depend on who
     * computes a unit) */
    const int64_t esz = b16 ? 2 : 4;
    int64_t grain = tb ? 8 : 64;
    if (tb) { /* ~1 MiB of B per unit (R streams of 128 KiB), at least 16 units */
        int64_t g = (1 << 20) / (K * esz) / 8 * 8, g16 = N / 16 / 8 * 8;
        if (g > g16) g = g16;
        if (g > grain) grain = g;
    }
    int64_t units = (N + grain - 1) / grain;
    double bytes = (double)N * K * esz;
    int nth = (bytes < 256 * 1024 || omp_in_parallel()) ? 1 : omp_get_max_threads();
    if (nth > units) nth = (int)units;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t n0 = u * grain, n1 = n0 + grain < N ? n0 + grain : N;
        {
            if (tb) (wide ? mv_tb_avx512 : mv_tb_generic)((int)M, n0, n1, K, alpha, a, B, b16, ldb, beta, C, ldc);
            else (wide ? mv_nb_avx512 : mv_nb_generic)((int)M, n0, n1, K, alpha, a, B, b16, ldb, beta, C, ldc);
        }
    }
}

/* Prefetch (into L2) segments [s0, s1) of a strided source: segment s is seg_bytes long at
 * base + s*stride_bytes. Used while one block computes to pull in the source of the block
 * packed next, so packing reads caches instead of waiting on DRAM. */
static inline void prefetch_segs(const char *base, int64_t stride_bytes, int64_t seg_bytes,
                                 int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s++) {
        const char *p = base + s * stride_bytes;
        for (int64_t o = 0; o < seg_bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
    }
}

/* ------------------------------------------------------------------ driver */

static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) C[m * ldc + n] = beta == 0.0f ? 0.0f : beta * C[m * ldc + n];
}

/* Packs panels [p0, p1) of the B block (jc, pc) of nc columns and kc rows into Bp (panel p at
 * p * nr * kslots): B [N, K] (tb) panel by panel, B [K, N] a group of panels per k row. */
static void pack_b_block(const kdesc *kd, bool tb, const void *B, bool b16, int64_t ldb, int64_t jc,
                         int64_t nc, int64_t p0, int64_t p1, int64_t pc, int64_t kc, float *Bp) {
    const int nr = kd->nr;
    if (!tb) {
        pack_b_rows(kd, B, b16, ldb, jc, nc, p0, p1, pc, kc, Bp);
        return;
    }
    const int64_t ks = kslots(kd, kc);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t cols = nc - p * nr < nr ? nc - p * nr : nr;
        pack_b_panel(kd, tb, B, b16, ldb, jc + p * nr, cols, pc, kc, Bp + p * nr * ks);
    }
}

/* The source of the B block packed after (jc, pc) — (jc, pc + KC) or (jc + NC, 0) within columns
 * [jc, n1) — pulled into the caches a slice per (row block, panel) unit of this block's compute. */
typedef struct {
    bool on;
    const char *base;
    int64_t stride, segs, seg_bytes, units;
} next_b;

static next_b next_b_block(bool tb, const void *B, int64_t ldb, int64_t esz, int64_t jc, int64_t pc,
                           int64_t n1, int64_t K, int64_t NC, int64_t KC, int64_t units) {
    int64_t jn = jc, pn = pc + KC;
    if (pn >= K) jn = jc + NC, pn = 0;
    const int64_t nn = n1 - jn < NC ? n1 - jn : NC, kn = K - pn < KC ? K - pn : KC;
    /* tb: rows n of B [N, K], each kn elements; else rows k of B [K, N], each nn */
    return (next_b){.on = jn < n1,
                    .base = (const char *)B + (tb ? jn * ldb + pn : pn * ldb + jn) * esz,
                    .stride = ldb * esz,
                    .segs = tb ? nn : kn,
                    .seg_bytes = (tb ? kn : nn) * esz,
                    .units = units};
}

static inline void next_b_prefetch(const next_b *nb, int64_t u) {
    if (nb->on) prefetch_segs(nb->base, nb->stride, nb->seg_bytes, nb->segs * u / nb->units, nb->segs * (u + 1) / nb->units);
}

/* C[ic.., jc+j..] (rows mc, cols <= nr) of one packed B micro-panel bp against the packed A block:
 * whole MR×NR tiles straight into C, edge tiles through the stack tile and merged. */
static inline void panel_compute(const kdesc *kd, int64_t kc, int64_t ks, const float *Ap, const float *bp,
                                 int64_t mc, int64_t cols, float *C, int64_t ldc, float alpha, float beta_k,
                                 float *tile) {
    const int mr = kd->mr, nr = kd->nr;
    for (int64_t i = 0; i < mc; i += mr) {
        const int64_t rows = mc - i < mr ? mc - i : mr;
        float *c = C + i * ldc;
        if (rows == mr && cols == nr) {
            kd->ukr(kc, Ap + i * ks, bp, c, ldc, alpha, beta_k);
            continue;
        }
        if (rows < mr && kd->ukr_rows) kd->ukr_rows((int)rows, kc, Ap + i * ks, bp, tile);
        else kd->ukr(kc, Ap + i * ks, bp, tile, nr, 1.0f, 0.0f);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t q = 0; q < cols; q++) {
                float s = alpha * tile[r * nr + q];
                c[r * ldc + q] = beta_k == 0.0f ? s : s + beta_k * c[r * ldc + q];
            }
    }
}

/* ------------------------------------------------------------------ pre-packed B (weights)
 *
 * A weight used for inference is the B of x·Wᵀ on every call; packing it into the kernel's
 * panels once (mmc_gemm_pack_b) saves the pack_b_block work of every later call. The layout is
 * the one gemm_slice and the shared path read from their B buffers, for the whole of B:
 *   data = [K block b (KC each, the last one shorter)][panel p of NR columns][ks slots][NR]
 * with ks = kslots(kd, kc of that block) (f32: kc floats; bf16-product kernels: kc/2 bf16 pairs,
 * AMX padded to whole 32-k steps). A thread's B block (jc, pc) then starts at panel jc / NR of
 * K block pc / KC: the same panels, packed by the same function (pack_b_panel), as the buffer
 * the unpacked path fills, so the results are the same bits. Columns past N are zero, as the
 * unpacked path pads them. KC is fixed for the process (init_blocking), so a packed B stays
 * valid for the life of the process; it records the kernel it was packed for and runs that one. */
struct mmc_gemm_packed_b {
    const kdesc *kd;
    int64_t N, K, kc, npanels;
    bool b16;       /* the source was bf16 */
    float *data;    /* 64-byte aligned; 4-byte slots */
    size_t bytes;
};

static inline const float *packed_block(const mmc_gemm_packed_b *pb, int64_t jc, int64_t pc) {
    const kdesc *kd = pb->kd;
    const int64_t kc = pb->K - pc < pb->kc ? pb->K - pc : pb->kc;
    return pb->data + (pc / pb->kc) * pb->npanels * kd->nr * kslots(kd, pb->kc) + jc * kslots(kd, kc);
}

/* One thread's GEMM on rows [m0, m1) × columns [n0, n1) of C (m0 a multiple of MR, n0 of NR,
 * so its register tiles are the tiles of the whole GEMM), the Goto loop nest with its own
 * packing buffers Ap (MC×KC) and Bp (KC × up to NC): no other thread reads them, so nothing
 * waits. NC is evened out over the slice (e.g. 2432 columns: two blocks of 1216, not
 * 2048 + 384); results do not depend on MC or NC. While a block computes, each (row block,
 * panel) unit prefetches its share of the source of the block packed next. */
static void gemm_slice(const kdesc *kd, bool ta, bool tb, int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                       int64_t K, float alpha, const float *A, int64_t lda, const void *B, bool b16,
                       int64_t ldb, float beta, float *C, int64_t ldc, float *Ap, float *Bp,
                       const mmc_gemm_packed_b *pb) {
    const int nr = kd->nr;
    const int64_t MC = kd->mc, KC = kd->kc, esz = b16 ? 2 : 4;
    const int64_t w = n1 - n0, nblk = (w + kd->nc - 1) / kd->nc;
    const int64_t NC = ((w + nblk - 1) / nblk + nr - 1) / nr * nr;
    const int64_t mblocks = (m1 - m0 + MC - 1) / MC;
    float tile[16 * 64] __attribute__((aligned(64)));
    for (int64_t jc = n0; jc < n1; jc += NC) {
        const int64_t nc = n1 - jc < NC ? n1 - jc : NC, npanels = (nc + nr - 1) / nr;
        for (int64_t pc = 0; pc < K; pc += KC) {
            const int64_t kc = K - pc < KC ? K - pc : KC, ks = kslots(kd, kc);
            const float beta_k = pc == 0 ? beta : 1.0f;
            if (pb) Bp = (float *)packed_block(pb, jc, pc);
            else pack_b_block(kd, tb, B, b16, ldb, jc, nc, 0, npanels, pc, kc, Bp);
            const next_b nb = pb ? (next_b){.on = false}
                                 : next_b_block(tb, B, ldb, esz, jc, pc, n1, K, NC, KC, mblocks * npanels);
            for (int64_t mb = 0; mb < mblocks; mb++) {
                const int64_t ic = m0 + mb * MC, mc = m1 - ic < MC ? m1 - ic : MC;
                pack_a(kd, ta, A, lda, ic, mc, pc, kc, Ap);
                for (int64_t jp = 0; jp < npanels; jp++) {
                    next_b_prefetch(&nb, mb * npanels + jp);
                    const int64_t j = jp * nr, cols = nc - j < nr ? nc - j : nr;
                    panel_compute(kd, kc, ks, Ap, Bp + jp * nr * ks, mc, cols, C + ic * ldc + jc + j, ldc, alpha,
                                  beta_k, tile);
                }
            }
        }
    }
}

/* The thread grid of a sliced GEMM: pm × pn = nth slices (rows split pm ways in whole MR tiles,
 * columns pn ways in whole NR panels), chosen to pack the fewest elements per thread: a thread
 * packs its rows of A once per NC block of its columns, and its columns of B once, so a split
 * of N repeats A's packing in every column slice and a split of M repeats B's. Returns false
 * when no grid gives every thread at least one tile row and one panel. */
static bool slice_grid(const kdesc *kd, int64_t M, int64_t N, int64_t K, int nth, int *pm_out, int *pn_out) {
    const int64_t mt = (M + kd->mr - 1) / kd->mr, np = (N + kd->nr - 1) / kd->nr;
    double best = -1;
    for (int pm = 1; pm <= nth; pm++) {
        if (nth % pm) continue;
        const int pn = nth / pm;
        if (pm > mt || pn > np) continue;
        const double rows = (double)((mt + pm - 1) / pm * kd->mr), cols = (double)((np + pn - 1) / pn * kd->nr);
        const double ncb = (double)(int64_t)((cols + (double)kd->nc - 1) / (double)kd->nc);
        const double cost = rows * (double)K * ncb + cols * (double)K;
        if (best < 0 || cost < best) best = cost, *pm_out = pm, *pn_out = pn;
    }
    return best >= 0;
}

static void gemm_packed(const kdesc *kd, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                        float alpha, const float *A, int64_t lda, const void *B, bool b16,
                        int64_t ldb, float beta, float *C, int64_t ldc, const mmc_gemm_packed_b *pb) {
    const int mr = kd->mr, nr = kd->nr;
    const int64_t MC = kd->mc, KC = kd->kc, NC = kd->nc, esz = b16 ? 2 : 4;
    double flops = 2.0 * M * N * K;
    int nth = (flops < 2e6 || omp_in_parallel()) ? 1 : omp_get_max_threads();
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    /* Two ways to share the work (MMC_GEMM_SPLIT forces one):
     *   slices  each thread an independent gemm_slice on its cell of a pm × pn grid: no barrier,
     *           but the operand split across the other dimension is packed by every slice of it;
     *   shared  (below) one B block packed by the team, then the compute handed out dynamically,
     *           a barrier after each phase of each (NC, KC) block.
     * auto: slices when the shared way has more than one B block, i.e. more than two barriers
     * (on Zen 5, 2 threads, quiet host, the shared way's loss against one thread grew with its
     * barrier count: 0.07-0.09 of peak at 2 barriers, 0.15-0.18 at 6-10, while slicing costs
     * 0-4 % more CPU time for its repeated packing, measured), shared otherwise. */
    int pm = 1, pn = 1;
    const bool many_blocks = ((N + NC - 1) / NC) * ((K + KC - 1) / KC) > 1;
    const bool slices = g_split == 0 || (g_split < 0 && many_blocks);
    if (nth == 1 || (slices && slice_grid(kd, M, N, K, nth, &pm, &pn))) {
        const int64_t mt = (M + mr - 1) / mr, np = (N + nr - 1) / nr;
        const int64_t slice_cols = (np + pn - 1) / pn * nr;
        ensure_bufs(kd, nth, pb ? -1 : slice_cols < NC ? slice_cols : NC);
        float **Abuf = tl_bufs.a, **Bbuf = tl_bufs.bt, *B0 = tl_bufs.b;
#pragma omp parallel num_threads(nth) if (nth > 1)
        {
            /* a team smaller than asked for runs the slices of the missing threads too */
            for (int s = omp_get_thread_num(); s < nth; s += omp_get_num_threads()) {
                const int sm = s / pn, sn = s % pn;
                const int64_t r0 = mt * sm / pm * mr, r1 = mt * (sm + 1) / pm * mr;
                const int64_t c0 = np * sn / pn * nr, c1 = np * (sn + 1) / pn * nr;
                gemm_slice(kd, ta, tb, r0, r1 < M ? r1 : M, c0, c1 < N ? c1 : N, K, alpha, A, lda, B, b16, ldb,
                           beta, C, ldc, Abuf[omp_get_thread_num()],
                           omp_get_thread_num() ? Bbuf[omp_get_thread_num()] : B0, pb);
            }
            if (kd == &K_AMX || kd_split(kd)) amx_release();
        }
        return;
    }
    ensure_bufs(kd, nth, pb ? -1 : 0);
    float *Bp = tl_bufs.b;
    float **Abuf = tl_bufs.a;

#pragma omp parallel num_threads(nth) if (nth > 1)
    {
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        float *Ap = Abuf[tid];
        float tile[16 * 64] __attribute__((aligned(64)));
        /* Work items: an MC block of rows × a chunk of NR panels, handed out dynamically
         * (the machine is shared; a stalled thread must not stall the team). The first
         * `whole` row blocks are items over all of N (A block packed once per item); the
         * rest — the last round, where whole blocks would leave a thread idle — are split
         * into `nchunks` panel chunks, and a thread re-packs A only when its row block
         * changes. */
        const int64_t mblocks = (M + MC - 1) / MC;
        const int64_t whole = mblocks >= 3 * nt ? mblocks - (mblocks % nt ? mblocks % nt : nt) : 0;

        for (int64_t jc = 0; jc < N; jc += NC) {
            const int64_t nc = N - jc < NC ? N - jc : NC;
            const int64_t npanels = (nc + nr - 1) / nr;
            const int64_t nchunks = 4 * nt < npanels ? 4 * nt : npanels;
            const int64_t items = whole + (mblocks - whole) * nchunks;
            /* groups of up to 8 panels, at least 2 per thread: for B [K, N] each k then
             * copies one contiguous row segment of the group (long sequential reads) */
            int64_t gsz = npanels / (2 * nt);
            gsz = gsz < 1 ? 1 : gsz > 8 ? 8 : gsz;
            const int64_t ngroups = (npanels + gsz - 1) / gsz;
            for (int64_t pc = 0; pc < K; pc += KC) {
                const int64_t kc = K - pc < KC ? K - pc : KC, ks = kslots(kd, kc); /* ks: panel row stride */
                const float beta_k = pc == 0 ? beta : 1.0f;
                const float *Bblk = Bp;
                if (pb) {
                    Bblk = packed_block(pb, jc, pc);
                } else {
#pragma omp for schedule(dynamic, 1)
                    for (int64_t g = 0; g < ngroups; g++)
                        pack_b_block(kd, tb, B, b16, ldb, jc, nc, g * gsz,
                                     g * gsz + gsz < npanels ? g * gsz + gsz : npanels, pc, kc, Bp);
                }
                const next_b nb = pb ? (next_b){.on = false}
                                     : next_b_block(tb, B, ldb, esz, jc, pc, N, K, NC, KC, mblocks * npanels);
                int64_t packed_mb = -1;
#pragma omp for schedule(dynamic, 1)
                for (int64_t it = 0; it < items; it++) {
                    const int64_t mb = it < whole ? it : whole + (it - whole) / nchunks;
                    const int64_t ic = mb * MC, mc = M - ic < MC ? M - ic : MC;
                    int64_t np0 = 0, np1 = npanels;
                    if (it >= whole) {
                        const int64_t ch = (it - whole) % nchunks;
                        np0 = npanels * ch / nchunks;
                        np1 = npanels * (ch + 1) / nchunks;
                    }
                    if (mb != packed_mb) {
                        pack_a(kd, ta, A, lda, ic, mc, pc, kc, Ap);
                        packed_mb = mb;
                    }
                    for (int64_t jp = np0; jp < np1; jp++) {
                        next_b_prefetch(&nb, mb * npanels + jp);
                        const int64_t j = jp * nr, cols = nc - j < nr ? nc - j : nr;
                        panel_compute(kd, kc, ks, Ap, Bblk + jp * nr * ks, mc, cols, C + ic * ldc + jc + j, ldc,
                                      alpha, beta_k, tile);
                    }
                } /* implicit barrier: B block is re-packed next */
            }
        }
        if (kd == &K_AMX || kd_split(kd)) amx_release();
    }
}

static void gemm_any(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const void *B, bool b16, int64_t ldb, float beta,
                     float *C, int64_t ldc, bool infer) {
    MMC_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=%lld N=%lld K=%lld",
              (long long)M, (long long)N, (long long)K);
    MMC_CHECK(lda >= (ta ? M : K) && ldb >= (tb ? K : N) && ldc >= N,
              "gemm: bad leading dims lda=%lld ldb=%lld ldc=%lld for M=%lld N=%lld K=%lld ta=%d tb=%d",
              (long long)lda, (long long)ldb, (long long)ldc, (long long)M, (long long)N,
              (long long)K, ta, tb);
    if (M == 0 || N == 0) return;
    if (K == 0) { scale_c(M, N, beta, C, ldc); return; }
    if (M <= SMALL_M) gemm_small_m(kernel(), ta, tb, M, N, K, alpha, A, lda, B, b16, ldb, beta, C, ldc);
    else gemm_packed(b16 ? kernel_for(infer) : kernel_f32(), ta, tb, M, N, K, alpha, A, lda, B, b16, ldb, beta, C, ldc, NULL);
}

void mmc_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc) {
    gemm_any(ta, tb, M, N, K, alpha, A, lda, B, false, ldb, beta, C, ldc, false);
}

void mmc_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                   float *C, int64_t ldc) {
    gemm_any(ta, tb, M, N, K, alpha, A, lda, B, true, ldb, beta, C, ldc, false);
}

void mmc_gemm_bf16_infer(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                         float *C, int64_t ldc) {
    gemm_any(ta, tb, M, N, K, alpha, A, lda, B, true, ldb, beta, C, ldc, true);
}

/* ------------------------------------------------------------------ pre-packed B: API */

mmc_gemm_packed_b *mmc_gemm_pack_b(const void *W, bool w_bf16, int64_t N, int64_t K, int64_t ldw, bool infer) {
    if (!W || N <= 0 || K <= 0 || ldw < K) {
        mmc_error(MMC_ERR_INVALID, "mmc_gemm_pack_b: bad weight N=%lld K=%lld ldw=%lld (want N, K > 0, ldw >= K)",
                  (long long)N, (long long)K, (long long)ldw);
        return NULL;
    }
    const kdesc *kd = w_bf16 ? kernel_for(infer) : kernel_f32();
    mmc_gemm_packed_b *pb = calloc(1, sizeof *pb);
    if (!pb) {
        mmc_error(MMC_ERR_OOM, "mmc_gemm_pack_b: out of memory");
        return NULL;
    }
    const int nr = kd->nr;
    pb->kd = kd, pb->N = N, pb->K = K, pb->kc = kd->kc, pb->b16 = w_bf16;
    pb->npanels = (N + nr - 1) / nr;
    int64_t slots = 0; /* 4-byte slots over all K blocks */
    for (int64_t pc = 0; pc < K; pc += pb->kc) {
        const int64_t kc = K - pc < pb->kc ? K - pc : pb->kc;
        slots += pb->npanels * nr * kslots(kd, kc);
    }
    pb->bytes = ((size_t)slots * 4 + 63) / 64 * 64;
    pb->data = aligned_alloc(64, pb->bytes);
    if (!pb->data) {
        free(pb);
        mmc_error(MMC_ERR_OOM, "mmc_gemm_pack_b: out of memory for %zu bytes of packed weight", (size_t)slots * 4);
        return NULL;
    }
    const int64_t nblk = (K + pb->kc - 1) / pb->kc, units = nblk * pb->npanels;
#pragma omp parallel for schedule(static) if (units > 8 && !omp_in_parallel())
    for (int64_t u = 0; u < units; u++) {
        const int64_t pc = u / pb->npanels * pb->kc, p = u % pb->npanels;
        const int64_t kc = K - pc < pb->kc ? K - pc : pb->kc, cols = N - p * nr < nr ? N - p * nr : nr;
        float *dst = (float *)packed_block(pb, p * nr, pc);
        pack_b_panel(kd, true, W, w_bf16, ldw, p * nr, cols, pc, kc, dst);
    }
    return pb;
}

void mmc_gemm_packed_b_free(mmc_gemm_packed_b *pb) {
    if (!pb) return;
    free(pb->data);
    free(pb);
}

size_t mmc_gemm_packed_b_bytes(const mmc_gemm_packed_b *pb) { return pb ? pb->bytes : 0; }
const char *mmc_gemm_packed_b_kernel(const mmc_gemm_packed_b *pb) { return pb ? pb->kd->name : ""; }
int64_t mmc_gemm_packed_b_rows(const mmc_gemm_packed_b *pb) { return pb ? pb->N : 0; }
int64_t mmc_gemm_packed_b_cols(const mmc_gemm_packed_b *pb) { return pb ? pb->K : 0; }

/* ------------------------------------------------------------------ pre-packed B: decode rows
 *
 * M <= 4 rows (decode) against a pre-packed weight. The packed GEMM pads those rows to a 14-row
 * register tile and packs A for every (NC, KC) block: at M = 1 the micro-kernel issues one
 * broadcast and two FMAs per row per 128 bytes of panel, and Qwen2-VL-2B's decode with packed
 * weights ran at 0.80x of the unpacked matvec (README, twelfth session). Here each pass streams a
 * few panels of one K block (PMV_P panels of NR = 32 columns: PMV_P sequential streams of
 * kc x 128 bytes) and keeps their 2·M·PMV_P accumulators in registers, A read straight from the
 * caller (f32 panels) or as bf16 pairs rounded once per call (the bf16-product panels of the
 * vdpbf16ps / AMX kernels, on vdpbf16ps). Each C element is summed exactly as the packed GEMM's
 * micro-kernel sums it: per K block from zero in k order (f32: one FMA per k; pairs: one
 * vdpbf16ps per pair), then alpha times that plus beta times C (beta 1 after the first block),
 * so the f32 and vdpbf16ps panels give the bits of the packed GEMM's edge tiles (its rows for any
 * M when alpha is 1; the AMX kernel's tile products round differently: within its tolerance,
 * test_gemm_packed). The work is split over
 * threads by whole units of panels (contiguous columns of C, no two threads on one line), handed
 * out dynamically; who computes a unit does not change its bits. MMC_PACKED_MV=0 turns it off
 * (the packed GEMM at every M, for comparison). */
enum { PMV_P = 4, PMV_UNIT = 8 };   /* panels per pass (M <= 2; half for 3-4 rows); per work unit */
static int g_pmv = -1;               /* MMC_PACKED_MV: 1 on (default), 0 off */
static int g_pmv_pf = 1024;          /* bytes ahead each panel stream is prefetched (MMC_PACKED_MV_PF) */

typedef struct {
    const mmc_gemm_packed_b *pb;
    int M;
    float alpha, beta;
    const float *A;        /* f32 panels: [M, lda] */
    int64_t lda;
    const uint32_t *xp;    /* pair panels: [M, xps] bf16 pairs of A, zero-padded */
    int64_t xps;
    float *C;
    int64_t ldc;
} pmv_args;

/* C[m, panels p0 .. p0+NP) of K block pc (kc k, ks slots per panel row); STEP(m, i, h) adds step k's
 * product for row m into acc[m][i][h] from b[i][h] (f32: an FMA with x[m][k]; pairs: a vdpbf16ps) */
#define PMV_PASS(name, TGT, XDECL, STEP)                                                                     \
    TGT __attribute__((always_inline)) static inline void name(const int M, const int NP, const pmv_args *a, \
                                                               int64_t p0, int64_t pc, int64_t kc, int64_t ks) { \
        const mmc_gemm_packed_b *pb = a->pb;                                                                 \
        const float *bp = packed_block(pb, p0 * 32, pc);                                                     \
        __m512 acc[4][PMV_P][2];                                                                             \
        for (int m = 0; m < M; m++)                                                                          \
            for (int i = 0; i < NP; i++) acc[m][i][0] = acc[m][i][1] = _mm512_setzero_ps();                  \
        const int64_t pstride = 32 * ks, pf = g_pmv_pf / 4, steps = a->xp ? ks : kc;                         \
        for (int64_t k = 0; k < steps; k++) {                                                                \
            __m512 b[PMV_P][2];                                                                              \
            for (int i = 0; i < NP; i++) {                                                                   \
                const float *q = bp + i * pstride + k * 32;                                                  \
                _mm_prefetch((const char *)(q + pf), _MM_HINT_T0);                                           \
                _mm_prefetch((const char *)(q + pf + 16), _MM_HINT_T0);                                      \
                b[i][0] = _mm512_load_ps(q);                                                                 \
                b[i][1] = _mm512_load_ps(q + 16);                                                            \
            }                                                                                                \
            for (int m = 0; m < M; m++) {                                                                    \
                XDECL;                                                                                       \
                for (int i = 0; i < NP; i++) {                                                               \
                    STEP(m, i, 0);                                                                           \
                    STEP(m, i, 1);                                                                           \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        /* the packed GEMM's edge-tile epilogue: s = alpha * acc, then s + beta_k * c */                     \
        const float beta_k = pc == 0 ? a->beta : 1.0f;                                                       \
        const __m512 va = _mm512_set1_ps(a->alpha), vb = _mm512_set1_ps(beta_k);                            \
        for (int m = 0; m < M; m++)                                                                          \
            for (int i = 0; i < NP; i++)                                                                     \
                for (int h = 0; h < 2; h++) {                                                                \
                    const int64_t n = (p0 + i) * 32 + h * 16, w = pb->N - n;                                 \
                    if (w <= 0) continue;                                                                    \
                    const __mmask16 mk = w >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);          \
                    float *c = a->C + m * a->ldc + n;                                                        \
                    __m512 s = _mm512_mul_ps(va, acc[m][i][h]);                                              \
                    if (beta_k != 0.0f) s = _mm512_add_ps(s, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mk, c))); \
                    _mm512_mask_storeu_ps(c, mk, s);                                                         \
                }                                                                                            \
    }
#define PMV_X_F32 const __m512 x = _mm512_set1_ps(a->A[m * a->lda + pc + k])
#define PMV_STEP_F32(m, i, h) acc[m][i][h] = _mm512_fmadd_ps(x, b[i][h], acc[m][i][h])
#define PMV_X_PAIRS const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a->xp[m * a->xps + pc / 2 + k])
#define PMV_STEP_PAIRS(m, i, h) acc[m][i][h] = _mm512_dpbf16_ps(acc[m][i][h], x, (__m512bh)_mm512_castps_si512(b[i][h]))
PMV_PASS(pmv_pass_f32, T512, PMV_X_F32, PMV_STEP_F32)
PMV_PASS(pmv_pass_pairs, TBF16, PMV_X_PAIRS, PMV_STEP_PAIRS)
#undef PMV_PASS
#undef PMV_X_F32
#undef PMV_STEP_F32
#undef PMV_X_PAIRS
#undef PMV_STEP_PAIRS

/* panels [p0, p1) over every K block: passes of PMV_P panels (PMV_P / 2 for 3-4 rows), then singles */
#define PMV_UNIT_FN(name, PASS, TGT)                                                                        \
    TGT static void name(const pmv_args *a, int64_t p0, int64_t p1) {                                        \
        const mmc_gemm_packed_b *pb = a->pb;                                                                 \
        const int np = a->M <= 2 ? PMV_P : PMV_P / 2;                                                        \
        for (int64_t pc = 0; pc < pb->K; pc += pb->kc) {                                                     \
            const int64_t kc = pb->K - pc < pb->kc ? pb->K - pc : pb->kc, ks = kslots(pb->kd, kc);           \
            int64_t p = p0;                                                                                  \
            for (; p + np <= p1; p += np) switch (a->M) {                                                    \
                case 1: PASS(1, PMV_P, a, p, pc, kc, ks); break;                                  \
                case 2: PASS(2, PMV_P, a, p, pc, kc, ks); break;                                  \
                case 3: PASS(3, PMV_P / 2, a, p, pc, kc, ks); break;                              \
                default: PASS(4, PMV_P / 2, a, p, pc, kc, ks); break;                             \
                }                                                                                            \
            for (; p < p1; p++) switch (a->M) {                                                              \
                case 1: PASS(1, 1, a, p, pc, kc, ks); break;                                      \
                case 2: PASS(2, 1, a, p, pc, kc, ks); break;                                      \
                case 3: PASS(3, 1, a, p, pc, kc, ks); break;                                      \
                default: PASS(4, 1, a, p, pc, kc, ks); break;                                     \
                }                                                                                            \
        }                                                                                                    \
    }
PMV_UNIT_FN(pmv_unit_f32, pmv_pass_f32, T512)
PMV_UNIT_FN(pmv_unit_pairs, pmv_pass_pairs, TBF16)
#undef PMV_UNIT_FN

/* Whether M rows against pb take the decode-rows path: an NR = 32 AVX-512 family kernel */
static bool pmv_ok(const mmc_gemm_packed_b *pb, int64_t M) {
    if (M < 1 || M > SMALL_M) return false;
    int on = __atomic_load_n(&g_pmv, __ATOMIC_ACQUIRE);
    if (on < 0) {   /* first call: the environment (every thread that races here reads the same) */
        const char *e = getenv("MMC_PACKED_MV");
        if (env_int("MMC_PACKED_MV_PF", 0) > 0) g_pmv_pf = env_int("MMC_PACKED_MV_PF", 0);
        on = e && *e && atoi(e) == 0 ? 0 : 1;
        __atomic_store_n(&g_pmv, on, __ATOMIC_RELEASE);
    }
    if (!on) return false;
    if (pb->kd == &K_AVX512) return true;
    return (pb->kd == &K_BF16DOT || pb->kd == &K_AMX) && cpu_bf16dot();
}

static void packed_mv(int64_t M, float alpha, const float *A, int64_t lda, const mmc_gemm_packed_b *pb, float beta,
                      float *C, int64_t ldc) {
    const bool pairs = pb->kd != &K_AVX512;
    pmv_args a = {pb, (int)M, alpha, beta, A, lda, NULL, 0, C, ldc};
    uint32_t *xp = NULL;
    if (pairs) {   /* A as bf16 pairs (the dot kernels' pack_a_dot rounding), zero past K and to whole tile steps */
        a.xps = (pb->K + 1) / 2 + 32;
        xp = calloc((size_t)(M * a.xps), sizeof *xp);
        MMC_CHECK(xp, "gemm (pre-packed weight): out of memory for %lld x %lld pairs", (long long)M, (long long)a.xps);
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < pb->K; k++)
                xp[m * a.xps + k / 2] |= (uint32_t)mmc_f32_to_bf16(A[m * lda + k]) << (16 * (k & 1));
        a.xp = xp;
    }
    const int64_t units = (pb->npanels + PMV_UNIT - 1) / PMV_UNIT;
    int nth = ((double)pb->bytes < 256 * 1024 || omp_in_parallel()) ? 1 : omp_get_max_threads();
    if (nth > units) nth = (int)units;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth) if (nth > 1)
    for (int64_t u = 0; u < units; u++) {
        const int64_t p0 = u * PMV_UNIT, p1 = p0 + PMV_UNIT < pb->npanels ? p0 + PMV_UNIT : pb->npanels;
        if (pairs) pmv_unit_pairs(&a, p0, p1);
        else pmv_unit_f32(&a, p0, p1);
    }
    free(xp);
}

void mmc_gemm_xwt_packed(int64_t M, float alpha, const float *A, int64_t lda, const mmc_gemm_packed_b *W,
                         float beta, float *C, int64_t ldc) {
    MMC_CHECK(W && M >= 0 && lda >= W->K && ldc >= W->N,
              "gemm (pre-packed weight): bad call M=%lld lda=%lld ldc=%lld for a packed [%lld, %lld] weight",
              (long long)M, (long long)lda, (long long)ldc, W ? (long long)W->N : 0LL, W ? (long long)W->K : 0LL);
    if (M == 0) return;
    /* every M, decode's M <= 4 included, runs on the packed panels: the original weight may be gone */
    if (pmv_ok(W, M)) {
        packed_mv(M, alpha, A, lda, W, beta, C, ldc);
        return;
    }
    gemm_packed(W->kd, false, true, M, W->N, W->K, alpha, A, lda, NULL, W->b16, W->K, beta, C, ldc, W);
}

/* ------------------------------------------------------------------ micro-kernel probe (bench)
 * bench_gemm's ukr_* cases: the f32 micro-kernel the GEMM runs (kernel(), with its B prefetch),
 * called `calls` times in the GEMM's order (for each B micro-panel [kc][nr], every A tile [kc][mr]),
 * the A tiles taken in turn from `na` consecutive ones and the B panels from `nb`, accumulating
 * into one mr×nr tile of C (beta 1, as every K block after the first). One tile and one panel of a
 * small kc: everything in L1; a megabyte of B panels or of A tiles: that operand streams from L2.
 * No packing, no edge tiles, no C traffic past L1: the ceiling the GEMM's loop nest can approach. */
void mmc_gemm_ukr_tile(int *mr, int *nr) {
    const kdesc *kd = kernel();
    *mr = kd->mr, *nr = kd->nr;
}

void mmc_gemm_ukr_loop(int64_t kc, const float *Ap, int64_t na, const float *Bp, int64_t nb, float *C, int64_t calls) {
    const kdesc *kd = kernel();
    MMC_CHECK(kc > 0 && na > 0 && nb > 0 && calls >= 0, "gemm: ukr probe kc=%lld na=%lld nb=%lld calls=%lld (want kc, na, nb > 0)",
              (long long)kc, (long long)na, (long long)nb, (long long)calls);
    int64_t a = 0, b = 0;
    for (int64_t c = 0; c < calls; c++) {
        kd->ukr(kc, Ap + a * kc * kd->mr, Bp + b * kc * kd->nr, C, kd->nr, 1.0f, 1.0f);
        if (++a == na) a = 0, b = b + 1 == nb ? 0 : b + 1;
    }
}
