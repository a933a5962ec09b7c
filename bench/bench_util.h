/* bench_util.h — helpers for bench/ programs. Each bench prints one JSON object per case
 * on stdout: {"name": ..., "mmc": value, "unit": ..., "better": "higher"|"lower"}; peer
 * scripts (bench/peer_*.py) print the same names with "peer" instead of "mmc", and
 * bench/run.sh merges both into build/bench/results.json with ratio = mmc / peer. */
#ifndef MMC_BENCH_UTIL_H
#define MMC_BENCH_UTIL_H

#include "mmc.h"
#include "cpuinfo.h"
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A parameter tensor (f32, requires grad) filled with N(0, std) from a seeded stream. */
static inline mmc_tensor *bench_rand_param(uint64_t seed, int ndim, const int64_t *shape, float std) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, ndim, shape);
    mmc_rng r;
    mmc_rng_init(&r, seed);
    mmc_rng_normal(&r, t->data, mmc_numel(t), 0, std);
    t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    return t;
}

static inline void bench_report(const char *name, double value, const char *unit, int higher_better) {
    printf("{\"name\": \"%s\", \"mmc\": %.6g, \"unit\": \"%s\", \"better\": \"%s\"}\n", name, value,
           unit, higher_better ? "higher" : "lower");
    fflush(stdout);
}

/* A figure shown for information, without a ratio (e.g. a memory baseline). */
static inline void bench_report_info(const char *name, double value, const char *unit) {
    printf("{\"name\": \"%s\", \"mmc\": %.6g, \"unit\": \"%s\", \"better\": \"none\"}\n", name, value, unit);
    fflush(stdout);
}

/* Run fn(arg) repeatedly: warm-up once, then until min_seconds elapsed and at least
 * min_iters; return the median seconds per call over the timed calls. */
typedef void (*bench_fn)(void *arg);
static int bench_cmp_(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static inline double bench_time(bench_fn fn, void *arg, double min_seconds, int min_iters) {
    fn(arg);
    double t[1000];
    int n = 0;
    double start = mmc_now();
    while (n < 1000 && (n < min_iters || mmc_now() - start < min_seconds)) {
        double t0 = mmc_now();
        fn(arg);
        t[n++] = mmc_now() - t0;
    }
    qsort(t, (size_t)n, sizeof t[0], bench_cmp_);
    return t[n / 2];
}

static inline double bench_status_mib_(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) { kb = atof(line + n); break; }
    fclose(f);
    return kb / 1024.0;
}
/* Peak resident set size of this process so far, in MiB (Linux VmHWM). */
static inline double bench_peak_rss_mib(void) { return bench_status_mib_("VmHWM:"); }
/* Resident set size now, in MiB (Linux VmRSS). */
static inline double bench_rss_mib(void) { return bench_status_mib_("VmRSS:"); }
/* Reset VmHWM to the current RSS (Linux >= 4.0), so that the next bench_peak_rss_mib()
 * is the peak of one phase; returns 0 on success, -1 where the kernel does not allow it. */
static inline int bench_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}
/* Memory figures are measured the same way on both sides (DESIGN.md; bench/peer_util.py's
 * mem_baseline): the baseline is the RSS after start-up (for a peer: after its imports), before
 * the model; the figure reported is peak RSS minus it, and the baseline is reported too.
 * Call this at that point: it resets VmHWM (so the peak is this run's) and returns VmRSS. */
static inline double bench_mem_baseline(void) {
    bench_reset_peak_rss();
    return bench_rss_mib();
}

/* Streaming read of p[0, n): four sequential streams, two 64-byte loads each per step, each stream
 * prefetched 2 KiB ahead (bench_gemm.c's DRAM probe; the single-stream loop the 7B benches used
 * before read 10.4 GB/s on one Intel core where this reads 13.7). */
__attribute__((target("avx512f"), noinline, unused)) static float bench_read_sum512_(const float *p, int64_t n) {
    __m512 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
    const int64_t q = n / 4 / 32 * 32;
    for (int64_t i = 0; i < q; i += 32)
        for (int s = 0; s < 4; s++) {
            const float *b = p + s * q + i;
            _mm_prefetch((const char *)b + 2048, _MM_HINT_T0);
            _mm_prefetch((const char *)b + 2048 + 64, _MM_HINT_T0);
            a[2 * s] = _mm512_add_ps(a[2 * s], _mm512_loadu_ps(b));
            a[2 * s + 1] = _mm512_add_ps(a[2 * s + 1], _mm512_loadu_ps(b + 16));
        }
    for (int i = 1; i < 8; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}
static inline float bench_read_sum_(const float *p, int64_t n) {
    if (__builtin_cpu_supports("avx512f")) return bench_read_sum512_(p, n);
    float acc[64] = {0}, t = 0;
    for (int64_t i = 0; i + 64 <= n; i += 64)
        for (int k = 0; k < 64; k++) acc[k] += p[i + k];
    for (int k = 0; k < 64; k++) t += acc[k];
    return t;
}
/* The host's DRAM read bandwidth on the bench's threads (GB/s): a buffer of 512 MiB, or twice the
 * L3 where that is bigger (so it comes from DRAM, as a decode's GBs of weights a token do), each
 * thread reading its contiguous share with bench_read_sum_ and timed on its own CPU clock (a pass
 * preempted by other processes still measures the memory system, not the share of the cores this
 * process got); the slowest thread of a pass counts, the best of 5 passes is returned. */
static inline double bench_read_bw(void) {
    const int64_t l3 = mmc_cpu_info_get()->cache.l3.size;
    const int64_t bytes = (int64_t)512 << 20 > 2 * l3 ? (int64_t)512 << 20 : (2 * l3 + (1 << 20) - 1) / (1 << 20) << 20;
    const int64_t n = bytes / 4;
    float *p = aligned_alloc(64, (size_t)bytes);
    if (!p) return 0;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = (float)(i & 1023);   /* first touch by the reading threads */
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < 5; r++) {
        float tot = 0;
        double slowest = 0;
#pragma omp parallel reduction(+ : tot) reduction(max : slowest)
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const int64_t share = n / nt / 128 * 128;
            struct timespec a, b;
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
            tot += bench_read_sum_(p + share * id, share);
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
            slowest = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        }
        sink += tot;
        if (slowest < best) best = slowest;
    }
    (void)sink;
    free(p);
    return (double)(n / omp_get_max_threads() / 128 * 128 * omp_get_max_threads()) * 4 / best / 1e9;
}
#endif
