/* encoder_common.h — what the text encoders (clip_text.c, t5.c) share and no public header
 * needs: activations by name, input checks, and an attention with a key
 * padding mask and an additive per-head bias (T5's relative positions), which mmc_attention
 * does not take. Inference only. */
#ifndef MMC_ENCODER_COMMON_H
#define MMC_ENCODER_COMMON_H

#include "mmc_encoders.h"
#include "mmc_models.h"
#include "../model_weights.h"
#include "mmc_lora.h"

mmc_tensor *enc_act(mmc_ctx *ctx, mmc_act a, mmc_tensor *x);
/* ids [B, T] and mask [B, T] (or NULL) integer tensors with ids in [0, vocab) and T <= max_t. */
mmc_status enc_check_inputs(const mmc_tensor *ids, const mmc_tensor *mask, int64_t vocab, int64_t max_t,
                            const char *what);
int64_t enc_int_at(const mmc_tensor *t, int64_t i);   /* flat element of an i32 / i64 tensor */
/* A ViT's vision_config sizes: each from 1 to MMC_CONFIG_MAX_DIM, hidden a multiple of the heads,
 * image a multiple of the patch; FORMAT errors prefixed by what. */
mmc_status enc_vit_check_sizes(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t channels,
                               int64_t image, int64_t patch, const char *what);

/* softmax(scale * q k^T + bias [+ causal] [+ key mask]) v, per batch and head:
 * q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv] (contiguous) -> [B, T, H, Dv].
 * rel_bias: a bias that depends on the key - query offset only (T5's relative positions),
 * [H, T + S - 1] with score(t, s) += rel_bias[h, s - t + T - 1]; H * (T + S) floats where a full
 * [H, T, S] table would take 64 MiB for T5-XXL's 64 heads at 512 tokens. NULL for none.
 * mask [B, S] (nonzero keeps the key) or NULL. A query that sees no key attends uniformly to
 * all S, as the additive finfo.min mask of transformers makes it. */
mmc_tensor *enc_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v, float scale, bool causal,
                          const mmc_tensor *mask, const float *rel_bias);

/* CLIPEncoderLayer (models/clip/modeling_clip.py), shared by CLIP's text tower (clip_text.c,
 * causal) and vision tower (vision/clip_vision.c, bidirectional):
 *   x = x + out_proj(attn(layer_norm1(x)))    scale head_dim^-0.5
 *   x = x + fc2(act(fc1(layer_norm2(x)))) */
typedef struct {
    mmc_tensor *ln1_w, *ln1_b, *ln2_w, *ln2_b;      /* [C] */
    mmc_linear_w q, k, v, o;                        /* self_attn.{q,k,v,out}_proj [C, C] + [C] */
    mmc_linear_w fc1;                               /* mlp.fc1 [F, C] + [F] */
    mmc_linear_w fc2;                               /* mlp.fc2 [C, F] + [C] */
} enc_clip_layer;
/* Bind "<prefix>layer_norm1.weight" ... "<prefix>mlp.fc2.bias". */
void enc_clip_layer_bind(mw_set *w, const char *prefix, enc_clip_layer *L, int64_t C, int64_t F);
/* The six linears of n layers under their PEFT module names "<prefix>encoder.layers.N.self_attn.q_proj"
 * ... ".mlp.fc2" (prefix the tower's, e.g. "text_model." or "model.vision_tower.vision_model."), for
 * LoRA targets. */
mmc_status enc_clip_layers_modules(enc_clip_layer *layers, int64_t n, const char *prefix, mmc_module_list *ml);
/* clip_text.c's layers the same way, and its "text_projection" when it has one (the struct is private to it). */
mmc_status clip_text_modules(mmc_clip_text *m, const char *prefix, mmc_module_list *ml);
/* True when the layer has something to train: a weight that requires grad or a LoRA adapter. */
bool enc_clip_layer_trainable(const enc_clip_layer *L);
/* x [B, T, C] -> [B, T, C]; H heads; mask [B, T] key padding (causal only) or NULL. */
mmc_tensor *enc_clip_layer_forward(mmc_ctx *ctx, const enc_clip_layer *L, mmc_tensor *x, int64_t H, float eps,
                                   mmc_act act, bool causal, const mmc_tensor *mask);

#endif
