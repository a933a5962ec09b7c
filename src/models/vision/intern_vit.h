/* intern_vit.h — the InternViT tower's binder, for the models that embed it (internvl.c).
 * Internal to src/models/. */
#ifndef MMC_INTERN_VIT_H
#define MMC_INTERN_VIT_H

#include "mmc_internvl.h"
#include "../model_weights.h"

/* Allocate and bind "<prefix>embeddings.*", "<prefix>encoder.layer.N.*" and, without
 * use_mean_pooling, "<prefix>layernorm.*"; problems are collected in w. NULL on out of memory. */
mmc_intern_vit *intern_vit_bind(mw_set *w, const char *prefix, const mmc_intern_vit_config *cfg);
void intern_vit_free(mmc_intern_vit *v);   /* the struct only: w owns the tensors */
const mmc_intern_vit_config *intern_vit_cfg(const mmc_intern_vit *v);

#endif
