/* mmc_llava.h — LLaVA-1.5 (transformers' LlavaForConditionalGeneration, model_type "llava"),
 * LLaVA-NeXT (LlavaNextForConditionalGeneration, "llava_next") and LLaVA-OneVision
 * (LlavaOnevisionForConditionalGeneration, "llava_onevision"), one struct with a variant.
 * LLaVA-1.5:
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
 * Training (llava_train.c), every variant: the causal-LM loss of a data-pipeline batch with
 * gradients through the projector, NeXT / OneVision's image_newline and the language model (and
 * the CLIP / SigLIP tower when its weights require grad), the parameters under the names
 * save_pretrained writes, and the linears under PEFT's module names for LoRA.
 */
#ifndef MMC_LLAVA_H
#define MMC_LLAVA_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_encoders.h"
#include "mmc_models.h"
#include "mmc_vlproc.h"

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
/* The tower's encoder linears for LoRA, appended to ml as "<prefix>encoder.layers.N.self_attn.{q,k,v,out}_proj"
 * and "...mlp.fc1" / "...mlp.fc2" (prefix e.g. "model.vision_tower.", the live transformers 5 LLaVA's
 * names that PEFT records; 4.x's "model.vision_tower.vision_model." adapters load through mmc_lora_canonical_name). With an adapter attached, mmc_clip_vision_forward records a tape in grad
 * mode (its gradients reach the adapters) although the tower's weights stay frozen. */
struct mmc_module_list;
mmc_status mmc_clip_vision_linears(mmc_clip_vision *v, const char *prefix, struct mmc_module_list *ml);
/* A CLIPVisionModel folder on its own (config.json of model_type clip_vision_model, or a config with a
 * vision_config; weights vision_model.* as 4.x saved them, or bare as 5.x does; f32 / bf16 / f16): Wan2.1 image-to-video's image_encoder.
 * Every missing, mis-shaped or unexpected tensor is listed. */
typedef struct mmc_clip_vision_model mmc_clip_vision_model;
mmc_status mmc_clip_vision_model_load(const char *dir, mmc_clip_vision_model **out);
mmc_clip_vision *mmc_clip_vision_model_tower(mmc_clip_vision_model *m);
void mmc_clip_vision_model_free(mmc_clip_vision_model *m);

/* ---------------------------------------------------------------- SigLIP vision tower */
typedef struct {
    int64_t hidden_size, intermediate_size;         /* Cv, Fv */
    int64_t num_hidden_layers, num_attention_heads;
    int64_t num_channels, image_size, patch_size;   /* S = image_size, p = patch_size */
    double layer_norm_eps;
    mmc_act hidden_act;           /* gelu_pytorch_tanh */
    bool use_head;                /* vision_use_head: the attention-pooling head is in the checkpoint */
} mmc_siglip_vision_config;

typedef struct mmc_siglip_vision mmc_siglip_vision;

/* From a vision_config object (SiglipVisionConfig's defaults for what it omits); `what` names it. */
mmc_status mmc_siglip_vision_config_read(const mmc_json *vc, const char *what, mmc_siglip_vision_config *out);
const mmc_siglip_vision_config *mmc_siglip_vision_cfg(const mmc_siglip_vision *v);
/* pixels [N, Cin, S, S] f32 -> hs[0 .. n_layers] [N, (S/p)^2, Cv]: hs[0] the patch + position
 * embeddings, hs[i] layer i's output (the last one before post_layernorm, as transformers'
 * hidden_states). In grad mode the ops record what needs it (weights that require grad, LoRA adapters). *hs is in
 * ctx's arena. */
mmc_status mmc_siglip_vision_forward(mmc_ctx *ctx, mmc_siglip_vision *v, mmc_tensor *pixels, int n_layers,
                                     mmc_tensor ***hs);
/* The same as mmc_clip_vision_linears for the SigLIP tower's encoder layers. */
mmc_status mmc_siglip_vision_linears(mmc_siglip_vision *v, const char *prefix, struct mmc_module_list *ml);
/* SiglipVisionModel's pooler_output: the attention-pooling head over post_layernorm(last layer)
 * -> [N, Cv] (MMC_ERR_UNSUPPORTED without vision_use_head). */
mmc_status mmc_siglip_vision_pool(mmc_ctx *ctx, mmc_siglip_vision *v, mmc_tensor *pixels, mmc_tensor **out);

/* SiglipImageProcessor's class defaults in CLIPImageProcessor's form (mmc_clip_proc: a fixed
 * {height, width} resize, 224 x 224, bicubic; no centre crop; rescale 1/255; mean = std = 0.5):
 * then mmc_clip_proc_load_dir reads a saved preprocessor_config.json over them and
 * mmc_clip_preprocess applies it (PIL backend, or torchvision with resize_mode TORCH). */
void mmc_siglip_proc_default(mmc_clip_proc *p);

/* ---------------------------------------------------------------- LLaVA */
#define MMC_LLAVA_MAX_FEATURE_LAYERS 16
#define MMC_LLAVA_MAX_PINPOINTS 128
typedef enum {
    MMC_LLAVA_15 = 0,             /* "llava": one S x S image, its features as they are */
    MMC_LLAVA_NEXT,               /* "llava_next": anyres tiles + base image, unpadded grid, image_newline */
    MMC_LLAVA_ONEVISION,          /* "llava_onevision": NeXT's, plus anyres_max_N downsampling and, with several
                                   * images in a prompt, each image padded to a square without tiles */
} mmc_llava_variant;

typedef struct mmc_llava {
    mmc_llava_variant variant;
    mmc_clip_vision *vision;      /* the CLIP tower, or NULL when the tower is SigLIP */
    mmc_siglip_vision *siglip;    /* the SigLIP tower (vision_config.model_type siglip_vision_model) or NULL */
    mmc_tensor *image_newline;    /* NeXT / OneVision: image_newline [C] */
    int64_t pinpoints[MMC_LLAVA_MAX_PINPOINTS][2];  /* image_grid_pinpoints (height, width) */
    int n_pinpoints;
    int64_t max_num_patches;      /* OneVision: vision_aspect_ratio "anyres_max_N" -> N */
    int64_t video_token_id;       /* OneVision: video_token_index (not used yet) */
    const char *lm_family;        /* "Llama", "Mistral" or "Qwen2" (text_config.model_type) */
    int64_t sliding_window;       /* Mistral's sliding_window (Qwen2's with use_sliding_window), 0 = none: not
                                   * implemented, so longer sequences are refused rather than computed wrongly */
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
/* Features of one S x S tile after vision_feature_select_strategy: (S/p)^2 plus the CLS token with
 * "full" (CLIP); (S/p)^2 (SigLIP "full"), minus one with "default" (SigLIP has no CLS, but
 * transformers drops the first token all the same). For LLaVA-1.5 the <image> tokens per image. */
int64_t mmc_llava_image_tokens(const mmc_llava *m);
/* select_best_resolution (transformers' image_processing_utils): of pinpoints [n][2] (height, width),
 * the one keeping most of an h x w image's pixels, the least waste on ties, the first on equal. */
void mmc_llava_best_resolution(const int64_t (*pins)[2], int n, int64_t h, int64_t w, int64_t *bh, int64_t *bw);
/* NeXT / OneVision: the tiles (base image first) the model expects for an h x w image; 1 for a
 * OneVision image in a prompt of several (multi). */
int64_t mmc_llava_image_patches(const mmc_llava *m, int64_t h, int64_t w, bool multi);
/* pixels [P, 3, S, S] -> projected features [n_features, C]: LLaVA-1.5 each image's tile's tokens;
 * NeXT / OneVision (sizes [n_images][2] the original (height, width); P the sum of
 * mmc_llava_image_patches) pack_image_features' output: per image the base tile's tokens, then the
 * tiles' grid un-padded (OneVision: bilinearly downsampled past anyres_max_N), rows ending in
 * image_newline; several images in a OneVision prompt: each one tile + image_newline. */
mmc_status mmc_llava_image_features_sized(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, const int64_t (*sizes)[2],
                                          int n_images, mmc_tensor **out);
/* The same with each image's multi flag given (NULL: n_images > 1 for all, one prompt's images):
 * a training batch of several samples has OneVision's single-image tiling per sample. With a tape
 * the gradients reach the projector, image_newline and a tower whose weights require grad. */
mmc_status mmc_llava_image_features_multi(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, const int64_t (*sizes)[2],
                                          const bool *multi, int n_images, mmc_tensor **out);
/* OneVision's video path (get_video_features): frames [F, 3, S, S] -> each frame's tile features
 * bilinearly pooled from g x g to ceil(g/2) x ceil(g/2) (apply_pooling), then one image_newline
 * -> [F * ceil(g/2)^2 + 1, C]. MMC_ERR_UNSUPPORTED for the other variants. */
mmc_status mmc_llava_video_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *frames, mmc_tensor **out);
/* The <video> tokens of n_frames frames (the model's count): n_frames * ceil(g/2)^2 + 1. */
int64_t mmc_llava_video_tokens(const mmc_llava *m, int64_t n_frames);
/* LLaVA-1.5's (no sizes). */
mmc_status mmc_llava_image_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, mmc_tensor **out);
/* ids [B, T] (i32/i64) -> hidden [B, T, C] after the final norm. Prefill (kv NULL or empty):
 * with pixels (may be NULL) the projected features replace the <image> embeddings in order
 * (their count must equal the number of <image> tokens); positions are kv->len + t. */
mmc_status mmc_llava_forward(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                             mmc_tensor **hidden);
/* The same with the images' original sizes [n_images][2] (height, width), which NeXT and OneVision
 * need (mmc_llava_image_features_sized); LLaVA-1.5 ignores them. */
mmc_status mmc_llava_forward_sized(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels,
                                   const int64_t (*sizes)[2], int n_images, mmc_kv_cache *kv, mmc_tensor **hidden);
/* The same with a OneVision video's frames [F, 3, S, S] (or NULL), spliced at the video_token_id
 * positions (their count must equal mmc_llava_video_tokens). */
mmc_status mmc_llava_forward_media(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels,
                                   const int64_t (*sizes)[2], int n_images, mmc_tensor *video, mmc_kv_cache *kv,
                                   mmc_tensor **hidden);
mmc_tensor *mmc_llava_logits(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *hidden);   /* [..., C] -> [..., V] */

/* One generation request as a decoder (mmc_models.h): the prefill runs the tower on pixels. */
typedef struct {
    mmc_llava *m;
    mmc_tensor *pixels;           /* [N, 3, S, S] or NULL */
    const int64_t (*sizes)[2];    /* NeXT / OneVision: the images' (height, width) */
    int n_images;
    mmc_tensor *video;            /* OneVision: a video's frames [F, 3, S, S] or NULL */
} mmc_llava_request;

/* ---------------------------------------------------------------- NeXT / OneVision processor
 * (llava_next_processor.c) LlavaNextImageProcessorPil / LlavaOnevisionImageProcessorPil and the
 * processors' placeholder counts (LlavaNextProcessor / LlavaOnevisionProcessor
 * _get_number_of_features). */
typedef struct {
    mmc_clip_proc base;           /* size, crop_size, do_center_crop, resample, mean / std, rescale */
    bool onevision;
    int64_t pinpoints[MMC_LLAVA_MAX_PINPOINTS][2];
    int n_pinpoints;
    /* the processor's own keys (processor_config.json), for the placeholder counts */
    int64_t patch_size;           /* NeXT: patch_size */
    int64_t num_additional_image_tokens;   /* NeXT: 1 for a tower with a CLS token */
    int64_t num_image_tokens;     /* OneVision: tokens of one tile */
    int64_t max_num_patches;      /* OneVision: vision_aspect_ratio anyres_max_N */
    bool strategy_default;        /* vision_feature_select_strategy "default": one token fewer */
    mmc_clip_proc video;          /* OneVision's video processor (LlavaOnevisionVideoProcessor): size, mean / std,
                                   * rescale, resample (torchvision, as transformers requires for videos) */
} mmc_llava_next_proc;

/* Defaults of the model's image processor class, the counts' keys from the model's config. */
void mmc_llava_next_proc_default(mmc_llava_next_proc *p, const mmc_llava *m);
/* processor_config.json (5.x: image_processor inside) or preprocessor_config.json + processor_config.json
 * (4.4x) over *p. used (may be NULL): the image processor file read. */
mmc_status mmc_llava_next_proc_load_dir(const char *dir, mmc_llava_next_proc *p, char *used, size_t cap);
/* images -> pixel_values [P, 3, S, S] (each image's tiles, base first, no batch padding) and
 * sizes[i] = (height, width); multi (OneVision, several images in a prompt): padded to a square
 * of the mean colour, one tile each. PIL backend only. */
mmc_status mmc_llava_next_preprocess(const mmc_llava_next_proc *p, const mmc_image *imgs, int n, bool multi,
                                     mmc_tensor **pixels, int64_t (*sizes)[2]);
/* The tiles (pixel_values rows) of an h x w image: the base + the best resolution's grid; 1 when multi. */
int64_t mmc_llava_next_image_tiles(const mmc_llava_next_proc *p, int64_t h, int64_t w, bool multi);
/* The <image> tokens of an h x w image (the processor's count, which the model's features must equal). */
int64_t mmc_llava_next_image_tokens(const mmc_llava_next_proc *p, int64_t h, int64_t w, bool multi);
/* OneVision video frames -> pixel_values_videos [F, 3, h, w]: every frame resized to the video
 * processor's size with torch's uint8 antialiased resize, then its fused rescale + normalise
 * (LlavaOnevisionVideoProcessor on the torchvision backend). */
mmc_status mmc_llava_next_preprocess_video(const mmc_llava_next_proc *p, const mmc_image *frames, int n,
                                           mmc_tensor **out);
/* The processor's <video> count: n_frames * ceil(sqrt(num_image_tokens) / 2)^2 + 1. */
int64_t mmc_llava_next_video_tokens(const mmc_llava_next_proc *p, int64_t n_frames);
mmc_decoder mmc_llava_decoder(mmc_llava_request *r);

/* ---------------------------------------------------------------- training (llava_train.c)
 * Every parameter with the name transformers 5's save_pretrained writes: vision_tower.* (as the
 * checkpoint had it, without a leading "model."), multi_modal_projector.*,
 * language_model.model.*, language_model.lm_head.weight. *params / *names malloc'd (the name
 * strings too: free each, then the arrays); the tensors stay the model's. */
mmc_status mmc_llava_params(mmc_llava *m, mmc_tensor ***params, char ***names, int *n);
/* The linears LoRA may adapt, with PEFT's module names on transformers 5's model:
 * model.language_model.layers.N.{self_attn.q/k/v/o_proj, mlp.gate/up/down_proj},
 * model.multi_modal_projector.linear_1 / linear_2, and the tower's encoder layers, CLIP's or
 * SigLIP's alike: model.vision_tower.encoder.layers.N.{self_attn.{q,k,v,out}_proj, mlp.fc1, mlp.fc2}
 * (SigLIP's attention-pooling head is not listed: LLaVA never runs it). */
struct mmc_module_list;
mmc_status mmc_llava_linears(mmc_llava *m, struct mmc_module_list *out);
/* A PEFT adapter directory on the model at inference (mmc_lora_load; freed with the model). */
mmc_status mmc_llava_attach_adapter(mmc_llava *m, const char *adapter_dir);

#ifdef __cplusplus
}
#endif
#endif /* MMC_LLAVA_H */
