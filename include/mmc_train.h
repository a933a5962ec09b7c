/* mmc_train.h — optimizers and learning-rate schedules.
 *
 * AdamW mirrors torch.optim.AdamW (decoupled weight decay; bias-corrected moments; eps
 * added after the square root), with fp32 state. Parameters whose ndim is 1 (norm weights,
 * biases) get no weight decay, as LLaMA-Factory / HF Trainer do. */
#ifndef MMC_TRAIN_H
#define MMC_TRAIN_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
} mmc_adamw_opts;

typedef struct {
    mmc_adamw_opts o;
    int n;
    mmc_tensor **params;   /* not owned */
    float **m, **v;        /* [numel] each, fp32 */
    bool *decay;
    int64_t step;
} mmc_adamw;

void mmc_adamw_defaults(mmc_adamw_opts *o);  /* lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01 */
/* Only parameters with MMC_REQUIRES_GRAD are optimised (frozen ones take no state). */
mmc_status mmc_adamw_init(mmc_adamw *a, const mmc_adamw_opts *o, mmc_tensor **params, int n);
void mmc_adamw_free(mmc_adamw *a);
/* One update with learning rate lr (from a schedule); params without a grad are skipped. */
void mmc_adamw_step(mmc_adamw *a, double lr);

/* Global L2 norm of all gradients; if max_norm > 0 and the norm exceeds it, scale the
 * gradients by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_). Returns the
 * norm before clipping. */
double mmc_clip_grad_norm(mmc_tensor **params, int n, double max_norm);

typedef enum { MMC_SCHED_CONSTANT, MMC_SCHED_LINEAR, MMC_SCHED_COSINE } mmc_sched_kind;
typedef struct {
    mmc_sched_kind kind;
    double lr, min_lr;
    int64_t warmup_steps, total_steps;
} mmc_schedule;
/* Learning rate for (0-based) step: linear warmup from 0, then constant / linear decay /
 * cosine decay to min_lr at total_steps (transformers' get_*_schedule_with_warmup). */
double mmc_schedule_lr(const mmc_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
