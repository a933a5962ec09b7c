/* mmc_dp.h — data parallelism for the trainer: gradient buckets reduced while backward
 * runs, and ZeRO stages 0-3 (DeepSpeed ZeRO / PyTorch DDP, ZeroRedundancyOptimizer, FSDP):
 *   0  buckets are all-reduced (sum); every rank keeps full AdamW state;
 *   1  buckets are reduce-scattered after the last micro-batch; each rank keeps AdamW state
 *      for its shard of every bucket only, updates that shard, and the parameters are
 *      all-gathered;
 *   2  as 1, and gradients live only in transient per-bucket buffers that are reduce-scattered
 *      after every micro-batch into a sharded accumulator and freed: a rank holds 1/N of the
 *      gradients plus the buckets in flight;
 *   3  as 2, and the parameters are sharded too: each rank keeps its 1/N (the fp32 master
 *      shard AdamW updates); a unit's parameters (a decoder layer, a vision block — the
 *      models bracket them with mmc_params_begin/_end) are all-gathered just before its
 *      forward and again before its backward, and freed afterwards (FSDP); the parameters of
 *      no unit (embeddings, final norm, lm_head, patch embedding, merger) form the root unit,
 *      gathered for the whole micro-batch.
 * Buckets follow the reverse parameter order (the order backward completes them; ZeRO-3: one
 * bucket per unit); a bucket is started as soon as the tape has unwound past the first use of
 * each of its parameters, in bucket order on every rank, so every rank issues the same
 * collectives in the same order whatever its micro-batch holds. The gradient is the SUM over
 * ranks: the trainer scales each micro-batch's loss by 1 / (label tokens of the global batch). */
#ifndef MMC_DP_H
#define MMC_DP_H

#include "mmc.h"
#include "mmc_parallel.h"
#include "mmc_train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_dp mmc_dp;

/* Units: unit_of[i] in [0, n_units) names the block parameter i belongs to, -1 = the root;
 * keys[u] is what the model passes to mmc_params_begin/_end for unit u (its layer struct);
 * fwd_pos[u] its place in the forward (0 runs first; NULL = the order of the units' first
 * parameters). frozen[j] (unit frozen_unit[j]) are the untrained parameters (LoRA's base, a
 * frozen vision tower): ZeRO-3 shards them too, in their own dtype, and gathers them with
 * their unit (FSDP with requires_grad=False parameters); they have no gradient and no optimizer
 * state. Other stages only count them (mmc_dp_memory.frozen). */
typedef struct {
    const int *unit_of;         /* [n] */
    const void *const *keys;    /* [n_units] */
    int n_units;
    const int *fwd_pos;         /* [n_units] or NULL */
    mmc_tensor *const *frozen;  /* [n_frozen] */
    const int *frozen_unit;     /* [n_frozen] */
    int n_frozen;
    /* [n_units] or NULL: may a gradient flow through unit u (a trained parameter upstream of
     * it)? A unit of untrained parameters only, with false here, is not gathered in backward.
     * NULL: true when a trained parameter is in the root or in a unit before u. */
    const bool *grad_through;
} mmc_dp_units;

/* model[i]: the tensors the forward uses (their ->grad is filled by backward); opt[i]: the
 * fp32 tensors AdamW updates (== model[i], or an fp32 master of a bf16 model[i]; ZeRO-3 keeps
 * the master's shard, gathers the parameters in model[i]'s dtype — bf16: half the bytes — and
 * frees both full tensors, so opt[i]->data is NULL too).
 * bucket_bytes 0 = 4 MiB (env MMC_DP_BUCKET_BYTES overrides). For zero >= 1 the AdamW state
 * is created here. ZeRO-3 copies this rank's shard out of model[i] and frees the full data
 * (model[i]->data is NULL except while its unit is gathered). units may be NULL (no hooks:
 * then ZeRO-3 keeps every parameter in the root unit). */
mmc_status mmc_dp_new(mmc_comm *dp, int zero, mmc_tensor **model, mmc_tensor **opt, int n,
                      size_t bucket_bytes, const mmc_adamw_opts *o, const mmc_dp_units *units, mmc_dp **out);
void mmc_dp_free(mmc_dp *d);
/* Before each micro-batch's forward: installs the parameter hooks on ctx (unit tracking,
 * ZeRO >= 2 gradient storage, ZeRO-3 gathering) and, for ZeRO-3, gathers the root unit. */
void mmc_dp_forward_begin(mmc_dp *d, mmc_ctx *ctx);
/* After a forward that has no backward (evaluation): frees what ZeRO-3 gathered. Collective. */
void mmc_dp_forward_end(mmc_dp *d);
/* ZeRO-3: gather every parameter into place (collective; for saving or evaluating without
 * hooks), until mmc_dp_release_params. No-op for other stages. */
mmc_status mmc_dp_gather_params(mmc_dp *d);
/* the same for the trained and/or the untrained parameters only (e.g. LoRA adapters for saving) */
mmc_status mmc_dp_gather_params_sel(mmc_dp *d, bool trained, bool frozen);
void mmc_dp_release_params(mmc_dp *d);
/* Backward of one micro-batch (replaces mmc_backward): walks the tape in reverse and starts
 * bucket reductions as their gradients complete — on the last micro-batch of the step, or on
 * every one with ZeRO-2. */
void mmc_dp_backward(mmc_dp *d, mmc_ctx *ctx, mmc_tensor *loss, bool last_micro);
/* Wait for every bucket. ZeRO-0: model[i]->grad hold the summed gradient. */
mmc_status mmc_dp_finish(mmc_dp *d, mmc_ctx *ctx);
/* Global gradient norm (over all ranks' shards for ZeRO >= 1), clipped as
 * torch.nn.utils.clip_grad_norm_ (ZeRO-0: the caller's mmc_clip_grad_norm does the same). */
/* Tensor parallelism (mmc_tp.h): the parameters are this rank's tp slices; split[i] (the i-th
 * parameter given to mmc_dp_new: split dim or -1) makes mmc_dp_clip sum the split ones'
 * squares over tp too and count the replicated ones once. tp NULL or of size 1: plain. */
void mmc_dp_set_tp(mmc_dp *d, mmc_comm *tp, const signed char *split);
mmc_status mmc_dp_clip(mmc_dp *d, double max_norm, double *norm);
/* Partial gradients summed over another group g (after mmc_dp_finish, before mmc_dp_clip):
 * sel[i] marks the i-th parameter given to mmc_dp_new whose gradient each rank of g holds only
 * a part of (sequence parallelism's replicated norms, a tensor-parallel LoRA's replicated
 * factor, a tower encoding each tp rank's share of the images). ZeRO >= 1: this rank's shard
 * slices of those parameters, packed into one all-reduce (g's ranks hold the same bucket layout
 * — the same parameter sizes in the same order — checked once); ZeRO 0: their full gradients. */
mmc_status mmc_dp_reduce_partial(mmc_dp *d, mmc_comm *g, const bool *sel);
/* ZeRO-3 with a lower-precision model: the fp32 masters (opt[i] != model[i], whose data ZeRO-3
 * freed) all-gathered from the shards into full buffers again (collective, for a save that needs
 * whole tensors), and freed by mmc_dp_release_masters. Other cases: nothing. */
mmc_status mmc_dp_gather_masters(mmc_dp *d);
void mmc_dp_release_masters(mmc_dp *d);
/* Pipeline parallelism (mmc_pp.h): d is one stage's data-parallel group. The stage's backward
 * runs in the pipeline runtime (no hooks): after its last micro-batch, mmc_dp_reduce_grads
 * reduces (ZeRO-0) or reduce-scatters (ZeRO-1/2) every bucket from model[i]->grad — ZeRO-2 then
 * (and ZeRO-3) then free those full gradients — and mmc_dp_finish waits. mmc_dp_set_norm_group
 * makes mmc_dp_clip sum the squares over outer too (the stages) and leave out the parameters with
 * skip[i] != 0 (the last stage's copy of a tied embedding); skip may be NULL. */
mmc_status mmc_dp_reduce_grads(mmc_dp *d);
/* ZeRO-3 under pipeline parallelism: the stage's parameters gathered (collective) for a whole
 * step's micro-batches (model[i]->data valid) until mmc_dp_release_stage (after
 * mmc_dp_reduce_grads / _finish); no-op for other stages (a checkpoint adds mmc_dp_gather_masters). */
mmc_status mmc_dp_gather_stage(mmc_dp *d);
void mmc_dp_release_stage(mmc_dp *d);
void mmc_dp_set_norm_group(mmc_dp *d, mmc_comm *outer, const unsigned char *skip);
/* ZeRO >= 1: AdamW on this rank's shard, then all-gather the parameters into opt[i]. */
mmc_status mmc_dp_step(mmc_dp *d, double lr);
/* ZeRO >= 1: gather the sharded AdamW moments into full (allocated, initialised) state
 * a->m / a->v over the same opt[] (collective); and scatter them back (after a restore). */
mmc_status mmc_dp_gather_state(mmc_dp *d, mmc_adamw *a);
void mmc_dp_scatter_state(mmc_dp *d, const mmc_adamw *a);
int64_t mmc_dp_adamw_step(const mmc_dp *d);
void mmc_dp_set_adamw_step(mmc_dp *d, int64_t step);

/* Bytes this rank holds for the trainable parameters now: parameters (ZeRO-3: the fp32 master
 * shard plus whatever is gathered; else the model tensors and fp32 masters), gradients (persistent autograd buffers, sharded accumulators, live
 * transient gradient buckets), persistent bucket buffers (ZeRO 0/1), optimizer state; and the
 * high-water marks of parameters and gradients including transient buffers since mmc_dp_new;
 * frozen: the untrained parameters given in mmc_dp_units (ZeRO-3: this rank's shards of them —
 * gathered ones count in params / params_peak). */
typedef struct { int64_t params, grads, buckets, optim, params_peak, grads_peak, frozen; } mmc_dp_memory;
void mmc_dp_get_memory(const mmc_dp *d, mmc_dp_memory *m);
/* Seconds the caller spent blocked waiting for gradient reductions in the last step, and
 * seconds from the first bucket's start to the last bucket's completion. */
void mmc_dp_get_timing(const mmc_dp *d, double *exposed_s, double *comm_s);
void mmc_dp_reset_timing(mmc_dp *d);   /* at the start of each step */

/* ---------------------------------------------------------------- sharded checkpoints
 * (src/parallel/dp_ckpt.c) ZeRO >= 1: each rank writes its moments (ZeRO-3: and its parameter
 * shard) to DIR/optimizer.rank<R>-of-<W>.safetensors; rank 0 writes
 * DIR/optimizer_manifest.json (world size, ZeRO stage, whether parameters are sharded, bucket
 * sizes and shard lengths, every parameter's bucket, offset, shape and unit).
 * names[i] is the checkpoint name of the i-th parameter given to mmc_dp_new. */
typedef struct {
    int rank, world, zero, n, nb, n_slices;
    int64_t *bucket_len, *bucket_shard;             /* [nb] */
    int *param_bucket;                              /* [n] */
    int64_t *param_off, *param_numel;               /* [n] */
    int *param_unit;                                /* [n] -1 = root */
    int *slice_param;                               /* [n_slices] this rank's pieces */
    int64_t *slice_numel;
    float **m, **v;                                 /* [n_slices] views of the live state */
    float **p;                                      /* [n_slices] ZeRO-3: the parameter shard (else NULL) */
} mmc_dp_layout;
void mmc_dp_get_layout(const mmc_dp *d, mmc_dp_layout *l);   /* allocates; free with: */
void mmc_dp_layout_free(mmc_dp_layout *l);
void mmc_dp_shard_path(char *buf, size_t cap, const char *dir, int rank, int world);
mmc_status mmc_dp_write_shard(const mmc_dp *d, const char *const *names, const char *dir);
/* params[i]: the i-th parameter given to mmc_dp_new (its shape goes into the manifest) */
mmc_status mmc_dp_write_manifest(const mmc_dp *d, const char *const *names, mmc_tensor *const *params,
                                 const char *dir);
/* True when DIR holds optimizer_manifest.json (a sharded checkpoint). */
bool mmc_dp_checkpoint_sharded(const char *dir);
/* Every shard the manifest lists is present (else MMC_ERR_NOT_FOUND naming the missing file);
 * world / zero (may be NULL) receive the layout the checkpoint was written with. */
mmc_status mmc_dp_check_shards(const char *dir, int *world, int *zero);
/* Full per-parameter moments m[i] / v[i] (numel of params[i] each) of the n parameters named
 * names[i], reassembled from every shard whatever layout wrote them (resharding). */
mmc_status mmc_dp_read_sharded_state(const char *dir, const char *const *names, mmc_tensor *const *params, int n,
                                     float **m, float **v);
/* True when DIR is a ZeRO-3 checkpoint: the trainable parameters are in the shards (param.*),
 * the untrained ones in model.frozen.safetensors, and there is no model.safetensors. */
bool mmc_dp_checkpoint_params_sharded(const char *dir);
/* The full values of the n parameters named names[i] from the shards, into params[i]->data
 * (full f32 tensors), whatever layout wrote them. */
mmc_status mmc_dp_read_sharded_params(const char *dir, const char *const *names, mmc_tensor *const *params, int n);
/* Write out_path (safetensors) with every parameter of a ZeRO-3 checkpoint: the trained ones
 * reassembled from the shards, the rest from model.frozen.safetensors (zero_to_fp32). */
mmc_status mmc_dp_consolidate(const char *dir, const char *out_path, int *n_tensors);

#ifdef __cplusplus
}
#endif
#endif
