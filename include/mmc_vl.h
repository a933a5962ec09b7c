/* mmc_vl.h — Qwen2-VL and Qwen2.5-VL: the vision towers and the full vision-language model
 * (transformers' Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration).
 *
 * The vision tower maps pre-flattened patches (pixel_values [N, Cin*kt*p*p], as the HF image
 * processor emits them, with image_grid_thw) to one embedding per spatial_merge^2 patches in
 * the language model's hidden size. The full model places those embeddings at the
 * <|image_pad|> / <|video_pad|> token positions, computes M-RoPE position ids the way
 * transformers' get_rope_index does, and runs the Qwen2 decoder (mmc_models.h).
 *
 * Checkpoints are read in both weight layouts (the Hub's visual.* / model.* / lm_head, and
 * transformers >= 4.52's model.visual.* / model.language_model.* / lm_head) and both config
 * layouts (flat text fields + rope_scaling, or nested text_config + rope_parameters).
 */
#ifndef MMC_VL_H
#define MMC_VL_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_infer.h"
#include "mmc_models.h"
#include "mmc_lora.h"
#include "mmc_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MMC_VL_QWEN2 = 0, MMC_VL_QWEN2_5 = 1 } mmc_vl_arch;

/* mmc_act (the vision tower's hidden_act): mmc_ops.h */

/* ---------------------------------------------------------------- vision tower */
#define MMC_VISION_MAX_FULLATT 64
typedef struct {
    mmc_vl_arch arch;
    int64_t depth;
    int64_t embed_dim;            /* Cv: Qwen2-VL embed_dim, Qwen2.5-VL hidden_size */
    int64_t num_heads;            /* H; head dim Dv = Cv / H */
    int64_t intermediate_size;    /* Fv: Qwen2-VL embed_dim * mlp_ratio */
    int64_t out_hidden_size;      /* the LM hidden size (Qwen2-VL vision hidden_size) */
    int64_t in_channels, patch_size, temporal_patch_size, spatial_merge_size;
    int64_t window_size;          /* Qwen2.5-VL window attention, in pixels */
    int fullatt[MMC_VISION_MAX_FULLATT]; /* Qwen2.5-VL blocks with full attention */
    int n_fullatt;
    double tokens_per_second;     /* Qwen2.5-VL video temporal position scale */
    double rope_theta;            /* 10000 */
    mmc_act act;
} mmc_vision_config;

typedef struct {
    mmc_tensor *norm1_w, *norm1_b;   /* [Cv]; biases only for Qwen2-VL (LayerNorm) */
    mmc_linear_w qkv;                /* w [3Cv, Cv], b [3Cv] (fused q, k, v) */
    mmc_linear_w proj;               /* w [Cv, Cv], b [Cv] */
    mmc_tensor *norm2_w, *norm2_b;   /* [Cv] */
    mmc_linear_w fc1, fc2;           /* Qwen2-VL: w [Fv, Cv] / [Cv, Fv], with biases */
    mmc_linear_w gate, up, down;     /* Qwen2.5-VL: w [Fv, Cv] / [Fv, Cv] / [Cv, Fv], with biases */
    struct mmc_comm *tp;             /* tensor parallelism (mmc_vision_shard_tp) or NULL */
} mmc_vision_block;

typedef struct {
    mmc_vision_config cfg;
    mmc_tensor *patch_w;             /* [Cv, Cin, kt, p, p] */
    mmc_vision_block *blocks;        /* [depth] */
    mmc_tensor *ln_q_w, *ln_q_b;     /* [Cv]; bias only for Qwen2-VL */
    mmc_linear_w mlp0;               /* merger.mlp.0: w [Cv*m^2, Cv*m^2], b [Cv*m^2] */
    mmc_linear_w mlp2;               /* merger.mlp.2: w [Co, Cv*m^2], b [Co] */
    mmc_tensor **params;             /* every parameter (owned) */
    char (*param_names)[96];         /* HF names without the "visual." prefix */
    int n_params;
    bool recompute;                  /* training: checkpoint each block (mmc_checkpoint) */
    struct mmc_comm *tp;             /* tensor-parallel group (not owned) or NULL */
    signed char *param_split;        /* [n_params] with tp: split code of each parameter (mmc_tp.h) */
} mmc_vision;

/* Read vision_config from a parsed config.json (either layout). */
mmc_status mmc_vision_config_read(const mmc_json *root, mmc_vl_arch arch, mmc_vision_config *out);
/* Bind the tower's weights under `prefix` ("visual." or "model.visual."). Every missing or
 * mis-shaped tensor is reported. With trainable = false f32/bf16 weights stay zero-copy in st
 * (which must outlive the tower). */
mmc_status mmc_vision_load_from(mmc_st *st, const mmc_vision_config *cfg, const char *prefix,
                                bool trainable, mmc_vision **out);
/* Fresh tower with random init (matrices normal(0, 0.02), biases normal(0, 0.02), norms 1), f32. */
mmc_status mmc_vision_new(const mmc_vision_config *cfg, uint64_t seed, mmc_vision **out);
void mmc_vision_free(mmc_vision *v);
/* Inference: pre-pack the tower's linears for the GEMM (mmc_prepack_linears, mmc_nn.h); the packed
 * copies replace the weights in v->params. Nothing under MMC_PREPACK=0 or tensor parallelism. */
mmc_status mmc_vision_prepack(mmc_vision *v, int *n_linears, int64_t *bytes_before, int64_t *bytes_after);
/* Tensor parallelism (mmc_tp.h): can tp ranks split this tower (tp divides num_heads and
 * intermediate_size)? If not, *why says which (for the log) and the tower stays replicated. */
bool mmc_vision_tp_ok(const mmc_vision_config *cfg, int tp, char *why, size_t cap);
/* This rank's shard of a full f32 tower: qkv split per third on rows (MMC_TP_FUSED3, whole
 * heads), proj and fc2 / down on columns (row-parallel), fc1 / gate / up on rows; norms, the
 * patch embedding and the merger replicated. */
mmc_status mmc_vision_shard_tp(mmc_vision *full, struct mmc_comm *tp, mmc_vision **out);
/* pixels [N, Cin*kt*p*p] (f32) for n grids (t, h, w) = grid_thw[3i..3i+2], N = sum t*h*w
 * -> [N / m^2, Co], in the images' token order. In grad mode with v->recompute, each block
 * that has something to train (its own parameters or LoRA adapters, or a patch embedding
 * that requires grad upstream) is checkpointed: its forward keeps only its output and its
 * backward re-runs it (a frozen tower records nothing either way). hidden (may be NULL) receives the last block's
 * output [N, Cv] (for Qwen2.5-VL in window order, as transformers' last_hidden_state).
 * Fails (MMC_ERR_SHAPE / MMC_ERR_INVALID) on a pixel count or grid that does not fit. */
mmc_status mmc_vision_forward(mmc_ctx *ctx, mmc_vision *v, mmc_tensor *pixels, const int64_t *grid_thw,
                              int n, mmc_tensor **out, mmc_tensor **hidden);
/* Qwen2.5-VL window attention (transformers' get_vision_window_index): window_index [N / m^2]
 * (merged-token permutation) and cu_window_seqlens [*n_windows + 1] (in patches, empty windows
 * dropped). Caller frees both with free(). */
mmc_status mmc_vision_window_index(const mmc_vision_config *cfg, const int64_t *grid_thw, int n,
                                   int64_t **window_index, int32_t **cu_seqlens, int *n_windows);

/* ---------------------------------------------------------------- full model */
typedef struct mmc_qwen2_vl {
    mmc_vl_arch arch;
    mmc_vision *visual;
    mmc_qwen2 *lm;
    int64_t image_token_id, video_token_id, vision_start_token_id;
    bool hub_layout;                 /* weights named visual.* / model.* (else model.visual.* ...) */
    mmc_st *st;                      /* kept open for zero-copy weights */
    mmc_lora_set *adapter;           /* PEFT adapter applied at inference (owned), or NULL */
    struct mmc_comm *vision_share;   /* per-modality plan (mmc_hetero.h): the tower (whole on every member)
                                      * encodes only this rank's share of a batch's images, the features
                                      * all-gathered over this group (the LM's tp group, or its cp group
                                      * under context parallelism); NULL: all of them */
    int64_t share_images, share_patches;  /* under vision_share: the images and patches this rank encoded */
    /* A source of ready features, asked first by mmc_qwen2_vl_encode (the per-modality plan under
     * pipeline parallelism, trainer_pp_hetero.c: every rank encoded its share of the step's images
     * before the pipeline ran, the first stage received them): the n grids' features [rows, Co], or
     * MMC_ERR_NOT_FOUND (no message) when it has none for these grids: the tower runs here. */
    mmc_status (*encode_hook)(void *arg, mmc_ctx *ctx, const int64_t *grid, int n, mmc_tensor **feats);
    void *encode_hook_arg;
} mmc_qwen2_vl;

/* Images and videos of one prompt batch. Grids are consumed in order, across the batch. */
typedef struct {
    mmc_tensor *pixel_values;        /* [Ni, Cin*kt*p*p] f32, or NULL */
    const int64_t *image_grid_thw;   /* [n_images][3] */
    int n_images;
    mmc_tensor *pixel_values_videos; /* [Nv, Cin*kt*p*p] f32, or NULL */
    const int64_t *video_grid_thw;   /* [n_videos][3] */
    int n_videos;
    const double *second_per_grid_ts;/* [n_videos] or NULL (1.0 each); Qwen2.5-VL only */
} mmc_vl_media;

/* Load from an HF directory (config.json + safetensors); model_type qwen2_vl or qwen2_5_vl. */
mmc_status mmc_qwen2_vl_load(const char *dir, bool trainable, mmc_qwen2_vl **out);
/* Tensor parallelism (mmc_tp.h): the same with the language model split over tp (its slices
 * only are bound: mmc_qwen2_load_from_tp) and the vision tower split too when tp divides its
 * heads and MLP (mmc_vision_tp_ok; trainable only), else replicated; tp NULL = load. */
mmc_status mmc_qwen2_vl_load_tp(const char *dir, bool trainable, struct mmc_comm *tp, mmc_qwen2_vl **out);
/* Replace m's (full, f32) language model (and vision tower, as above) by this rank's tp shard,
 * e.g. after mmc_qwen2_vl_new. */
mmc_status mmc_qwen2_vl_shard_tp(mmc_qwen2_vl *m, struct mmc_comm *tp);
/* The same two with split_tower false: only the language model is split, the tower stays whole
 * (a per-modality plan: the tower data-parallel, see vision_share). */
mmc_status mmc_qwen2_vl_load_tp_ex(const char *dir, bool trainable, struct mmc_comm *tp, bool split_tower,
                                   mmc_qwen2_vl **out);
mmc_status mmc_qwen2_vl_shard_tp_ex(mmc_qwen2_vl *m, struct mmc_comm *tp, bool split_tower);
void mmc_qwen2_vl_free(mmc_qwen2_vl *m);
/* The merged features [sum t h w / m^2, out_hidden] of n images (or videos) through the tower:
 * mmc_vision_forward, or under m->vision_share this rank's share encoded and the rows all-gathered. */
mmc_status mmc_qwen2_vl_encode(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *pixels, const int64_t *grid, int n,
                               mmc_tensor **feats);
/* The tower's share of a per-modality plan (mmc_hetero.h): the n images shared out over g by patch
 * count, this rank's run encoded with the whole tower, the merged features all-gathered over g in
 * image order (every member the same [sum t h w / m^2, out_hidden]); the images and patches this
 * rank encoded are added to *n_images and *n_patches. Collective over g. */
mmc_status mmc_vision_forward_shared(mmc_ctx *ctx, struct mmc_comm *g, mmc_vision *visual, mmc_tensor *pixels,
                                     const int64_t *grid, int n, mmc_tensor **feats, int64_t *n_images,
                                     int64_t *n_patches);
/* Inference: pre-pack the language model's and the tower's linears (mmc_qwen2_prepack,
 * mmc_vision_prepack); counts added to (each may be NULL). */
mmc_status mmc_qwen2_vl_prepack(mmc_qwen2_vl *m, int *n_linears, int64_t *bytes_before, int64_t *bytes_after);

/* M-RoPE positions as transformers' get_rope_index (5.x): text runs count up by one; an
 * image/video run of t*h*w/m^2 placeholders gets (t*interval, h, w) positions offset by the
 * run's start, and the text after it continues at start + max(h, w)/m. ids [B, T]
 * (row-major) -> pos [3, B, T], deltas [B] (max position + 1 - T). Fails with a message giving
 * both counts when placeholders and grids disagree. */
mmc_status mmc_qwen2_vl_rope_index(const mmc_qwen2_vl *m, const int32_t *ids, int64_t B, int64_t T,
                                   const mmc_vl_media *media, int64_t *pos, int64_t *deltas);

/* Forward: ids [B, T] (i32/i64) -> hidden [B, T, C] after the final norm.
 * Prefill (kv NULL or empty): the vision towers run on media (may be NULL for text), their
 * outputs replace the placeholder embeddings, positions come from get_rope_index and
 * rope_deltas [B] is written (if not NULL). Decode (kv->len > 0): positions are
 * kv->len + t + rope_deltas[b] on all three axes, and media must be NULL. */
mmc_status mmc_qwen2_vl_forward(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                                mmc_kv_cache *kv, int64_t *rope_deltas, mmc_tensor **hidden);
/* Training layouts (mmc_data.h's mmc_batch): right-padded rows need nothing extra (pads come
 * last and are never seen by real tokens); a packed row (B == 1) gives cu_seqlens [n_seqs + 1]
 * (cu_seqlens[n_seqs] <= T; the tail is padding): attention is block-diagonal causal and the
 * M-RoPE positions restart in every segment. position_ids [3, B, T], if given, are used as they are. */
typedef struct {
    const int64_t *position_ids;     /* [3, B, T] or NULL (computed as get_rope_index does) */
    const int32_t *cu_seqlens;       /* packed row: [n_seqs + 1], else NULL */
    int n_seqs;
} mmc_vl_seq;
mmc_status mmc_qwen2_vl_forward_ex(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                                   const mmc_vl_seq *seq, mmc_kv_cache *kv, int64_t *rope_deltas,
                                   mmc_tensor **hidden);
/* The decoder's inputs as mmc_qwen2_vl_forward_ex computes them: the token embeddings with the
 * vision features at the placeholders -> *embeds [B, T, C] (embeds NULL: neither the embedding
 * nor the towers run — a later pipeline stage, mmc_pp.h, needs only the positions), the M-RoPE
 * tables *cos, *sin [B, T, D] and the attention options (a packed row's blocks, in ctx's arena). */
mmc_status mmc_qwen2_vl_inputs(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *ids, const mmc_vl_media *media,
                               const mmc_vl_seq *seq, mmc_kv_cache *kv, int64_t *rope_deltas, mmc_tensor **embeds,
                               mmc_tensor **cos, mmc_tensor **sin, mmc_attn_opts *attn);
/* Fresh model with random init (both parts f32, mmc_vision_new / mmc_qwen2_new) from a parsed
 * config.json (`what` names it in messages). */
mmc_status mmc_qwen2_vl_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_qwen2_vl **out);
/* hidden [..., C] -> logits [..., V] */
mmc_tensor *mmc_qwen2_vl_logits(mmc_ctx *ctx, mmc_qwen2_vl *m, mmc_tensor *hidden);

/* Every linear module (vision tower, merger, language model) with the module names
 * transformers >= 4.52 uses ("model.visual.blocks.N.attn.qkv",
 * "model.language_model.layers.N.self_attn.q_proj", ...), for LoRA targets and PEFT files. */
mmc_status mmc_qwen2_vl_linears(mmc_qwen2_vl *m, mmc_module_list *out);
/* Apply a PEFT LoRA adapter (vision tower, merger and/or language model modules) at
 * inference, as mmc_qwen2_attach_adapter does for the text model. */
mmc_status mmc_qwen2_vl_attach_adapter(mmc_qwen2_vl *m, const char *adapter_dir);

/* One generation request as a decoder (mmc_models.h): the prefill runs the vision towers on
 * media (may be NULL) and keeps the prompt's rope_deltas, which offset every decoded
 * position as in transformers. The request must outlive the decoder's use. */
typedef struct {
    mmc_qwen2_vl *m;
    const mmc_vl_media *media;
    int64_t rope_delta;          /* written by the prefill */
} mmc_qwen2_vl_request;
mmc_decoder mmc_qwen2_vl_decoder(mmc_qwen2_vl_request *r);

#ifdef __cplusplus
}
#endif
#endif /* MMC_VL_H */
