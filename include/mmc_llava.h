/* mmc_llava.h — LLaVA-1.5 (transformers' LlavaForConditionalGeneration, model_type "llava"):
 * a CLIP ViT vision tower (CLIPVisionModel), a two-layer multi_modal_projector and a Llama
 * language model (mmc_models.h's decoder with Llama's flags, llama.c).
 *
 * The tower maps pixel_values [N, 3, S, S] (CLIPImageProcessor's output, S = image_size) to
 * its hidden states; the model selects vision_feature_layer (an index or a list, negative
 * counting from the end), drops the CLS token ("default") or keeps it ("full"), projects the
 * features to the LM's hidden size and puts them at the <image> token positions (the processor
 * has expanded each <image> into one token per feature). Checkpoints are read in each weight
 * layout met in practice: the Hub's 4.4x (vision_tower.vision_model.*, multi_modal_projector.*,
 * language_model.model.*, language_model.lm_head.*), transformers 4.52-4.57's
 * (model.vision_tower.vision_model.*, model.multi_modal_projector.*, model.language_model.*,
 * lm_head.*) and 5.x save_pretrained's (the 4.4x names with the tower as vision_tower.*).
 * Training (llava_train.c): the causal-LM loss of a data-pipeline batch with gradients through
 * the projector and the language model (and the CLIP tower when its weights require grad), the parameters under the
 * names save_pretrained writes, and the linears under PEFT's module names for LoRA.
 */
#ifndef MMC_LLAVA_H
#define MMC_LLAVA_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_encoders.h"
#include "mmc_models.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- CLIP vision tower */
typedef struct {
    int64_t hidden_size;          /* Cv */
    int64_t intermediate_size;    /* Fv */
    int64_t num_hidden_layers, num_attention_heads;
    int64_t num_channels, image_size, patch_size;   /* S = image_size, p = patch_size */
    double layer_norm_eps;
    mmc_act hidden_act;           /* quick_gelu for OpenAI's CLIP */
} mmc_clip_vision_config;

typedef struct mmc_clip_vision mmc_clip_vision;

/* From a vision_config object (CLIPVisionConfig's defaults for what it omits); `what` names it. */
mmc_status mmc_clip_vision_config_read(const mmc_json *vc, const char *what, mmc_clip_vision_config *out);
const mmc_clip_vision_config *mmc_clip_vision_cfg(const mmc_clip_vision *v);
/* pixels [N, Cin, S, S] f32 -> hidden states hs[0 .. n_layers] [N, 1 + (S/p)^2, Cv]: hs[0] the
 * embeddings after pre_layrnorm, hs[i] the output of layer i (transformers' hidden_states);
 * only the first n_layers layers run (n_layers <= num_hidden_layers). *hs is in ctx's arena.
 * MMC_ERR_SHAPE naming the sizes when pixels do not fit. */
mmc_status mmc_clip_vision_forward(mmc_ctx *ctx, mmc_clip_vision *v, mmc_tensor *pixels, int n_layers,
                                   mmc_tensor ***hs);

/* ---------------------------------------------------------------- LLaVA */
#define MMC_LLAVA_MAX_FEATURE_LAYERS 16
typedef struct mmc_llava {
    mmc_clip_vision *vision;
    mmc_qwen2 *lm;                /* Llama (mmc_llama_config_read's flags) */
    mmc_linear_w proj1;           /* multi_modal_projector.linear_1: w [C, Cv * n_feature_layers], b [C] */
    mmc_linear_w proj2;           /* multi_modal_projector.linear_2: w [C, C], b [C] */
    mmc_act proj_act;             /* projector_hidden_act (gelu) */
    int64_t image_token_id;       /* image_token_id (5.x) / image_token_index (4.4x) */
    int feature_layers[MMC_LLAVA_MAX_FEATURE_LAYERS];   /* indices into hs[], made non-negative */
    int n_feature_layers;
    bool feature_full;            /* vision_feature_select_strategy "full": keep the CLS token */
    bool hub_layout;              /* language model under language_model.model. (4.4x / 5.x saves) */
    struct mmc_lora_set *adapter; /* a PEFT adapter attached at inference (mmc_llava_attach_adapter) */
    void *weights;                /* the tower's and projector's bound tensors (internal) */
} mmc_llava;

/* Load from an HF directory (config.json + safetensors), model_type "llava". */
mmc_status mmc_llava_load(const char *dir, mmc_llava **out);
/* The same; trainable: every weight is an owned f32 copy (the trainer updates them in place). */
mmc_status mmc_llava_load_ex(const char *dir, bool trainable, mmc_llava **out);
/* Fresh model with random init (f32: matrices normal(0, 0.02), norms 1, biases 0) from a parsed
 * config.json (`what` names it in messages); for benchmarks. */
mmc_status mmc_llava_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_llava **out);
void mmc_llava_free(mmc_llava *m);
/* Features (and so <image> tokens) per image: (S/p)^2, plus one with "full". */
int64_t mmc_llava_image_tokens(const mmc_llava *m);
/* pixels [N, 3, S, S] -> projected features [N * image_tokens, C]. */
mmc_status mmc_llava_image_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, mmc_tensor **out);
/* ids [B, T] (i32/i64) -> hidden [B, T, C] after the final norm. Prefill (kv NULL or empty):
 * with pixels (may be NULL) the projected features replace the <image> embeddings in order
 * (their count must equal the number of <image> tokens); positions are kv->len + t. */
mmc_status mmc_llava_forward(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                             mmc_tensor **hidden);
mmc_tensor *mmc_llava_logits(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *hidden);   /* [..., C] -> [..., V] */

/* One generation request as a decoder (mmc_models.h): the prefill runs the tower on pixels. */
typedef struct {
    mmc_llava *m;
    mmc_tensor *pixels;           /* [N, 3, S, S] or NULL */
} mmc_llava_request;
mmc_decoder mmc_llava_decoder(mmc_llava_request *r);

/* ---------------------------------------------------------------- training (llava_train.c)
 * Every parameter with the name transformers 5's save_pretrained writes: vision_tower.* (as the
 * checkpoint had it, without a leading "model."), multi_modal_projector.*,
 * language_model.model.*, language_model.lm_head.weight. *params / *names malloc'd (the name
 * strings too: free each, then the arrays); the tensors stay the model's. */
mmc_status mmc_llava_params(mmc_llava *m, mmc_tensor ***params, char ***names, int *n);
/* The linears LoRA may adapt, with PEFT's module names on transformers 5's model:
 * model.language_model.layers.N.{self_attn.q/k/v/o_proj, mlp.gate/up/down_proj},
 * model.multi_modal_projector.linear_1 / linear_2 (the tower's attention / MLP are plain tensors
 * of the shared CLIP layer, not LoRA-able linears: not listed). */
struct mmc_module_list;
mmc_status mmc_llava_linears(mmc_llava *m, struct mmc_module_list *out);
/* A PEFT adapter directory on the model at inference (mmc_lora_load; freed with the model). */
mmc_status mmc_llava_attach_adapter(mmc_llava *m, const char *adapter_dir);

#ifdef __cplusplus
}
#endif
#endif /* MMC_LLAVA_H */
