/* mmc_omni.h — the Qwen2.5-Omni thinker (transformers' Qwen2_5OmniThinkerForConditionalGeneration,
 * and the thinker.* part of a full Qwen2_5OmniForConditionalGeneration checkpoint), CPU inference:
 * text output from text, audio and images. Speech output (the talker and token2wav) is not
 * supported.
 *
 *   audio  Qwen2_5OmniAudioEncoder (src/models/audio/omni_audio.c): Whisper-like, over the real
 *          frames of WhisperFeatureExtractor's features split into chunks of 2 * n_window frames,
 *          each chunk convolved and attended on its own, then 2x average pooling, ln_post and a
 *          projection to the LM width: L frames -> ((L - 1) / 2 + 1 - 2) / 2 + 1 tokens.
 *   vision the Qwen2.5-VL tower (mmc_vl.h) with its fused q/k/v assembled from Omni's separate
 *          q / k / v weights.
 *   LM     Qwen2 with M-RoPE; positions from get_rope_index (TMRoPE: text and audio count up by
 *          one, an image run gets (t * position_id_per_seconds, h, w) offsets, every run is
 *          wrapped in its bos / eos tokens). Without image or video grids transformers uses
 *          plain 0..T-1 positions, and so does this.
 *
 *          A video run gets (long(t * second_per_grid * position_id_per_seconds), h, w); with
 *          use_audio_in_video the video's audio track and frames share one
 *          <|vision_bos|><|audio_bos|> ... <|audio_eos|><|vision_eos|> block whose tokens alternate
 *          in chunks of seconds_per_chunk (video chunk j, then audio chunk j), both starting at
 *          the same position.
 */
#ifndef MMC_OMNI_H
#define MMC_OMNI_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_models.h"
#include "mmc_ops.h"
#include "mmc_vl.h"
#include "mmc_audio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- audio encoder */
typedef struct {
    int64_t num_mel_bins, d_model, encoder_layers, encoder_attention_heads, encoder_ffn_dim;
    int64_t max_source_positions, n_window, output_dim;
    mmc_act act;
} mmc_omni_audio_config;

typedef struct mmc_omni_audio mmc_omni_audio;

/* audio_config of a thinker config (a parsed JSON object holding "audio_config"). */
mmc_status mmc_omni_audio_config_read(const mmc_json *thinker_cfg, const char *what, mmc_omni_audio_config *c);
/* Bind "<prefix>audio_tower.*" of st (zero-copy, st outliving the encoder; trainable: f32 copies
 * flagged MMC_PARAM | MMC_REQUIRES_GRAD, as mmc_omni_load_ex(dir, true) wants for training). */
mmc_status mmc_omni_audio_load_from(mmc_st *st, const mmc_omni_audio_config *c, const char *prefix,
                                    bool trainable, mmc_omni_audio **out);
void mmc_omni_audio_free(mmc_omni_audio *a);
/* Tokens the encoder makes of L feature frames (transformers' _get_feat_extract_output_lengths). */
int64_t mmc_omni_audio_tokens(int64_t frames);
/* feats [num_mel_bins, stride] row-major, of which the first `frames` columns are used (the
 * feature_attention_mask's ones) -> *out [mmc_omni_audio_tokens(frames), output_dim] in ctx's arena.
 * Records the tape (the encoder trains) when grad mode is on and a parameter of the encoder requires
 * a gradient; otherwise runs without one. */
mmc_status mmc_omni_audio_forward(mmc_ctx *ctx, const mmc_omni_audio *a, const float *feats, int64_t stride,
                                  int64_t frames, mmc_tensor **out);

/* ---------------------------------------------------------------- thinker */
typedef struct mmc_omni {
    mmc_omni_audio *audio;
    mmc_vision *visual;
    mmc_qwen2 *lm;
    int64_t audio_token_id, image_token_id, video_token_id, vision_start_token_id, audio_start_token_id;
    int64_t audio_end_token_id;
    double position_id_per_seconds, seconds_per_chunk;
    bool full_checkpoint;            /* a Qwen2_5OmniForConditionalGeneration (thinker.* prefix) */
    bool has_talker;                 /* ... that holds talker / token2wav weights (not run) */
    mmc_st *st;
    mmc_tensor **qkv_views;          /* training: the vision q / k / v row views of mmc_omni_params, */
    int n_qkv_views;                 /* three per fused qkv weight / bias (borrowed from its caller) */
    mmc_linear_w *vis_parts;         /* LoRA: [depth][3] the vision blocks' q / k / v as adapter hosts
                                      * (qkv.parts), made by mmc_omni_linears */
    /* training under a per-modality plan (mmc_hetero.h, parallel.audio / parallel.vision): the members
     * of share (the language model's tp group) hold the same samples; with share_audio each encodes
     * only its share of a batch's audio clips (balanced by mel frames), with share_vision its share of
     * the images (by patches), and the features are all-gathered over share; NULL: all of them */
    struct mmc_comm *share;
    bool share_audio, share_vision;
    int64_t share_clips, share_frames;     /* what this rank encoded under share: clips and mel frames, */
    int64_t share_images, share_patches;   /* images and patches */
} mmc_omni;

/* config.json model_type "qwen2_5_omni_thinker" or "qwen2_5_omni" (its thinker_config). */
mmc_status mmc_omni_load(const char *dir, mmc_omni **out);
void mmc_omni_free(mmc_omni *m);
/* Is dir a Qwen2.5-Omni checkpoint (thinker or full)? */
bool mmc_omni_is_omni_dir(const char *dir);

typedef struct {
    const float *feats;              /* [num_mel_bins, stride] per audio, in prompt order */
    int64_t stride, frames;          /* columns per row; real frames (mask sum) */
} mmc_omni_audio_in;

typedef struct {
    const mmc_omni_audio_in *audios;
    int n_audios;
    mmc_tensor *pixel_values;        /* [Ni, Cin*kt*p*p] or NULL */
    const int64_t *image_grid_thw;   /* [n_images][3] */
    int n_images;
    mmc_tensor *pixel_values_videos; /* [Nv, Cin*kt*p*p] or NULL */
    const int64_t *video_grid_thw;   /* [n_videos][3] */
    int n_videos;
    const double *second_per_grid;   /* [n_videos]: temporal_patch_size / fps (the processor's 2 / 2.0 = 1) */
    /* Each video takes its audio track: the audios are consumed in prompt order, a video's
     * at its <|VIDEO|> placeholder (transformers' use_audio_in_video / load_audio_from_video). */
    bool use_audio_in_video;
} mmc_omni_media;

/* get_rope_index of Qwen2_5OmniThinkerModel for one row ids [T]: pos [3, T],
 * *delta = max + 1 - T. */
mmc_status mmc_omni_rope_index(const mmc_omni *m, const int32_t *ids, int64_t T, const mmc_omni_media *media,
                               int64_t *pos, int64_t *delta);
/* Prefill ids [1, T] with media (or decode with media NULL and kv->len > 0: positions
 * kv->len + t + *rope_delta) -> hidden [1, T, C] after the final norm. */
mmc_status mmc_omni_forward(mmc_ctx *ctx, mmc_omni *m, const int32_t *ids, int64_t T, const mmc_omni_media *media,
                            mmc_kv_cache *kv, int64_t *rope_delta, mmc_tensor **hidden);

/* Qwen2_5OmniProcessor's audio features (src/processors/omni_processor.c): pcm [n] at
 * fe->sampling_rate -> *feats [fe->feature_size, *stride] (malloc'd; stride = nb_max_frames) and
 * the real frame count (feature_attention_mask's sum). Longer than the window: an error. */
mmc_status mmc_omni_audio_features(const mmc_whisper_fe *fe, const float *pcm, int64_t n, float **feats,
                                   int64_t *stride, int64_t *frames);
/* Qwen2_5OmniProcessor's placeholder expansion on token ids: every <|AUDIO|> becomes the i-th
 * audio's token count (from its real frame count), every <|IMAGE|> grid t*h*w / merge^2 tokens,
 * every <|VIDEO|> its grid's tokens or, with use_audio_in_video, <|audio_bos|> + the video's and
 * its audio's tokens interleaved by seconds_per_chunk + <|audio_eos|> (replace_video_with_audio_token).
 * *out malloc'd. Errors when the placeholders and the media counts disagree. */
mmc_status mmc_omni_expand(const mmc_omni *m, const int32_t *ids, int64_t n, const mmc_omni_media *media,
                           int32_t **out, int64_t *n_out);

/* transformers' get_chunked_index over increasing values: bounds b[0..k] (b has n + 2 slots) of
 * the k runs; a new run starts at each element reaching the next multiple of tpc. */
int mmc_omni_chunks(const double *vals, int64_t n, double tpc, int64_t *b);

/* ---------------------------------------------------------------- training (omni_train.c) */
/* mmc_omni_load with the language model's weights copied to trainable f32 parameters. */
mmc_status mmc_omni_load_ex(const char *dir, bool trainable, mmc_omni **out);
/* A fresh thinker from a parsed thinker config.json (model.init): the LM (mmc_qwen2_new), the
 * vision tower (mmc_vision_new) and the audio encoder (mmc_omni_audio_new) from separate streams
 * of seed; what names the config in messages. */
mmc_status mmc_omni_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_omni **out);
/* A fresh audio encoder: transformers' init (N(0, 0.02) matrices, zero biases, unit LayerNorms). */
mmc_status mmc_omni_audio_new(const mmc_omni_audio_config *c, uint64_t seed, mmc_omni_audio **out);
/* The audio encoder's bound tensors and their checkpoint names ("audio_tower.*"). */
void mmc_omni_audio_params(const mmc_omni_audio *a, mmc_tensor ***params, char (**names)[256], int *n);
int64_t mmc_omni_audio_mels(const mmc_omni_audio *a);
/* xs[0..n) [n_i, C] stacked along rows, on the tape (any n >= 1; mmc_concat takes at most 8). */
mmc_tensor *mmc_omni_cat_rows(mmc_ctx *ctx, mmc_tensor **xs, int n);
/* Whether a parameter of the encoder (or a LoRA adapter on one of its linears) requires a gradient. */
bool mmc_omni_audio_trainable(const mmc_omni_audio *a);
/* The encoder's linears (layers.N.self_attn.{q,k,v,out}_proj, fc1, fc2, proj) under prefix, for LoRA. */
struct mmc_module_list;
mmc_status mmc_omni_audio_linears(mmc_omni_audio *a, const char *prefix, struct mmc_module_list *out);
/* Every parameter of a thinker under save_pretrained's names (model.*, lm_head.weight,
 * audio_tower.*, visual.* with q / k / v as views of the fused qkv; *views (those views and owned
 * copies such as audio_tower.audio_bos_eos_token) freed by the
 * caller with mmc_tensor_free). Arrays malloc'd. */
mmc_status mmc_omni_params(mmc_omni *m, mmc_tensor ***params, char ***names, mmc_tensor ***views, int *n,
                           int *n_views);
/* The LM's and the audio encoder's linears under the live thinker's module names
 * (model.language_model.layers.N.self_attn.q_proj ..., model.audio_tower.layers.N.fc1 ...), what PEFT
 * records for a thinker. */
mmc_status mmc_omni_linears(mmc_omni *m, struct mmc_module_list *out);
/* A PEFT adapter of the thinker applied at inference (`--adapter`). */
mmc_status mmc_omni_attach_adapter(mmc_omni *m, const char *adapter_dir);

/* Request state for mmc_generate (mmc_infer.h). */
typedef struct {
    mmc_omni *m;
    const mmc_omni_media *media;
    int64_t rope_delta;
} mmc_omni_request;
mmc_decoder mmc_omni_decoder(mmc_omni_request *r);

#ifdef __cplusplus
}
#endif
#endif /* MMC_OMNI_H */
