/* linear.c — the linear building block (mmc_nn.h): base projection plus optional LoRA
 * adapter, mirroring PEFT's lora.Linear.forward: result = base(x) + B(A(dropout(x))) * scale. */
#include "mmc_nn.h"

mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b)
    __attribute__((weak));
mmc_tensor *mmc_q8_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_q8 *q, mmc_tensor *b)
    __attribute__((weak));

mmc_tensor *mmc_nn_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l) {
    mmc_tensor *y;
    if (l->q) {
        MMC_CHECK(mmc_nf4_linear, "NF4 weights need the quantisation module (src/nn/quant.c)");
        y = mmc_nf4_linear(ctx, x, l->q, l->b);
    } else if (l->q8) {
        MMC_CHECK(mmc_q8_linear, "int8 weights need the quantisation module (src/nn/quant.c)");
        y = mmc_q8_linear(ctx, x, l->q8, l->b);
    } else {
        y = mmc_linear(ctx, x, l->w, l->b);
    }
    if (!l->lora) return y;
    const mmc_lora *a = l->lora;
    mmc_tensor *xd = a->dropout > 0 ? mmc_nn_dropout(ctx, x, a->dropout, a->stream) : x;
    mmc_tensor *h = mmc_linear(ctx, xd, a->A, NULL);       /* [..., r] */
    h = mmc_linear(ctx, h, a->B, NULL);                     /* [..., N] */
    return mmc_add(ctx, y, mmc_scale(ctx, h, a->scale));
}
