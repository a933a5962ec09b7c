/* bench_gemm.c — GEMM throughput against this machine's own limits.
 *
 * Cases (JSON lines, see bench_util.h; bench/peer_gemm.py prints the same names for torch):
 *   fma_peak                     register-only FMA loop on all threads (GFLOP/s), the max of
 *                                measurements at the start and at the end of the run
 * Every figure is the best (fastest) call of a ~1 s timed run: the machine is shared. Memory
 * bandwidth drifts with what other tenants do, so the decode matvec's timed calls alternate
 * with reads (of the DRAM probe's buffer, or of the weight itself) and its fraction is best ÷
 * best of the two series.
 * (GEMMs are not interleaved with FMA bursts: idle gaps let other tenants evict L3.)
 *   gemm_{f32,bf16}_<layout>     mmc_gemm_f32 / mmc_gemm_bf16 GFLOP/s, Qwen2-0.5B shapes
 *                                (tokens 512, hidden 896, intermediate 4864):
 *                                xWt   y  = x·Wᵀ  M=512  N=4864 K=896   (ta=0, tb=1)
 *                                dyW   dx = dy·W  M=512  N=896  K=4864  (ta=0, tb=0)
 *                                dyTx  dW = dyᵀ·x M=4864 N=896  K=512   (ta=1, tb=0, beta=1)
 *                                sq1024 square 1024 (ta=0, tb=0)
 *   gemm_bf16dot_<layout>        mmc_gemm_bf16_infer on the opt-in AVX512_BF16 kernel (vdpbf16ps,
 *                                activations rounded to bf16: MMC_GEMM_BF16=dot), where the CPU
 *                                has it; _vs_bf16: its speed-up over the default bf16 path
 *   gemm_*_frac_peak             the same figure divided by fma_peak (fraction, this run)
 *   gemm_f32_<layout>_openblas   the gemm_f32 figure again, on a row of its own against the
 *                                best BLAS of the machine (bench/peer_gemm_blas.py: OpenBLAS,
 *                                the core it picks and the AVX-512 cores forced, fastest)
 *   ukr_f32_{l1,l2b,l2a,kc}      the GEMM's f32 micro-kernel alone (mmc_gemm_ukr_loop: no packing, no
 *                                edge tiles, C stays in L1), GFLOP/s and _frac_peak: l1 one A tile and
 *                                one B panel of kc 128 (both in L1); l2b kc 256, B panels walking
 *                                through 1 MiB (B from L2, A in L1); l2a kc 256, A tiles through 1 MiB
 *                                (A from L2, B in L1); kc the GEMM's own KC, its A block and 1 MiB of
 *                                B panels (as the GEMM's loop nest runs it). Each thread its own.
 *   ukr_mix_*                    the instruction mix alone (x86-64 AVX-512, inline asm, all operands
 *                                at fixed L1 addresses, no pointer updates): 14x32 = 2 B loads + 14
 *                                vbroadcastss + 28 FMA per k step (the kernel's), 14x32eb = the same
 *                                with embedded-broadcast FMAs ({1to16}), 6x64 = 4 loads + 6 broadcasts
 *                                + 24 FMA, 14x32_7bc = only 7 broadcasts (B and half of A in
 *                                registers), 14x32pf = the kernel's mix with its 3 prefetches per k
 *                                step (2 B lines, 1 A line), GFLOP/s and _frac_peak: what a broadcast
 *                                kernel can reach
 *   mem_read_bw                  streaming read of a 512 MiB (or 2 x L3) buffer on all threads (GB/s): the
 *                                DRAM. The best of two read kernels (a static half per thread with
 *                                four streams; dynamic 1 MiB chunks with eight; both prefetch 2 KiB
 *                                ahead on each stream), max of every measurement in the run
 *   mem_read_bw_l3               the same kernels on a buffer of half the L3 (at most 32 MiB) read
 *                                back to back: the L3
 *   matvec_{f32,bf16}_8192x4096  y = x·Wᵀ with M=1 (decode), GB/s of weight bytes streamed, calls
 *                                back to back (the weight as cache-resident as it gets, as the
 *                                PyTorch peer is timed); _dram: each call after an eviction (DRAM)
 *   matvec_{int8,nf4}_8192x4096  the same with quantised weights read directly (qmatvec.c:
 *                                int8 per-row scales; NF4 blocks of 64), GB/s of the bytes
 *                                held (codes + scales)
 *   matvec_*_frac_bw             that divided by the read bandwidth of its window: back to back,
 *                                a read of the same weight buffer; _dram, the DRAM read
 *   matvec_{f32,bf16}_8192x4096_packed  the back-to-back matvec on a pre-packed weight
 *                                (mmc_gemm_xwt_packed: what generate / chat / serve run)
 *   matvec_bf16_4864x896         a Qwen2 MLP weight (fits in L3), GB/s
 * Threads: OMP_NUM_THREADS (bench/run.sh sets it to MMC_BENCH_THREADS). Every case is run
 * twice: with all threads on the wall clock, then as "<case>_1t" with one thread timed on
 * its own CPU-time clock (robust when other processes share the cores).
 */
#include "bench_util.h"
#include "gemm.h"
#include "mmc_quant.h"
#include "qmatvec.h"
#include "cpuinfo.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <time.h>

/* ---- FMA peak: 24 independent accumulator chains per thread, no memory traffic */
__attribute__((target("avx512f"), noinline))
static float fma_loop_512(int64_t iters) {
    __m512 acc[24];
    for (int i = 0; i < 24; i++) acc[i] = _mm512_set1_ps((float)i * 1e-3f);
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], m, a);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"), noinline))
static float fma_loop_256(int64_t iters) {
    __m256 acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i * 1e-3f);
    const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], m, a);
    }
    float out[8], s = 0;
    for (int i = 1; i < 12; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    _mm256_storeu_ps(out, acc[0]);
    for (int i = 0; i < 8; i++) s += out[i];
    return s;
}

static volatile float g_sink;

/* ---- micro-kernel instruction-mix probes (see ukr_mix_* above): one k step per line group,
 * accumulators zmm4..zmm31 (14x32) or zmm8..zmm31 (6x64), B in zmm0..3, A broadcasts in zmm2/3
 * (14x32) or zmm4..5 (6x64 uses zmm6/7); `p` points at 64-byte aligned data in L1. */
#if defined(__x86_64__)
#define MX_CLOB                                                                                       \
    "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11", \
        "zmm12", "zmm13", "zmm14", "zmm15", "zmm16", "zmm17", "zmm18", "zmm19", "zmm20", "zmm21",     \
        "zmm22", "zmm23", "zmm24", "zmm25", "zmm26", "zmm27", "zmm28", "zmm29", "zmm30", "zmm31", "memory", "cc"
#define MX_BF(off, s, r0, r1) "vbroadcastss " #off "(%[p]), %%zmm" #s "\n\t"                           \
    "vfmadd231ps %%zmm" #s ", %%zmm0, %%zmm" #r0 "\n\t vfmadd231ps %%zmm" #s ", %%zmm1, %%zmm" #r1 "\n\t"
#define MX_FF(s, r0, r1) "vfmadd231ps %%zmm" #s ", %%zmm0, %%zmm" #r0 "\n\t vfmadd231ps %%zmm" #s ", %%zmm1, %%zmm" #r1 "\n\t"
#define MX_EB(off, r0, r1) "vfmadd231ps " #off "(%[p])%{1to16%}, %%zmm0, %%zmm" #r0 "\n\t"                 \
    "vfmadd231ps " #off "(%[p])%{1to16%}, %%zmm1, %%zmm" #r1 "\n\t"
/* before each loop: B from p, accumulators zeroed (no denormals, no leftovers) */
#define MX_INIT                                                                                        \
    "vmovaps 128(%[p]), %%zmm0\n\t vmovaps 192(%[p]), %%zmm1\n\t vmovaps 256(%[p]), %%zmm2\n\t"              \
    "vmovaps 320(%[p]), %%zmm3\n\t vpxord %%zmm4, %%zmm4, %%zmm4\n\t vmovaps %%zmm4, %%zmm5\n\t"             \
    "vmovaps %%zmm4, %%zmm6\n\t vmovaps %%zmm4, %%zmm7\n\t vmovaps %%zmm4, %%zmm8\n\t vmovaps %%zmm4, %%zmm9\n\t" \
    "vmovaps %%zmm4, %%zmm10\n\t vmovaps %%zmm4, %%zmm11\n\t vmovaps %%zmm4, %%zmm12\n\t"                      \
    "vmovaps %%zmm4, %%zmm13\n\t vmovaps %%zmm4, %%zmm14\n\t vmovaps %%zmm4, %%zmm15\n\t"                      \
    "vmovaps %%zmm4, %%zmm16\n\t vmovaps %%zmm4, %%zmm17\n\t vmovaps %%zmm4, %%zmm18\n\t"                      \
    "vmovaps %%zmm4, %%zmm19\n\t vmovaps %%zmm4, %%zmm20\n\t vmovaps %%zmm4, %%zmm21\n\t"                      \
    "vmovaps %%zmm4, %%zmm22\n\t vmovaps %%zmm4, %%zmm23\n\t vmovaps %%zmm4, %%zmm24\n\t"                      \
    "vmovaps %%zmm4, %%zmm25\n\t vmovaps %%zmm4, %%zmm26\n\t vmovaps %%zmm4, %%zmm27\n\t"                      \
    "vmovaps %%zmm4, %%zmm28\n\t vmovaps %%zmm4, %%zmm29\n\t vmovaps %%zmm4, %%zmm30\n\t vmovaps %%zmm4, %%zmm31\n\t"
#define MX_B2 "vmovaps 128(%[p]), %%zmm0\n\t vmovaps 192(%[p]), %%zmm1\n\t"
__attribute__((target("avx512f"), noinline)) static void mix_14x32(int64_t n, const float *p) {
    __asm__ volatile(MX_INIT "1:\n\t" MX_B2 MX_BF(0, 2, 4, 5) MX_BF(4, 3, 6, 7) MX_BF(8, 2, 8, 9) MX_BF(12, 3, 10, 11)
                     MX_BF(16, 2, 12, 13) MX_BF(20, 3, 14, 15) MX_BF(24, 2, 16, 17) MX_BF(28, 3, 18, 19)
                     MX_BF(32, 2, 20, 21) MX_BF(36, 3, 22, 23) MX_BF(40, 2, 24, 25) MX_BF(44, 3, 26, 27)
                     MX_BF(48, 2, 28, 29) MX_BF(52, 3, 30, 31) "dec %[n]\n\t jnz 1b\n\t"
                     : [n] "+r"(n) : [p] "r"(p) : MX_CLOB);
}
/* the 14x32 mix plus the Intel kernel's three prefetches per k step (2 B lines, 1 A line) */
#define MX_PF "prefetcht0 512(%[p])\n\t prefetcht0 576(%[p])\n\t prefetcht0 640(%[p])\n\t"
__attribute__((target("avx512f"), noinline)) static void mix_14x32pf(int64_t n, const float *p) {
    __asm__ volatile(MX_INIT "1:\n\t" MX_B2 MX_PF MX_BF(0, 2, 4, 5) MX_BF(4, 3, 6, 7) MX_BF(8, 2, 8, 9) MX_BF(12, 3, 10, 11)
                     MX_BF(16, 2, 12, 13) MX_BF(20, 3, 14, 15) MX_BF(24, 2, 16, 17) MX_BF(28, 3, 18, 19)
                     MX_BF(32, 2, 20, 21) MX_BF(36, 3, 22, 23) MX_BF(40, 2, 24, 25) MX_BF(44, 3, 26, 27)
                     MX_BF(48, 2, 28, 29) MX_BF(52, 3, 30, 31) "dec %[n]\n\t jnz 1b\n\t"
                     : [n] "+r"(n) : [p] "r"(p) : MX_CLOB);
}
__attribute__((target("avx512f"), noinline)) static void mix_14x32eb(int64_t n, const float *p) {
    __asm__ volatile(MX_INIT "1:\n\t" MX_B2 MX_EB(0, 4, 5) MX_EB(4, 6, 7) MX_EB(8, 8, 9) MX_EB(12, 10, 11) MX_EB(16, 12, 13)
                     MX_EB(20, 14, 15) MX_EB(24, 16, 17) MX_EB(28, 18, 19) MX_EB(32, 20, 21) MX_EB(36, 22, 23)
                     MX_EB(40, 24, 25) MX_EB(44, 26, 27) MX_EB(48, 28, 29) MX_EB(52, 30, 31) "dec %[n]\n\t jnz 1b\n\t"
                     : [n] "+r"(n) : [p] "r"(p) : MX_CLOB);
}
__attribute__((target("avx512f"), noinline)) static void mix_14x32_7bc(int64_t n, const float *p) {
    __asm__ volatile(MX_INIT "1:\n\t" MX_BF(0, 2, 4, 5) MX_FF(3, 6, 7) MX_BF(8, 2, 8, 9) MX_FF(3, 10, 11) MX_BF(16, 2, 12, 13)
                     MX_FF(3, 14, 15) MX_BF(24, 2, 16, 17) MX_FF(3, 18, 19) MX_BF(32, 2, 20, 21) MX_FF(3, 22, 23)
                     MX_BF(40, 2, 24, 25) MX_FF(3, 26, 27) MX_BF(48, 2, 28, 29) MX_FF(3, 30, 31) "dec %[n]\n\t jnz 1b\n\t"
                     : [n] "+r"(n) : [p] "r"(p) : MX_CLOB);
}
__attribute__((target("avx512f"), noinline)) static void mix_6x64(int64_t n, const float *p) {
    /* accumulators zmm8..31: row i, vector j in zmm(8 + 4i + j) */
    __asm__ volatile(MX_INIT "1:\n\t"
                     "vmovaps 128(%[p]), %%zmm0\n\t vmovaps 192(%[p]), %%zmm1\n\t"
                     "vmovaps 256(%[p]), %%zmm2\n\t vmovaps 320(%[p]), %%zmm3\n\t"
                     "vbroadcastss 0(%[p]), %%zmm6\n\t"
                     "vfmadd231ps %%zmm6, %%zmm0, %%zmm8\n\t vfmadd231ps %%zmm6, %%zmm1, %%zmm9\n\t"
                     "vfmadd231ps %%zmm6, %%zmm2, %%zmm10\n\t vfmadd231ps %%zmm6, %%zmm3, %%zmm11\n\t"
                     "vbroadcastss 4(%[p]), %%zmm7\n\t"
                     "vfmadd231ps %%zmm7, %%zmm0, %%zmm12\n\t vfmadd231ps %%zmm7, %%zmm1, %%zmm13\n\t"
                     "vfmadd231ps %%zmm7, %%zmm2, %%zmm14\n\t vfmadd231ps %%zmm7, %%zmm3, %%zmm15\n\t"
                     "vbroadcastss 8(%[p]), %%zmm6\n\t"
                     "vfmadd231ps %%zmm6, %%zmm0, %%zmm16\n\t vfmadd231ps %%zmm6, %%zmm1, %%zmm17\n\t"
                     "vfmadd231ps %%zmm6, %%zmm2, %%zmm18\n\t vfmadd231ps %%zmm6, %%zmm3, %%zmm19\n\t"
                     "vbroadcastss 12(%[p]), %%zmm7\n\t"
                     "vfmadd231ps %%zmm7, %%zmm0, %%zmm20\n\t vfmadd231ps %%zmm7, %%zmm1, %%zmm21\n\t"
                     "vfmadd231ps %%zmm7, %%zmm2, %%zmm22\n\t vfmadd231ps %%zmm7, %%zmm3, %%zmm23\n\t"
                     "vbroadcastss 16(%[p]), %%zmm6\n\t"
                     "vfmadd231ps %%zmm6, %%zmm0, %%zmm24\n\t vfmadd231ps %%zmm6, %%zmm1, %%zmm25\n\t"
                     "vfmadd231ps %%zmm6, %%zmm2, %%zmm26\n\t vfmadd231ps %%zmm6, %%zmm3, %%zmm27\n\t"
                     "vbroadcastss 20(%[p]), %%zmm7\n\t"
                     "vfmadd231ps %%zmm7, %%zmm0, %%zmm28\n\t vfmadd231ps %%zmm7, %%zmm1, %%zmm29\n\t"
                     "vfmadd231ps %%zmm7, %%zmm2, %%zmm30\n\t vfmadd231ps %%zmm7, %%zmm3, %%zmm31\n\t"
                     "dec %[n]\n\t jnz 1b\n\t"
                     : [n] "+r"(n) : [p] "r"(p) : MX_CLOB);
}
#endif

/* Clock: wall time for the all-threads suite; this thread's CPU time for the 1-thread suite,
 * which time slices given to other processes on the shared machine do not inflate. */
static bool g_cpu_clock = false;
static double clk(void) {
    if (!g_cpu_clock) return mmc_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double fma_peak_gflops(void) {
    const bool w512 = __builtin_cpu_supports("avx512f");
    const int64_t iters = 2000000; /* ~20 ms per rep */
    double best = 0;
    for (int rep = 0; rep < 40; rep++) {
        double t0 = clk();
        int nt = 1;
#pragma omp parallel if (!g_cpu_clock)
        {
#pragma omp single
            nt = omp_get_num_threads();
            float r = w512 ? fma_loop_512(iters) : fma_loop_256(iters);
            if (r == 12345.0f) g_sink = r;
        }
        double dt = clk() - t0;
        double flops = (double)nt * iters * (w512 ? 24 * 16 : 12 * 8) * 2.0;
        if (flops / dt > best) best = flops / dt;
    }
    return best * 1e-9;
}

/* ---- memory bandwidth: each thread sums its contiguous share of a buffer
 * Several sequential streams per thread, two 64-byte loads each per iteration, and a software
 * prefetch BW_PF bytes ahead on every stream: on the Intel VM (1 thread, CPU clock, a 960 MiB
 * buffer) four streams read 12.5 GB/s without the prefetch and 13.7 with it (one stream 10.4 either
 * way), so a probe without it under-read what a kernel with prefetches moves. Unaligned loads: the
 * weight buffers of the hot matvec cases are read with these too. */
#define BW_PF 2048
__attribute__((target("avx512f"), noinline))
static float sum_512(const float *p, int64_t n) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
    const int64_t q = n / 4 / 32 * 32;
    const float *s0 = p, *s1 = p + q, *s2 = p + 2 * q, *s3 = p + 3 * q;
    for (int64_t i = 0; i < q; i += 32) {
        _mm_prefetch((const char *)(s0 + i) + BW_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(s1 + i) + BW_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(s2 + i) + BW_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(s3 + i) + BW_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)(s0 + i) + BW_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(s1 + i) + BW_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(s2 + i) + BW_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(s3 + i) + BW_PF + 64, _MM_HINT_T0);
        a[0] = _mm512_add_ps(a[0], _mm512_loadu_ps(s0 + i));
        a[1] = _mm512_add_ps(a[1], _mm512_loadu_ps(s0 + i + 16));
        a[2] = _mm512_add_ps(a[2], _mm512_loadu_ps(s1 + i));
        a[3] = _mm512_add_ps(a[3], _mm512_loadu_ps(s1 + i + 16));
        a[4] = _mm512_add_ps(a[4], _mm512_loadu_ps(s2 + i));
        a[5] = _mm512_add_ps(a[5], _mm512_loadu_ps(s2 + i + 16));
        a[6] = _mm512_add_ps(a[6], _mm512_loadu_ps(s3 + i));
        a[7] = _mm512_add_ps(a[7], _mm512_loadu_ps(s3 + i + 16));
    }
    for (int i = 1; i < 8; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}
static float sum_plain(const float *p, int64_t n) {
    float s[16] = {0};
    for (int64_t i = 0; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) s[j] += p[i + j];
    float t = 0;
    for (int j = 0; j < 16; j++) t += s[j];
    return t;
}
/* eight sequential streams (as the decode matvec keeps eight weight rows in flight) */
__attribute__((target("avx512f"), noinline))
static float sum8_512(const float *p, int64_t n) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
    const int64_t q = n / 8 / 16 * 16;
    for (int64_t i = 0; i < q; i += 16)
        for (int s = 0; s < 8; s++) {
            _mm_prefetch((const char *)(p + s * q + i) + BW_PF, _MM_HINT_T0);
            a[s] = _mm512_add_ps(a[s], _mm512_loadu_ps(p + s * q + i));
        }
    for (int i = 1; i < 8; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}
typedef struct { const float *p; int64_t n; int kind; } bw_arg;
static void bw_run(void *v) {
    bw_arg *a = v;
    const bool w512 = __builtin_cpu_supports("avx512f");
    float tot = 0;
    if (a->kind == 0) { /* a static half per thread, four streams each */
#pragma omp parallel reduction(+ : tot)
        {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t chunk = a->n / nt / 64 * 64;
            tot += w512 ? sum_512(a->p + chunk * t, chunk) : sum_plain(a->p + chunk * t, chunk);
        }
    } else { /* dynamic 1 MiB chunks, eight streams each */
        const int64_t chunk = 1 << 18, nch = (a->n + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : tot)
        for (int64_t c = 0; c < nch; c++) {
            const int64_t len = a->n - c * chunk < chunk ? a->n - c * chunk : chunk;
            tot += w512 ? sum8_512(a->p + c * chunk, len) : sum_plain(a->p + c * chunk, len);
        }
    }
    g_sink = tot;
}

/* ---- GEMM cases */
typedef struct {
    bool ta, tb, bf16;
    int64_t M, N, K;
    float beta;
    float *A, *B, *C;
    uint16_t *Bh;
    mmc_q8 *q8;     /* matvec on int8 / NF4 weights (M = 1) when set */
    mmc_nf4 *q4;
} gemm_arg;
static void gemm_run(void *v) {
    gemm_arg *g = v;
    if (g->q8) { mmc_qmv_int8(g->M, g->N, g->K, g->A, g->q8->q, g->q8->scale, g->C); return; }
    if (g->q4) { mmc_qmv_nf4(g->M, g->A, g->q4, g->C); return; }
    int64_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    if (g->bf16) mmc_gemm_bf16_infer(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, lda, g->Bh, ldb, g->beta, g->C, g->N);
    else mmc_gemm_f32(g->ta, g->tb, g->M, g->N, g->K, 1.0f, g->A, lda, g->B, ldb, g->beta, g->C, g->N);
}

/* x·Wᵀ on a pre-packed W (mmc_gemm_pack_b: the B panels packed once, as at model load) */
typedef struct {
    int64_t M;
    const float *A;
    float *C;
    const mmc_gemm_packed_b *W;
} packed_arg;
static void packed_run(void *v) {
    packed_arg *p = v;
    mmc_gemm_xwt_packed(p->M, 1.0f, p->A, mmc_gemm_packed_b_cols(p->W), p->W, 0.0f, p->C, mmc_gemm_packed_b_rows(p->W));
}

static float *falloc(int64_t n) {
    float *p = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
    MMC_CHECK(p, "bench_gemm: out of memory (%lld floats)", (long long)n);
    return p;
}

/* Time fn(arg) for at least min_seconds and min_iters calls after a warm-up; when ref is
 * given, each timed call is preceded by a timed ref(ref_arg) (the machine limit), so both
 * series see the same conditions. The best (minimum) call of each goes to *best_fn and
 * *best_ref: the machine is shared, and fma_peak and mem_read_bw use the same estimator,
 * so fractions compare like with like. */
static void paired_time(bench_fn fn, void *arg, bench_fn ref, void *ref_arg, double min_seconds,
                        int min_iters, double *best_fn, double *best_ref) {
    fn(arg);
    if (ref) ref(ref_arg);
    double bf = 1e30, br = 1e30, start = mmc_now();
    for (int n = 0; n < 1000 && (n < min_iters || mmc_now() - start < min_seconds); n++) {
        double t0 = clk();
        if (ref) ref(ref_arg);
        double t1 = clk();
        fn(arg);
        double t2 = clk();
        if (t1 - t0 < br) br = t1 - t0;
        if (t2 - t1 < bf) bf = t2 - t1;
    }
    *best_fn = bf;
    if (best_ref) *best_ref = br;
}

static double best_time(bench_fn fn, void *arg, double min_seconds, int min_iters) {
    double t;
    paired_time(fn, arg, NULL, NULL, min_seconds, min_iters, &t, NULL);
    return t;
}

static void fill(float *p, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) * (1.0f / (1 << 24)) - 0.5f;
    }
}

/* ---- MMC_MATMUL_PRECISION=high (bf16x3 on AMX, gemm.c's amx_bf16x3) on the f32 GEMM cases, timed
 * alternately with the f32 path on the same operands:
 *   gemm_bf16x3_<layout>            GFLOP/s (peer: PyTorch's f32 matmul, peer_gemm.py)
 *   gemm_bf16x3_<layout>_vs_f32     its speed-up over mmc's f32 GEMM of the same run
 *   gemm_bf16x3_<layout>_err        max |C - C_f64| / sum_k |a||b| over 16 rows (f64 oracle), and
 *   gemm_bf16x3_<layout>_err_f32    the same for the f32 path (lower is better; all-threads suite only)
 *   gemm_bf16x3_xWt_packed          x·Wᵀ on a weight pre-packed into bf16x3 panels
 * Skipped where the CPU (or the OS) offers no AMX. MMC_BENCH_GEMM_PACKED_ONLY=1 runs these too. */
static void bf3_run(void *v) {
    mmc_gemm_set_matmul_precision("high");
    gemm_run(v);
    mmc_gemm_set_matmul_precision("highest");
}
static double bf3_err(const gemm_arg *g, bool high) {
    const int64_t rows = 16, m0 = g->M / 2, lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    const float *A = g->ta ? g->A + m0 : g->A + m0 * g->K;
    float *C = falloc(rows * g->N), *R = falloc(rows * g->N), *S = falloc(rows * g->N);
    float *Aa = falloc(g->M * g->K), *Ba = falloc(g->K * g->N);
    for (int64_t i = 0; i < g->M * g->K; i++) Aa[i] = fabsf(g->A[i]);
    for (int64_t i = 0; i < g->K * g->N; i++) Ba[i] = fabsf(g->B[i]);
    mmc_gemm_set_matmul_precision(high ? "high" : "highest");
    mmc_gemm_f32(g->ta, g->tb, rows, g->N, g->K, 1.0f, A, lda, g->B, ldb, 0.0f, C, g->N);
    mmc_gemm_set_matmul_precision("highest");
    mmc_gemm_ref(g->ta, g->tb, rows, g->N, g->K, 1.0f, A, lda, g->B, ldb, 0.0f, R, g->N);
    mmc_gemm_ref(g->ta, g->tb, rows, g->N, g->K, 1.0f, g->ta ? Aa + m0 : Aa + m0 * g->K, lda, Ba, ldb, 0.0f, S, g->N);
    double worst = 0;
    for (int64_t i = 0; i < rows * g->N; i++)
        if (S[i] > 0 && fabs((double)C[i] - R[i]) / S[i] > worst) worst = fabs((double)C[i] - R[i]) / S[i];
    free(C); free(R); free(S); free(Aa); free(Ba);
    return worst;
}

static void bf16x3_suite(const char *sfx) {
    if (mmc_gemm_set_matmul_precision("high") != 0) {
        mmc_gemm_set_matmul_precision("highest");
        fprintf(stderr, "bench_gemm%s: no AMX here: gemm_bf16x3_* skipped\n", sfx);
        return;
    }
    mmc_gemm_set_matmul_precision("highest");
    static const struct { const char *name; bool ta, tb; int64_t M, N, K; float beta; } cs[] = {
        {"xWt", false, true, 512, 4864, 896, 0.0f},
        {"dyW", false, false, 512, 896, 4864, 0.0f},
        {"dyTx", true, false, 4864, 896, 512, 1.0f},
        {"sq1024", false, false, 1024, 1024, 1024, 0.0f},
    };
    char name[128];
    for (int c = 0; c < 5; c++) {
        const int k = c < 4 ? c : 0; /* 4: xWt on a pre-packed weight */
        gemm_arg g = {cs[k].ta, cs[k].tb, false, cs[k].M, cs[k].N, cs[k].K, cs[k].beta, NULL, NULL, NULL, NULL, NULL, NULL};
        g.A = falloc(g.M * g.K);
        g.B = falloc(g.K * g.N);
        g.C = falloc(g.M * g.N);
        fill(g.A, g.M * g.K, 1);
        fill(g.B, g.K * g.N, 2);
        fill(g.C, g.M * g.N, 3);
        const double fl = 2.0 * g.M * g.N * g.K;
        double tx, tf;
        if (c < 4) {
            paired_time(bf3_run, &g, gemm_run, &g, 2.0, 10, &tx, &tf);
        } else {
            mmc_gemm_set_matmul_precision("high");
            mmc_gemm_packed_b *W = mmc_gemm_pack_b(g.B, false, g.N, g.K, g.K, true);
            mmc_gemm_set_matmul_precision("highest");
            MMC_CHECK(W, "bench_gemm: %s", mmc_last_error());
            packed_arg pa = {g.M, g.A, g.C, W};
            paired_time(packed_run, &pa, gemm_run, &g, 2.0, 10, &tx, &tf);
            mmc_gemm_packed_b_free(W);
        }
        const char *nm = c < 4 ? cs[k].name : "xWt_packed";
        snprintf(name, sizeof name, "gemm_bf16x3_%s%s", nm, sfx);
        bench_report(name, fl / tx * 1e-9, "GFLOP/s", 1);
        snprintf(name, sizeof name, "gemm_bf16x3_%s%s_vs_f32", nm, sfx);
        bench_report(name, tf / tx, "fraction", 1);
        double ex = 0, ef = 0;
        if (c < 4 && !sfx[0]) { /* the same numbers at any thread count: once */
            ex = bf3_err(&g, true), ef = bf3_err(&g, false);
            snprintf(name, sizeof name, "gemm_bf16x3_%s%s_err", nm, sfx);
            bench_report(name, ex, "max |err| / sum|a||b|", 0);
            snprintf(name, sizeof name, "gemm_bf16x3_%s%s_err_f32", nm, sfx);
            bench_report(name, ef, "max |err| / sum|a||b|", 0);
        }
        fprintf(stderr, "bench_gemm%s: bf16x3 %s %.1f GFLOP/s, f32 %.1f (alternated; %.2fx); max err / sum|a||b| "
                "%.3g (f32 %.3g)\n", sfx, nm, fl / tx * 1e-9, fl / tf * 1e-9, tf / tx, ex, ef);
        free(g.A); free(g.B); free(g.C);
    }
}

/* ---- the micro-kernel probes (ukr_f32_*, ukr_mix_*): every thread runs its own copy; the time
 * is the slowest thread's (wall clock) or this thread's CPU time (1-thread suite) */
typedef struct {
    int64_t kc, na, nb, calls;
    int mix;           /* 0: mmc_gemm_ukr_loop; 1..5: mix_14x32, _14x32eb, _6x64, _14x32_7bc, _14x32pf */
    float *buf[256];   /* per thread: A tiles, B panels, C tile */
} ukr_arg;
static void ukr_run(void *v) {
    const ukr_arg *u = v;
#pragma omp parallel if (!g_cpu_clock)
    {
        int mr, nr;
        mmc_gemm_ukr_tile(&mr, &nr);
        const float *A = u->buf[omp_get_thread_num()], *B = A + u->na * u->kc * mr;
        float *C = (float *)B + u->nb * u->kc * nr;
        if (u->mix == 0) mmc_gemm_ukr_loop(u->kc, A, u->na, B, u->nb, C, u->calls);
#if defined(__x86_64__)
        else if (u->mix == 1) mix_14x32(u->calls, A);
        else if (u->mix == 2) mix_14x32eb(u->calls, A);
        else if (u->mix == 3) mix_6x64(u->calls, A);
        else if (u->mix == 4) mix_14x32_7bc(u->calls, A);
        else mix_14x32pf(u->calls, A);
#endif
    }
}

static void ukr_case(ukr_arg *u, double flops_per_call, const char *name, const char *sfx, double peak) {
    char nm[128];
    int mr, nr;
    mmc_gemm_ukr_tile(&mr, &nr);
    const int nt = g_cpu_clock ? 1 : omp_get_max_threads() < 256 ? omp_get_max_threads() : 256;
    const int64_t n = (u->na * mr + u->nb * nr + 16) * u->kc + mr * nr + 192; /* + the 176 floats the mixes touch */
#pragma omp parallel num_threads(nt) if (!g_cpu_clock)
    {   /* first touch by the thread that reads it */
        float *p = falloc(n);
        for (int64_t i = 0; i < n; i++) p[i] = (float)(i % 17) * (1.0f / 64) - 0.125f;
        u->buf[omp_get_thread_num()] = p;
    }
    double t = best_time(ukr_run, u, 0.3, 5);
    for (int i = 0; i < nt; i++) free(u->buf[i]);
    double gf = flops_per_call * (double)u->calls * nt / t * 1e-9;
    snprintf(nm, sizeof nm, "ukr_%s%s", name, sfx);
    bench_report(nm, gf, "GFLOP/s", 1);
    snprintf(nm, sizeof nm, "ukr_%s%s_frac_peak", name, sfx);
    bench_report(nm, gf / peak, "fraction", 1);
    if (!u->mix)
        fprintf(stderr, "bench_gemm%s: micro-kernel %dx%d alone, kc %lld, %lld A tiles (%lld KiB), %lld B panels (%lld KiB): "
                "%.1f GFLOP/s = %.3f of the FMA peak\n", sfx, mr, nr, (long long)u->kc, (long long)u->na,
                (long long)(u->na * u->kc * mr * 4 / 1024), (long long)u->nb, (long long)(u->nb * u->kc * nr * 4 / 1024), gf, gf / peak);
}

static void ukr_cases(const char *sfx, double peak) {
    int mr, nr;
    mmc_gemm_ukr_tile(&mr, &nr);
    mmc_gemm_info gi;
    mmc_gemm_describe(&gi);
    /* f32_l1   one A tile and one B panel of kc 128 (7 + 16 KiB on AVX-512): all in L1
     * f32_l2b  kc 256, B panels through 1 MiB, one A tile: B streams from L2 (A in L1)
     * f32_l2a  kc 256, one B panel (32 KiB: L1), A tiles through 1 MiB: A streams from L2 (BLIS' way)
     * f32_kc   the GEMM's KC, its MC / MR A tiles (the A block) and B panels through 1 MiB: the GEMM's
     *          loop nest without packing and edge tiles */
    const int64_t kc = gi.f32.kc, mib = 1 << 20;
    const struct { const char *name; int64_t kc, na, nb; } lv[] = {
        {"f32_l1", 128, 1, 1},
        {"f32_l2b", 256, 1, mib / (256 * nr * 4)},
        {"f32_l2a", 256, mib / (256 * mr * 4), 1},
        {"f32_kc", kc, gi.f32.mc / mr, mib / (kc * nr * 4) > 1 ? mib / (kc * nr * 4) : 1},
    };
    for (int l = 0; l < 4; l++) {
        const double fl = 2.0 * mr * nr * lv[l].kc;
        const int64_t per = lv[l].na * lv[l].nb;
        ukr_arg u = {lv[l].kc, lv[l].na, lv[l].nb, ((int64_t)(2e8 / fl) + per - 1) / per * per, 0, {0}}; /* ~1 ms */
        ukr_case(&u, fl, lv[l].name, sfx, peak);
    }
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512f")) return;
    static const char *const mix_name[6] = {NULL, "mix_14x32", "mix_14x32eb", "mix_6x64", "mix_14x32_7bc", "mix_14x32pf"};
    static const double mix_flops[6] = {0, 2 * 28 * 16, 2 * 28 * 16, 2 * 24 * 16, 2 * 28 * 16, 2 * 28 * 16};
    for (int m = 1; m <= 5; m++) {
        ukr_arg u = {1, 1, 1, 200000, m, {0}};
        ukr_case(&u, mix_flops[m], mix_name[m], sfx, peak);
    }
#endif
}

static void suite(const char *sfx) {
    char name[128];
    double peak = fma_peak_gflops();
    mmc_gemm_info gd;
    mmc_gemm_describe(&gd);
    fprintf(stderr, "bench_gemm%s: kernel %s (bf16: %s), blocking %lld/%lld/%lld (%s), %d threads, FMA peak %.1f GFLOP/s\n",
            sfx, gd.f32.kernel, gd.bf16_infer.kernel, (long long)gd.f32.mc, (long long)gd.f32.kc, (long long)gd.f32.nc,
            gd.blocking_source, omp_get_max_threads(), peak);

    static const struct { const char *name; bool ta, tb; int64_t M, N, K; float beta; bool bf16ok; } cases[] = {
        {"xWt", false, true, 512, 4864, 896, 0.0f, true},
        {"dyW", false, false, 512, 896, 4864, 0.0f, true},
        {"dyTx", true, false, 4864, 896, 512, 1.0f, false},
        {"sq1024", false, false, 1024, 1024, 1024, 0.0f, true},
    };
    double f32_gflops[4] = {0}, bf16_gflops[4] = {0}, fr_val[16];
    char fr_name[16][96];
    int n_fr = 0;
    mmc_gemm_info gi;
    mmc_gemm_describe(&gi);
    /* bf = 0: f32, 1: bf16 (mmc_gemm_bf16_infer as configured: widened to f32 unless
     * MMC_GEMM_BF16=dot), 2: the AVX512_BF16 kernel (vdpbf16ps) switched on here, 3: the AMX
     * kernel, each where the CPU has it (A rounded to bf16: a weight GEMM in generation;
     * training's take the exact path) */
    static const char *const bf_kernel[4] = {NULL, NULL, "avx512_bf16", "amx_bf16"};
    static const char *const bf_name[4] = {"f32", "bf16", "bf16dot", "bf16amx"};
    /* MMC_BENCH_GEMM_PACKED_ONLY=1: only the pre-packed cases below (a quick check) */
    const bool packed_only = getenv("MMC_BENCH_GEMM_PACKED_ONLY") && atoi(getenv("MMC_BENCH_GEMM_PACKED_ONLY"));
    /* MMC_BENCH_GEMM_MATVEC_ONLY=1: only the bandwidth and matvec cases (a quick check) */
    const bool matvec_only = getenv("MMC_BENCH_GEMM_MATVEC_ONLY") && atoi(getenv("MMC_BENCH_GEMM_MATVEC_ONLY"));
    /* MMC_BENCH_GEMM_UKR_ONLY=1: only the micro-kernel probes (a quick check) */
    const bool ukr_only = getenv("MMC_BENCH_GEMM_UKR_ONLY") && atoi(getenv("MMC_BENCH_GEMM_UKR_ONLY"));
    if (!packed_only && !matvec_only) ukr_cases(sfx, peak);
    if (ukr_only) return;
    for (int bf = 0; bf < 4 && !packed_only && !matvec_only; bf++)
        for (int c = 0; c < 4; c++) {
            if (bf && !cases[c].bf16ok) continue;
            if (bf >= 2 && mmc_gemm_set_bf16_kernel(bf_kernel[bf]) != 0) continue;
            gemm_arg g = {cases[c].ta, cases[c].tb, bf >= 1, cases[c].M, cases[c].N, cases[c].K, cases[c].beta,
                          NULL, NULL, NULL, NULL, NULL, NULL};
            int64_t na = g.M * g.K, nb = g.K * g.N, nc = g.M * g.N;
            g.A = falloc(na);
            g.B = falloc(nb);
            g.C = falloc(nc);
            g.Bh = (uint16_t *)falloc((nb + 1) / 2); /* 64-byte aligned, as mmc tensors are */
            fill(g.A, na, 1);
            fill(g.B, nb, 2);
            fill(g.C, nc, 3);
            for (int64_t i = 0; i < nb; i++) g.Bh[i] = mmc_f32_to_bf16(g.B[i]);
            double t = best_time(gemm_run, &g, 1.0, 5);
            mmc_gemm_set_bf16_kernel(gi.bf16_dot ? gi.bf16_infer.kernel : "f32");
            double gf = 2.0 * g.M * g.N * g.K / t * 1e-9;
            const char *dt = bf_name[bf];
            snprintf(name, sizeof name, "gemm_%s_%s%s", dt, cases[c].name, sfx);
            bench_report(name, gf, "GFLOP/s", 1);
            snprintf(fr_name[n_fr], sizeof fr_name[0], "gemm_%s_%s%s_frac_peak", dt, cases[c].name, sfx);
            fr_val[n_fr++] = gf;
            if (bf == 0) {
                f32_gflops[c] = gf;
                /* the same figure against the best BLAS here (bench/peer_gemm_blas.py: OpenBLAS) */
                snprintf(name, sizeof name, "gemm_f32_%s%s_openblas", cases[c].name, sfx);
                bench_report(name, gf, "GFLOP/s", 1);
            }
            else if (bf == 1) {
                bf16_gflops[c] = gf;
                snprintf(name, sizeof name, "gemm_bf16_%s%s_vs_f32", cases[c].name, sfx);
                bench_report(name, gf / f32_gflops[c], "fraction", 1);
            } else {
                snprintf(name, sizeof name, "gemm_%s_%s%s_vs_bf16", dt, cases[c].name, sfx);
                bench_report(name, gf / bf16_gflops[c], "fraction", 1);
            }
            free(g.A); free(g.B); free(g.C); free(g.Bh);
        }

    /* pre-packed weights: x·Wᵀ with W packed once (f32 panels; bf16 pair panels for the
     * bf16-product kernels), timed alternately with the unpacked call on the same operands:
     *   gemm_<dt>_xWt_packed           GFLOP/s
     *   gemm_<dt>_xWt_packed_vs_unpacked  its speed-up over the unpacked call of the same run */
    for (int bf = 0; bf < 4 && !matvec_only; bf++) {
        if (bf == 1 || (bf >= 2 && mmc_gemm_set_bf16_kernel(bf_kernel[bf]) != 0)) continue;
        gemm_arg g = {false, true, bf >= 1, cases[0].M, cases[0].N, cases[0].K, 0.0f, NULL, NULL, NULL, NULL, NULL, NULL};
        g.A = falloc(g.M * g.K);
        g.B = falloc(g.N * g.K);
        g.C = falloc(g.M * g.N);
        g.Bh = (uint16_t *)falloc((g.N * g.K + 1) / 2);
        fill(g.A, g.M * g.K, 1);
        fill(g.B, g.N * g.K, 2);
        for (int64_t i = 0; i < g.N * g.K; i++) g.Bh[i] = mmc_f32_to_bf16(g.B[i]);
        mmc_gemm_packed_b *W = mmc_gemm_pack_b(bf ? (const void *)g.Bh : (const void *)g.B, bf >= 1, g.N, g.K, g.K, true);
        MMC_CHECK(W, "bench_gemm: %s", mmc_last_error());
        float *C2 = falloc(g.M * g.N);
        packed_arg pa = {g.M, g.A, C2, W};
        double tp, tu;
        paired_time(packed_run, &pa, gemm_run, &g, 2.0, 10, &tp, &tu);
        mmc_gemm_set_bf16_kernel(gi.bf16_dot ? gi.bf16_infer.kernel : "f32");
        const double fl = 2.0 * g.M * g.N * g.K;
        snprintf(name, sizeof name, "gemm_%s_xWt_packed%s", bf_name[bf], sfx);
        bench_report(name, fl / tp * 1e-9, "GFLOP/s", 1);
        snprintf(name, sizeof name, "gemm_%s_xWt_packed%s_vs_unpacked", bf_name[bf], sfx);
        bench_report(name, tu / tp, "fraction", 1);
        fprintf(stderr, "bench_gemm%s: %s x·Wᵀ packed %.1f GFLOP/s, unpacked %.1f (same run, alternated)\n", sfx,
                bf_name[bf], fl / tp * 1e-9, fl / tu * 1e-9);
        mmc_gemm_packed_b_free(W);
        free(g.A); free(g.B); free(g.C); free(g.Bh); free(C2);
    }

    if (!matvec_only) bf16x3_suite(sfx);
    if (packed_only) return;
    double peak2 = fma_peak_gflops();
    if (peak2 > peak) peak = peak2;
    if (!matvec_only) {
        snprintf(name, sizeof name, "fma_peak%s", sfx);
        bench_report(name, peak, "GFLOP/s", 1);
    }
    for (int i = 0; i < n_fr; i++) bench_report(fr_name[i], fr_val[i] / peak, "fraction", 1);

    /* memory bandwidth, at two levels of the hierarchy (the matvec cases below say which one
     * each fraction divides by):
     *   DRAM   a 512 MiB buffer, or twice the L3 where that is bigger (960 MiB on the Granite
     *          Rapids VM): what the DRAM delivers (mem_read_bw); decode of a whole model reads
     *          from here (GBs of weights a token)
     *   cache  a buffer of half the L3, at most 32 MiB, read back to back: it stays in the L3
     *          (mem_read_bw_l3) — the level a weight that fits the L3 is read from, as it is when a
     *          matvec runs back to back (how PyTorch's figures are timed). On the Intel VM the L3
     *          reports 480 MiB, but a 64-128 MiB buffer read back to back comes at the DRAM's rate
     *          as soon as other tenants run: the L3 this VM keeps is far smaller than it reports. */
    const int64_t l3 = mmc_cpu_info_get()->cache.l3.size;
    const int64_t nbw = ((int64_t)512 << 20 > 2 * l3 ? (int64_t)512 << 20 : (2 * l3 + (1 << 20) - 1) / (1 << 20) << 20) >> 2;
    float *buf = falloc(nbw);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nbw; i++) buf[i] = 1.0f; /* first touch by the reading threads */
    bw_arg ba[2] = {{buf, nbw, 0}, {buf, nbw, 1}};
    double tbw[2] = {best_time(bw_run, &ba[0], 1.0, 5), best_time(bw_run, &ba[1], 1.0, 5)};
    const int bk = tbw[1] < tbw[0]; /* the faster read kernel is the reference from here on */
    double bw = (double)nbw * 4 / tbw[bk] * 1e-9;
    {
        const int64_t nl3 = (l3 > 0 && l3 / 2 < ((int64_t)32 << 20) ? l3 / 2 : (int64_t)32 << 20) >> 2;
        bw_arg bl[2] = {{buf, nl3, 0}, {buf, nl3, 1}};
        double t0 = best_time(bw_run, &bl[0], 0.5, 20), t1 = best_time(bw_run, &bl[1], 0.5, 20);
        snprintf(name, sizeof name, "mem_read_bw_l3%s", sfx);
        bench_report(name, (double)nl3 * 4 / (t0 < t1 ? t0 : t1) * 1e-9, "GB/s", 1);
    }
    double mv_frac[4] = {0}, mv_frac_dram[4] = {0};
    static const char *const mv_dt[4] = {"f32", "bf16", "int8", "nf4"};

    /* matvec (decode): M=1, y = x · Wᵀ, W [N, K] streamed once. The 8192x4096 weight, timed two ways:
     *   matvec_<dt>_8192x4096       back to back, each call alternated with a read of the same
     *                               weight buffer: the weight stays in whatever cache holds it, as
     *                               when PyTorch's figure is timed; _frac_bw divides by that read
     *   matvec_<dt>_8192x4096_dram  each call alternated with the DRAM read above, which evicts the
     *                               weight: a decode step's case (peer_gemm.py evicts the same way);
     *                               _frac_bw divides by that read, which is the DRAM figure of the
     *                               window (the decode goal's bandwidth)
     *   matvec_{f32,bf16}_8192x4096_packed  the same back-to-back matvec on a pre-packed weight
     *                               (mmc_gemm_xwt_packed, what generate / chat / serve run: f32
     *                               panels; bf16 pair panels of the AMX / vdpbf16ps kernel, x rounded
     *                               to bf16 as with --bf16-matmul), alternated with the unpacked call;
     *                               _vs_unpacked its speed over that */
    static const struct { int64_t N, K; } mv[] = {{8192, 4096}, {4864, 896}};
    for (int s = 0; s < 2; s++)
        for (int bf = 0; bf < 4; bf++) {
            if (s == 1 && bf != 1) continue;
            gemm_arg g = {false, true, bf == 1, 1, mv[s].N, mv[s].K, 0.0f, NULL, NULL, NULL, NULL, NULL, NULL};
            int64_t nb = g.N * g.K;
            double wbytes = (double)nb * (bf == 1 ? 2 : 4);
            g.A = falloc(g.K);
            g.C = falloc(g.N);
            fill(g.A, g.K, 4);
            if (bf == 1) {
                g.Bh = (uint16_t *)falloc((nb + 1) / 2); /* 64-byte aligned, as mmc tensors are */
                for (int64_t i = 0; i < nb; i++) g.Bh[i] = (uint16_t)(0x3c00 + (i & 0xff));
            } else {
                g.B = falloc(nb);
                fill(g.B, nb, 5);
            }
            if (bf >= 2) {   /* quantised: the f32 source goes, the codes stay */
                mmc_status qs = bf == 2 ? mmc_q8_quantize(g.B, g.N, g.K, &g.q8) : mmc_nf4_quantize(g.B, g.N, g.K, false, &g.q4);
                MMC_CHECK(qs == MMC_OK, "bench_gemm: %s", mmc_last_error());
                wbytes = (double)(bf == 2 ? mmc_q8_bytes(g.q8) : mmc_nf4_bytes(g.q4));
                free(g.B);
                g.B = NULL;
            }
            if (s == 1) { /* fits in L3: not interleaved with reads */
                double t = best_time(gemm_run, &g, 1.0, 10);
                snprintf(name, sizeof name, "matvec_%s_%lldx%lld%s", mv_dt[bf], (long long)g.N, (long long)g.K, sfx);
                bench_report(name, wbytes / t * 1e-9, "GB/s", 1);
            } else {
                /* the weight's main buffer (codes for int8 / NF4), read as the reference of the hot case */
                const void *wb = bf == 0 ? (const void *)g.B : bf == 1 ? (const void *)g.Bh : bf == 2 ? (const void *)g.q8->q
                                                                                           : (const void *)g.q4->codes;
                const int64_t wfl = (bf == 0 ? nb * 4 : bf == 1 ? nb * 2 : bf == 2 ? nb : nb / 2) / 4;
                bw_arg wr = {(const float *)wb, wfl, bk};
                double t, tref;
                paired_time(gemm_run, &g, bw_run, &ba[bk], 1.0, 10, &t, &tref);
                double gbs = wbytes / t * 1e-9, bw_win = (double)nbw * 4 / tref * 1e-9;
                if (bw_win > bw) bw = bw_win;
                snprintf(name, sizeof name, "matvec_%s_%lldx%lld_dram%s", mv_dt[bf], (long long)g.N, (long long)g.K, sfx);
                bench_report(name, gbs, "GB/s", 1);
                mv_frac_dram[bf] = gbs / bw_win;
                const double gbs_dram = gbs;
                paired_time(gemm_run, &g, bw_run, &wr, 1.0, 10, &t, &tref);
                gbs = wbytes / t * 1e-9;
                snprintf(name, sizeof name, "matvec_%s_%lldx%lld%s", mv_dt[bf], (long long)g.N, (long long)g.K, sfx);
                bench_report(name, gbs, "GB/s", 1);
                mv_frac[bf] = gbs / ((double)wfl * 4 / tref * 1e-9);
                fprintf(stderr, "bench_gemm%s: matvec %s 8192x4096: %.1f GB/s back to back (read of the weight %.1f), "
                        "%.1f after an eviction (DRAM read %.1f)\n", sfx, mv_dt[bf], gbs, (double)wfl * 4 / tref * 1e-9,
                        gbs_dram, bw_win);
                if (bf <= 1) { /* the pre-packed weight: f32 panels; bf16 pair panels of the dot kernel */
                    const bool dot = bf == 1 && (gi.amx_available || gi.bf16_dot_available);
                    if (dot) mmc_gemm_set_bf16_kernel(gi.amx_available ? "amx_bf16" : "avx512_bf16");
                    mmc_gemm_packed_b *W = bf == 0 || dot ? mmc_gemm_pack_b(bf ? (const void *)g.Bh : (const void *)g.B,
                                                                           bf == 1, g.N, g.K, g.K, true) : NULL;
                    mmc_gemm_set_bf16_kernel(gi.bf16_dot ? gi.bf16_infer.kernel : "f32");
                    if (W) {
                        packed_arg pa = {1, g.A, g.C, W};
                        double tp, tu;
                        paired_time(packed_run, &pa, gemm_run, &g, 1.0, 10, &tp, &tu);
                        const double pbytes = (double)mmc_gemm_packed_b_bytes(W);
                        snprintf(name, sizeof name, "matvec_%s_8192x4096_packed%s", mv_dt[bf], sfx);
                        bench_report(name, pbytes / tp * 1e-9, "GB/s", 1);
                        snprintf(name, sizeof name, "matvec_%s_8192x4096_packed%s_vs_unpacked", mv_dt[bf], sfx);
                        bench_report(name, tu / tp, "fraction", 1);
                        fprintf(stderr, "bench_gemm%s: matvec %s 8192x4096 on a pre-packed weight (%s panels): %.1f GB/s, "
                                "unpacked %.1f (alternated)\n", sfx, mv_dt[bf], mmc_gemm_packed_b_kernel(W),
                                pbytes / tp * 1e-9, wbytes / tu * 1e-9);
                        mmc_gemm_packed_b_free(W);
                    }
                }
            }
            free(g.A); free(g.B); free(g.C); free(g.Bh);
            mmc_q8_free(g.q8);
            mmc_nf4_free(g.q4);
        }
    free(buf);
    snprintf(name, sizeof name, "mem_read_bw%s", sfx);
    bench_report(name, bw, "GB/s", 1);
    for (int bf = 0; bf < 4; bf++) {
        snprintf(name, sizeof name, "matvec_%s_8192x4096%s_frac_bw", mv_dt[bf], sfx);
        bench_report(name, mv_frac[bf], "fraction", 1);
        snprintf(name, sizeof name, "matvec_%s_8192x4096_dram%s_frac_bw", mv_dt[bf], sfx);
        bench_report(name, mv_frac_dram[bf], "fraction", 1);
    }
}

int main(void) {
    /* all threads, wall clock: what a training step sees */
    g_cpu_clock = false;
    suite("");
    /* one thread, CPU-time clock: kernel quality independent of other load on the machine */
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    g_cpu_clock = true;
    suite("_1t");
    omp_set_num_threads(nt);
    return 0;
}
