/* linear.c — the linear building block (mmc_nn.h): base projection plus optional LoRA
 * adapter, mirroring PEFT's lora.Linear.forward: result = base(x) + B(A(dropout(x))) * scale; for a
 * fused linear (parts), each part's adapter on its slice of the output, as PEFT on the separate linears. */
#include "mmc_nn.h"
#include "mmc_ops.h"

#include <string.h>

mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b)
    __attribute__((weak));
mmc_tensor *mmc_q8_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_q8 *q, mmc_tensor *b)
    __attribute__((weak));

/* B(A(dropout(x))) * scale [..., N] */
static mmc_tensor *lora_delta(mmc_ctx *ctx, mmc_tensor *x, const mmc_lora *a) {
    mmc_tensor *xd = a->dropout > 0 ? mmc_nn_dropout(ctx, x, a->dropout, a->stream) : x;
    mmc_tensor *h = mmc_linear(ctx, xd, a->A, NULL);       /* [..., r] */
    h = mmc_linear(ctx, h, a->B, NULL);                     /* [..., N] */
    return mmc_scale(ctx, h, a->scale);
}

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
    if (l->lora) y = mmc_add(ctx, y, lora_delta(ctx, x, l->lora));
    if (!l->n_parts) return y;
    /* a fused linear's parts: each adapted part's delta on its slice of the output, zeros elsewhere */
    mmc_tensor *d[8];
    bool any = false;
    MMC_CHECK(l->n_parts <= 8, "mmc_nn_linear: %d parts (at most 8)", l->n_parts);
    for (int j = 0; j < l->n_parts; j++) any |= l->parts[j].lora != NULL;
    if (!any) return y;
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int j = 0; j < l->n_parts; j++) {
        const mmc_linear_w *p = &l->parts[j];
        if (p->lora) { d[j] = lora_delta(ctx, x, p->lora); continue; }
        shape[x->ndim - 1] = p->out_features;
        d[j] = mmc_new(ctx, MMC_F32, x->ndim, shape);                         /* [..., N_j] of zeros */
        memset(d[j]->data, 0, mmc_nbytes(d[j]));
    }
    return mmc_add(ctx, y, mmc_concat(ctx, d, l->n_parts, x->ndim - 1));
}
