/* step_check.h — one step of the hand-driven training-parity loops (test_sd3, test_unet,
 * test_wan, test_hunyuan: the model's loss on a reference batch, then the step the reference
 * script takes): backward, gradients clipped to norm 1, AdamW at lr, gradients zeroed; the
 * loss and the pre-clip grad norm against the reference's within tol relative, the worst of
 * each kept for the summary line. Include after test_util.h. */
#ifndef MMC_STEP_CHECK_H
#define MMC_STEP_CHECK_H

#include "mmc_train.h"

static inline double step_check(mmc_ctx *ctx, mmc_tensor *loss, mmc_tensor **params, int n_params, mmc_adamw *opt,
                                double lr, double want_loss, double want_norm, double tol, const char *what, int step,
                                double *worst_loss, double *worst_norm) {
    const double lv = *(float *)loss->data;
    mmc_backward(ctx, loss);
    mmc_ctx_reset(ctx);
    const double norm = mmc_clip_grad_norm(params, n_params, 1.0);
    mmc_adamw_step(opt, lr);
    mmc_zero_grad(params, n_params);
    const double rl = fabs(lv - want_loss) / fabs(want_loss), rn = fabs(norm - want_norm) / fabs(want_norm);
    *worst_loss = fmax(*worst_loss, rl), *worst_norm = fmax(*worst_norm, rn);
    CHECKF(rl < tol && rn < tol, "%s step %d: loss %.6f vs %.6f, grad norm %.5f vs %.5f", what, step, lv, want_loss,
           norm, want_norm);
    return lv;
}

#endif
