/* encoder_common.h — what the text encoders (clip_text.c, t5.c) share and no public header
 * needs: a weight binder that lists every missing or mis-shaped tensor, the per-layer
 * release of intermediates, activations by name, input checks, and an attention with a key
 * padding mask and an additive per-head bias (T5's relative positions), which mmc_attention
 * does not take. Inference only. */
#ifndef MMC_ENCODER_COMMON_H
#define MMC_ENCODER_COMMON_H

#include "mmc_encoders.h"
#include "mmc_models.h"

typedef struct {
    mmc_st *st;
    mmc_tensor **params;      /* every bound tensor, owned (freed by enc_params_free) */
    int n_params, cap;
    char *errs;               /* one line per problem, the first ENC_MAX_LISTED of them */
    size_t errcap;
    int bad;
} enc_weights;

/* Open dir's model.safetensors (or its index); NOT_FOUND naming dir when absent. */
mmc_status enc_weights_open(const char *dir, enc_weights *w);
/* Bind "<prefix><name>" of the given shape to *slot, or record the problem. */
void enc_bind(enc_weights *w, const char *prefix, const char *name, mmc_tensor **slot, int ndim, const int64_t *shape);
/* After binding: MMC_ERR_FORMAT listing the problems ("<dir>: <cls> weights: N problems: ..."). */
mmc_status enc_bind_status(const enc_weights *w, const char *dir, const char *cls);
void enc_weights_close(enc_weights *w);
int64_t enc_weights_count(const enc_weights *w);

/* Without a tape, drop everything allocated in the activation arena after m except y. */
mmc_tensor *enc_keep(mmc_ctx *ctx, mmc_arena_mark m, mmc_tensor *y);
mmc_tensor *enc_act(mmc_ctx *ctx, mmc_act a, mmc_tensor *x);
/* ids [B, T] and mask [B, T] (or NULL) integer tensors with ids in [0, vocab) and T <= max_t. */
mmc_status enc_check_inputs(const mmc_tensor *ids, const mmc_tensor *mask, int64_t vocab, int64_t max_t,
                            const char *what);
int64_t enc_int_at(const mmc_tensor *t, int64_t i);   /* flat element of an i32 / i64 tensor */

/* softmax(scale * q k^T + bias [+ causal] [+ key mask]) v, per batch and head:
 * q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv] (contiguous) -> [B, T, H, Dv].
 * rel_bias: a bias that depends on the key - query offset only (T5's relative positions),
 * [H, T + S - 1] with score(t, s) += rel_bias[h, s - t + T - 1]; H * (T + S) floats where a full
 * [H, T, S] table would take 64 MiB for T5-XXL's 64 heads at 512 tokens. NULL for none.
 * mask [B, S] (nonzero keeps the key) or NULL. A query that sees no key attends uniformly to
 * all S, as the additive finfo.min mask of transformers makes it. */
mmc_tensor *enc_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v, float scale, bool causal,
                          const mmc_tensor *mask, const float *rel_bias);

#endif
