/* mmc_wan_t2v.h — Wan2.1 text-to-video, diffusers-exact: the WanTransformer3DModel video DiT
 * (src/models/diffusion/wan.c) and the WanPipeline (src/diffusion/wan_pipeline.c: UMT5 prompts,
 * classifier-free guidance, the UniPCMultistepScheduler loop). The causal 3D VAE (AutoencoderKLWan)
 * and the video writer live in their own files.
 *
 * Shapes are outermost-first: video latents [B, C, F, H, W] (F latent frames = (frames - 1) / 4 + 1,
 * H, W = pixels / 8 for the released VAE). */
#ifndef MMC_WAN_T2V_H
#define MMC_WAN_T2V_H

#include "mmc.h"
#include "mmc_diffusion.h"
#include "mmc_image.h"
#include "mmc_io.h"
#include "mmc_lora.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- WanTransformer3DModel
 * diffusers' models/transformers/transformer_wan.py (Wan2.1 text-to-video). */
typedef struct {
    int64_t patch_size[3];                /* (t, h, w): (1, 2, 2) for every released model */
    int64_t num_attention_heads, attention_head_dim;
    int64_t in_channels, out_channels;
    int64_t text_dim;                     /* UMT5 hidden size (4096) */
    int64_t freq_dim;                     /* sinusoidal timestep channels (256) */
    int64_t ffn_dim;
    int64_t num_layers;
    bool cross_attn_norm;                 /* an affine LayerNorm before the cross-attention */
    double eps;
    int64_t rope_max_seq_len;             /* rows of the rope table: patches per axis must not exceed it */
    int rope_dims[3];                     /* t, h, w shares of attention_head_dim (WanRotaryPosEmbed) */
    int64_t image_dim;                    /* image-to-video: CLIP image states' width (1280), 0 for T2V */
    int64_t added_kv_proj_dim;            /* I2V: add_k_proj / add_v_proj input width (= heads * head_dim) */
    int64_t pos_embed_seq_len;            /* first-last-frame (FLF2V): 2 x S_img (514), 0 otherwise */
} mmc_wan_config;

typedef struct mmc_wan mmc_wan;

/* config.json of a transformer/ folder. Wan2.1 I2V's image branch (image_dim with added_kv_proj_dim)
 * and the first-last-frame model's (FLF2V) pos_embed_seq_len are read. */
mmc_status mmc_wan_config_read(const mmc_json *cfg, const char *what, mmc_wan_config *out);
/* Load from a transformer/ folder (config.json + diffusion_pytorch_model safetensors, single or
 * sharded; f32 / bf16 / f16, computed in f32). trainable: f32 copies that require grad. Every
 * missing or mis-shaped tensor is listed. */
mmc_status mmc_wan_load(const char *dir, bool trainable, mmc_wan **out);
/* A randomly initialised transformer (torch's nn.Linear init, seeded; norm weights 1), f32, trainable:
 * for training from scratch and benchmarks. */
mmc_status mmc_wan_new(const mmc_wan_config *cfg, uint64_t seed, mmc_wan **out);
void mmc_wan_free(mmc_wan *m);
const mmc_wan_config *mmc_wan_cfg(const mmc_wan *m);
int64_t mmc_wan_param_count(const mmc_wan *m);
int mmc_wan_param_list(mmc_wan *m, mmc_tensor ***params, const char *const **names);
/* Every nn.Linear under diffusers' module name ("blocks.0.attn1.to_q", "blocks.0.ffn.net.0.proj",
 * "condition_embedder.time_proj", "proj_out", ...): for LoRA. */
mmc_status mmc_wan_linears(mmc_wan *m, mmc_module_list *ml);

typedef struct {
    mmc_tensor *hidden;        /* [B, in_channels, F, H, W] latents; F, H, W multiples of the patch */
    const float *timestep;     /* [B] as WanPipeline passes it: the scheduler's integer timestep (0..1000) */
    mmc_tensor *encoder;       /* [B, T, text_dim] UMT5 states (zero past each prompt's tokens) */
    mmc_tensor *image;         /* I2V models only (required there, else NULL): [B, S_img, image_dim] CLIP vision
                                  states (encoder_hidden_states_image; 257 of them in Wan2.1 I2V); FLF2V models:
                                  [B, 2 S_img, image_dim], the first then the last frame's (diffusers' view of
                                  encode_image([first, last])) */
} mmc_wan_inputs;
/* The flow prediction [B, out_channels, F, H, W]. Differentiable in grad mode; without it each
 * block's intermediates are released as soon as its output exists. */
mmc_status mmc_wan_forward(mmc_ctx *ctx, mmc_wan *m, const mmc_wan_inputs *in, mmc_tensor **out);
/* Activation recompute (model.recompute: full): in grad mode each block runs under mmc_checkpoint,
 * its intermediates rebuilt in backward (the same gradients, less memory). */
void mmc_wan_set_recompute(mmc_wan *m, bool on);
/* Training (src/train/trainer_wan.c): the flow-matching loss of one micro-batch, on the tape in grad
 * mode: latents / noise [B, C, F, h, w], the batch's sigmas and timesteps (mmc_fm_train_sigma),
 * prompt_embeds [B, T, text_dim], the weighting scheme; target noise - x0 (pooled and guidance unused). */
mmc_status mmc_wan_fm_loss(mmc_ctx *ctx, mmc_wan *m, const mmc_flux_fm_batch *b, mmc_tensor **loss);
/* The image-to-video form (an I2V transformer: in_channels = 2 z_dim + 4): the transformer sees
 * cat([x_t, condition], channels) with condition [B, 4 + z_dim, F, h, w] (mmc_wan_i2v_condition's, per
 * sample) and the CLIP image states image [B, S_img, image_dim]; latents / noise have z_dim channels
 * (out_channels), the target is noise - x0 as above. */
mmc_status mmc_wan_i2v_fm_loss(mmc_ctx *ctx, mmc_wan *m, const mmc_flux_fm_batch *b, mmc_tensor *condition,
                               mmc_tensor *image, mmc_tensor **loss);

/* ---------------------------------------------------------------- WanPipeline (text -> video) */
typedef struct mmc_wan_pipeline mmc_wan_pipeline;
typedef struct {
    int height, width;           /* pixels: multiples of the VAE factor x the patch (16) */
    int frames;                  /* 4k + 1 */
    int steps;
    double guidance;             /* classifier-free guidance; > 1 needs a negative encoding (5.0 in diffusers) */
    void (*progress)(void *user, int step, int n, double step_seconds);
    void *user;
    const mmc_tensor *condition;      /* image-to-video only: mmc_wan_i2v_condition's [1, 4 + z_dim, t, h, w] */
    const mmc_tensor *image_embeds;   /* image-to-video only: mmc_wan_encode_image's [1, S_img, image_dim] */
} mmc_wan_sample_opts;

/* Reads model_index.json (must be WanPipeline) and the configs; loads no weights. */
mmc_status mmc_wan_pipeline_open(const char *dir, mmc_wan_pipeline **out);
void mmc_wan_pipeline_free(mmc_wan_pipeline *p);
const mmc_wan_config *mmc_wan_pipeline_transformer_cfg(const mmc_wan_pipeline *p);
int mmc_wan_pipeline_vae_spatial(const mmc_wan_pipeline *p);     /* 8 */
int mmc_wan_pipeline_vae_temporal(const mmc_wan_pipeline *p);    /* 4 */
/* MMC_ERR_INVALID naming the nearest valid count unless frames = temporal * k + 1. */
mmc_status mmc_wan_pipeline_check_frames(const mmc_wan_pipeline *p, int frames);
/* MMC_ERR_INVALID naming the nearest valid size unless height and width are multiples of the VAE
 * factor times the patch. */
mmc_status mmc_wan_pipeline_check_size(const mmc_wan_pipeline *p, int height, int width);
/* The latent shape [C, F, h, w] of one video. */
void mmc_wan_latent_shape(const mmc_wan_pipeline *p, int frames, int height, int width, int64_t shape[4]);
/* encode_prompt for B prompts: prompt_clean (HTML entities, whitespace), the tokenizer padded to
 * max_sequence_length, UMT5 with the attention mask, and the states past each prompt's tokens set
 * to zero -> [B, max_sequence_length, text_dim] (persistent). */
mmc_status mmc_wan_encode_prompt(mmc_ctx *ctx, mmc_wan_pipeline *p, const char *const *prompts, int B,
                                 int max_sequence_length, mmc_tensor **embeds);
/* WanImageToVideoPipeline (Wan2.1 I2V) only. encode_image: CLIPImageProcessor + CLIPVisionModel's
 * hidden_states[-2] -> [1, S_img, image_dim] (persistent; the encoder is loaded and freed here).
 * i2v_condition: prepare_latents' condition for a clip of frames x height x width from the image:
 * the mask channels and the normalised VAE latents of [image resized with lanczos, zeros]
 * -> [1, scale_factor_temporal + z_dim, t, h, w] (persistent). */
bool mmc_wan_pipeline_is_i2v(const mmc_wan_pipeline *p);
mmc_status mmc_wan_encode_image(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *img, mmc_tensor **embeds);
/* encode_image of n images one by one (the encoder loaded once) -> [n, S_img, image_dim] (persistent). */
mmc_status mmc_wan_encode_images(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *imgs, int n, mmc_tensor **embeds);
/* The pipeline's AutoencoderKLWan (loaded on first use; owned by the pipeline). */
mmc_status mmc_wan_pipeline_vae(mmc_wan_pipeline *p, mmc_wan_vae **vae);
mmc_status mmc_wan_i2v_condition(mmc_wan_pipeline *p, const mmc_image *img, const mmc_image *last, int frames,
                                 int height, int width, mmc_tensor **condition);
/* First-last-frame to video (Wan2.1 FLF2V: an I2V folder whose transformer has pos_embed_seq_len): the
 * pipeline's `last_image`. mmc_wan_i2v_condition with last: the clip [first, zeros, last] and the mask 1 on
 * both given frames. encode_first_last: encode_image([first, last]) as the transformer takes it,
 * [1, 2 S_img, image_dim] (last NULL: encode_image of first). check_last_image: MMC_ERR_INVALID naming
 * what is wrong unless a last frame is given exactly for an FLF2V transformer. */
bool mmc_wan_pipeline_is_flf2v(const mmc_wan_pipeline *p);
mmc_status mmc_wan_pipeline_check_last_image(const mmc_wan_pipeline *p, bool last);
mmc_status mmc_wan_encode_first_last(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_image *first,
                                     const mmc_image *last, mmc_tensor **embeds);
/* The denoising loop on latents [B, C, F, h, w] (updated in place; C = the VAE's z_dim for image to
 * video, with opts.condition and opts.image_embeds); neg may be NULL when guidance <= 1. */
mmc_status mmc_wan_sample(mmc_ctx *ctx, mmc_wan_pipeline *p, const mmc_tensor *cond, const mmc_tensor *neg,
                          mmc_tensor *latents, const mmc_wan_sample_opts *o);
/* A diffusers LoRA on the transformer ("transformer.<module>.lora_A.weight"), applied unmerged at
 * weight x alpha / r. One at a time. */
mmc_status mmc_wan_pipeline_load_lora(mmc_wan_pipeline *p, const char *path, float weight);
void mmc_wan_pipeline_release_transformer(mmc_wan_pipeline *p);
/* Sample with the caller's transformer (training's validation videos: adapters attached), not freed by
 * the pipeline; NULL hands it back. */
void mmc_wan_pipeline_borrow_transformer(mmc_wan_pipeline *p, mmc_wan *m);
const char *mmc_wan_pipeline_vae_dir(const mmc_wan_pipeline *p);
/* output_type="pt": latents [B, C, t, h, w] -> video [B, frames, 3, H, W] in [0, 1] (persistent):
 * denormalised with the VAE's latents_mean / latents_std, decoded clip by clip by AutoencoderKLWan
 * (its chunked causal decode; the transformer is freed first), then x / 2 + 0.5 clamped.
 * progress (may be NULL) is called after each latent frame: done of n over the whole batch. */
mmc_status mmc_wan_decode(mmc_wan_pipeline *p, const mmc_tensor *latents, mmc_wan_vae_progress progress, void *user,
                          mmc_tensor **video);
/* diffusers' Wan prompt_clean into out, as with ftfy installed (Wan's requirements; the I2V pipeline
 * needs it): mmc_ftfy_fix_text (ftfy.fix_text without its mojibake repair), html.unescape twice of the
 * common entities, Python's whitespace runs to one space, stripped. */
void mmc_wan_prompt_clean(const char *in, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* MMC_WAN_T2V_H */
