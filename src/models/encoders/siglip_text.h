/* siglip_text.h — SigLIP's text tower (siglip_text.c), bound into a weight set the caller owns
 * (the dual encoder of vlm/clip_model.c). Internal to src/models/. */
#ifndef MMC_SIGLIP_TEXT_H
#define MMC_SIGLIP_TEXT_H

#include "encoder_common.h"

typedef struct {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
    int64_t max_position_embeddings, projection_size;
    double layer_norm_eps;
    mmc_act hidden_act;
} siglip_text_config;

typedef struct {
    siglip_text_config cfg;
    mmc_tensor *tok_emb, *pos_emb;     /* embeddings.token_embedding [V, C], position_embedding [P, C] */
    enc_clip_layer *layers;            /* encoder.layers [num_hidden_layers] (CLIP's layer layout) */
    mmc_tensor *ln_f_w, *ln_f_b;       /* final_layer_norm [C] */
    mmc_linear_w head;                 /* head [projection_size, C] + [projection_size] */
} siglip_text;

/* SiglipTextConfig from the text_config object j (transformers' defaults for absent keys); FORMAT
 * errors prefixed by what. */
mmc_status siglip_text_config_read(const mmc_json *j, const char *what, siglip_text_config *c);
/* Bind "<prefix>embeddings.*", "<prefix>encoder.layers.N.*", "<prefix>final_layer_norm.*",
 * "<prefix>head.*"; problems are collected in w. NULL on out of memory. */
siglip_text *siglip_text_bind(mw_set *w, const char *prefix, const siglip_text_config *c);
void siglip_text_free(siglip_text *t);   /* the struct only: w owns the tensors */
/* ids [B, T] (T <= max_position_embeddings), mask [B, T] or NULL -> pooler_output [B, projection_size]:
 * head(final_layer_norm(encoder(x))[:, -1]). */
mmc_status siglip_text_forward(mmc_ctx *ctx, const siglip_text *t, const mmc_tensor *ids, const mmc_tensor *mask,
                               mmc_tensor **pooled);

#endif
