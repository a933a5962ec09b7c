/* mmc_wgrad.h — the split backward of the autograd (src/core/autograd.c): input gradients now,
 * weight gradients later, for zero-bubble pipeline schedules (DualPipeV in mmc_pp.h). */
#ifndef MMC_WGRAD_H
#define MMC_WGRAD_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Split backward (zero-bubble pipeline schedules: DualPipeV, mmc_pp.h). While deferral is on,
 * ops whose backward has a weight-gradient half (mmc_linear: dW += dyᵀ x, db += Σ dy) compute
 * only the input gradient (dx, "B") and queue the node with its weight rule; the queue keeps x
 * and dy alive in the context's arena. mmc_backward_weights (the "W" pass) runs the queued
 * weight halves in the order they were queued — each parameter then receives exactly the same
 * accumulations, in the same order, as an unsplit backward — and empties the queue; it returns
 * how many ran. mmc_ctx_reset drops the queue. A checkpointed block's recomputation is released
 * inside its backward, so its weight halves always run at once. Ops without a split accumulate
 * every gradient in the input half. */
bool mmc_set_defer_weight_grads(mmc_ctx *ctx, bool on);   /* returns the previous setting */
bool mmc_defer_weight_grads(const mmc_ctx *ctx);
void mmc_defer_weight_grad(mmc_ctx *ctx, mmc_node *n, mmc_backward_fn weight_fn);   /* for backward rules */
int mmc_deferred_weight_grads(const mmc_ctx *ctx);
int mmc_backward_weights(mmc_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif
