/* mmc_tp.h — tensor parallelism (Megatron-LM, Shoeybi et al. 2019): the autograd ops a
 * model uses to split its matrices over a tensor-parallel group, and the helpers that load,
 * gather and measure the split parameters. Everything goes through the communicator
 * (mmc_parallel.h); layers never call MPI.
 *
 *   f  = mmc_tp_copy:    identity forward, all-reduce (sum) of the gradient backward — placed
 *                        before a column-parallel linear, whose input is replicated;
 *   g  = mmc_tp_reduce:  all-reduce (sum) forward, identity backward — after a row-parallel
 *                        linear, whose outputs are partial sums.
 * Column-parallel linear (q/k/v, gate/up, lm_head): rows of W [N, K] (output features) are
 * split, so rank r computes features [r N/tp, (r+1) N/tp). Row-parallel linear (o, down):
 * columns of W (input features) are split; the partial products are all-reduced and the bias,
 * replicated, is added once after the reduction. Vocab-parallel embedding: rank r owns token
 * ids [r V/tp, (r+1) V/tp); a masked lookup gives zero rows for ids it does not own, then g.
 * Vocab-parallel cross-entropy: the max and the sum of exponentials per row are all-reduced,
 * the target logit comes from the rank that owns it; the gradient softmax - onehot is exact.
 * With these, a rank's gradient of each split parameter is its slice of the single-process
 * gradient, and the replicated parameters (norms, row-parallel biases) get the same full
 * gradient on every rank: no further reduction over the tp group is needed.
 *
 * Sharding of a parameter: MMC_TP_REPLICATED or the dimension split evenly over the group
 * (rank r holds the r-th of tp equal, contiguous blocks along that dimension). */
#ifndef MMC_TP_H
#define MMC_TP_H

#include "mmc.h"
#include "mmc_ops.h"
#include "mmc_nn.h"
#include "mmc_io.h"
#include "mmc_parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_TP_REPLICATED (-1)
/* A fused projection [3 n, ...] (q, k, v stacked, as the vision tower's qkv): each third is
 * split on its rows, i.e. the view [3, n, ...] is split on dim 1; rank r holds
 * [q_r; k_r; v_r]. Usable wherever a split dimension is taken. */
#define MMC_TP_FUSED3 8
/* The plain (shape, split dim) that split code `split` of a tensor of shape `shape` means:
 * MMC_TP_FUSED3 -> [3, shape[0]/3, shape[1..]] split on 1; anything else unchanged. */
void mmc_tp_view(int ndim, const int64_t *shape, int split, int *vndim, int64_t *vshape, int *vsplit);

/* ---------------------------------------------------------------- autograd ops */
/* f: y = x (a new tensor sharing nothing with x); backward dx += all_reduce(dy). */
mmc_tensor *mmc_tp_copy(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);
/* g: y = all_reduce(x); backward dx += dy. */
mmc_tensor *mmc_tp_reduce(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);
/* Row-parallel linear: x [..., K/tp] (this rank's input features) with l->w [N, K/tp];
 * -> g(x W^T + s B (A x)) + b [..., N].
 * LoRA under tensor parallelism: on a column-parallel linear A [r, K] is replicated and B
 * [N/tp, r] split on rows; on a row-parallel one A [r, K/tp] is split on columns and B [N, r]
 * replicated. The replicated factor's gradient is then a partial sum on each rank (its input or
 * output is split): the caller all-reduces it over the group after backward (Megatron does the
 * same for such "sequence-parallel"-style partial gradients). */
mmc_tensor *mmc_tp_row_linear(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l);
/* The same with the all-reduce overlapped: x's rows in `chunks` pieces (at most
 * MMC_NODE_MAX_IN), each piece's reduction running while the next piece's GEMM does
 * (parallel.tp_comm_chunks; chunks <= 1: mmc_tp_row_linear). */
mmc_tensor *mmc_tp_row_linear_chunked(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l, int chunks);
/* Vocab-parallel embedding: table [V/tp, C] holds ids [vocab_start, vocab_start + V/tp);
 * ids [...] (i32/i64, each in [0, V)) -> g(masked lookup) [..., C], replicated. */
mmc_tensor *mmc_tp_embedding(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *table, mmc_tensor *ids, int64_t vocab_start,
                             int64_t padding_idx);   /* -1: none */
/* Vocab-parallel cross-entropy: logits [N, V/tp] (this rank's vocabulary slice starting at
 * vocab_start), targets [N] global ids or ignore_index; the mean over scored rows as
 * mmc_cross_entropy (0 when all are ignored), the same scalar on every rank. */
mmc_tensor *mmc_tp_cross_entropy(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *logits, mmc_tensor *targets,
                                 int64_t vocab_start, int64_t ignore_index);
/* All-gather along the last dimension: x [..., n/tp] -> [..., n] (e.g. the full logits for
 * generation); backward takes this rank's slice of the gradient. */
mmc_tensor *mmc_tp_gather_last(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);

/* ---------------------------------------------------------------- sequence parallelism
 * (Korthikanti et al. 2022, Megatron's sequence_parallel): between the tensor-parallel blocks
 * the residual stream, the norms and the bias adds run on this rank's slice of the sequence,
 * x [B, T/tp, C] (rank r holds positions [r T/tp, (r+1) T/tp) of every row); f becomes an
 * all-gather along T (backward: reduce-scatter) and g a reduce-scatter (backward: all-gather).
 * Replicated parameters used on the slices (norm weights, row-parallel biases) then get a
 * partial gradient on each rank, which the caller all-reduces over the group after backward.
 * T must be divisible by tp. */
/* x [B, T, C] replicated -> this rank's slice [B, T/tp, C]; backward all-gathers. */
mmc_tensor *mmc_tp_sp_split(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);
/* x [B, T/tp, C] -> [B, T, C] (all-gather along T); backward reduce-scatters the gradient. */
mmc_tensor *mmc_tp_sp_gather(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);
/* x [B, T, C] partial sums -> [B, T/tp, C] summed over ranks; backward all-gathers. */
mmc_tensor *mmc_tp_sp_reduce_scatter(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x);
/* Row-parallel linear ending in a reduce-scatter: -> [B, T/tp, N] (+ b). */
mmc_tensor *mmc_tp_row_linear_sp(mmc_ctx *ctx, mmc_comm *tp, mmc_tensor *x, const mmc_linear_w *l);

/* ---------------------------------------------------------------- sharded parameters */
/* Bind this rank's slice of checkpoint tensor `name` (full shape `shape`, split on dim
 * split_dim or MMC_TP_REPLICATED) as a new f32 tensor: only the slice is read from the
 * mapping and copied (no full copy per rank). trainable marks it a parameter. Problems are
 * appended to errs, as mmc_model_bind does. */
mmc_status mmc_tp_bind(const mmc_st *st, const char *name, int ndim, const int64_t *shape, int split_dim,
                       mmc_comm *tp, bool trainable, mmc_tensor **slot, char *errs, size_t errcap);
/* The local shape of a full shape split on split_dim over tp ranks. */
void mmc_tp_local_shape(int ndim, const int64_t *full, int split_dim, int tp_size, int64_t *local);
/* Copy this rank's slice of a full contiguous f32 tensor into local (contiguous f32). */
void mmc_tp_take_slice(const float *full, int ndim, const int64_t *full_shape, int split_dim, int rank,
                       int tp_size, float *local);
/* Gather a split parameter: local (this rank's slice, any float dtype, contiguous) -> full
 * (contiguous f32, the full shape; every rank receives it). Collective over tp. */
mmc_status mmc_tp_gather(mmc_comm *tp, const mmc_tensor *local, int split_dim, mmc_tensor *full);
/* Global L2 norm of the gradients of params[i] (split[i]: their sharding): the squares of
 * split gradients are summed over the group, replicated ones counted once. Collective. */
mmc_status mmc_tp_grad_norm(mmc_comm *tp, mmc_tensor *const *params, const signed char *split, int n,
                            double *norm);

#ifdef __cplusplus
}
#endif
#endif
