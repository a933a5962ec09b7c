/* mmc_internvl.h — InternVL 2.5 / 3 in transformers' HF-native layout
 * (InternVLForConditionalGeneration, model_type "internvl"): an InternViT vision tower
 * (InternVLVisionModel), pixel shuffle x downsample_ratio, a multi_modal_projector (LayerNorm +
 * Linear + act + Linear) and a Qwen2 language model (mmc_models.h's decoder, qwen2.c); and its
 * processor (GotOcr2ImageProcessor's crop_to_patches tiling + InternVLProcessor's
 * <img><IMG_CONTEXT>*N</img> expansion).
 *
 * The tower maps tiles pixel_values [N, 3, s, s] to hidden states; the model takes
 * vision_feature_layer (-1: the last hidden state, after the tower's final LayerNorm unless
 * use_mean_pooling), drops the CLS token, pixel-shuffles the (s/p)^2 grid to
 * (s/p * r)^2 tokens of Cv / r^2 channels, projects them to the LM's hidden size and puts them
 * at the <IMG_CONTEXT> positions. Weights are read as transformers 5.x save_pretrained writes them
 * (vision_tower.*, multi_modal_projector.*, language_model.model.*, language_model.lm_head.*) and
 * as 4.52-4.57 write them (model.vision_tower.*, model.multi_modal_projector.*,
 * model.language_model.*, lm_head.*). Training (HF-native layout; the tower frozen by default, trainable): internvl_train.c. */
#ifndef MMC_INTERNVL_H
#define MMC_INTERNVL_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_image.h"
#include "mmc_encoders.h"
#include "mmc_models.h"
#include "mmc_vlproc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- InternViT tower */
typedef struct {
    int64_t hidden_size, intermediate_size;  /* Cv, Fv */
    int64_t num_hidden_layers, num_attention_heads;
    int64_t num_channels, image_size, patch_size;   /* square sizes (image_size / patch_size lists must be square) */
    double layer_norm_eps;
    mmc_act hidden_act;
    bool attention_bias, use_qk_norm, rms_norm;     /* norm_type "rms_norm" */
    bool use_mean_pooling;                          /* false: a final LayerNorm ("layernorm") */
    bool abs_pos;                                   /* use_absolute_position_embeddings */
    double qk_norm_eps;                             /* 1e-6 (HF-native); layer_norm_eps (OpenGVLab's) */
    bool remote;                                    /* OpenGVLab's InternVisionModel names (fused attn.qkv) */
} mmc_intern_vit_config;

typedef struct mmc_intern_vit mmc_intern_vit;

/* From a vision_config object (InternVLVisionConfig's defaults for what it omits). */
mmc_status mmc_intern_vit_config_read(const mmc_json *vc, const char *what, mmc_intern_vit_config *out);
/* From OpenGVLab's remote-code vision_config (InternVisionConfig, model_type intern_vit_6b:
 * qkv_bias, qk_normalization, norm_type, layer_norm_eps, image_size, patch_size, ...). */
mmc_status mmc_intern_vit_config_read_remote(const mmc_json *vc, const char *what, mmc_intern_vit_config *out);
/* pixels [N, Cin, H, W] f32 (H, W multiples of patch_size; position embeddings interpolated
 * bicubically when the grid differs from image_size's, as interpolate_pos_encoding does) ->
 * hidden states hs[0 .. n_layers] [N, 1 + (H/p)(W/p), Cv]: hs[0] the embeddings, hs[i] layer i's
 * output; with n_layers == num_hidden_layers, *last is the last hidden state (after the final
 * LayerNorm when use_mean_pooling is false), else NULL. In ctx's arena. */
mmc_status mmc_intern_vit_forward(mmc_ctx *ctx, mmc_intern_vit *v, mmc_tensor *pixels, int n_layers,
                                  mmc_tensor ***hs, mmc_tensor **last);

/* ---------------------------------------------------------------- InternVL */
typedef struct mmc_internvl {
    mmc_intern_vit *vision;
    mmc_qwen2 *lm;                /* Qwen2, or InternLM2 read onto the same (Llama) decoder */
    bool lm_internlm2;            /* internvl_chat with llm_config.model_type internlm2 (InternVL2 / 2.5-8B) */
    void *lm_repack;              /* InternLM2: the q / k / v rows gathered from wqkv, which lm may view */
    mmc_tensor *proj_ln_w, *proj_ln_b;   /* multi_modal_projector.layer_norm [Cv / r^2] */
    mmc_linear_w proj1;           /* linear_1: w [C, Cv / r^2], b [C] */
    mmc_linear_w proj2;           /* linear_2: w [C, C], b [C] */
    mmc_act proj_act;             /* projector_hidden_act (gelu) */
    int64_t image_token_id;       /* <IMG_CONTEXT> */
    int feature_layer;            /* index into hs[] (0 .. L), made non-negative; L + 1: last_hidden_state */
    int shuffle;                  /* 1 / downsample_ratio (2) */
    bool ps_v1;                   /* OpenGVLab's ps_version "v1": the shuffled grid left transposed */
    bool remote_layout;           /* OpenGVLab's InternVLChatModel (vision_model.*, mlp1.*, language_model.*) */
    bool hub_layout;              /* language_model.model.* (5.x saves) rather than model.language_model.* */
    struct mmc_lora_set *adapter; /* a PEFT adapter attached at inference (mmc_internvl_attach_adapter) */
    void *weights;                /* the tower's and projector's bound tensors (internal) */
} mmc_internvl;

mmc_status mmc_internvl_load(const char *dir, mmc_internvl **out);
/* trainable: every weight an f32 parameter (for mmc train). */
mmc_status mmc_internvl_load_ex(const char *dir, bool trainable, mmc_internvl **out);
/* packed: an InternLM2 language model (internvl_chat) in its own layout, one packed attention.wqkv
 * linear per layer under the remote code's names (as training has it, and as PEFT adapters over
 * wqkv need); else its q / k / v viewed as Llama's. mmc_internvl_load_ex passes packed = trainable. */
mmc_status mmc_internvl_load_opts(const char *dir, bool trainable, bool packed, mmc_internvl **out);
/* Fresh model with random init from a parsed config.json; for benchmarks. */
mmc_status mmc_internvl_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_internvl **out);
void mmc_internvl_free(mmc_internvl *m);
/* <IMG_CONTEXT> tokens per tile of side s: ((s/p) r)^2. */
int64_t mmc_internvl_tile_tokens(const mmc_internvl *m, int64_t s);
/* tiles [N, 3, s, s] -> projected features [N * tile_tokens, C]. */
mmc_status mmc_internvl_image_features(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *pixels, mmc_tensor **out);
/* ids [B, T] -> hidden [B, T, C] after the final norm; the features of pixels (or NULL) replace
 * the <IMG_CONTEXT> embeddings in order (the counts must agree); positions kv->len + t. */
mmc_status mmc_internvl_forward(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *ids, mmc_tensor *pixels,
                                mmc_kv_cache *kv, mmc_tensor **hidden);
mmc_tensor *mmc_internvl_logits(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *hidden);

typedef struct {
    mmc_internvl *m;
    mmc_tensor *pixels;           /* [N, 3, s, s] or NULL */
} mmc_internvl_request;
mmc_decoder mmc_internvl_decoder(mmc_internvl_request *r);

/* ---------------------------------------------------------------- training (internvl_train.c) */
struct mmc_module_list;
/* Every parameter with save_pretrained's name (transformers 5: vision_tower.*,
 * multi_modal_projector.*, language_model.model.*, language_model.lm_head.weight; OpenGVLab's
 * internvl_chat, its Qwen2 as loaded or its InternLM2 loaded packed: vision_model.*, mlp1.*,
 * language_model.model.*, language_model.lm_head.weight / language_model.output.weight); arrays
 * malloc'd (names too). */
mmc_status mmc_internvl_params(mmc_internvl *m, mmc_tensor ***params, char ***names, int *n);
/* The linears LoRA may target, named as in the live transformers model (PEFT's module names):
 * model.language_model.layers.*, model.multi_modal_projector.linear_1 / linear_2 and the tower's
 * model.vision_tower.encoder.layer.N.attention.{q,k,v}_proj / .projection_layer / .mlp.fc1 / fc2;
 * internvl_chat: language_model.model.layers.N.self_attn.{q,k,v,o}_proj / mlp.{gate,up,down}_proj
 * (Qwen2) or .attention.wqkv / wo, feed_forward.w1 / w2 / w3 (InternLM2 packed), mlp1.1, mlp1.3. */
mmc_status mmc_internvl_linears(mmc_internvl *m, struct mmc_module_list *out);
/* A PEFT adapter directory on the model at inference (mmc_lora_load on mmc_internvl_linears' modules:
 * the language model, the projector, the tower; freed with the model). HF-native layout, or
 * internvl_chat with its Qwen2, or its InternLM2 loaded packed (mmc_internvl_load_opts). */
mmc_status mmc_internvl_attach_adapter(mmc_internvl *m, const char *adapter_dir);
/* mmc_internvl_batch_loss: mmc_trainer.h. */

/* ---------------------------------------------------------------- processor */
/* InternVLVideoProcessor (models/internvl/video_processing_internvl.py; transformers runs it on
 * torchvision only): frames sampled by its sample_frames, each resized to size with torch's uint8
 * antialiased resize, then the fused rescale + normalise -> [F, 3, h, w], one tile per frame. */
typedef struct {
    int64_t size_h, size_w;       /* size.height / width (384 x 384 by default; the Hub's -hf checkpoints: 448) */
    mmc_resample resample;        /* bicubic */
    bool do_resize, do_rescale, do_normalize;
    double rescale_factor;
    float image_mean[3], image_std[3];   /* OpenAI CLIP's by default; the Hub's checkpoints: ImageNet's */
    bool do_sample_frames;        /* false (transformers' default): every frame */
    int64_t num_frames;           /* 0: unset */
    double fps;                   /* 0: unset; num_frames wins when both are set */
    bool shift_half;              /* initial_shift true: total / num_frames / 2 */
    double initial_shift;         /* else this (false: 0) */
} mmc_internvl_video_proc;

typedef struct {
    int64_t size_h, size_w;       /* the tile size (size.height / width) */
    bool crop_to_patches;         /* InternVLProcessor passes true (its images_kwargs default) */
    int64_t min_patches, max_patches;
    bool use_thumbnail;           /* true for transformers; the config's use_thumbnail for OpenGVLab's */
    mmc_resample resample;
    bool do_resize, do_rescale, do_normalize;
    double rescale_factor;
    float image_mean[3], image_std[3];
    int64_t image_seq_length;     /* <IMG_CONTEXT> tokens per tile */
    mmc_vlproc_resize_mode resize_mode;   /* PIL (default) or TORCH (transformers 5's default torchvision backend) */
    mmc_internvl_video_proc video;   /* the video processor (HF-native layout) */
} mmc_internvl_proc;

void mmc_internvl_proc_default(mmc_internvl_proc *p);
/* processor_config.json ("image_processor", image_seq_length), else preprocessor_config.json; for
 * OpenGVLab's layout (config.json model_type internvl_chat) config.json's force_image_size (else
 * vision_config.image_size), dynamic_image_size, min/max_dynamic_patch, use_thumbnail, with
 * load_image's ImageNet mean/std and bicubic resize, and image_seq_length its num_image_token. */
mmc_status mmc_internvl_proc_load_dir(const char *dir, mmc_internvl_proc *p, char *used, size_t cap);
/* Videos. The video settings are read by mmc_internvl_proc_load_dir (HF-native layout) with
 * AutoVideoProcessor's precedence: processor_config.json's "video_processor", else
 * video_preprocessor_config.json, else preprocessor_config.json read over the video defaults. */
void mmc_internvl_video_proc_default(mmc_internvl_video_proc *v);
/* InternVLVideoProcessor.sample_frames on a video of `total` frames at video_fps (0: unknown):
 * without do_sample_frames every frame; else n = num_frames, or int(total / video_fps * fps), and
 * indices int(torch.arange(shift, total, total / n)) (float32 values), shift = total / n / 2 with
 * initial_shift true. Fails with the reason (and what to change) where transformers fails. *idx malloc'd. */
mmc_status mmc_internvl_video_sample(const mmc_internvl_video_proc *v, int64_t total, double video_fps,
                                     int64_t **idx, int *n);
/* Frames [n] (RGB) -> pixel_values [n, 3, size_h, size_w]. */
mmc_status mmc_internvl_video_preprocess(const mmc_internvl_video_proc *v, const mmc_image *frames, int n,
                                         mmc_tensor **out);
/* A video file (decoded through FFmpeg, mmc_video.h, sampled as above) or a folder of frame images
 * (every frame, in file-name order: transformers never samples a frame list) -> pixel_values
 * [F, 3, h, w]; *indices (malloc'd, may pass NULL) the frames' indices in the file. Errors name the path. */
mmc_status mmc_internvl_video_load(const mmc_internvl_video_proc *v, const char *path, const mmc_image_opts *io,
                                   mmc_tensor **out, int64_t **indices, int *n_frames);
/* InternVLProcessor's video expansion on the templated text: each "<video>" (the chat template's
 * video part) becomes "Frame1: <IMG_CONTEXT>\nFrame2: <IMG_CONTEXT>..." (frames[v] of them), each
 * <IMG_CONTEXT> to be expanded by mmc_internvl_expand with image_seq_length tokens, as the processor's
 * "Frame{i}: <img><IMG_CONTEXT>*N</img>" (<img>, </img> and <IMG_CONTEXT> are special tokens, so the
 * tokenised text is the same). order[k] (n_images + n_videos entries, may be NULL) gets 0 for an
 * image and 1 for a video, in the order their placeholders appear; at[v] / grow[v] (may be NULL) the
 * byte offset of video v's "<video>" in text and how many bytes its expansion adds. The counts of
 * "<IMG_CONTEXT>" and "<video>" in text must be n_images and n_videos. *out malloc'd. */
mmc_status mmc_internvl_video_text(const char *text, int n_images, const int64_t *frames, int n_videos, char **out,
                                   uint8_t *order, int64_t *at, int64_t *grow);
/* The tile grid get_optimal_tiled_canvas picks for an image (columns, rows). */
void mmc_internvl_tile_grid(const mmc_internvl_proc *p, int64_t h, int64_t w, int *cols, int *rows);
/* Images -> pixel_values [sum tiles, 3, size_h, size_w] and tiles per image (n_tiles[n]). */
mmc_status mmc_internvl_preprocess(const mmc_internvl_proc *p, const mmc_image *imgs, int n, mmc_tensor **out,
                                   int64_t *n_tiles);
/* ids with one image_token per image -> each replaced by start, image_token x
 * (image_seq_length * n_tiles[i]), end (InternVLProcessor's expansion; the three are special
 * tokens, so expanding ids equals expanding the text). *out malloc'd. */
mmc_status mmc_internvl_expand(const int32_t *ids, int64_t n, int32_t image_token, int32_t start, int32_t end,
                               const int64_t *tokens_per_image, int n_images, int32_t **out, int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* MMC_INTERNVL_H */
