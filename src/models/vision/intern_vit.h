/* intern_vit.h — the InternViT tower's binder, for the models that embed it (internvl.c).
 * Internal to src/models/. */
#ifndef MMC_INTERN_VIT_H
#define MMC_INTERN_VIT_H

#include "mmc_internvl.h"
#include "../model_weights.h"
#include "mmc_lora.h"

/* Allocate and bind "<prefix>embeddings.*", "<prefix>encoder.layer.N.*" and, without
 * use_mean_pooling, "<prefix>layernorm.*"; problems are collected in w. NULL on out of memory. */
mmc_intern_vit *intern_vit_bind(mw_set *w, const char *prefix, const mmc_intern_vit_config *cfg);
void intern_vit_free(mmc_intern_vit *v);   /* the struct only: w owns the tensors */
const mmc_intern_vit_config *intern_vit_cfg(const mmc_intern_vit *v);
/* The linears LoRA may adapt, with PEFT's module names under prefix (transformers 5's
 * "model.vision_tower."): encoder.layer.N.attention.{q,k,v}_proj / .projection_layer, .mlp.fc1 / fc2.
 * None for OpenGVLab's layout. With an adapter on any, the forward records a tape in grad mode even
 * when the tower's own weights are frozen. */
struct mmc_module_list;
mmc_status intern_vit_linears(mmc_intern_vit *v, const char *prefix, struct mmc_module_list *out);

#endif
