/* mmc_diffusion.h — image generation, diffusers-exact: diffusers model directories
 * (model_index.json + one folder per component), the AutoencoderKL VAE, the Flux and SD3
 * diffusion transformers, the FlowMatchEulerDiscreteScheduler, the FluxPipeline (text-to-image,
 * img2img, LoRA) and StableDiffusion3Pipeline, and the flow-matching training objective. Models
 * live in src/models/diffusion/, schedulers, pipelines and the directory reader in src/diffusion/
 * (diffusers keeps models, schedulers and pipelines apart; so does mmc), the objective in
 * src/train/flow_matching.c.
 *
 * Shapes are outermost-first: images [B, 3, H, W] in [-1, 1], latents [B, Cl, H/f, W/f]
 * with f = 2^(levels - 1) (8 for every released VAE).
 */
#ifndef MMC_DIFFUSION_H
#define MMC_DIFFUSION_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_lora.h"
#include "mmc_ops.h"

#include <stdio.h>

struct mmc_clip_text;   /* mmc_encoders.h */

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- ops for conv nets
 * (kept here until mmc_ops.h takes them; implemented in src/ops/resample.c, with backward) */
/* F.interpolate(x, scale_factor=2.0, mode="nearest"): x [B, C, H, W] -> [B, C, 2H, 2W] */
mmc_tensor *mmc_upsample_nearest2x(mmc_ctx *ctx, mmc_tensor *x);
/* F.pad(x, (left, right, top, bottom)) with zeros: x [B, C, H, W] -> [B, C, H+t+b, W+l+r] */
mmc_tensor *mmc_pad2d(mmc_ctx *ctx, mmc_tensor *x, int left, int right, int top, int bottom);

/* ---------------------------------------------------------------- diffusers directories
 * model_index.json names the pipeline class ("_class_name") and its components, each as
 * ["library", "ClassName"] ([null, null] for an absent optional one); every present
 * component has a folder of its name with config.json (scheduler_config.json for
 * schedulers; tokenizer files for tokenizers) and, for models, diffusion_pytorch_model /
 * model safetensors, single or sharded with an index. mmc_diffusers_open checks the
 * layout against what the pipeline class takes: a component the pipeline needs but the
 * file lacks (or sets to null), one the pipeline does not take, a class mmc does not know
 * or of the wrong kind for its slot, or a missing folder / config, is an error naming it. */
typedef enum {
    MMC_DCOMP_VAE, MMC_DCOMP_TRANSFORMER, MMC_DCOMP_UNET, MMC_DCOMP_TEXT_ENCODER,
    MMC_DCOMP_TOKENIZER, MMC_DCOMP_SCHEDULER, MMC_DCOMP_IMAGE_ENCODER,
    MMC_DCOMP_FEATURE_EXTRACTOR, MMC_DCOMP_SAFETY_CHECKER, MMC_DCOMP_KIND_COUNT
} mmc_dcomp_kind;

#define MMC_DIFFUSERS_MAX_COMPONENTS 16
#define MMC_DIFFUSERS_MAX_DTYPES 4
typedef struct {
    char name[48];            /* folder / key in model_index.json: "vae", "text_encoder_2" */
    char library[32];         /* "diffusers", "transformers" */
    char class_name[64];      /* "AutoencoderKL" */
    mmc_dcomp_kind kind;
    bool present;             /* false for [null, null] */
    bool mmc_implements;      /* mmc can run this class */
    char weights[1024];       /* safetensors file or index, "" when the component has none */
    int64_t n_params;         /* parameters (elements) in its safetensors; 0 without weights */
    int n_dtypes;
    mmc_dtype dtypes[MMC_DIFFUSERS_MAX_DTYPES];   /* dtypes of its tensors, first seen first */
    int64_t dtype_params[MMC_DIFFUSERS_MAX_DTYPES];/* elements per dtype */
} mmc_diffusers_component;

typedef struct {
    char dir[512];
    char pipeline[64];        /* "FluxPipeline" */
    char diffusers_version[32];
    int n;
    mmc_diffusers_component comp[MMC_DIFFUSERS_MAX_COMPONENTS];
} mmc_diffusers_dir;

mmc_status mmc_diffusers_open(const char *dir, mmc_diffusers_dir *out);
/* The component called name, or NULL (absent ones included, with present = false). */
const mmc_diffusers_component *mmc_diffusers_find(const mmc_diffusers_dir *d, const char *name);
/* Path of a component's file: "<dir>/<component>/<file>" ("<dir>/<component>" when file is ""). */
void mmc_diffusers_path(const mmc_diffusers_dir *d, const char *component, const char *file,
                        char *buf, size_t n);
const char *mmc_dcomp_kind_name(mmc_dcomp_kind k);
/* `mmc merge` on a pipeline folder (src/diffusion/lora_merge.c): the PEFT LoRA adapter adapter_dir (on the
 * transformer; HunyuanDiTPipeline only) folded into a copy of pipe_dir written atomically to out_dir, the
 * transformer's weights as one diffusion_pytorch_model.safetensors (W + scale B A in W's dtype), everything
 * else copied; *n_merged (may be NULL): the number of merged weights. pipe_dir may also be the
 * HunyuanDiT2DModel folder itself: out_dir is then that folder merged. is_model_dir: dir holds a diffusers model (config.json with _class_name). */
mmc_status mmc_diffusers_merge_lora(const char *pipe_dir, const char *adapter_dir, const char *out_dir, int *n_merged);
bool mmc_diffusers_is_model_dir(const char *dir);
/* MMC_ERR_INVALID naming the nearest valid size (halves rounded up) unless height and width are
 * positive multiples of `multiple`; why says where the multiple comes from. */
mmc_status mmc_diffusion_check_size(int height, int width, int multiple, const char *why);
/* A table for `mmc info`: pipeline, then one line per component with its library/class,
 * kind, parameter count and dtypes, and whether mmc runs it. */
void mmc_diffusers_print(const mmc_diffusers_dir *d, FILE *f);

/* ---------------------------------------------------------------- AutoencoderKL
 * diffusers' AutoencoderKL (models/autoencoders/autoencoder_kl.py, Encoder / Decoder in
 * vae.py): see src/models/diffusion/autoencoder_kl.c. */
#define MMC_VAE_MAX_LEVELS 8
typedef struct {
    int64_t in_channels, out_channels, latent_channels;
    int64_t levels;                              /* len(block_out_channels) */
    int64_t block_out_channels[MMC_VAE_MAX_LEVELS];
    int64_t layers_per_block;
    int64_t norm_num_groups;
    int64_t sample_size;                         /* tiling: tile_sample_min_size */
    double scaling_factor, shift_factor;         /* shift_factor 0 when null */
    bool use_quant_conv, use_post_quant_conv, mid_block_add_attention;
} mmc_vae_config;

typedef struct mmc_vae mmc_vae;

mmc_status mmc_vae_config_read(const mmc_json *cfg, const char *what, mmc_vae_config *out);
/* Load from a folder with config.json and diffusion_pytorch_model.safetensors (or its
 * .index.json): f32 / bf16 / f16, computed in f32. Every missing or mis-shaped tensor is
 * reported. Old checkpoints' attention names (query/key/value/proj_attn) are accepted. */
mmc_status mmc_vae_load(const char *dir, mmc_vae **out);
mmc_status mmc_vae_load_st(const char *config_dir, mmc_st *weights, const char *what, mmc_vae **out);   /* as mmc_unet_load_st */
void mmc_vae_free(mmc_vae *v);
/* A fresh, trainable VAE of this config (torch's default init; training: src/train/trainer_vae.c). */
mmc_status mmc_vae_new(const mmc_vae_config *cfg, uint64_t seed, mmc_vae **out);
/* Every tensor under its diffusers name (the set's own arrays; n returned). */
int mmc_vae_param_list(mmc_vae *v, mmc_tensor ***params, const char (**names)[256]);
const mmc_vae_config *mmc_vae_cfg(const mmc_vae *v);
int64_t mmc_vae_param_count(const mmc_vae *v);
int mmc_vae_downscale(const mmc_vae *v);        /* 2^(levels-1) */

/* encode: x [B, Cin, H, W] (H, W multiples of the downscale) -> moments
 * [B, 2*Cl, H/f, W/f] (encoder, then quant_conv when present): latent_dist's parameters. */
mmc_tensor *mmc_vae_encode(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *x);
/* latent_dist from the moments: mean, logvar clamped to [-30, 20], std = exp(logvar / 2);
 * any of the outputs may be NULL. Each [B, Cl, h, w]. */
void mmc_vae_latent_dist(mmc_ctx *ctx, mmc_tensor *moments, mmc_tensor **mean, mmc_tensor **logvar,
                         mmc_tensor **std);
/* latent_dist.sample(): mean + std * noise. noise [B, Cl, h, w] as given (parity with
 * torch's generator), or, when NULL, drawn from mmc's Philox stream `seed`. mode() is mean. */
mmc_tensor *mmc_vae_sample(mmc_ctx *ctx, mmc_tensor *moments, mmc_tensor *noise, uint64_t seed);
/* decode: z [B, Cl, h, w] -> [B, Cout, h*f, w*f] (post_quant_conv when present, then the
 * decoder). No scaling: pipelines call it on latents / scaling_factor + shift_factor. */
mmc_tensor *mmc_vae_decode(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *z);
/* Tiled decode as diffusers' enable_tiling(): tiles of tile_latent latents (its
 * tile_latent_min_size = tile_sample / f) taken every 3/4 of a tile, decoded one by one,
 * blended over tile_sample/4 rows and columns (blend_v / blend_h) and cropped. tile_sample
 * 0 takes sample_size from config.json. Used whenever z exceeds one tile; inference only. */
mmc_tensor *mmc_vae_decode_tiled(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *z, int64_t tile_sample);
/* Tiled encode as diffusers' _tiled_encode (enable_tiling): image tiles of tile_sample
 * pixels every 3/4 tile, each encoded (with quant_conv) on its own, blended over a quarter of
 * a latent tile -> moments as mmc_vae_encode gives them. Inference only. */
mmc_tensor *mmc_vae_encode_tiled(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *x, int64_t tile_sample);
/* Pipelines' latent scaling: (z - shift_factor) * scaling_factor after encoding, and its
 * inverse z / scaling_factor + shift_factor before decoding (in place, f32). */
void mmc_vae_scale_latents(const mmc_vae *v, mmc_tensor *z);
/* VaeImageProcessor.denormalize of a decoded image, in place: x / 2 + 0.5 clamped to [0, 1]. */
mmc_tensor *mmc_vae_postprocess(mmc_ctx *ctx, mmc_tensor *x);
void mmc_vae_unscale_latents(const mmc_vae *v, mmc_tensor *z);

/* Training an AutoencoderKL from scratch (`mmc train-vae`, src/train/trainer_vae.c): MSE
 * reconstruction + kl_weight * the mean KL to N(0, 1), AdamW with warmup and cosine decay; the
 * config's shift_factor / scaling_factor are set from the trained latents' mean and std. */
typedef struct {
    double val_mse, psnr, seconds, shift, scaling;
} mmc_vae_train_report;
typedef struct {
    const char *data;       /* image folder with metadata.jsonl ("file_name" per line) */
    const char *config;     /* AutoencoderKL config.json: the architecture */
    const char *out_dir;    /* config.json + diffusion_pytorch_model.safetensors + reconstructions.png */
    int resolution, batch, log_every;
    int64_t steps, warmup;
    double lr, min_lr, kl_weight;
    uint64_t seed;
    mmc_vae_train_report *report;   /* filled when not NULL */
} mmc_vae_train_opts;
void mmc_vae_train_defaults(mmc_vae_train_opts *o);
mmc_status mmc_vae_train(const mmc_vae_train_opts *o);

/* ---------------------------------------------------------------- AutoencoderKLWan
 * diffusers' AutoencoderKLWan (models/autoencoders/autoencoder_kl_wan.py), the causal 3D VAE
 * of Wan2.1: see src/models/diffusion/autoencoder_kl_wan.c. One clip at a time (batch 1),
 * channel-first: video [C, T, H, W] in [-1, 1], latents [z_dim, t, h, w] with
 * t = (T - 1) / 4 + 1, h = H / 8, w = W / 8 (T = 4k + 1; H, W multiples of 8). Clips run
 * in chunks as diffusers' feature cache does it: the encoder takes the first frame alone, then
 * 4 frames at a time; the decoder one latent frame at a time (1, then 4 output frames); every
 * causal convolution carries its last two input frames (CACHE_T) to the next chunk, so memory
 * does not grow with the clip. Wan2.1 layouts only (is_residual false, patch_size null,
 * attn_scales []): others are refused by name. Weights f32 / bf16 / f16, computed in f32. */
#define MMC_WAN_VAE_MAX_LEVELS 8
#define MMC_WAN_VAE_MAX_Z 64
typedef struct {
    int64_t base_dim, decoder_base_dim, z_dim;
    int levels;                                        /* len(dim_mult) */
    int64_t dim_mult[MMC_WAN_VAE_MAX_LEVELS];
    int64_t num_res_blocks;
    bool temperal_downsample[MMC_WAN_VAE_MAX_LEVELS];  /* levels - 1 entries (sic: diffusers' key) */
    int64_t in_channels, out_channels;
    int64_t scale_factor_temporal, scale_factor_spatial;   /* 4, 8 */
    float latents_mean[MMC_WAN_VAE_MAX_Z], latents_std[MMC_WAN_VAE_MAX_Z];   /* [z_dim] */
} mmc_wan_vae_config;

typedef struct mmc_wan_vae mmc_wan_vae;
/* Called after each chunk: done of n (encoder chunks, or latent frames when decoding). */
typedef void (*mmc_wan_vae_progress)(void *user, int done, int n);

mmc_status mmc_wan_vae_config_read(const mmc_json *cfg, const char *what, mmc_wan_vae_config *out);
/* Load from a vae/ folder (config.json + diffusion_pytorch_model safetensors, single or sharded;
 * f32 / bf16 / f16 weights, widened to f32). Every missing or mis-shaped tensor is listed. */
mmc_status mmc_wan_vae_load(const char *dir, mmc_wan_vae **out);
void mmc_wan_vae_free(mmc_wan_vae *v);
const mmc_wan_vae_config *mmc_wan_vae_cfg(const mmc_wan_vae *v);
int64_t mmc_wan_vae_param_count(const mmc_wan_vae *v);
/* MMC_ERR_INVALID unless frames = 4k + 1 (k >= 0), naming the nearest valid count(s). */
mmc_status mmc_wan_check_frames(int64_t frames);
/* Latent frames of a clip of `frames` (4k + 1) frames: k + 1. */
int64_t mmc_wan_vae_latent_frames(int64_t frames);

/* decode: z [z_dim, t, h, w] -> frames [out_channels, 4(t-1)+1, 8h, 8w], clamped to [-1, 1] as
 * diffusers' _decode does (post_quant_conv first). z is the raw VAE latent: pipelines call it on
 * mmc_wan_vae_denormalize'd latents. progress may be NULL. */
mmc_status mmc_wan_vae_decode(mmc_wan_vae *v, const float *z, int64_t t, int64_t h, int64_t w, float *frames,
                              mmc_wan_vae_progress progress, void *user);
/* encode: x [in_channels, T, H, W] in [-1, 1] (T = 4k + 1; H, W multiples of 8) -> latent_dist's
 * mean [z_dim, t, h, w] (= mode()) and logvar clamped to [-30, 20] (may be NULL), after quant_conv. */
mmc_status mmc_wan_vae_encode(mmc_wan_vae *v, const float *x, int64_t T, int64_t H, int64_t W, float *mean,
                              float *logvar, mmc_wan_vae_progress progress, void *user);
/* latent_dist.sample(): out[i] = mean[i] + exp(0.5 * logvar[i]) * noise[i] (torch's roundings). */
void mmc_wan_vae_sample(const float *mean, const float *logvar, const float *noise, int64_t n, float *out);
/* The Wan pipelines' latent normalisation, in place on z [z_dim, n_per_channel] with
 * mean / std from config.json (latents_mean / latents_std), in f32 as torch does it:
 * normalize:   z = (z - mean) * (1 / std)      (WanImageToVideoPipeline, training latents)
 * denormalize: z = z / (1 / std) + mean         (WanPipeline before vae.decode) */
void mmc_wan_vae_normalize(const mmc_wan_vae *v, float *z, int64_t n_per_channel);
void mmc_wan_vae_denormalize(const mmc_wan_vae *v, float *z, int64_t n_per_channel);

/* ---------------------------------------------------------------- FluxTransformer2DModel
 * diffusers' models/transformers/transformer_flux.py: see src/models/diffusion/flux.c.
 * Latents enter packed (the pipeline's _pack_latents: 2x2 patches of the VAE latent as
 * tokens of in_channels = 4 * latent channels), text as T5 hidden states, pooled CLIP. */
typedef struct {
    int64_t patch_size, in_channels, out_channels;
    int64_t num_layers, num_single_layers;        /* double-stream, single-stream blocks */
    int64_t attention_head_dim, num_attention_heads;
    int64_t joint_attention_dim;                  /* T5 hidden size */
    int64_t pooled_projection_dim;                /* CLIP pooled size */
    bool guidance_embeds;                         /* guidance-distilled (FLUX.1-dev) */
    int axes_dims_rope[3];                        /* sums to attention_head_dim */
} mmc_flux_config;

typedef struct mmc_flux mmc_flux;

mmc_status mmc_flux_config_read(const mmc_json *cfg, const char *what, mmc_flux_config *out);
/* Load from a transformer/ folder (config.json + diffusion_pytorch_model safetensors, single or
 * sharded; f32 / bf16 / f16). trainable: f32 copies that require grad (full fine-tune);
 * otherwise f32 and bf16 matrices stay mapped. Every missing or mis-shaped tensor is listed. */
mmc_status mmc_flux_load(const char *dir, bool trainable, mmc_flux **out);
/* A randomly initialised transformer (torch's nn.Linear init, seeded), f32, trainable: for training
 * from scratch. */
mmc_status mmc_flux_new(const mmc_flux_config *cfg, uint64_t seed, mmc_flux **out);
void mmc_flux_free(mmc_flux *m);
const mmc_flux_config *mmc_flux_cfg(const mmc_flux *m);
int64_t mmc_flux_param_count(const mmc_flux *m);
/* Every parameter and its checkpoint name (the optimizer's and a checkpoint's view). */
int mmc_flux_param_list(mmc_flux *m, mmc_tensor ***params, const char *const **names);
/* Every linear under diffusers' module name ("transformer_blocks.0.attn.to_q"): for LoRA. */
struct mmc_module_list;
mmc_status mmc_flux_linears(mmc_flux *m, struct mmc_module_list *ml);

typedef struct {
    mmc_tensor *hidden;        /* [B, S, in_channels] packed latents */
    mmc_tensor *encoder;       /* [B, T, joint_attention_dim] T5 last_hidden_state */
    mmc_tensor *pooled;        /* [B, pooled_projection_dim] CLIP pooler_output */
    const float *timestep;     /* [B] sigma-scale timesteps (t / 1000 as the pipeline passes them) */
    const float *guidance;     /* [B] guidance scale, required iff guidance_embeds, else NULL */
    const float *img_ids;      /* [S, 3] (0, row, col) per latent token */
    const float *txt_ids;      /* [T, 3] zeros in FluxPipeline */
} mmc_flux_inputs;
/* The velocity prediction [B, S, patch^2 * out_channels]. Differentiable in grad mode;
 * without it, each block's intermediates are released as soon as its outputs exist. */
mmc_status mmc_flux_forward(mmc_ctx *ctx, mmc_flux *m, const mmc_flux_inputs *in, mmc_tensor **out);

/* FluxPipeline's latent layout: _pack_latents z [B, C, H, W] -> [B, (H/2)(W/2), 4C] (each
 * token a 2x2 patch, channel-major: c*4 + dy*2 + dx), _unpack_latents back, and
 * _prepare_latent_image_ids: ids [(H/2)(W/2), 3] = (0, row, col). H, W even. */
mmc_tensor *mmc_flux_pack_latents(mmc_ctx *ctx, const mmc_tensor *z);
mmc_tensor *mmc_flux_unpack_latents(mmc_ctx *ctx, const mmc_tensor *x, int64_t H, int64_t W);
void mmc_flux_latent_ids(int64_t H, int64_t W, float *ids);

/* ---------------------------------------------------------------- SD3Transformer2DModel
 * diffusers' models/transformers/transformer_sd3.py (MMDiT of Stable Diffusion 3 / 3.5): see
 * src/models/diffusion/sd3.c. Latents enter unpacked [B, C, H, W] (the model patchifies them
 * itself), text as the pipeline's joint CLIP+T5 states, pooled as both CLIPs' pooled outputs. */
#define MMC_SD3_MAX_LAYERS 128
typedef struct {
    int64_t sample_size;                          /* sets base_size of the stored sin-cos table */
    int64_t patch_size, in_channels, out_channels;
    int64_t num_layers;                           /* JointTransformerBlocks, the last context_pre_only */
    int64_t attention_head_dim, num_attention_heads;
    int64_t joint_attention_dim;                  /* text hidden size (4096 for CLIP+T5) */
    int64_t caption_projection_dim;               /* context_embedder's output: must be heads * head_dim */
    int64_t pooled_projection_dim;                /* 2048 for the two CLIP pooled outputs */
    int64_t pos_embed_max_size;                   /* latent patches per side of the position table */
    bool qk_norm;                                 /* qk_norm "rms_norm" (SD3.5) or null (SD3) */
    bool dual_attention[MMC_SD3_MAX_LAYERS];      /* block i in dual_attention_layers (SD3.5-medium) */
} mmc_sd3_config;

typedef struct mmc_sd3 mmc_sd3;

mmc_status mmc_sd3_config_read(const mmc_json *cfg, const char *what, mmc_sd3_config *out);
/* Load from a transformer/ folder (config.json + diffusion_pytorch_model safetensors, single or
 * sharded; f32 / bf16 / f16). trainable: f32 copies that require grad (full fine-tune); otherwise
 * f32 and bf16 matrices stay mapped. The pos_embed buffer (saved: persistent with
 * pos_embed_max_size) is bound, never trained. Every missing or mis-shaped tensor is listed. */
mmc_status mmc_sd3_load(const char *dir, bool trainable, mmc_sd3 **out);
void mmc_sd3_free(mmc_sd3 *m);
const mmc_sd3_config *mmc_sd3_cfg(const mmc_sd3 *m);
/* Parameters as diffusers' num_parameters() counts them (the pos_embed buffer excluded). */
int64_t mmc_sd3_param_count(const mmc_sd3 *m);
/* The bound tensor of checkpoint name `name` ("transformer_blocks.0.attn.to_q.weight"), or NULL. */
mmc_tensor *mmc_sd3_param(const mmc_sd3 *m, const char *name);
/* The linear modules by diffusers' module names ("transformer_blocks.0.attn.to_q",
 * "transformer_blocks.0.ff.net.0.proj", "context_embedder", ...) for LoRA. */
mmc_status mmc_sd3_linears(mmc_sd3 *m, mmc_module_list *out);
/* The trainable parameters (every bound tensor but the pos_embed buffer) and their checkpoint
 * names; owned by the model. Returns their count. */
int mmc_sd3_param_list(mmc_sd3 *m, mmc_tensor ***params, const char *const **names);

typedef struct {
    mmc_tensor *hidden;        /* [B, in_channels, H, W] latents; H, W multiples of patch_size */
    mmc_tensor *encoder;       /* [B, T, joint_attention_dim] */
    mmc_tensor *pooled;        /* [B, pooled_projection_dim] */
    const float *timestep;     /* [B] as StableDiffusion3Pipeline passes it: sigma * 1000, unscaled */
    const int *skip_layers;    /* blocks to skip (skip-layer guidance), or NULL */
    int n_skip_layers;
} mmc_sd3_inputs;
/* The velocity prediction [B, out_channels, H, W]. Errors name the input when a size does not fit
 * the config (including H/p or W/p beyond pos_embed_max_size). Differentiable in grad mode;
 * without it, each block's intermediates are released as soon as its outputs exist. */
mmc_status mmc_sd3_forward(mmc_ctx *ctx, mmc_sd3 *m, const mmc_sd3_inputs *in, mmc_tensor **out);

/* ---------------------------------------------------------------- HunyuanDiT2DModel
 * diffusers' models/transformers/hunyuan_transformer_2d.py: see src/models/diffusion/hunyuan_dit.c.
 * Latents enter unpacked [B, C, H, W]; text as the BERT states [B, text_len, cross_attention_dim]
 * and the T5 states [B, text_len_t5, cross_attention_dim_t5] with their 0/1 masks. */
#define MMC_HUNYUAN_MAX_LAYERS 128
typedef struct {
    int64_t num_attention_heads, attention_head_dim;   /* hidden_size must be heads * head_dim */
    int64_t in_channels, patch_size, sample_size, hidden_size, num_layers;
    int64_t out_channels;                              /* 2 * in_channels with learn_sigma */
    int64_t ff_inner;                                  /* int(inner_dim * mlp_ratio) */
    int64_t cross_attention_dim, cross_attention_dim_t5, pooled_projection_dim;
    int64_t text_len, text_len_t5;
    bool learn_sigma, use_style_cond_and_image_meta_size;
} mmc_hunyuan_dit_config;

typedef struct mmc_hunyuan_dit mmc_hunyuan_dit;

mmc_status mmc_hunyuan_dit_config_read(const mmc_json *cfg, const char *what, mmc_hunyuan_dit_config *out);
/* Load from a transformer/ folder (config.json + diffusion_pytorch_model safetensors, single or
 * sharded; f32 / bf16 / f16). Every missing or mis-shaped tensor is listed. trainable: f32 copies
 * flagged as parameters (full fine-tuning); else mapped views (inference, LoRA). */
mmc_status mmc_hunyuan_dit_load(const char *dir, bool trainable, mmc_hunyuan_dit **out);
void mmc_hunyuan_dit_free(mmc_hunyuan_dit *m);
const mmc_hunyuan_dit_config *mmc_hunyuan_dit_cfg(const mmc_hunyuan_dit *m);
int64_t mmc_hunyuan_dit_param_count(const mmc_hunyuan_dit *m);
/* Every tensor with its diffusers name (what save_pretrained writes); the array is the model's. */
int mmc_hunyuan_dit_param_list(mmc_hunyuan_dit *m, mmc_tensor ***params, const char *const **names);
/* The tensor of that diffusers name, or NULL. */
const mmc_tensor *mmc_hunyuan_dit_param(const mmc_hunyuan_dit *m, const char *name);
/* Every nn.Linear under its diffusers module name ("blocks.0.attn1.to_q", "blocks.3.skip_linear", ...). */
mmc_status mmc_hunyuan_dit_linears(mmc_hunyuan_dit *m, mmc_module_list *ml);
/* Activation recompute (model.recompute: full): in grad mode each block runs under mmc_checkpoint. */
void mmc_hunyuan_dit_set_recompute(mmc_hunyuan_dit *m, bool on);

/* The rotary table HunyuanDiTPipeline passes as image_rotary_emb: get_2d_rotary_pos_embed(head_dim,
 * get_resize_crop_region_for_grid((gh, gw), base_size), (gh, gw)) with gh = height // 8 // patch,
 * base_size = 512 // 8 // patch -> cos, sin [gh * gw, head_dim] f32 (interleaved pairs). */
void mmc_hunyuan_rope(mmc_ctx *ctx, int64_t head_dim, int64_t gh, int64_t gw, int64_t base_size, mmc_tensor **cos,
                      mmc_tensor **sin);

typedef struct {
    mmc_tensor *hidden;        /* [B, in_channels, H, W] latents; H, W multiples of patch_size */
    const float *timestep;     /* [B] */
    mmc_tensor *encoder;       /* [B, text_len, cross_attention_dim] BERT last hidden state */
    const int32_t *mask;       /* [B, text_len] 0/1 */
    mmc_tensor *encoder_t5;    /* [B, text_len_t5, cross_attention_dim_t5] */
    const int32_t *mask_t5;    /* [B, text_len_t5] 0/1 */
    const float *image_meta_size;   /* [B, 6] (original, target size, crop top-left); v1.1 configs only */
    const int64_t *style;      /* [B] style_embedder rows; v1.1 configs only */
    mmc_tensor *rope_cos, *rope_sin;  /* [(H/p)(W/p), head_dim] (mmc_hunyuan_rope) */
} mmc_hunyuan_dit_inputs;
/* The prediction [B, out_channels, H, W] (noise / v in the first in_channels, the learned variance
 * after). Errors name the input whose size does not fit the config. */
mmc_status mmc_hunyuan_dit_forward(mmc_ctx *ctx, mmc_hunyuan_dit *m, const mmc_hunyuan_dit_inputs *in,
                                   mmc_tensor **out);

/* ---------------------------------------------------------------- HunyuanDiTPipeline
 * diffusers' pipelines/hunyuandit/pipeline_hunyuandit.py over a diffusers folder (tokenizer /
 * text_encoder: BERT, tokenizer_2 / text_encoder_2: T5, transformer, vae, scheduler: DDPMScheduler):
 * src/diffusion/hunyuan_pipeline.c. */
typedef struct mmc_hunyuan_pipeline mmc_hunyuan_pipeline;
typedef struct {
    mmc_tensor *embeds, *mask;          /* BERT last_hidden_state [B, 77, C], mask [B, 77] i32 */
    mmc_tensor *embeds_t5, *mask_t5;    /* T5 [B, 256, E5], mask [B, 256] i32 */
} mmc_hunyuan_cond;
typedef struct {
    int height, width;                  /* pixels; the latents are height / 8 x width / 8 */
    int steps;
    double guidance;                    /* > 1: classifier-free guidance with the negative encoding */
    double guidance_rescale;            /* rescale_noise_cfg's phi (0: off, the pipeline's default) */
    uint64_t seed;                      /* mmc's rng for DDPM's variance noise when step_noise is NULL */
    const float *step_noise;            /* [steps, B, C, h, w] the scheduler's draws (torch's generator), or NULL */
    void (*progress)(void *user, int step, int n, double step_seconds);
    void *user;
} mmc_hunyuan_opts;
mmc_status mmc_hunyuan_pipeline_open(const char *dir, mmc_hunyuan_pipeline **out);
void mmc_hunyuan_pipeline_free(mmc_hunyuan_pipeline *p);
int mmc_hunyuan_pipeline_latent_channels(const mmc_hunyuan_pipeline *p);
/* Sample with the caller's transformer (training's validation images); the pipeline's own is freed
 * at the first call, the borrowed one is never freed by the pipeline. */
void mmc_hunyuan_pipeline_borrow_transformer(mmc_hunyuan_pipeline *p, mmc_hunyuan_dit *m);
/* A LoRA on the transformer, applied unmerged at scale * weight: a PEFT adapter directory
 * (adapter_config.json + adapter_model.safetensors, "base_model.model.<module>.lora_A.weight": what
 * `mmc train` writes, since diffusers 0.42 has no load_lora_weights for HunyuanDiTPipeline), or a
 * diffusers-layout pytorch_lora_weights.safetensors ("transformer.<module>...", or its folder). */
mmc_status mmc_hunyuan_pipeline_load_lora(mmc_hunyuan_pipeline *p, const char *path, float weight);
/* use_resolution_binning (the pipeline's default): sizes floored to multiples of 16, then, unless one of
 * the trained shapes, mapped to the closest (map_to_standard_shapes). */
void mmc_hunyuan_bin_resolution(int *height, int *width);
/* encode_prompt for both encoders (tensors in ctx's arena). */
mmc_status mmc_hunyuan_encode_prompt(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const char *const *prompts, int B,
                                     mmc_hunyuan_cond *out);
/* The denoising loop on latents [B, C, h, w] (the initial noise, replaced by the result). */
mmc_status mmc_hunyuan_sample(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const mmc_hunyuan_cond *cond,
                              const mmc_hunyuan_cond *neg, const mmc_hunyuan_opts *o, mmc_tensor *latents);
/* VAE decode of latents / scaling_factor -> images [B, 3, H, W] in [0, 1]. */
mmc_status mmc_hunyuan_decode(mmc_ctx *ctx, mmc_hunyuan_pipeline *p, const mmc_tensor *latents, mmc_tensor **image);

/* ---------------------------------------------------------------- UNet2DConditionModel
 * diffusers' models/unets/unet_2d_condition.py as Stable Diffusion 1.x / 2.x and SDXL use it: see
 * src/models/diffusion/unet2d_condition.c. DownBlock2D / CrossAttnDownBlock2D, UNetMidBlock2DCrossAttn,
 * UpBlock2D / CrossAttnUpBlock2D, the "text_time" addition embedding of SDXL. */
#define MMC_UNET_MAX_LEVELS 6
typedef struct {
    int64_t in_channels, out_channels;
    int64_t sample_size;                            /* latent size a side the model was trained at */
    int levels;
    int64_t block_out_channels[MMC_UNET_MAX_LEVELS];
    bool down_cross[MMC_UNET_MAX_LEVELS];           /* CrossAttnDownBlock2D (else DownBlock2D) */
    bool up_cross[MMC_UNET_MAX_LEVELS];             /* CrossAttnUpBlock2D (else UpBlock2D), in up order */
    int64_t layers_per_block[MMC_UNET_MAX_LEVELS];
    int64_t transformer_layers[MMC_UNET_MAX_LEVELS];        /* transformer_layers_per_block, down order */
    int64_t up_transformer_layers[MMC_UNET_MAX_LEVELS];     /* reverse_transformer_layers_per_block, up order */
    int64_t heads[MMC_UNET_MAX_LEVELS];             /* num_attention_heads, else attention_head_dim (sic) */
    bool mid_cross;                                 /* mid_block_type UNetMidBlock2DCrossAttn (else none) */
    int64_t cross_attention_dim;
    int64_t norm_num_groups;
    double norm_eps;
    bool use_linear_projection;
    bool flip_sin_to_cos;
    double freq_shift;
    double mid_block_scale_factor;
    int64_t time_embed_dim;                         /* block_out_channels[0] * 4 unless time_embedding_dim */
    bool text_time;                                 /* addition_embed_type "text_time" (SDXL) */
    int64_t addition_time_embed_dim, projection_class_embeddings_input_dim;
} mmc_unet_config;

typedef struct mmc_unet mmc_unet;

mmc_status mmc_unet_config_read(const mmc_json *cfg, const char *what, mmc_unet_config *out);
/* Load from a unet/ folder (config.json + diffusion_pytorch_model safetensors, single or sharded;
 * f32 / bf16 / f16, computed in f32). Every missing or mis-shaped tensor is listed. */
mmc_status mmc_unet_load(const char *dir, bool trainable, mmc_unet **out);
/* The same with the weights taken from `weights` (diffusers names; taken, closed on failure too), config.json
 * from config_dir; `what` names the weights in errors (a single-file checkpoint: src/diffusion/single_file.c). */
mmc_status mmc_unet_load_st(const char *config_dir, mmc_st *weights, const char *what, bool trainable,
                            mmc_unet **out);
/* A randomly initialised UNet of a config (config.json's keys; torch's nn.Linear-style init, norm weights 1), f32,
 * frozen: benchmarks. */
mmc_status mmc_unet_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_unet **out);
void mmc_unet_free(mmc_unet *m);
const mmc_unet_config *mmc_unet_cfg(const mmc_unet *m);
int64_t mmc_unet_param_count(const mmc_unet *m);
/* Every parameter and its checkpoint name ("down_blocks.1.attentions.0.proj_in.weight"), owned by
 * the model (the optimizer's and a checkpoint's view). Returns their count. */
int mmc_unet_param_list(mmc_unet *m, mmc_tensor ***params, const char *const **names);
/* The nn.Linear modules of the transformers and embeddings under diffusers' module names
 * ("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q", "...ff.net.0.proj", proj_in /
 * proj_out with use_linear_projection, "time_embedding.linear_1", "add_embedding.linear_2"): for LoRA. */
mmc_status mmc_unet_linears(mmc_unet *m, mmc_module_list *out);

typedef struct {
    mmc_tensor *sample;        /* [B, in_channels, H, W]; H, W multiples of 2^(levels - 1) */
    const float *timestep;     /* [B] */
    mmc_tensor *encoder;       /* [B, T, cross_attention_dim] */
    mmc_tensor *text_embeds;   /* [B, P] pooled text embeds (text_time only, else NULL) */
    const float *time_ids;     /* [B, n_time_ids] (text_time only): SDXL's add_time_ids */
    int n_time_ids;
} mmc_unet_inputs;
/* The noise (or v) prediction [B, out_channels, H, W]. Inference only (no tape); each block's
 * intermediates are released as soon as its output exists. Errors name the input that does not fit. */
mmc_status mmc_unet_forward(mmc_ctx *ctx, mmc_unet *m, const mmc_unet_inputs *in, mmc_tensor **out);

/* ---------------------------------------------------------------- FluxPipeline
 * text -> image from a FluxPipeline folder, as diffusers' FluxPipeline.__call__ runs it: see
 * src/diffusion/flux_pipeline.c. Components load when first needed; the text encoders are freed
 * as soon as the prompts are encoded. */
typedef struct mmc_flux_pipeline mmc_flux_pipeline;
typedef struct {
    mmc_tensor *prompt_embeds;   /* [B, T, joint_attention_dim] T5 states (persistent) */
    mmc_tensor *pooled;          /* [B, pooled_projection_dim] CLIP pooled (persistent) */
} mmc_flux_cond;
typedef struct {
    int height, width;           /* pixels: positive multiples of 2 x the VAE factor (16) */
    int steps;
    double guidance;             /* distilled guidance (guidance_embeds checkpoints), 3.5 in diffusers */
    double true_cfg;             /* > 1 with a negative prompt: a second pass per step */
    int start_step;              /* img2img: the first step (mmc_flux_img2img_latents); 0 otherwise */
    bool img2img;                /* SDXL / SD: the latents are mmc_sdxl_img2img_latents' (already noised, not
                                  * scaled by init_noise_sigma), denoised from start_step */
    void (*progress)(void *user, int step, int n, double step_seconds);
    void *user;
} mmc_flux_sample_opts;

/* Reads model_index.json (must be FluxPipeline) and the configs; loads no weights. */
mmc_status mmc_flux_pipeline_open(const char *dir, mmc_flux_pipeline **out);
void mmc_flux_pipeline_free(mmc_flux_pipeline *p);
const mmc_flux_config *mmc_flux_pipeline_transformer_cfg(const mmc_flux_pipeline *p);
int mmc_flux_pipeline_vae_scale(const mmc_flux_pipeline *p);
/* MMC_ERR_INVALID naming the nearest valid size unless both are multiples of 2 x the VAE factor. */
mmc_status mmc_flux_check_size(const mmc_flux_pipeline *p, int height, int width);
int64_t mmc_flux_image_tokens(const mmc_flux_pipeline *p, int height, int width);   /* S of the packed latents */
/* encode_prompt for B prompts: CLIP pooled (77 tokens) and T5 states (max_sequence_length tokens). */
mmc_status mmc_flux_encode_prompt(mmc_ctx *ctx, mmc_flux_pipeline *p, const char *const *prompts, int B,
                                  int max_sequence_length, mmc_flux_cond *out);
void mmc_flux_cond_free(mmc_flux_cond *c);
/* The denoising loop on packed latents [B, S, in_channels] (updated in place); neg may be NULL. */
mmc_status mmc_flux_sample(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                           mmc_tensor *latents, const mmc_flux_sample_opts *o);
/* Unpack, unscale, VAE-decode (tiled: diffusers' enable_tiling) and denormalise -> [B, 3, H, W] in [0, 1]. */
mmc_status mmc_flux_decode(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_tensor *latents, int height, int width,
                           bool tiled, mmc_tensor **image);
void mmc_flux_pipeline_release_transformer(mmc_flux_pipeline *p);
/* img2img as FluxImg2ImgPipeline: the first step int(max(n - min(n * strength, n), 0)), and the
 * starting latents scale_noise(image_latents, timesteps[start], noise), packed. image_latents are
 * scaled VAE latents [B, C, h, w] (mmc_flux_encode_image, or given), noise of the same shape.
 * Set the sample options' start_step to *start_step. */
int mmc_flux_img2img_start(int steps, double strength);
mmc_status mmc_flux_img2img_latents(mmc_ctx *ctx, mmc_flux_pipeline *p, const mmc_tensor *image_latents,
                                    const mmc_tensor *noise, int steps, double strength, int height, int width,
                                    mmc_tensor **packed, int *start_step);
/* VAE-encode images pixels [B, 3, H, W] in [-1, 1] (VaeImageProcessor.preprocess's output), sample the
 * latent distribution from mmc's stream `seed`, shift and scale -> [B, C, h, w]. */
mmc_status mmc_flux_encode_image(mmc_ctx *ctx, mmc_flux_pipeline *p, const float *pixels, int64_t B, int height,
                                 int width, uint64_t seed, mmc_tensor **latents);
/* Sample with the caller's transformer (a training run's, adapters attached), not owned; NULL
 * returns to loading the folder's own. */
void mmc_flux_pipeline_borrow_transformer(mmc_flux_pipeline *p, mmc_flux *m);
/* A diffusers LoRA (a folder with pytorch_lora_weights.safetensors, or the file) on the
 * transformer, applied unmerged at scale weight x alpha / r. One adapter at a time. */
mmc_status mmc_flux_pipeline_load_lora(mmc_flux_pipeline *p, const char *path, float weight);

/* The pipelines' text-encoder calls (src/diffusion/prompt_encoders.c): persistent copies, the
 * encoders loaded and freed inside. CLIP over prompts padded to the tokenizer's model_max_length:
 * any of hidden_states[-2] [B, L, C], pooler_output [B, C], text_embeds [B, P] (an error without a
 * projection); T5's last_hidden_state [B, T, d] over T padded tokens, tokenized as transformers 5
 * rebuilds T5Tokenizer (MMC_T5_PIPELINE_TRANSFORMERS5), as diffusers runs it. */
mmc_status mmc_pipe_clip_encode(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const char *const *prompts,
                                int B, mmc_tensor **penultimate, mmc_tensor **pooled, mmc_tensor **text_embeds);
/* The same with the encoder loaded as `lo` says: its weights from lo->weights (taken; mmc_clip_text_load_st, named
 * lo->what in errors) else enc_dir's, and lo->patch called on it once loaded (a kohya LoRA merged in). */
typedef struct {
    mmc_st *weights;
    const char *what;
    mmc_status (*patch)(void *user, struct mmc_clip_text *m);
    void *user;
} mmc_clip_load;
mmc_status mmc_pipe_clip_encode_st(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const mmc_clip_load *lo,
                                   const char *const *prompts, int B, mmc_tensor **penultimate, mmc_tensor **pooled,
                                   mmc_tensor **text_embeds);
mmc_status mmc_pipe_t5_encode(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const char *const *prompts,
                              int B, int max_sequence_length, mmc_tensor **states);

/* ---------------------------------------------------------------- single-file checkpoints
 * One .safetensors in the original LDM / SGM layout (SD 1.x, SDXL base and refiner), converted as diffusers'
 * from_single_file converts it: src/diffusion/single_file.c. Each component comes out as a set of diffusers
 * names viewing the file (valid while the mmc_single_file lives), for mmc_unet_load_st and the like. */
typedef enum { MMC_SF_SDXL_BASE, MMC_SF_SDXL_REFINER, MMC_SF_SD1 } mmc_single_file_kind;
typedef struct mmc_single_file mmc_single_file;
mmc_status mmc_single_file_open(const char *path, mmc_single_file **out);
/* The same over tensors already opened (taken, also on failure; `path` names them in errors): the fuzzer's entry. */
mmc_status mmc_single_file_open_st(mmc_st *tensors, const char *path, mmc_single_file **out);
void mmc_single_file_free(mmc_single_file *sf);
mmc_single_file_kind mmc_single_file_get_kind(const mmc_single_file *sf);
const char *mmc_single_file_kind_name(mmc_single_file_kind k);
const char *mmc_single_file_path(const mmc_single_file *sf);
/* The UNet (layers_per_block from cfg), the VAE (its levels from cfg), text encoder 0 (CLIP-L) or 1 (OpenCLIP
 * bigG, the SDXL text_encoder_2). Errors name the file and the first tensor that fits no rule. */
mmc_status mmc_single_file_unet(mmc_single_file *sf, const mmc_unet_config *cfg, mmc_st **out);
mmc_status mmc_single_file_vae(mmc_single_file *sf, const mmc_vae_config *cfg, mmc_st **out);
mmc_status mmc_single_file_text_encoder(mmc_single_file *sf, int which, mmc_st **out);

/* ---------------------------------------------------------------- kohya / A1111 LoRA files
 * lora_unet_* / lora_te_* / lora_te1_* / lora_te2_* keys with lora_down / lora_up / alpha, converted as diffusers'
 * load_lora_weights does: src/diffusion/lora_kohya.c. Open reads and checks the whole file (every key kohya
 * naming, lora_up beside each lora_down, equal ranks, alpha a number), scales alpha / r x weight. */
typedef struct mmc_kohya_lora mmc_kohya_lora;
bool mmc_lora_file_is_kohya(const char *path);     /* a .safetensors with kohya-style keys */
mmc_status mmc_kohya_lora_open(const char *path, float weight, mmc_kohya_lora **out);
mmc_status mmc_kohya_lora_open_st(mmc_st *tensors, const char *path, float weight, mmc_kohya_lora **out);   /* taken */
void mmc_kohya_lora_free(mmc_kohya_lora *k);
int mmc_kohya_lora_count(const mmc_kohya_lora *k, int comp);   /* adapters of 0 UNet, 1 text_encoder, 2 text_encoder_2 */
/* The UNet's adapters: on its linears ml (mmc_unet_linears) unmerged, into its 1x1 convolutions merged; a module
 * name that fits none is an error naming its key. */
mmc_status mmc_kohya_lora_unet(const mmc_kohya_lora *k, const mmc_module_list *ml, mmc_unet *unet, mmc_lora_set **out);
/* Merge text encoder `which`'s (1, 2) adapters into a loaded CLIP text model. */
mmc_status mmc_kohya_lora_merge_clip(const mmc_kohya_lora *k, int which, struct mmc_clip_text *m);

/* ---------------------------------------------------------------- StableDiffusion3Pipeline
 * text -> image from a StableDiffusion3Pipeline folder: src/diffusion/sd3_pipeline.c. Prompt
 * encodings use mmc_flux_cond (prompt_embeds [B, 77 + T, joint], pooled [B, 768 + 1280]); latents
 * are unpacked [B, C, H/f, W/f]; the sample options' guidance is classifier-free guidance here
 * (> 1: a negative encoding is required; diffusers' default negative prompt is ""). */
typedef struct mmc_sd3_pipeline mmc_sd3_pipeline;
mmc_status mmc_sd3_pipeline_open(const char *dir, mmc_sd3_pipeline **out);
void mmc_sd3_pipeline_free(mmc_sd3_pipeline *p);
int mmc_sd3_pipeline_latent_channels(const mmc_sd3_pipeline *p);
/* A diffusers LoRA on the SD3 transformer (as mmc_flux_pipeline_load_lora). */
mmc_status mmc_sd3_pipeline_load_lora(mmc_sd3_pipeline *p, const char *path, float weight);
void mmc_sd3_latent_size(const mmc_sd3_pipeline *p, int height, int width, int64_t *h, int64_t *w);
mmc_status mmc_sd3_check_size(const mmc_sd3_pipeline *p, int height, int width);
mmc_status mmc_sd3_encode_prompt(mmc_ctx *ctx, mmc_sd3_pipeline *p, const char *const *prompts, int B,
                                 int max_sequence_length, mmc_flux_cond *out);
mmc_status mmc_sd3_sample(mmc_ctx *ctx, mmc_sd3_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                          mmc_tensor *latents, const mmc_flux_sample_opts *o);
/* Unscale, decode (the transformer is freed first), denormalise -> [B, 3, H, W] in [0, 1]. */
mmc_status mmc_sd3_decode(mmc_ctx *ctx, mmc_sd3_pipeline *p, const mmc_tensor *latents, bool tiled, mmc_tensor **image);
/* Sample with the caller's transformer (a model being trained, adapters attached) until called
 * again with NULL; the pipeline neither frees nor unloads it. */
void mmc_sd3_pipeline_borrow_transformer(mmc_sd3_pipeline *p, mmc_sd3 *m);
/* img2img as StableDiffusion3Img2ImgPipeline:
 * encode_image: pixels [B, 3, H, W] in [-1, 1] (VaeImageProcessor.preprocess's output) -> VAE latent_dist.sample()
 *   with vae_noise [B, C, h, w] (the generator's draw, for parity) or, when NULL, mmc's stream `seed`, then
 *   (z - shift_factor) * scaling_factor -> *latents [B, C, h, w] (persistent).
 * img2img_latents: set_timesteps(steps) (mu when dynamic); start = int(max(steps - min(steps x strength, steps), 0))
 *   (an error when no step is left); latents = scale_noise(image_latents, timesteps[start], noise) (latents may be
 *   image_latents); set the sample options' start_step = *start_step. */
mmc_status mmc_sd3_encode_image(mmc_ctx *ctx, mmc_sd3_pipeline *p, const float *pixels, int64_t B, int height,
                                int width, const mmc_tensor *vae_noise, uint64_t seed, mmc_tensor **latents);
mmc_status mmc_sd3_img2img_latents(mmc_sd3_pipeline *p, const mmc_tensor *image_latents, const mmc_tensor *noise,
                                   int steps, double strength, int height, int width, mmc_tensor *latents,
                                   int *start_step);

/* ---------------------------------------------------------------- FlowMatchEulerDiscreteScheduler
 * diffusers' schedulers/scheduling_flow_match_euler_discrete.py, computed in the same
 * precision as it is (numpy float64 where diffusers uses numpy on float64, float32 where it
 * uses torch or numpy on float32), so that sigmas and timesteps are bitwise equal. */
typedef enum { MMC_TIME_SHIFT_EXPONENTIAL, MMC_TIME_SHIFT_LINEAR } mmc_time_shift_type;
typedef struct {
    int64_t num_train_timesteps;
    double shift;
    bool use_dynamic_shifting;
    double base_shift, max_shift;
    int64_t base_image_seq_len, max_image_seq_len;
    bool invert_sigmas;
    double shift_terminal;                      /* 0 when null */
    bool use_karras_sigmas, use_exponential_sigmas;
    mmc_time_shift_type time_shift_type;
    bool stochastic_sampling;
} mmc_fm_config;

typedef struct {
    mmc_fm_config cfg;
    float sigma_min, sigma_max;                 /* of the training schedule (after __init__) */
    int n;                                      /* inference steps */
    float *sigmas;                              /* [n + 1], the last 0 (1 with invert_sigmas) */
    float *timesteps;                           /* [n] */
} mmc_fm_scheduler;

/* Defaults as diffusers' __init__; then the keys of a scheduler_config.json. Beta sigmas
 * (scipy's beta.ppf) are MMC_ERR_UNSUPPORTED, naming the key. */
void mmc_fm_config_default(mmc_fm_config *c);
mmc_status mmc_fm_config_read(const mmc_json *j, const char *what, mmc_fm_config *out);
mmc_status mmc_fm_load(const char *scheduler_dir, mmc_fm_scheduler *out);
mmc_status mmc_fm_init(const mmc_fm_config *c, mmc_fm_scheduler *out);
void mmc_fm_free(mmc_fm_scheduler *s);
/* The pipelines' calculate_shift: mu for an image of image_seq_len latent tokens. */
double mmc_fm_calculate_shift(const mmc_fm_config *c, int64_t image_seq_len);
/* set_timesteps(n, sigmas=..., mu=...). sigmas: NULL (the schedule from sigma_max to
 * sigma_min in float64), or n values (converted to float32 first, as diffusers does with
 * np.array(sigmas).astype(np.float32)). mu is required with use_dynamic_shifting. */
mmc_status mmc_fm_set_timesteps(mmc_fm_scheduler *s, int n, const double *sigmas, double mu);
/* FluxPipeline's default sigmas: np.linspace(1.0, 1/n, n) into out[n]. */
void mmc_fm_flux_sigmas(int n, double *out);
/* One Euler step at step index i: sample [n_elem] += (sigma[i+1] - sigma[i]) * model_output
 * (in f32). With stochastic_sampling: x0 = sample - sigma[i] * v, sample = (1 - sigma[i+1]) *
 * x0 + sigma[i+1] * noise (noise required then). */
void mmc_fm_step(const mmc_fm_scheduler *s, int i, const float *model_output, float *sample,
                 int64_t n_elem, const float *noise);
/* scale_noise: sample = sigma[i] * noise + (1 - sigma[i]) * sample (img2img, training). */
void mmc_fm_scale_noise(const mmc_fm_scheduler *s, int i, float *sample, const float *noise,
                        int64_t n_elem);

/* ---------------------------------------------------------------- DDPM-family schedulers
 * diffusers' EulerDiscreteScheduler, EulerAncestralDiscreteScheduler, DPMSolverMultistepScheduler,
 * DDIMScheduler, PNDMScheduler and UniPCMultistepScheduler (orders 1-2, bh1 / bh2, with the flow
 * sigmas the Wan pipelines use) (schedulers/scheduling_*.py, 0.42), read from a scheduler_config.json:
 * src/diffusion/schedulers.c. One struct for the four (they share the training schedule of
 * betas / alphas_cumprod and the timestep spacings); `kind` picks the set_timesteps and step
 * rules. Randomness (ancestral noise, SDE noise, DDIM with eta > 0) is a tensor the caller
 * passes, so a run can use torch's generator's draws, or mmc's. */
typedef enum { MMC_NSCHED_EULER, MMC_NSCHED_EULER_ANCESTRAL, MMC_NSCHED_DPM_MULTISTEP, MMC_NSCHED_DDIM,
               MMC_NSCHED_PNDM, MMC_NSCHED_UNIPC } mmc_nsched_kind;
/* FLOW: UniPC's flow_prediction (x0 = sample - sigma * output), the Wan pipelines' */
typedef enum { MMC_PRED_EPSILON, MMC_PRED_V, MMC_PRED_SAMPLE, MMC_PRED_FLOW } mmc_pred_type;
typedef enum { MMC_BETA_LINEAR, MMC_BETA_SCALED_LINEAR, MMC_BETA_SQUAREDCOS } mmc_beta_schedule;
typedef enum { MMC_SPACING_LINSPACE, MMC_SPACING_LEADING, MMC_SPACING_TRAILING } mmc_timestep_spacing;
typedef struct {
    mmc_nsched_kind kind;
    int64_t num_train_timesteps;
    double beta_start, beta_end;
    mmc_beta_schedule beta_schedule;
    mmc_pred_type prediction_type;
    mmc_timestep_spacing timestep_spacing;
    int64_t steps_offset;
    bool rescale_betas_zero_snr;
    /* Euler and DPM-Solver */
    bool use_karras_sigmas;
    bool final_sigmas_sigma_min;        /* final_sigmas_type "sigma_min" (else "zero") */
    double sigma_min, sigma_max;        /* Karras range; NAN when null (the schedule's ends) */
    bool interpolation_log_linear;      /* Euler: interpolation_type "log_linear" (else "linear") */
    /* DPM-Solver */
    int solver_order;                   /* 1 or 2 */
    bool sde;                           /* algorithm_type "sde-dpmsolver++" (else "dpmsolver++") */
    bool solver_heun;                   /* solver_type "heun" (else "midpoint") */
    bool lower_order_final, euler_at_final;
    double lambda_min_clipped;          /* -INFINITY by default */
    /* DDIM (and PNDM's set_alpha_to_one) */
    bool clip_sample, set_alpha_to_one;
    double clip_sample_range;
    /* UniPC (solver_order, lower_order_final and final_sigmas_sigma_min above): bh1 or bh2 */
    bool solver_bh1;
    bool use_flow_sigmas;               /* sigmas 1 -> 1/T shifted by flow_shift, alpha = 1 - sigma */
    double flow_shift;
} mmc_nsched_config;

typedef struct {
    mmc_nsched_config cfg;
    float *alphas_cumprod;      /* [num_train_timesteps] */
    float train_ac_last;        /* DDPMScheduler's alphas_cumprod[-1] (differs under zero-SNR rescaling) */
    int num_inference_steps;    /* the n of set_timesteps */
    int n;                      /* timesteps: n, or n + 1 where numpy's arange gives one more (trailing) */
    float *timesteps;           /* [n] (integer-valued except Euler's linspace / Karras ones) */
    float *sigmas;              /* [n + 1] (NULL for DDIM) */
    float init_noise_sigma;
    double eta;                 /* DDIM's step(eta=...); 0 unless the caller sets it */
    /* DPM-Solver's multistep state */
    float *prev_x0;             /* [n_elem] the previous step's data prediction */
    int64_t n_elem;
    int lower_order_nums;
    /* PNDM's (PLMS) state: the last model outputs (ets, oldest first) and the sample of its first step */
    float *pndm_buf;            /* [5 * n_elem]: four ets and cur_sample */
    float *ets[4];
    int n_ets, counter;
    /* UniPC's state: model_outputs[-2], model_outputs[-1] (data predictions) and last_sample */
    float *unipc_buf;           /* [3 * n_elem] */
    int unipc_order;            /* this_order of the last predictor (the next corrector's) */
} mmc_nsched;

/* Defaults of diffusers' __init__ for the kind, then the keys of a scheduler_config.json (its
 * _class_name picks the kind). Keys mmc cannot honour (trained_betas, thresholding, beta or
 * exponential sigmas, 3rd-order or non-++ DPM-Solver, learned variance, ...) are
 * MMC_ERR_UNSUPPORTED naming the key; unknown values are MMC_ERR_INVALID naming key and value. */
mmc_status mmc_nsched_config_read(const mmc_json *j, const char *what, mmc_nsched_config *out);
/* Reads <dir>/scheduler_config.json (diffusers writes -Infinity for lambda_min_clipped; accepted). */
mmc_status mmc_nsched_load(const char *scheduler_dir, mmc_nsched *out);
mmc_status mmc_nsched_init(const mmc_nsched_config *c, mmc_nsched *out);
void mmc_nsched_free(mmc_nsched *s);
const char *mmc_nsched_kind_name(mmc_nsched_kind k);
/* set_timesteps(n): timesteps and sigmas as diffusers computes them (the same float32 / float64
 * steps), and resets the multistep state. */
mmc_status mmc_nsched_set_timesteps(mmc_nsched *s, int n);
/* scale_model_input at step i: the factor the sample is divided by (sqrt(sigma^2 + 1) for the
 * Euler kinds, 1 otherwise), and the division itself into out (may alias in). */
float mmc_nsched_input_divisor(const mmc_nsched *s, int i);
void mmc_nsched_scale_model_input(const mmc_nsched *s, int i, const float *in, float *out, int64_t n_elem);
/* step(model_output, timesteps[i], sample): sample [n_elem] is replaced by prev_sample. noise
 * [n_elem] is required by EulerAncestral, sde-dpmsolver++ and DDIM with eta > 0 (the
 * randn_tensor draw / variance_noise), else ignored (may be NULL). Steps must run in order
 * i = 0, 1, ... for DPM-Solver (it keeps the previous data prediction). */
mmc_status mmc_nsched_step(mmc_nsched *s, int i, const float *model_output, float *sample, int64_t n_elem,
                          const float *noise);
/* Training arithmetic of DDPMScheduler on this config's schedule (diffusers' training scripts load the
 * pipeline's scheduler_config.json into a DDPMScheduler; its alphas_cumprod ends at 0 under zero-SNR
 * rescaling, not 2^-24). For B samples of `per` values each at integer timesteps t[B] in [0, T):
 * add_noise: out = sqrt(ac[t]) x0 + sqrt(1 - ac[t]) noise; velocity (get_velocity, the v-prediction
 * target): out = sqrt(ac[t]) noise - sqrt(1 - ac[t]) x0; snr (training_utils.compute_snr): (sqrt(ac[t]) /
 * sqrt(1 - ac[t]))^2, for min-SNR loss weighting. */
void mmc_nsched_add_noise(const mmc_nsched *s, const int64_t *t, int64_t B, int64_t per, const float *x0,
                          const float *noise, float *out);
void mmc_nsched_velocity(const mmc_nsched *s, const int64_t *t, int64_t B, int64_t per, const float *x0,
                         const float *noise, float *out);
float mmc_nsched_snr(const mmc_nsched *s, int64_t t);

/* ---------------------------------------------------------------- StableDiffusionXLPipeline
 * text -> image from a StableDiffusionXLPipeline folder: src/diffusion/sdxl_pipeline.c. Prompt
 * encodings use mmc_flux_cond (prompt_embeds [B, 77, C1 + C2] = both CLIPs' hidden_states[-2],
 * pooled [B, P] = the second's text_embeds); latents [B, C, H/f, W/f] are the initial noise (scaled
 * by the scheduler's init_noise_sigma inside); the sample options' guidance is classifier-free
 * guidance (> 1 needs a negative encoding: mmc_sdxl_zero_cond when mmc_sdxl_force_zeros and no
 * negative prompt was given, as diffusers does). The scheduler is the folder's (any of mmc_nsched), or
 * one set with mmc_sdxl_pipeline_set_scheduler (a folder whose own scheduler mmc does not run opens, and
 * sampling then needs one set). The same calls run a StableDiffusionPipeline (SD 1.x / 2.x) folder:
 * prompt_embeds = the CLIPTextModel's last_hidden_state, pooled NULL, no add_time_ids, never zeros. */
typedef struct mmc_sdxl_pipeline mmc_sdxl_pipeline;
mmc_status mmc_sdxl_pipeline_open(const char *dir, mmc_sdxl_pipeline **out);
/* A single-file checkpoint (SD 1.x, SDXL base or refiner, mmc_single_file_open) with the diffusers folder that gives its
 * configs, tokenizers and scheduler (config_dir; its weights, if any, are not read). NULL config_dir is an
 * error saying so. */
mmc_status mmc_sdxl_pipeline_open_single_file(const char *file, const char *config_dir, mmc_sdxl_pipeline **out);
void mmc_sdxl_pipeline_free(mmc_sdxl_pipeline *p);
int mmc_sdxl_pipeline_latent_channels(const mmc_sdxl_pipeline *p);
bool mmc_sdxl_force_zeros(const mmc_sdxl_pipeline *p);     /* model_index.json's force_zeros_for_empty_prompt */
bool mmc_sdxl_is_xl(const mmc_sdxl_pipeline *p);           /* SDXL (else an SD 1.x / 2.x StableDiffusionPipeline) */
int mmc_sdxl_default_size(const mmc_sdxl_pipeline *p);     /* unet sample_size x VAE factor: 1024 SDXL, 512 SD 1.5 */
mmc_nsched *mmc_sdxl_scheduler(mmc_sdxl_pipeline *p);       /* e.g. to set DDIM's eta */
/* Swap the scheduler for the one in scheduler_dir/scheduler_config.json (diffusers' pipe.scheduler =
 * Cls.from_config(...)). */
mmc_status mmc_sdxl_pipeline_set_scheduler(mmc_sdxl_pipeline *p, const char *scheduler_dir);
/* A diffusers LoRA for the UNet ("unet.<module>.lora_A.weight", as save_lora_weights and `mmc train`
 * write it; a directory or .safetensors path) applied unmerged at scale * weight, or a kohya / A1111 file
 * (mmc_lora_file_is_kohya: UNet and text-encoder adapters). One at a time; attached again whenever the UNet
 * is loaded again (mmc_sdxl_decode frees it). */
mmc_status mmc_sdxl_pipeline_load_lora(mmc_sdxl_pipeline *p, const char *path, float weight);
/* Sample with the caller's UNet (training's validation images; its adapters stay the caller's); NULL
 * returns to the pipeline's own. The pipeline never frees a borrowed UNet. */
void mmc_sdxl_pipeline_borrow_unet(mmc_sdxl_pipeline *p, mmc_unet *m);
void mmc_sdxl_latent_size(const mmc_sdxl_pipeline *p, int height, int width, int64_t *h, int64_t *w);
mmc_status mmc_sdxl_check_size(const mmc_sdxl_pipeline *p, int height, int width);
mmc_status mmc_sdxl_encode_prompt(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const char *const *prompts, int B,
                                  mmc_flux_cond *out);
mmc_status mmc_sdxl_zero_cond(const mmc_flux_cond *like, mmc_flux_cond *out);
/* img2img as StableDiffusionXLImg2ImgPipeline / StableDiffusionImg2ImgPipeline do it:
 * encode_image: pixels [B, 3, H, W] in [-1, 1] (VaeImageProcessor.preprocess's output) -> VAE latent_dist.sample()
 *   with vae_noise [B, C, h, w] (the generator's draw, for parity) or, when NULL, mmc's stream `seed`, times
 *   scaling_factor -> *latents [B, C, h, w] (persistent).
 * img2img_latents: set_timesteps(steps); get_timesteps: init = min(int(steps x strength), steps), start =
 *   steps - init (an error when no step is left); latents = scheduler.add_noise(image_latents, noise,
 *   timesteps[start]) (Euler kinds: x + sigma n; DPM-Solver: alpha_t x + sigma_t n; DDIM / PNDM: sqrt(ac) x +
 *   sqrt(1 - ac) n), written into latents; set the sample options' img2img and start_step = *start_step. */
mmc_status mmc_sdxl_encode_image(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const float *pixels, int64_t B, int height,
                                 int width, const mmc_tensor *vae_noise, uint64_t seed, mmc_tensor **latents);
mmc_status mmc_sdxl_img2img_latents(mmc_sdxl_pipeline *p, const mmc_tensor *image_latents, const mmc_tensor *noise,
                                    int steps, double strength, mmc_tensor *latents, int *start_step);
/* The refiner's micro-conditioning (model_index.json requires_aesthetics_score): add_time_ids (original size, crop,
 * aesthetic_score) and, for the negative half, negative_aesthetic_score (diffusers' defaults 6 and 2.5). */
bool mmc_sdxl_requires_aesthetics(const mmc_sdxl_pipeline *p);
void mmc_sdxl_set_aesthetic_scores(mmc_sdxl_pipeline *p, double aesthetic_score, double negative_aesthetic_score);
bool mmc_sdxl_has_text_encoder(const mmc_sdxl_pipeline *p);  /* false for the refiner (CLIP-G only) */
/* The denoising loop on latents (updated in place); noise_seed seeds the per-step noise of stochastic
 * schedulers (EulerAncestral, sde-dpmsolver++, DDIM with eta > 0). */
mmc_status mmc_sdxl_sample(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_flux_cond *cond, const mmc_flux_cond *neg,
                           mmc_tensor *latents, const mmc_flux_sample_opts *o, uint64_t noise_seed);
/* Unscale, decode (the UNet is freed first; computed in f32, which is force_upcast), denormalise ->
 * [B, 3, H, W] in [0, 1]. */
mmc_status mmc_sdxl_decode(mmc_ctx *ctx, mmc_sdxl_pipeline *p, const mmc_tensor *latents, bool tiled,
                           mmc_tensor **image);

/* ---------------------------------------------------------------- flow-matching training
 * The objective of diffusers' SD3 / Flux training scripts (src/train/flow_matching.c). One
 * --weighting_scheme picks both the timestep density (logit_normal, mode, else uniform) and
 * the loss weighting (sigma_sqrt, cosmap, else 1), as diffusers' training_utils does. */
typedef enum { MMC_FM_NONE, MMC_FM_LOGIT_NORMAL, MMC_FM_MODE, MMC_FM_SIGMA_SQRT, MMC_FM_COSMAP } mmc_fm_scheme;
mmc_status mmc_fm_scheme_parse(const char *s, const char *what, mmc_fm_scheme *out);
/* compute_density_for_timestep_sampling: n values of u in [0, 1]. */
void mmc_fm_sample_u(mmc_fm_scheme scheme, double logit_mean, double logit_std, double mode_scale, mmc_rng *r, int n,
                     float *u);
/* diffusers' find_nearest_bucket (training_utils): the bucket (bh[i], bw[i]) with the least
 * |h * bw - w * bh|, the last of equals. */
int mmc_fm_nearest_bucket(int h, int w, const int *bh, const int *bw, int n);
/* compute_loss_weighting_for_sd3 at sigma. */
float mmc_fm_loss_weight(mmc_fm_scheme scheme, float sigma);
/* index = (u * num_train_timesteps).long() into the scheduler's __init__ schedule: its sigma and
 * timestep (sigma * num_train_timesteps), as the scripts' get_sigmas finds them. */
void mmc_fm_train_sigma(const mmc_fm_config *c, float u, float *sigma, float *timestep);

typedef struct {
    const mmc_tensor *latents;        /* [B, C, h, w] x0: VAE latents, (z - shift) * scaling */
    const mmc_tensor *noise;          /* [B, C, h, w] */
    const float *sigmas, *timesteps;  /* [B] each, from mmc_fm_train_sigma */
    mmc_tensor *prompt_embeds;        /* [B, T, joint_attention_dim] */
    mmc_tensor *pooled;               /* [B, pooled_projection_dim] */
    double guidance;                  /* for guidance-embedding models (the scripts' --guidance_scale) */
    mmc_fm_scheme weighting;
} mmc_flux_fm_batch;
/* The scalar loss of one micro-batch, on the tape in grad mode. */
/* Rectified flow's noising, per sample b of contiguous f32 x0 / noise [B, ...] (any rank):
 * x_t = (1 - sigmas[b]) x0 + sigmas[b] noise, target = noise - x0 (both in ctx). Flux, SD3 and Wan share it. */
void mmc_fm_interpolate(mmc_ctx *ctx, const mmc_tensor *x0, const mmc_tensor *nz, const float *sigmas, mmc_tensor **xt,
                        mmc_tensor **target);
mmc_status mmc_flux_fm_loss(mmc_ctx *ctx, mmc_flux *m, const mmc_flux_fm_batch *b, mmc_tensor **loss);

/* SD3 / SD3.5, as diffusers' train_dreambooth_(lora_)sd3.py computes it: the latents unpacked, the
 * timestep unscaled (0..1000), and with precondition_outputs (the scripts' default) the prediction
 * turned into an x0 estimate, pred * (-sigma) + noisy, against x0; without, against noise - x0.
 * The batch's guidance is unused. */
mmc_status mmc_sd3_fm_loss(mmc_ctx *ctx, mmc_sd3 *m, const mmc_flux_fm_batch *b, bool precondition_outputs,
                           mmc_tensor **loss);

/* ---------------------------------------------------------------- DDPM training (SD 1.x / 2.x, SDXL)
 * The objective of diffusers' train_text_to_image(_lora)(_sdxl).py: src/train/ddpm_loss.c. */
typedef struct {
    const mmc_tensor *latents;        /* [B, C, h, w] x0: VAE latents * scaling_factor */
    const mmc_tensor *noise;          /* [B, C, h, w] (offset noise already added) */
    const int64_t *timesteps;         /* [B] integers in [0, num_train_timesteps) */
    mmc_tensor *prompt_embeds;        /* [B, T, cross_attention_dim] */
    mmc_tensor *text_embeds;          /* [B, P] pooled (SDXL: text_encoder_2's), NULL without text_time */
    const float *time_ids;            /* [B, n_time_ids] SDXL's (original size, crop top-left, target size);
                                         HunyuanDiT's image_meta_size (original size, target size, crop top-left) */
    int n_time_ids;
    const int32_t *mask, *mask_t5;    /* HunyuanDiT: [B, text_len], [B, text_len_t5] 0/1; prompt_embeds are the
                                         BERT states, text_embeds the T5 states [B, text_len_t5, E5] */
    mmc_pred_type prediction_type;    /* the scheduler's, or the run's override */
    double snr_gamma;                 /* min-SNR weighting; 0: off (plain MSE) */
} mmc_ddpm_batch;
/* The scalar loss of one micro-batch, on the tape in grad mode. s: the pipeline's scheduler (its
 * DDPMScheduler training schedule). */
mmc_status mmc_unet_ddpm_loss(mmc_ctx *ctx, mmc_unet *m, const mmc_nsched *s, const mmc_ddpm_batch *b,
                              mmc_tensor **loss);
/* HunyuanDiTPipeline's DDPMScheduler from its scheduler/ folder (dir: that folder): the schedule (alphas_cumprod,
 * prediction_type) as an mmc_nsched with DDIM's timestep rules; keys mmc does not honour must keep their
 * defaults (errors name the file and key). Training reads its DDPM schedule from it. */
mmc_status mmc_hunyuan_ddpm_load(const char *dir, mmc_nsched *out);
/* What HunyuanDiTPipeline's transformer predicts when sampling (a run's diffusion.prediction_type
 * override; epsilon or v). */
void mmc_hunyuan_pipeline_set_prediction_type(mmc_hunyuan_pipeline *p, mmc_pred_type pred);
/* HunyuanDiT2DModel under the same objective (trainer_hunyuan.c): the image-size conditioning from
 * time_ids (6 per sample, required by v1.1 configs), style 0, the pipeline's rotary table over the
 * latent grid (base 512 // 8 // patch_size); with learn_sigma only the first in_channels of the
 * prediction enter the loss (the pipeline's noise_pred.chunk(2, dim=1)[0]). */
mmc_status mmc_hunyuan_ddpm_loss(mmc_ctx *ctx, mmc_hunyuan_dit *m, const mmc_nsched *s, const mmc_ddpm_batch *b,
                                 mmc_tensor **loss);
/* The pieces both share: x_t = add_noise(x0, noise, t), the target of b->prediction_type, the timesteps
 * as floats (all in ctx; errors for a bad batch); then the (min-SNR weighted) mean squared error. */
mmc_status mmc_ddpm_prepare(mmc_ctx *ctx, const mmc_nsched *s, const mmc_ddpm_batch *b, int64_t out_channels,
                            mmc_tensor **xt, mmc_tensor **target, float **ts);
mmc_tensor *mmc_ddpm_finish(mmc_ctx *ctx, const mmc_nsched *s, const mmc_ddpm_batch *b, mmc_tensor *pred,
                            mmc_tensor *target);
/* min(snr_t, gamma) / snr_t (epsilon), / (snr_t + 1) (v_prediction), min(snr_t, gamma) (sample);
 * 1 when snr_gamma <= 0. */
float mmc_ddpm_snr_weight(const mmc_nsched *s, mmc_pred_type pred, double snr_gamma, int64_t t);
/* The scripts' offset noise for one sample: noise [C, per_channel] += noise_offset * randn(C, 1, 1). */
void mmc_ddpm_offset_noise(mmc_rng *r, int64_t C, int64_t per_channel, double noise_offset, float *noise);

#ifdef __cplusplus
}
#endif
#endif /* MMC_DIFFUSION_H */
