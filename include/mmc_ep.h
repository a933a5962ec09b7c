/* mmc_ep.h — expert parallelism (src/parallel/ep.c), as Megatron-LM's expert-model-parallel /
 * DeepSpeed-MoE: the experts of every MoE layer are split over an expert-parallel group of P
 * ranks (rank r holds experts [r E/P, (r+1) E/P)); each rank routes its own tokens, sends every
 * routed row to the rank of its expert with an all-to-all-v, the experts run there, and a second
 * all-to-all-v brings the outputs back to be weighted and summed (the backward runs the two
 * exchanges the other way). The group is carved out of the data-parallel group
 * (parallel.expert_parallel divides parallel.data_parallel): the dense parameters stay
 * data-parallel over all of it, each expert's weights live on one rank of each group and their
 * gradients are summed over the data_parallel / expert_parallel ranks that hold the same
 * experts. Checkpoints are saved in the Hugging Face layout with every expert whole, so they load
 * into any layout. */
#ifndef MMC_EP_H
#define MMC_EP_H

#include "mmc.h"
#include "mmc_models.h"
#include "mmc_parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An error unless ep ranks can split n_experts evenly (the message lists the sizes that can). */
mmc_status mmc_ep_check(int64_t n_experts, int ep);

/* The experts of one MoE block under expert parallelism (collective over ep): xs [S, C] this
 * rank's routed rows sorted by expert, counts[E] rows per (global) expert; run computes this
 * rank's experts over rows grouped by local expert -> the expert outputs for xs's rows [S, C]. */
typedef mmc_tensor *(*mmc_ep_run_fn)(mmc_ctx *ctx, mmc_moe_block *b, mmc_tensor *x, const int64_t *counts);
mmc_tensor *mmc_ep_experts(mmc_ctx *ctx, mmc_comm *ep, mmc_tensor *xs, const int64_t *counts, int64_t n_experts,
                           mmc_moe_block *b, mmc_ep_run_fn run);

/* Whether a parameter (its HF name without prefix) is a routed expert's (held by one rank of the
 * ep group), as opposed to the replicated dense ones. */
bool mmc_ep_is_expert_param(const char *name);

/* Every parameter of m with the experts of all ranks (all-gathered over ep: collective), as new
 * tensors (each in its dtype) with their HF names (without prefix) in (*names)[i]; free with mmc_ep_full_free. */
mmc_status mmc_ep_full_weights(mmc_qwen2 *m, mmc_comm *ep, mmc_tensor ***full, char (**names)[96], int *n);
void mmc_ep_full_free(mmc_tensor **full, char (*names)[96], int n);

#ifdef __cplusplus
}
#endif
#endif
