/* bench_conv.c — mmc_conv2d forward + backward (dx, dW, db) against PyTorch's CPU conv2d
 * (bench/peer_conv.py prints the same case names), in GFLOP/s counting 3 GEMM-equivalents
 * (y, dx, dW: 3 · 2·B·Cout·Ho·Wo·Cin·kh·kw), the direct-convolution count whatever
 * algorithm runs (Winograd does fewer multiplies; the figure is then "effective").
 * Shapes: a small training-style layer (the original case) and two layers typical of an
 * SD / Flux VAE decoder (3x3, stride 1, padding 1): 128 channels at 128x128 and 512
 * channels at 32x32. Each shape also reports its passes separately (…_fwd: the forward;
 * …_bwd_data: dx alone; …_bwd_weight: dW and db alone; 2·B·Cout·Ho·Wo·Cin·kh·kw each; the
 * backward passes are timed on one recorded forward). MMC_BENCH_FILTER=conv runs just this
 * file and its peer. */
#include "bench_util.h"
#include "mmc_ops.h"

typedef struct {
    mmc_ctx *ctx;
    mmc_tensor *x, *w, *b;
    float *dy;  /* upstream gradient, numel(y) */
} ccase;

static void run_conv(void *arg) {
    ccase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *y = mmc_conv2d(c->ctx, c->x, c->w, c->b, 1, 1);
    mmc_tensor *g = mmc_grad(c->ctx, y);
    memcpy(g->data, c->dy, mmc_nbytes(g));
    bool prev = mmc_set_grad_enabled(c->ctx, false);
    mmc_backward_range(c->ctx, 0, mmc_tape_len(c->ctx));
    mmc_set_grad_enabled(c->ctx, prev);
}

static void run_fwd(void *arg) {
    ccase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_conv2d(c->ctx, c->x, c->w, c->b, 1, 1);
}

/* the backward of the forward recorded by the caller (gradients accumulate: timing only) */
static void run_bwd(void *arg) {
    ccase *c = arg;
    bool prev = mmc_set_grad_enabled(c->ctx, false);
    mmc_backward_range(c->ctx, 0, mmc_tape_len(c->ctx));
    mmc_set_grad_enabled(c->ctx, prev);
}

static void set_rg(mmc_tensor *t, bool on) {
    if (on) t->flags |= MMC_REQUIRES_GRAD;
    else t->flags &= ~MMC_REQUIRES_GRAD;
}

/* x [B, Cin, H, W], w [Cout, Cin, 3, 3], bias, stride 1, padding 1 */
static void bench_conv(int64_t B, int64_t Cin, int64_t H, int64_t W, int64_t Cout, double min_s,
                       bool passes) {
    char name[128], base[96];
    ccase c = {.ctx = mmc_ctx_new()};
    c.x = bench_rand_param(30, 4, MMC_SHAPE(B, Cin, H, W), 1);
    c.w = bench_rand_param(31, 4, MMC_SHAPE(Cout, Cin, 3, 3), 0.05f);
    c.b = bench_rand_param(32, 1, MMC_SHAPE(Cout), 1);
    int64_t ny = B * Cout * H * W;
    c.dy = malloc((size_t)ny * sizeof(float));
    mmc_rng r;
    mmc_rng_init(&r, 33);
    mmc_rng_normal(&r, c.dy, ny, 0, 1);
    const double flop1 = 2.0 * B * Cout * H * W * Cin * 9;
    snprintf(base, sizeof base, "conv2d_fwdbwd_%lldx%lldx%lldx%lld_k3_c%lld", (long long)B,
             (long long)Cin, (long long)H, (long long)W, (long long)Cout);
    double t = bench_time(run_conv, &c, min_s, 2);
    bench_report(base, 3 * flop1 / t * 1e-9, "GFLOP/s", 1);
    if (passes) {
        t = bench_time(run_fwd, &c, min_s / 2, 2);
        snprintf(name, sizeof name, "%s_fwd", base);
        bench_report(name, flop1 / t * 1e-9, "GFLOP/s", 1);
        for (int p = 0; p < 2; p++) {   /* 0: dx alone, 1: dW and db alone */
            set_rg(c.x, p == 0), set_rg(c.w, p == 1), set_rg(c.b, p == 1);
            mmc_ctx_reset(c.ctx);
            mmc_tensor *y = mmc_conv2d(c.ctx, c.x, c.w, c.b, 1, 1);
            memcpy(mmc_grad(c.ctx, y)->data, c.dy, (size_t)ny * sizeof(float));
            t = bench_time(run_bwd, &c, min_s / 2, 2);
            snprintf(name, sizeof name, "%s_%s", base, p == 0 ? "bwd_data" : "bwd_weight");
            bench_report(name, flop1 / t * 1e-9, "GFLOP/s", 1);
        }
        set_rg(c.x, true), set_rg(c.w, true), set_rg(c.b, true);
    }
    free(c.dy);
    mmc_tensor_free(c.x), mmc_tensor_free(c.w), mmc_tensor_free(c.b);
    mmc_ctx_free(c.ctx);
}

int main(void) {
    bench_conv(4, 32, 32, 32, 64, 1.0, true);      /* small training layer */
    bench_conv(1, 128, 128, 128, 128, 1.0, true);  /* VAE decoder, 128 channels at 128x128 */
    bench_conv(1, 512, 32, 32, 512, 1.5, true);    /* VAE mid / decoder, 512 channels at 32x32 */
    return 0;
}
