/* bench_attention.c — mmc_attention forward and forward+backward throughput (GFLOP/s) on
 * Qwen2-0.5B shapes (Hq 14, Hkv 2, D 64, causal; T 512 and 2048) and a Qwen2-VL-like vision
 * case (full attention, H 16, D 80, T 1024). FLOPs: forward 4*T*S*D*Hq*B (halved when causal),
 * backward 2.5x that; bench/peer_attention.py uses the same formula for torch's SDPA.
 * Besides the wall-clock figures, each fwd+bwd case is also reported per CPU-second
 * (`..._fwdbwd_cpu`: FLOPs / process CPU time x threads, min of 4 calls), which a loaded host
 * (other processes on the cores) distorts much less; the peer reports the same. */
#include "bench_util.h"
#include "mmc_ops.h"

#include <math.h>
#include <sys/resource.h>

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

/* min over n calls of the process CPU seconds one call takes */
static double cpu_time(void (*fn)(void *), void *arg, int n) {
    double best = 1e30;
    for (int i = 0; i < n; i++) {
        double c0 = cpu_seconds();
        fn(arg);
        double c = cpu_seconds() - c0;
        if (c < best) best = c;
    }
    return best;
}

typedef struct {
    const char *name;
    int B, T, S, Hq, Hkv, D;
    bool causal;
} acase;

typedef struct {
    const acase *c;
    mmc_ctx *ctx;
    mmc_tensor *q, *k, *v;
    bool bwd;
} run_arg;

static void run(void *p) {
    run_arg *a = p;
    mmc_attn_opts o = {.causal = a->c->causal};
    mmc_set_grad_enabled(a->ctx, a->bwd);
    mmc_tensor *y = mmc_attention(a->ctx, a->q, a->k, a->v, &o);
    if (a->bwd) {
        mmc_tensor *g = mmc_grad(a->ctx, y);
        float *gd = g->data;
        for (int64_t i = 0; i < mmc_numel(g); i++) gd[i] = 1e-3f * (float)(i % 7);
        mmc_backward_range(a->ctx, 0, mmc_tape_len(a->ctx));
    }
    mmc_ctx_reset(a->ctx);
}

int main(void) {
    const char *env = getenv("MMC_BENCH_THREADS");
    const int threads = env ? atoi(env) : 2;
    mmc_set_num_threads(threads);
    static const acase cases[] = {
        {"attn_qwen2_0.5b_t512_causal", 1, 512, 512, 14, 2, 64, true},
        {"attn_qwen2_0.5b_t2048_causal", 1, 2048, 2048, 14, 2, 64, true},
        {"attn_vision_t1024_h16_d80_full", 1, 1024, 1024, 16, 16, 80, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const acase *c = &cases[i];
        run_arg a = {c, mmc_ctx_new(), bench_rand_param(1, 4, MMC_SHAPE(c->B, c->T, c->Hq, c->D), 1),
                     bench_rand_param(2, 4, MMC_SHAPE(c->B, c->S, c->Hkv, c->D), 1),
                     bench_rand_param(3, 4, MMC_SHAPE(c->B, c->S, c->Hkv, c->D), 1), false};
        double fwd = 4.0 * c->B * c->T * c->S * c->D * c->Hq * (c->causal ? 0.5 : 1.0);
        char name[128];
        double t = bench_time(run, &a, 1.0, 3);
        snprintf(name, sizeof name, "%s_fwd", c->name);
        bench_report(name, fwd / t * 1e-9, "GFLOP/s", 1);
        a.bwd = true;
        t = bench_time(run, &a, 2.0, 3);
        snprintf(name, sizeof name, "%s_fwdbwd", c->name);
        bench_report(name, 3.5 * fwd / t * 1e-9, "GFLOP/s", 1);
        t = cpu_time(run, &a, 4) / threads;
        snprintf(name, sizeof name, "%s_fwdbwd_cpu", c->name);
        bench_report(name, 3.5 * fwd / t * 1e-9, "GFLOP/s (CPU)", 1);
        mmc_tensor_free(a.q);
        mmc_tensor_free(a.k);
        mmc_tensor_free(a.v);
        mmc_ctx_free(a.ctx);
    }
    return 0;
}
