/* bench_qmatvec.c — the decode matvecs on quantised weights (qmatvec.c) against this machine's read
 * bandwidth, measured in the same run, and against mmc's own dense (bf16, f32) matvec.
 *
 * y[M, N] = x[M, K] · Wᵀ for M = 1..4 rows of x (a decode step; up to 4 sequences), W [N, K] in
 *   nf4     NF4 blocks of 64, f32 absmax (`--quantize nf4`: 4.5 bits a weight)
 *   nf4dq   NF4 with double-quantised absmax (QLoRA's `double_quant: true`: 4.127 bits)
 *   int8    per-row scale (`--quantize int8`)
 *   bf16    mmc_gemm_bf16_infer's matvec (bf16 weights as loaded)
 * at three sizes, each named after where the NF4 weight lives:
 *   l2      1024 x 2048    (NF4 1.1 MiB: a core's L2), back to back
 *   l3      4096 x 4096    (NF4 9 MiB: the L3), back to back
 *   dram    8192 x 4096    each call after a read of a 512 MiB (or 2 x L3) buffer that evicts it
 * on 1 and 2 threads (OMP_NUM_THREADS caps it). Each timed call alternates with a timed read
 * probe of the same window: for l2 / l3 a read of the weight's own main buffer (codes, int8 or bf16
 * values) with the four-stream prefetching read of bench_gemm.c; for dram the evicting read (the
 * DRAM rate). Figures are the best call of each series (the machine is shared). Cases:
 *   qmv_<fmt>_<size>_m<M>_<T>t          GB/s of the weight bytes held (codes + scales)
 *   qmv_<fmt>_<size>_m<M>_<T>t_frac     that ÷ the probe's GB/s of the same window
 *   qmv_nf4_<size>_m1_<T>t_vs_bf16      time of the bf16 matvec ÷ time of the NF4 one (same shape)
 *   qmv_nf4_<size>_m1_<T>t_vs_lut       the NF4 kernel against the previous AVX-512 kernel (the 16-level
 *                                       LUT from vpmovzxbd-widened codes, MMC_QMV_NF4=lut), alternated
 *   qmv_read_<size>_<T>t                the probe itself (best over the run, GB/s)
 * The "_1t" figures are timed on the thread's CPU clock (robust to other processes on the cores),
 * "_2t" on the wall clock; l2 calls (~10 us, below what the CPU clock resolves well in a VM) on the
 * wall clock at both, the best of some thousand calls. bench/peer_qmatvec.py prints the qmv_nf4_* names for bitsandbytes'
 * matmul_4bit on the CPU (the peer a QLoRA user has), so results.json carries the ratio.
 * usage: bench_qmatvec [FMT[,FMT..] [SIZE[,SIZE..]]]   (default: all; MMC_BENCH_QMV_MAXM=1..4 caps M) */
#include "bench_util.h"
#include "gemm.h"
#include "mmc_quant.h"
#include "qmatvec.h"

#include <time.h>

static bool g_cpu_clock;
static double clk(void) {
    if (!g_cpu_clock) return mmc_now();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static volatile float g_sink;

typedef struct { const float *p; int64_t n; } rd_arg;   /* n floats */
static void rd_run(void *v) {
    const rd_arg *a = v;
    float tot = 0;
    const int nt = omp_get_max_threads();
#pragma omp parallel num_threads(nt) reduction(+ : tot) if (nt > 1)
    {
        const int th = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t chunk = a->n / th / 128 * 128;
        tot += bench_read_sum_(a->p + chunk * t, chunk);   /* bench_util.h: four prefetched streams */
    }
    g_sink = tot;
}

enum { F_NF4, F_NF4DQ, F_INT8, F_BF16, F_NFMT };
static const char *const fmt_name[F_NFMT] = {"nf4", "nf4dq", "int8", "bf16"};
typedef struct {
    int fmt, M;
    int64_t N, K;
    const float *x;
    float *y;
    mmc_nf4 *q4;
    mmc_q8 *q8;
    uint16_t *wh;
} mv_arg;
static void mv_run(void *v) {
    const mv_arg *a = v;
    switch (a->fmt) {
    case F_NF4: case F_NF4DQ: mmc_qmv_nf4(a->M, a->x, a->q4, a->y); break;
    case F_INT8: mmc_qmv_int8(a->M, a->N, a->K, a->x, a->q8->q, a->q8->scale, a->y); break;
    default: mmc_gemm_bf16_infer(false, true, a->M, a->N, a->K, 1.0f, a->x, a->K, a->wh, a->K, 0.0f, a->y, a->N); break;
    }
}
static void mv_run_lut(void *v) {   /* the previous NF4 kernel, for the A/B */
    mmc_qmv_set_nf4_kernel("lut");
    mv_run(v);
    mmc_qmv_set_nf4_kernel(NULL);
}

/* best of fn and of ref, each timed call of fn preceded by a timed ref (same conditions) */
static void paired(bench_fn fn, void *arg, bench_fn ref, void *rarg, double secs, int iters, double *bf, double *br) {
    fn(arg);
    ref(rarg);
    *bf = *br = 1e30;
    const double start = mmc_now();
    for (int n = 0; n < 2000 && (n < iters || mmc_now() - start < secs); n++) {
        double t0 = clk();
        ref(rarg);
        double t1 = clk();
        fn(arg);
        double t2 = clk();
        if (t1 - t0 < *br) *br = t1 - t0;
        if (t2 - t1 < *bf) *bf = t2 - t1;
    }
}

/* best of fa and of fb, called alternately on the same operands, each call after an untimed
 * ref (the eviction of the dram case) when given */
static void ab(bench_fn fa, bench_fn fb, void *arg, bench_fn ref, void *rarg, double secs, int iters, double *ta,
               double *tb) {
    fa(arg);
    fb(arg);
    *ta = *tb = 1e30;
    const double start = mmc_now();
    for (int n = 0; n < 2000 && (n < iters || mmc_now() - start < secs); n++) {
        if (ref) ref(rarg);
        double t0 = clk();
        fa(arg);
        double t1 = clk();
        if (ref) ref(rarg);
        double t2 = clk();
        fb(arg);
        double t3 = clk();
        if (t1 - t0 < *ta) *ta = t1 - t0;
        if (t3 - t2 < *tb) *tb = t3 - t2;
    }
}

static bool listed(const char *list, const char *name) {
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

int main(int argc, char **argv) {
    const char *fmts = argc > 1 ? argv[1] : NULL, *sizes = argc > 2 ? argv[2] : NULL;
    static const struct { const char *name; int64_t N, K; } sz[] = {{"l2", 1024, 2048}, {"l3", 4096, 4096}, {"dram", 8192, 4096}};
    const int maxt = omp_get_max_threads() < 2 ? omp_get_max_threads() : 2;
    const char *em = getenv("MMC_BENCH_QMV_MAXM");   /* rows of x up to this (default 4) */
    const int maxm = em && atoi(em) >= 1 && atoi(em) <= 4 ? atoi(em) : 4;
    const int64_t l3 = mmc_cpu_info_get()->cache.l3.size;
    const int64_t ebytes = (int64_t)512 << 20 > 2 * l3 ? (int64_t)512 << 20 : (2 * l3 + (1 << 20) - 1) / (1 << 20) << 20;
    float *ev = NULL;
    char name[128];
    fprintf(stderr, "bench_qmatvec: kernel %s, load %s", mmc_qmv_kernel_name(), "");
    {
        FILE *f = fopen("/proc/loadavg", "r");
        char la[64] = "?\n";
        if (f) { if (!fgets(la, sizeof la, f)) strcpy(la, "?\n"); fclose(f); }
        fprintf(stderr, "%s", la);
    }
    for (int s = 0; s < 3; s++) {
        if (!listed(sizes, sz[s].name)) continue;
        const bool dram = s == 2;
        if (dram && !ev) {
            ev = aligned_alloc(64, (size_t)ebytes);
            MMC_CHECK(ev, "bench_qmatvec: out of memory");
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < ebytes / 4; i++) ev[i] = 1.0f;
        }
        const int64_t N = sz[s].N, K = sz[s].K;
        float *w = malloc(sizeof(float) * (size_t)(N * K)), *x = malloc(sizeof(float) * (size_t)(4 * K)),
              *y = malloc(sizeof(float) * (size_t)(4 * N));
        MMC_CHECK(w && x && y, "bench_qmatvec: out of memory");
        uint32_t seed = 12345;
        for (int64_t i = 0; i < N * K; i++) {
            seed = seed * 1664525u + 1013904223u;
            w[i] = ((float)(seed >> 8) * (1.0f / (1 << 24)) - 0.5f) * 0.1f;
        }
        for (int64_t i = 0; i < 4 * K; i++) x[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
        double t_nf4[3] = {0}, t_bf16[3] = {0}, best_rd[3] = {0};
        for (int f = 0; f < F_NFMT; f++) {
            if (!listed(fmts, fmt_name[f])) continue;
            mv_arg a = {f, 1, N, K, x, y, NULL, NULL, NULL};
            const void *main_buf;
            int64_t main_bytes;
            double wbytes;
            if (f == F_NF4 || f == F_NF4DQ) {
                MMC_CHECK(!mmc_nf4_quantize(w, N, K, f == F_NF4DQ, &a.q4), "bench_qmatvec: %s", mmc_last_error());
                main_buf = a.q4->codes, main_bytes = N * K / 2, wbytes = (double)mmc_nf4_bytes(a.q4);
            } else if (f == F_INT8) {
                MMC_CHECK(!mmc_q8_quantize(w, N, K, &a.q8), "bench_qmatvec: %s", mmc_last_error());
                main_buf = a.q8->q, main_bytes = N * K, wbytes = (double)mmc_q8_bytes(a.q8);
            } else {
                a.wh = aligned_alloc(64, (size_t)(N * K * 2));
                MMC_CHECK(a.wh, "bench_qmatvec: out of memory");
                for (int64_t i = 0; i < N * K; i++) a.wh[i] = mmc_f32_to_bf16(w[i]);
                main_buf = a.wh, main_bytes = N * K * 2, wbytes = (double)(N * K * 2);
            }
            rd_arg probe = dram ? (rd_arg){ev, ebytes / 4} : (rd_arg){main_buf, main_bytes / 4};
            const double pbytes = dram ? (double)ebytes : (double)main_bytes;
            for (int t = 1; t <= maxt; t++) {
                omp_set_num_threads(t);
                g_cpu_clock = t == 1 && s > 0;   /* l2 calls are ~10 us: the wall clock, best of many */
                for (int M = 1; M <= maxm; M++) {
                    a.M = M;
                    double tf, tr;
                    paired(mv_run, &a, rd_run, &probe, dram ? 0.6 : 0.3, dram ? 6 : s == 0 ? 500 : 20, &tf, &tr);
                    const double gbs = wbytes / tf * 1e-9, rbs = pbytes / tr * 1e-9;
                    if (rbs > best_rd[t]) best_rd[t] = rbs;
                    snprintf(name, sizeof name, "qmv_%s_%s_m%d_%dt", fmt_name[f], sz[s].name, M, t);
                    bench_report(name, gbs, "GB/s", 1);
                    snprintf(name, sizeof name, "qmv_%s_%s_m%d_%dt_frac", fmt_name[f], sz[s].name, M, t);
                    bench_report(name, gbs / rbs, "fraction", 1);
                    fprintf(stderr, "bench_qmatvec: %-5s %-4s M=%d %dt: %6.1f GB/s, read probe %6.1f GB/s: %.3f\n",
                            fmt_name[f], sz[s].name, M, t, gbs, rbs, gbs / rbs);
                    if (M == 1 && f == F_NF4) t_nf4[t] = tf;
                    if (M == 1 && f == F_BF16) t_bf16[t] = tf;
                    if (M == 1 && f == F_NF4 && !strcmp(mmc_qmv_kernel_name(), "avx512")) {
                        double tn, tl;   /* the A/B: this kernel and the previous one, alternating */
                        ab(mv_run, mv_run_lut, &a, dram ? rd_run : NULL, &probe, dram ? 0.6 : 0.3, dram ? 6 : 20, &tn, &tl);
                        snprintf(name, sizeof name, "qmv_nf4_%s_m1_%dt_vs_lut", sz[s].name, t);
                        bench_report(name, tl / tn, "fraction", 1);
                        fprintf(stderr, "bench_qmatvec: nf4   %-4s M=1 %dt: %.2fx the previous kernel (%.1f vs %.1f GB/s)\n",
                                sz[s].name, t, tl / tn, wbytes / tn * 1e-9, wbytes / tl * 1e-9);
                    }
                }
            }
            mmc_nf4_free(a.q4);
            mmc_q8_free(a.q8);
            free(a.wh);
        }
        for (int t = 1; t <= maxt; t++) {
            if (t_nf4[t] > 0 && t_bf16[t] > 0) {
                snprintf(name, sizeof name, "qmv_nf4_%s_m1_%dt_vs_bf16", sz[s].name, t);
                bench_report(name, t_bf16[t] / t_nf4[t], "fraction", 1);
            }
            if (best_rd[t] > 0) {
                snprintf(name, sizeof name, "qmv_read_%s_%dt", sz[s].name, t);
                bench_report(name, best_rd[t], "GB/s", 1);
            }
        }
        free(w); free(x); free(y);
    }
    free(ev);
    return 0;
}
