/* bench_util.h — helpers for bench/ programs. Each bench prints one JSON object per case
 * on stdout: {"name": ..., "mmc": value, "unit": ..., "better": "higher"|"lower"}; peer
 * scripts (bench/peer_*.py) print the same names with "peer" instead of "mmc", and
 * bench/run.sh merges both into build/bench/results.json with ratio = mmc / peer. */
#ifndef MMC_BENCH_UTIL_H
#define MMC_BENCH_UTIL_H

#include "mmc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#endif
