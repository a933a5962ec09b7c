/* pipe_util.h — small helpers the diffusion pipelines share (internal to src/diffusion/). */
#ifndef MMC_PIPE_UTIL_H
#define MMC_PIPE_UTIL_H

#include "mmc.h"

#include <string.h>

/* Classifier-free guidance's doubled batch: rows of a, then of b, along dim 0 -> [2B, ...] in ctx
 * (a and b contiguous f32 of the same shape). */
static inline mmc_tensor *pipe_stack2(mmc_ctx *ctx, const mmc_tensor *a, const mmc_tensor *b) {
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[0] *= 2;
    mmc_tensor *t = mmc_new(ctx, MMC_F32, a->ndim, shape);
    memcpy(t->data, a->data, mmc_nbytes(a));
    memcpy((char *)t->data + mmc_nbytes(a), b->data, mmc_nbytes(b));
    return t;
}

#endif
