/* loss.c — mmc_cross_entropy: torch.nn.functional.cross_entropy(logits, targets,
 * ignore_index=..., reduction='mean') with a fused log-softmax (src/backend/cpu/loss.c).
 *
 * The mean is over rows whose target != ignore_index. When every row is ignored torch
 * returns NaN (0/0); mmc returns 0 and a zero gradient instead, so a batch made only of
 * prompt tokens (all labels -100) cannot poison a training run. The per-row losses are
 * summed in row order in double, so the loss is identical for any thread count. */
#include "mmc_ops.h"
#include "loss.h"

static void xent_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *logits = n->in[0], *targets = n->in[1];
    int64_t N = n->i[0], V = n->i[1], count = n->i[2], ignore = n->i[3];
    if (!mmc_requires_grad(logits)) return;
    float *gl = mmc_grad(ctx, logits)->data;   /* allocated (zero) even when all are ignored */
    if (count == 0) return;
    float g = ((const float *)n->out->grad->data)[0];
    mmc_cpu_xent_bwd(logits->data, targets->data, targets->dtype == MMC_I64, ignore,
                     n->saved[0]->data, g / (float)count, gl, N, V);
}

mmc_tensor *mmc_cross_entropy(mmc_ctx *ctx, mmc_tensor *logits, mmc_tensor *targets,
                              int64_t ignore_index) {
    char sl[64], st[64];
    MMC_CHECK(logits && targets, "mmc_cross_entropy: logits and targets are required");
    MMC_CHECK(logits->dtype == MMC_F32 && logits->ndim == 2 && mmc_is_contiguous(logits) &&
                  (targets->dtype == MMC_I32 || targets->dtype == MMC_I64) && targets->ndim == 1 &&
                  mmc_is_contiguous(targets) && targets->shape[0] == logits->shape[0],
              "mmc_cross_entropy: need logits contiguous f32 [N, V] and targets i32/i64 [N]; got "
              "logits %s %s, targets %s %s",
              mmc_dtype_name(logits->dtype), mmc_shape_str(logits, sl, sizeof sl),
              mmc_dtype_name(targets->dtype), mmc_shape_str(targets, st, sizeof st));
    int64_t N = logits->shape[0], V = logits->shape[1], count = 0;
    bool i64 = targets->dtype == MMC_I64;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = i64 ? ((const int64_t *)targets->data)[i] : ((const int32_t *)targets->data)[i];
        if (t == ignore_index) continue;
        MMC_CHECK(t >= 0 && t < V, "mmc_cross_entropy: target %lld at row %lld is out of range [0, %lld)",
                  (long long)t, (long long)i, (long long)V);
        count++;
    }
    mmc_tensor *lse = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(N));   /* [N] */
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    float *row_loss = mmc_scratch_alloc(ctx, (size_t)(N > 0 ? N : 1) * sizeof(float));   /* [N] */
    mmc_cpu_xent_fwd(logits->data, targets->data, i64, ignore_index, lse->data, row_loss, N, V);
    double sum = 0;
    for (int64_t i = 0; i < N; i++) sum += row_loss[i];
    mmc_scratch_release(ctx, m);
    mmc_tensor *loss = mmc_scalar(ctx, count ? (float)(sum / (double)count) : 0.0f);   /* [] */
    mmc_tensor *in[2] = {logits, targets};
    mmc_node *n = mmc_tape_record(ctx, "cross_entropy", xent_backward, loss, 2, in);
    if (n) {
        n->saved[0] = lse;
        n->i[0] = N;
        n->i[1] = V;
        n->i[2] = count;
        n->i[3] = ignore_index;
    }
    return loss;
}
