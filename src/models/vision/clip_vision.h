/* clip_vision.h — the CLIP vision tower's struct and binder, for the models that embed it
 * (llava.c). Internal to src/models/. */
#ifndef MMC_CLIP_VISION_H
#define MMC_CLIP_VISION_H

#include "mmc_llava.h"
#include "../encoders/encoder_common.h"

struct mmc_clip_vision {
    mmc_clip_vision_config cfg;
    mmc_tensor *patch_w;             /* embeddings.patch_embedding.weight [Cv, Cin, p, p] (no bias) */
    mmc_tensor *class_emb;           /* embeddings.class_embedding [Cv] */
    mmc_tensor *pos_emb;             /* embeddings.position_embedding.weight [1 + (S/p)^2, Cv] */
    mmc_tensor *pre_ln_w, *pre_ln_b; /* pre_layrnorm [Cv] */
    enc_clip_layer *layers;          /* encoder.layers [num_hidden_layers] */
    mmc_tensor *post_ln_w, *post_ln_b; /* post_layernorm [Cv] (the pooled output's; bound, unused) */
};

/* Allocate and bind "<prefix>embeddings.*", "<prefix>pre_layrnorm.*", "<prefix>encoder.layers.N.*",
 * "<prefix>post_layernorm.*" (prefix e.g. "model.vision_tower.vision_model."); problems are
 * collected in w. NULL on out of memory. */
mmc_clip_vision *clip_vision_bind(mw_set *w, const char *prefix, const mmc_clip_vision_config *cfg);
void clip_vision_free(mmc_clip_vision *v);   /* the struct only: w owns the tensors */

#endif
