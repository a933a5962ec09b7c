/* mmc_lora.h — LoRA adapters on a model's linear layers, in PEFT's format (mirrors
 * peft.tuners.lora: LoraConfig, LoraModel, save_pretrained / from_pretrained):
 *   y = base(x) + (alpha / r) · B(A(dropout(x)))      (alpha / sqrt(r) with use_rslora)
 * A [r, K] ~ kaiming_uniform(a = sqrt(5)) (U(-1/sqrt(K), 1/sqrt(K))), B [N, r] = 0.
 *
 * A model exposes its linear modules with their Hugging Face module names (e.g.
 * "model.layers.0.self_attn.q_proj", "model.visual.blocks.0.attn.qkv") through an
 * mmc_module_list; targets select among them:
 *   - a plain name ("q_proj") matches a module whose name is it or ends with ".q_proj"
 *     (PEFT's list semantics);
 *   - a glob with * ? [ ] ("model.layers.*.self_attn.q_proj") matches the full name;
 *   - "re:<regex>" is a POSIX extended regex matched against the whole name (PEFT's
 *     string form of target_modules).
 * Attaching freezes the base weights and biases of adapted modules (their REQUIRES_GRAD
 * cleared); adapter tensors are persistent, trainable parameters.
 * Saved files: adapter_config.json + adapter_model.safetensors with keys
 * "base_model.model.<module>.lora_A.weight" / ".lora_B.weight". Loading also accepts
 * adapters saved against the other Qwen2-VL naming ("model.layers." vs
 * "model.language_model.layers.", "visual." vs "model.visual."). */
#ifndef MMC_LORA_H
#define MMC_LORA_H

#include "mmc.h"
#include "mmc_nn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_MODULE_NAME 128

/* A model's linear modules and their HF module names (no ".weight"). */
typedef struct mmc_module_list {
    mmc_linear_w **mods;
    char (*names)[MMC_MODULE_NAME];
    int n, cap;
} mmc_module_list;

mmc_status mmc_module_list_add(mmc_module_list *ml, mmc_linear_w *l, const char *name);
void mmc_module_list_free(mmc_module_list *ml);

typedef struct {
    int r;
    float alpha;
    float dropout;
    bool use_rslora;
    const char *const *targets;   /* names / globs / "re:" regexes */
    int n_targets;
    uint64_t seed;                /* init of A */
} mmc_lora_config;

typedef struct mmc_lora_set {
    int r;
    float alpha, dropout;
    bool use_rslora;
    char **targets;               /* as configured (for adapter_config.json) */
    int n_targets;
    int n;                        /* adapted modules */
    mmc_linear_w **mods;          /* [n] */
    char (*names)[MMC_MODULE_NAME]; /* [n] */
    mmc_lora *adapters;           /* [n]; mods[i]->lora == &adapters[i] */
    mmc_tensor **params;          /* [2n] A0, B0, A1, B1, ... (names "<module>.lora_A.weight") */
    int n_params;
} mmc_lora_set;

/* True if module `name` is selected by target t (rules above). */
bool mmc_lora_target_match(const char *t, const char *name);

/* Attach adapters to every module matching a target. Fails (MMC_ERR_INVALID) if no module
 * matches, naming the targets and a few module names. */
mmc_status mmc_lora_attach(const mmc_module_list *ml, const mmc_lora_config *cfg, mmc_lora_set **out);
/* Remove the adapters from the modules (base weights stay frozen) and free them. */
void mmc_lora_free(mmc_lora_set *s);

/* Keep only the adapters i with keep[i] (a pipeline stage keeps its layers'), freeing the others'
 * A and B and detaching them from their modules; the kept ones keep their dropout streams. */
void mmc_lora_keep(mmc_lora_set *s, const bool *keep);

/* Write dir/adapter_config.json and dir/adapter_model.safetensors (created atomically;
 * dir is created if missing). base_model may be NULL. */
mmc_status mmc_lora_save(const mmc_lora_set *s, const char *dir, const char *base_model);
/* The same with PEFT's task_type ("CAUSAL_LM" above; NULL writes null: PeftModel.from_pretrained then wraps
 * any module, e.g. a diffusers transformer, in a plain PeftModel). */
mmc_status mmc_lora_save_task(const mmc_lora_set *s, const char *dir, const char *base_model, const char *task_type);
/* Read a PEFT LoRA adapter directory and attach it (trainable: adapter params require
 * grad). Every adapter module must exist in ml, else an error names the missing ones. */
mmc_status mmc_lora_load(const char *dir, const mmc_module_list *ml, bool trainable, mmc_lora_set **out);

/* diffusers' LoRA format for a pipeline component ("transformer"): dir/pytorch_lora_weights.safetensors
 * with "<component>.<module>.lora_A.weight" / ".lora_B.weight" keys and the LoraConfig in the
 * "lora_adapter_metadata" __metadata__ entry (keys "<component>.r", ".lora_alpha", ...), as
 * save_lora_weights writes it and load_lora_weights reads it. Loading takes that directory or a
 * .safetensors path; without metadata alpha = r (scale 1); weight multiplies the scale (as
 * set_adapters' weights). One rank per file; DoRA and kohya-style keys are errors that say so. */
mmc_status mmc_lora_save_diffusers(const mmc_lora_set *s, const char *dir, const char *component);
mmc_status mmc_lora_load_diffusers(const char *path, const char *component, const mmc_module_list *ml, float weight,
                                   bool trainable, mmc_lora_set **out);

/* W += scale · B [N, r] · A [r, K] on a weight W [N, ...] of N x K values (a linear's [N, K], a 1x1 convolution's
 * [N, K, 1, 1]) in f32: a view of a checkpoint, or another dtype, becomes an f32 copy W owns. `what` names it. */
mmc_status mmc_lora_merge_tensor(mmc_tensor *W, const mmc_tensor *A, const mmc_tensor *B, float scale, const char *what);
/* Adapters from tensors already read (f32, contiguous: A [r, K], B [N, r]), each on module ml->mods[module] with
 * its own rank and scale (y = base(x) + scale · B(A(x))), not trainable: what a kohya / A1111 file converts to
 * (src/nn/lora_convert.c). Shapes that do not fit the module are MMC_ERR_SHAPE naming it. */
typedef struct {
    int module;                   /* index into the module list */
    const mmc_tensor *A, *B;
    float scale;                  /* alpha / r x the adapter weight */
} mmc_lora_item;
mmc_status mmc_lora_set_build(const mmc_module_list *ml, const mmc_lora_item *items, int n, mmc_lora_set **out);

/* ---- inference on an adapter directory (no `mmc merge` needed)
 * True if dir holds a PEFT adapter (dir/adapter_config.json exists). */
bool mmc_lora_is_adapter_dir(const char *dir);
/* Which base model and which adapter a user means by --model / --adapter:
 *  - adapter NULL, model a plain model directory: base = model, no adapter (adir = "");
 *  - adapter NULL, model an adapter directory (e.g. a LoRA training checkpoint): adir = model,
 *    base = its adapter_config.json's base_model_name_or_path;
 *  - adapter given: adir = adapter, base = model, or the adapter's base_model_name_or_path
 *    when model is NULL (model must not itself be an adapter directory).
 * A relative base_model_name_or_path is tried as given (from the working directory), then
 * relative to the adapter directory; the base must hold a config.json. Errors say which
 * paths were tried and how to name the base explicitly (--model BASE --adapter DIR). */
mmc_status mmc_lora_resolve(const char *model, const char *adapter, char *base, size_t base_cap, char *adir,
                            size_t adir_cap);

/* Scale of an adapter config: alpha / r, or alpha / sqrt(r) with rsLoRA. */
float mmc_lora_scale(int r, float alpha, bool use_rslora);
/* "model.language_model.layers.0.mlp.up_proj" and "model.layers.0.mlp.up_proj" both map to
 * "lm.layers.0.mlp.up_proj"; "model.visual.x" and "visual.x" to "visual.x"; LLaVA's
 * "model.vision_tower.x", "model.vision_tower.vision_model.x" and "vision_tower.vision_model.x" to
 * "vision_tower.x". */
void mmc_lora_canonical_name(const char *name, char *out, size_t cap);

/* Read adapter_config.json (r, lora_alpha, lora_dropout, use_rslora; unsupported PEFT
 * options — DoRA, rank/alpha patterns, biases, fan_in_fan_out — are errors). */
mmc_status mmc_lora_read_config(const char *dir, int *r, float *alpha, float *dropout, bool *use_rslora);

/* W [N, K] += scale · B [N, r] · A [r, K] (f32). */
void mmc_lora_merge_into(float *W, const float *A, const float *B, int64_t N, int64_t K, int64_t r,
                         float scale);

#ifdef __cplusplus
}
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Fold a PEFT LoRA adapter into a Hugging Face model directory (peft's merge_and_unload):
 * every adapted "<module>.weight" becomes W + scale · B·A (computed in f32, stored in W's
 * dtype); every other tensor is copied unchanged (vision tower, norms, embeddings ...),
 * and the non-weight files (config, tokenizer, processor, chat template, generation
 * config) are copied. Weights go to one out_dir/model.safetensors. The directory is built
 * as out_dir.tmp.<pid> and renamed into place (an existing out_dir is replaced only once
 * the new one is complete). *n_merged (may be NULL) receives the number of merged weights. */
mmc_status mmc_lora_merge_dir(const char *model_dir, const char *adapter_dir, const char *out_dir,
                              int *n_merged);
/* The weights part of it: the safetensors `weights` (a file, a sharded index or a directory as
 * mmc_st_open takes it) with the adapter folded in, written to the one file out_file (not atomic:
 * callers write into a directory they rename into place). Errors name adapter modules that
 * match no 2-D weight. */
mmc_status mmc_lora_merge_file(const char *weights, const char *adapter_dir, const char *out_file, int *n_merged);
#ifdef __cplusplus
}
#endif
