/* siglip_vision.h — the SigLIP vision tower's struct and binder, for the models that embed it
 * (llava.c: LLaVA-OneVision). Internal to src/models/. */
#ifndef MMC_SIGLIP_VISION_H
#define MMC_SIGLIP_VISION_H

#include "mmc_llava.h"
#include "../encoders/encoder_common.h"

struct mmc_siglip_vision {
    mmc_siglip_vision_config cfg;
    mmc_tensor *patch_w, *patch_b;     /* embeddings.patch_embedding [Cv, Cin, p, p], [Cv] */
    mmc_tensor *pos_emb;               /* embeddings.position_embedding.weight [(S/p)^2, Cv] */
    enc_clip_layer *layers;            /* encoder.layers [num_hidden_layers] (CLIP's layer layout) */
    mmc_tensor *post_ln_w, *post_ln_b; /* post_layernorm [Cv] */
    /* head (SiglipMultiheadAttentionPoolingHead), only with vision_use_head */
    mmc_tensor *probe;                 /* head.probe [1, 1, Cv] */
    mmc_tensor *in_w, *in_b;           /* head.attention.in_proj_weight [3 Cv, Cv], in_proj_bias [3 Cv] */
    mmc_tensor *out_w, *out_b;         /* head.attention.out_proj [Cv, Cv], [Cv] */
    mmc_tensor *head_ln_w, *head_ln_b; /* head.layernorm [Cv] */
    mmc_linear_w fc1, fc2;             /* head.mlp.fc1 [Fv, Cv] + [Fv], fc2 [Cv, Fv] + [Cv] */
};

/* Allocate and bind "<prefix>embeddings.*", "<prefix>encoder.layers.N.*", "<prefix>post_layernorm.*" and,
 * with vision_use_head, "<prefix>head.*"; problems are collected in w. NULL on out of memory. */
mmc_siglip_vision *siglip_vision_bind(mw_set *w, const char *prefix, const mmc_siglip_vision_config *cfg);
void siglip_vision_free(mmc_siglip_vision *v);   /* the struct only: w owns the tensors */

#endif
