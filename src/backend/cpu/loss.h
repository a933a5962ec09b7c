/* loss.h — fused cross-entropy kernels: log-softmax + NLL per row in one pass over the
 * logits (online max / sum of exponentials), and the softmax-minus-one-hot backward. */
#ifndef MMC_CPU_LOSS_H
#define MMC_CPU_LOSS_H
#include <stdbool.h>
#include <stdint.h>

/* logits [N, V]; targets [N] (i64 when tgt_i64, else i32). Writes lse [N] and
 * row_loss [N] = lse - logits[t] (0 for rows whose target == ignore_index). Targets must be
 * in [0, V) or ignore_index (checked by the caller). */
void mmc_cpu_xent_fwd(const float *logits, const void *targets, bool tgt_i64, int64_t ignore_index,
                      float *lse, float *row_loss, int64_t N, int64_t V);
/* dlogits [N, V] += scale * (softmax(logits) - onehot(t)) for non-ignored rows. */
void mmc_cpu_xent_bwd(const float *logits, const void *targets, bool tgt_i64, int64_t ignore_index,
                      const float *lse, float scale, float *dlogits, int64_t N, int64_t V);
#endif
