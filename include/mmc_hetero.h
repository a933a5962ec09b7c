/* mmc_hetero.h — per-modality (heterogeneous) parallel plans: an encoder laid out differently
 * from the language model it feeds (MindSpeed-MM's per-module settings). The supported case is
 * the one that pays: the vision tower (with its merger) data-parallel over every rank while the
 * language model runs at tp x dp. The ranks of a tensor-parallel group hold the same samples, so
 * instead of each encoding all of them (or splitting the small tower's matrices), the group shares
 * the micro-batch's images out — each rank encodes a contiguous run of them, balanced by patch
 * count — and the merged features are all-gathered inside the group before they are placed in
 * the embeddings. Every rank then encodes 1/(tp x dp) of the global batch's images: the tower is
 * data-parallel over the world. Backward: the language model's computation is replicated over
 * its tp group (Megatron's f / g keep the residual stream and its gradient identical on every
 * member), so each rank's share of the feature gradient is simply its own rows (Megatron's
 * gather_from_tensor_model_parallel_region does the same); the tower's weight gradients are then
 * partial per rank and are summed over the world (the trainer: over dp by the bucketed reducer,
 * then over tp — the two groups together are the world). With the language model pipelined
 * (trainer_pp_hetero.c) the share is over the replica's stages x tp ranks and the whole step's
 * micro-batches, the features go to the first stage by an all-to-all and their gradient comes back
 * after the pipeline's backward. Qwen2.5-Omni's audio encoder takes the
 * same plan (parallel.audio), its clips shared by mel frames (omni_train.c). */
#ifndef MMC_HETERO_H
#define MMC_HETERO_H

#include "mmc.h"
#include "mmc_parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Share n items of cost cost[i] (>= 0; e.g. patches) out over size ranks as contiguous runs,
 * balanced by cost: item i goes to the rank whose 1/size of the total its cost midpoint falls
 * in. Rank `rank` gets items [*first, *first + *count) (possibly none). Deterministic: every
 * member computes the same split from the same costs. */
void mmc_hetero_share(const int64_t *cost, int n, int size, int rank, int *first, int *count);

/* All-gather of rows over group g: x [rows[r], C] on rank r (rows[] the same array on every
 * member; a rank may hold 0 rows) -> [sum rows, C], rank 0's rows first; f32. Backward: this
 * rank's rows of the gradient (valid when everything downstream is replicated over g, as the
 * layers of a tensor-parallel group are). */
mmc_tensor *mmc_hetero_gather_rows(mmc_ctx *ctx, mmc_comm *g, mmc_tensor *x, const int64_t *rows);

#ifdef __cplusplus
}
#endif
#endif
