/* mmc_cp.h — context parallelism, DeepSpeed-Ulysses style (Jacobs et al. 2023, "DeepSpeed
 * Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence Transformer
 * Models"): a context-parallel group of C ranks splits every sample's sequence, rank r holding
 * positions [r T/C, (r+1) T/C) through the embedding, the norms, the MLPs and the loss. Inside
 * attention an all-to-all turns the sequence shards of q, k and v [B, T/C, H, D] into head
 * shards [B, T, H/C, D] (rank r: heads [r H/C, (r+1) H/C) over the whole sequence), the usual
 * causal (or packed, cu_seqlens) attention runs on them, and the inverse all-to-all brings the
 * output back to [B, T/C, H, D]. Backward mirrors it: the gradient of one all-to-all is the
 * other. RoPE is applied before the exchange, with each token's global position.
 * Weights are replicated over the group; each rank's weight gradients are partial (its tokens
 * only) and are all-reduced over the group, as data parallelism does. C must divide the query
 * heads; KV heads are divided among the ranks when C divides them, else (C a multiple of them)
 * each is replicated over C / Hkv ranks (mmc_cp_expand_kv).
 *
 * Ring attention (parallel.context_parallel_mode: ring; src/parallel/cp_ring.c) keeps every
 * head on every rank instead: the K/V shards are passed around the ring of C ranks, each rank
 * merging its queries' attention over each block by the log-sum-exp rule, and backward passes
 * dK/dV around the ring as well. Rank r holds the zigzag shard (chunks r and 2C-1-r of the row
 * cut into 2C, mmc_cp_ring_pos) so that causal work is equal on every rank; no head constraint. */
#ifndef MMC_CP_H
#define MMC_CP_H

#include "mmc.h"
#include "mmc_ops.h"
#include "mmc_models.h"
#include "mmc_parallel.h"
#include "mmc_data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How attention crosses the sequence split (parallel.context_parallel_mode). */
typedef enum { MMC_CP_ULYSSES = 0, MMC_CP_RING = 1 } mmc_cp_mode;

/* Plain (no autograd) re-sharding over the group's C ranks, f32:
 * seq -> head: x [B, T/C, H, D] (this rank's tokens, all heads) -> y [B, T, H/C, D];
 * head -> seq: y [B, T, H/C, D] -> x [B, T/C, H, D]. Collective over cp. */
mmc_status mmc_cp_seq_to_head_raw(mmc_comm *cp, const float *x, float *y, int64_t B, int64_t Tl, int64_t H, int64_t D);
mmc_status mmc_cp_head_to_seq_raw(mmc_comm *cp, const float *y, float *x, int64_t B, int64_t Tl, int64_t H, int64_t D);
/* The autograd ops (cp NULL or of size 1: identity). */
mmc_tensor *mmc_cp_seq_to_head(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *x);   /* [B,T/C,H,D] -> [B,T,H/C,D] */
mmc_tensor *mmc_cp_head_to_seq(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *y);   /* [B,T,H/C,D] -> [B,T/C,H,D] */

/* k or v [B, T/C, Hkv, D] ready for mmc_cp_seq_to_head: itself when C divides Hkv; when Hkv < C
 * (C a multiple of Hkv) each KV head repeated C / Hkv times -> [B, T/C, C, D], so that each rank
 * receives the KV head of its query heads' GQA group (backward sums the copies). */
mmc_tensor *mmc_cp_expand_kv(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *k);
/* Whether a Qwen2 text model can be split over C context-parallel ranks: MMC_OK, or an
 * MMC_ERR_INVALID naming the key (num_attention_heads / num_key_value_heads) and what to do. */
mmc_status mmc_cp_check_qwen2(const mmc_qwen2_config *c, int C, const char *file);
/* Set (cp != NULL) or clear the group on the model's layers: their attention then exchanges
 * q/k/v and its output as above (Ulysses), or runs ring attention after mmc_cp_set_mode_qwen2
 * (m, MMC_CP_RING). */
void mmc_cp_attach_qwen2(mmc_qwen2 *m, mmc_comm *cp);
void mmc_cp_set_mode_qwen2(mmc_qwen2 *m, mmc_cp_mode mode);

/* Ring attention. Global index of local token t of rank r's zigzag shard of Tl = T/C tokens
 * (Tl even): chunk r for t < Tl/2, chunk 2C-1-r after. */
int64_t mmc_cp_ring_pos(int r, int C, int64_t Tl, int64_t t);
/* q [B, T/C, Hq, D], k, v [B, T/C, Hkv, D]: this rank's zigzag shard (RoPE applied at the global
 * positions) -> [B, T/C, Hq, D], the rows of attention over the whole row. opts as for
 * mmc_attention, in global positions: causal, scale, cu_seqlens (B == 1; tokens past
 * cu_seqlens[n_seqs] are one more segment). Collective over cp (NULL or size 1: one block). */
mmc_tensor *mmc_cp_ring_attention(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v,
                                  const mmc_attn_opts *opts);
/* The causal-LM loss of this rank's share of micro-batch b (Ulysses: b->T divisible by the group
 * size; ring: the row is padded inside to a multiple of 2C, ignored labels, and each rank takes
 * its zigzag shard, as set by mmc_cp_set_mode_qwen2): the labels are shifted on the whole row first, so a shard's last token is scored against the
 * next shard's first; returns sum over this rank's scored tokens of the token NLL times scale
 * (the caller's 1 / global label count), n_scored this rank's count. */
mmc_tensor *mmc_cp_qwen2_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b,
                                 double scale, int64_t *n_scored);

/* The same for a Qwen2-VL / Qwen2.5-VL micro-batch (images, videos, packed rows): the vision tower
 * runs replicated on every rank over the whole micro-batch, its features are scattered into the
 * whole row's embeddings and the M-RoPE positions are computed on the whole row; then each rank
 * keeps its shard's rows (as above) for the decoder and the loss. The tower's weight gradients
 * are then partial per rank (its tokens' share of the features' gradient) and sum over the group
 * to the single process's, as every other weight gradient does (mmc_cp_trainer_reduce).
 * -> *loss as mmc_cp_qwen2_lm_loss; fails (before any collective) on media that do not match
 * the placeholders, identically on every rank. */
/* Identity forward; backward sums the gradient over cp (every rank of the group records it):
 * for features computed whole on every rank and scattered into rows only some rank scores. */
mmc_tensor *mmc_cp_sum_grad(mmc_ctx *ctx, mmc_comm *cp, mmc_tensor *x);
/* The same loss from the whole row's input embeddings e [B, T, C] (a LLaVA / InternVL micro-batch,
 * mmc_llava_batch_embeds with cp): this rank's shard of rows with 1-D positions restarting at each
 * packed segment (mmc_embeds_positions), -> as mmc_cp_qwen2_lm_loss. */
mmc_tensor *mmc_cp_embeds_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, mmc_comm *cp, const mmc_batch *b, mmc_tensor *e,
                                  double scale, int64_t *n_scored);
struct mmc_qwen2_vl;
mmc_status mmc_cp_qwen2_vl_loss(mmc_ctx *ctx, struct mmc_qwen2_vl *vl, mmc_comm *cp, const mmc_batch *b,
                                double scale, mmc_tensor **loss, int64_t *n_scored);

#ifdef __cplusplus
}
#endif
#endif
