/* model_weights.h — the weight set every model loader shares (internal to src/models/): open a
 * component's safetensors (single file or sharded index), bind tensors by name and shape while
 * collecting every problem rather than stopping at the first, own what was bound, and report
 * tensors of the checkpoint that the config does not use. Also the activation-arena trim the
 * inference forwards use between blocks. */
#ifndef MMC_MODEL_WEIGHTS_H
#define MMC_MODEL_WEIGHTS_H

#include "mmc_models.h"
#include "mmc_nn.h"

typedef struct {
    mmc_st *st;               /* kept open: inference weights are zero-copy views into it */
    mmc_tensor **params;      /* every bound tensor, owned */
    char (*names)[256];       /* their checkpoint names, parallel to params */
    int n_params, cap;
    char *errs;               /* one line per problem, the first MW_MAX_LISTED of them */
    size_t errcap;
    int bad;
    bool trainable;           /* bind f32 copies flagged MMC_PARAM | MMC_REQUIRES_GRAD */
    int random;               /* an mw_init kind: fresh tensors instead of a checkpoint (mw_init_random) */
    mmc_rng rng;
    int64_t init_fan_in;      /* the fan-in of the bias being bound (mw_bind_linear) */
} mw_set;

/* How fresh tensors start, as the reference libraries initialise a new model:
 *  MW_INIT_HF_NORMAL   transformers' _init_weights: matrices and embeddings N(0, 0.02), biases 0
 *  MW_INIT_TORCH_LINEAR torch's nn.Linear default (what diffusers' models keep): weights and biases
 *                       U(-1/sqrt(fan_in), 1/sqrt(fan_in))
 * norm weights ("norm" / "layrnorm" in the name) are 1 either way. */
typedef enum { MW_INIT_NONE, MW_INIT_HF_NORMAL, MW_INIT_TORCH_LINEAR } mw_init;

#define MW_MAX_LISTED 8

/* Open "<dir>/<stem>.safetensors", else "<dir>/<stem>.safetensors.index.json" (stem "model" for
 * transformers, "diffusion_pytorch_model" for diffusers); NOT_FOUND naming both when absent. */
mmc_status mw_open(const char *dir, const char *stem, mw_set *w);
/* A set over tensors already opened (a component's view of a single-file checkpoint: mmc_st_new_view);
 * the set owns st from here on, whatever the result. */
mmc_status mw_adopt(mmc_st *st, mw_set *w);
/* A set without a checkpoint (fresh models, benchmarks): every mw_bind allocates an f32 tensor of
 * the asked shape, initialised as `kind` says from a stream seeded with seed; trainable ones (set
 * w->trainable) are flagged MMC_PARAM | MMC_REQUIRES_GRAD. */
mmc_status mw_init_random(mw_set *w, uint64_t seed, mw_init kind);
/* Bind "<prefix><name>" of the given shape to *slot, or record the problem. */
void mw_bind(mw_set *w, const char *prefix, const char *name, mmc_tensor **slot, int ndim, const int64_t *shape);
/* "<prefix><name>.weight" [shape] and "<prefix><name>.bias" [shape[0]]. */
void mw_bind_wb(mw_set *w, const char *prefix, const char *name, mmc_tensor **weight, mmc_tensor **bias, int ndim,
                const int64_t *shape);
/* After binding: MMC_ERR_FORMAT listing the problems ("<dir>: <cls> weights: N problems: ..."). */
mmc_status mw_status(const mw_set *w, const char *dir, const char *cls);
/* MMC_ERR_FORMAT when the checkpoint holds a tensor nothing bound: saved from another config. */
mmc_status mw_check_unused(const mw_set *w, const char *dir, const char *cls);
void mw_close(mw_set *w);
int64_t mw_count(const mw_set *w);

/* Without a tape to feed, drop everything allocated in the activation arena after m but y. */
mmc_tensor *mw_keep(mmc_ctx *ctx, mmc_arena_mark m, mmc_tensor *y);
/* The same for n (<= 8) outputs, replaced in ys[] by contiguous copies; a no-op in grad mode. */
void mw_keep_n(mmc_ctx *ctx, mmc_arena_mark m, int n, mmc_tensor **ys);
/* An nn.Linear "<prefix><name>" [N, K] (+ bias [N] when bias) into an mmc_linear_w. */
void mw_bind_linear(mw_set *w, const char *prefix, const char *name, mmc_linear_w *l, int64_t N, int64_t K, bool bias);

#endif
