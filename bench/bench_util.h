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

static inline void bench_report(const char *name, double value, const char *unit, int higher_better) {
    printf("{\"name\": \"%s\", \"mmc\": %.6g, \"unit\": \"%s\", \"better\": \"%s\"}\n", name, value,
           unit, higher_better ? "higher" : "lower");
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

/* Peak resident set size of this process so far, in MiB (Linux VmHWM). */
static inline double bench_peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) { kb = atof(line + 6); break; }
    fclose(f);
    return kb / 1024.0;
}
#endif
