/* bench_ops_nn.c — dense / norm / loss ops, forward + backward, against PyTorch
 * (bench/peer_ops_nn.py prints the same case names).
 *
 * Linear runs at Qwen2-0.5B MLP shapes (x [512, 896] · W[4864, 896]ᵀ and
 * x [512, 4864] · W[896, 4864]ᵀ) and is reported in GFLOP/s (fwd 2MNK + bwd 4MNK). The same
 * three GEMM calls are also timed bare in this binary ("gemm3_*"), and
 * "linear_over_gemm3_*" = linear / gemm3 is the op's overhead (target >= 0.9). */
#include "bench_util.h"
#include "gemm.h"
#include "mmc_ops.h"

#include <math.h>

typedef struct {
    mmc_ctx *ctx;
    mmc_tensor *x, *w, *b, *t;  /* inputs (t: targets) */
    float *dy;                  /* upstream gradient, numel(out) */
    int64_t M, N, K;            /* linear / gemm sizes */
    int kind;
    float *A, *B, *C, *D, *E;   /* raw gemm buffers */
} bcase;

enum { K_LINEAR, K_RMS, K_LN, K_GN, K_XENT };

static float *rand_buf(uint64_t seed, int64_t n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    mmc_rng r;
    mmc_rng_init(&r, seed);
    mmc_rng_normal(&r, p, n, 0, 1);
    return p;
}

/* one forward + backward step of the op under test */
static void run_op(void *arg) {
    bcase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *y = NULL;
    switch (c->kind) {
    case K_LINEAR: y = mmc_linear(c->ctx, c->x, c->w, NULL); break;
    case K_RMS: y = mmc_rmsnorm(c->ctx, c->x, c->w, 1e-6f); break;
    case K_LN: y = mmc_layernorm(c->ctx, c->x, c->w, c->b, 1e-5f); break;
    case K_GN: y = mmc_groupnorm(c->ctx, c->x, 32, c->w, c->b, 1e-5f); break;
    case K_XENT: y = mmc_cross_entropy(c->ctx, c->x, c->t, -100); break;
    }
    if (c->kind == K_XENT) {
        mmc_backward(c->ctx, y);
        return;
    }
    mmc_tensor *g = mmc_grad(c->ctx, y);
    memcpy(g->data, c->dy, mmc_nbytes(g));
    bool prev = mmc_set_grad_enabled(c->ctx, false);
    mmc_backward_range(c->ctx, 0, mmc_tape_len(c->ctx));
    mmc_set_grad_enabled(c->ctx, prev);
}

/* the three GEMMs of a linear step, bare: y = x·Wᵀ, dx += dy·W, dW += dyᵀ·x */
static void run_gemm3(void *arg) {
    bcase *c = arg;
    int64_t M = c->M, N = c->N, K = c->K;
    mmc_gemm_f32(false, true, M, N, K, 1.0f, c->A, K, c->B, K, 0.0f, c->C, N);
    mmc_gemm_f32(false, false, M, K, N, 1.0f, c->C, N, c->B, K, 1.0f, c->D, K);
    mmc_gemm_f32(true, false, N, K, M, 1.0f, c->C, N, c->A, K, 1.0f, c->E, K);
}

static void bench_linear(const char *tag, int64_t M, int64_t K, int64_t N, double min_s) {
    int iters = min_s > 0 ? 2 : 1;
    char name[128];
    double flop = 6.0 * (double)M * N * K;
    bcase c = {.ctx = mmc_ctx_new(), .kind = K_LINEAR, .M = M, .N = N, .K = K};
    c.A = rand_buf(1, M * K), c.B = rand_buf(2, N * K), c.C = rand_buf(3, M * N);
    c.D = rand_buf(4, M * K), c.E = rand_buf(5, N * K);
    double tg = bench_time(run_gemm3, &c, min_s, iters);
    snprintf(name, sizeof name, "gemm3_%s", tag);
    bench_report(name, flop / tg * 1e-9, "GFLOP/s", 1);
    c.x = bench_rand_param(6, 2, MMC_SHAPE(M, K), 1);
    c.w = bench_rand_param(7, 2, MMC_SHAPE(N, K), 0.05f);
    c.dy = rand_buf(8, M * N);
    double tl = bench_time(run_op, &c, min_s, iters);
    snprintf(name, sizeof name, "linear_fwdbwd_%s", tag);
    bench_report(name, flop / tl * 1e-9, "GFLOP/s", 1);
    snprintf(name, sizeof name, "linear_over_gemm3_%s", tag);
    bench_report(name, tg / tl, "fraction", 1);
    free(c.A), free(c.B), free(c.C), free(c.D), free(c.E), free(c.dy);
    mmc_tensor_free(c.x), mmc_tensor_free(c.w);
    mmc_ctx_free(c.ctx);
}

static void bench_norm(const char *name, int kind, int ndim, const int64_t *xs, int64_t C) {
    bcase c = {.ctx = mmc_ctx_new(), .kind = kind};
    c.x = bench_rand_param(10, ndim, xs, 1);
    c.w = bench_rand_param(11, 1, MMC_SHAPE(C), 1);
    c.b = kind == K_RMS ? NULL : bench_rand_param(12, 1, MMC_SHAPE(C), 1);
    c.dy = rand_buf(13, mmc_numel(c.x));
    double t = bench_time(run_op, &c, 0.5, 5);
    bench_report(name, t * 1e6, "us", 0);
    free(c.dy);
    mmc_tensor_free(c.x), mmc_tensor_free(c.w), mmc_tensor_free(c.b);
    mmc_ctx_free(c.ctx);
}

static void bench_xent(int64_t N, int64_t V) {
    char name[128];
    bcase c = {.ctx = mmc_ctx_new(), .kind = K_XENT};
    c.x = bench_rand_param(20, 2, MMC_SHAPE(N, V), 2);
    c.t = mmc_tensor_new(MMC_I64, 1, MMC_SHAPE(N));
    for (int64_t i = 0; i < N; i++) ((int64_t *)c.t->data)[i] = i % 17 == 5 ? -100 : (i * 7919) % V;
    double t = bench_time(run_op, &c, 1.0, 3);
    snprintf(name, sizeof name, "xent_fwdbwd_%lldx%lld", (long long)N, (long long)V);
    bench_report(name, t * 1e3, "ms", 0);
    mmc_tensor_free(c.x), mmc_tensor_free(c.t);
    mmc_ctx_free(c.ctx);
}


int main(void) {
    bool ref = strcmp(mmc_gemm_kernel_name(), "reference") == 0;
    if (ref)
        fprintf(stderr, "bench_ops_nn: GEMM is the reference triple loop; GEMM-bound cases are slow\n");
    double min_s = ref ? 0.0 : 1.0;   /* reference GEMM: one timed call per case */
    bench_linear("512x896x4864", 512, 896, 4864, min_s);   /* Qwen2-0.5B gate/up proj */
    bench_linear("512x4864x896", 512, 4864, 896, min_s);   /* Qwen2-0.5B down proj */
    bench_norm("rmsnorm_fwdbwd_512x896", K_RMS, 2, MMC_SHAPE(512, 896), 896);
    bench_norm("layernorm_fwdbwd_512x896", K_LN, 2, MMC_SHAPE(512, 896), 896);
    bench_norm("groupnorm_fwdbwd_4x128x32x32_g32", K_GN, 4, MMC_SHAPE(4, 128, 32, 32), 128);
    bench_xent(256, 151936);
    return 0;
}
