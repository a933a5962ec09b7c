/* bench_ops_elementwise.c — forward + backward throughput of the hot elementwise ops:
 * bias add (broadcast [C] over [R, C]), swiglu, gelu (erf), softmax (last dim), at MLP
 * shapes of Qwen2-0.5B ([512, 4864] intermediate, [512, 896] hidden). Reports output
 * elements per second (millions) for one forward + one backward; bench/peer_ops_elementwise.py
 * times the same cases in PyTorch. */
#include "bench_util.h"
#include "mmc_ops.h"

typedef struct {
    int op;                  /* 0 add_bias, 1 swiglu, 2 gelu, 3 softmax */
    mmc_ctx *ctx;
    mmc_tensor *a, *b, *g;   /* inputs (params, persistent grads), output grad */
} bcase;

static void run(void *arg) {
    bcase *c = arg;
    mmc_ctx *ctx = c->ctx;
    mmc_tensor *y;
    switch (c->op) {
    case 0: y = mmc_add(ctx, c->a, c->b); break;
    case 1: y = mmc_swiglu(ctx, c->a, c->b); break;
    case 2: y = mmc_gelu(ctx, c->a); break;
    default: y = mmc_softmax(ctx, c->a); break;
    }
    y->grad = c->g;   /* seed the output gradient without a copy (as y.backward(g)) */
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    mmc_ctx_reset(ctx);
}

int main(void) {
    const char *names[] = {"add_bias", "swiglu", "gelu", "softmax"};
    const int64_t shapes[][2] = {{512, 4864}, {512, 896}};
    for (int op = 0; op < 4; op++) {
        for (int s = 0; s < 2; s++) {
            int64_t R = shapes[s][0], C = shapes[s][1];
            bcase c = {.op = op, .ctx = mmc_ctx_new()};
            c.a = bench_rand_param(1, 2, MMC_SHAPE(R, C), 1);
            c.b = op == 0 ? bench_rand_param(2, 1, MMC_SHAPE(C), 1) : op == 1 ? bench_rand_param(2, 2, MMC_SHAPE(R, C), 1) : NULL;
            c.g = bench_rand_param(3, 2, MMC_SHAPE(R, C), 1);
            c.g->flags = MMC_OWNS_DATA;
            double t = bench_time(run, &c, 0.5, 5);
            char name[96];
            snprintf(name, sizeof name, "ew_%s_fwdbwd_%lldx%lld", names[op], (long long)R, (long long)C);
            bench_report(name, (double)(R * C) / t / 1e6, "Melem/s", 1);
            mmc_tensor_free(c.a);
            mmc_tensor_free(c.b);
            mmc_tensor_free(c.g);
            mmc_ctx_free(c.ctx);
        }
    }
    return 0;
}
