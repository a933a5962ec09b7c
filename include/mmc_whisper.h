/* mmc_whisper.h — Whisper speech recognition (transformers' WhisperForConditionalGeneration and
 * WhisperGenerationMixin.generate), CPU inference.
 *
 * The model takes log-mel features [n_mels, frames] as WhisperFeatureExtractor makes them
 * (mmc_audio.h: mmc_whisper_features). The encoder runs on one 30 s window of
 * 2 * max_source_positions frames (3000); mmc_whisper_transcribe walks longer inputs window by
 * window as transformers' long-form generation does (see there).
 *
 * Errors return mmc_status with mmc_last_error() naming the file / key / argument.
 */
#ifndef MMC_WHISPER_H
#define MMC_WHISPER_H

#include "mmc.h"
#include "mmc_ops.h"
#include "mmc_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t vocab_size, num_mel_bins, d_model;
    int64_t encoder_layers, encoder_attention_heads, encoder_ffn_dim;
    int64_t decoder_layers, decoder_attention_heads, decoder_ffn_dim;
    int64_t max_source_positions, max_target_positions;
    int64_t decoder_start_token_id;
    bool scale_embedding;           /* decoder token embeddings * sqrt(d_model) */
    mmc_act activation_function;    /* "gelu" in every released checkpoint */
} mmc_whisper_config;

typedef struct mmc_whisper mmc_whisper;

/* A checkpoint directory: config.json + model.safetensors (or a sharded index). Weight names
 * "model.encoder.*" / "model.decoder.*" (WhisperForConditionalGeneration, every transformers
 * version) or "encoder.*" / "decoder.*" (a bare WhisperModel); the output projection is
 * "proj_out.weight" when the file holds one, else tied to decoder.embed_tokens. */
mmc_status mmc_whisper_load(const char *dir, mmc_whisper **out);
void mmc_whisper_free(mmc_whisper *m);
const mmc_whisper_config *mmc_whisper_cfg(const mmc_whisper *m);
int64_t mmc_whisper_param_count(const mmc_whisper *m);

/* Encoder over one window: feats [n_mels, frames] row-major, frames == 2 * max_source_positions.
 * *out: last_hidden_state [max_source_positions, d_model] in ctx's activation arena. */
mmc_status mmc_whisper_encode(mmc_ctx *ctx, const mmc_whisper *m, const float *feats, int64_t frames,
                              mmc_tensor **out);

/* Decoder state for one encoder output: the cross-attention keys/values (computed once here)
 * and the self-attention KV cache (max_target_positions long). */
typedef struct mmc_whisper_dec mmc_whisper_dec;
mmc_status mmc_whisper_dec_new(mmc_ctx *ctx, const mmc_whisper *m, const mmc_tensor *enc, mmc_whisper_dec **out);
void mmc_whisper_dec_free(mmc_whisper_dec *d);
/* Forget the self-attention cache (the cross keys/values stay). */
void mmc_whisper_dec_reset(mmc_whisper_dec *d);
int64_t mmc_whisper_dec_len(const mmc_whisper_dec *d);
/* Feed n tokens after the cached ones; logits [n, vocab] (all_logits) or [vocab] (the last
 * token's) into `logits`. MMC_ERR_INVALID past max_target_positions or for an id out of range. */
mmc_status mmc_whisper_dec_step(mmc_ctx *ctx, mmc_whisper_dec *d, const int32_t *ids, int64_t n, bool all_logits,
                                float *logits);

/* generation_config.json (with config.json's forced_decoder_ids as transformers' fallback). */
#define MMC_WHISPER_MAX_LANGS 128
#define MMC_WHISPER_MAX_SUPPRESS 512
typedef struct {
    int32_t decoder_start_token_id, eos_token_id, no_timestamps_token_id; /* -1: absent */
    int32_t prev_sot_token_id;
    int32_t max_length, max_initial_timestamp_index;                     /* -1: absent */
    bool is_multilingual;               /* false only when the file says so */
    bool return_timestamps;
    int n_forced;                       /* forced_decoder_ids [[i, id|null] ...]: ids at 1..n */
    int32_t forced[8];                  /* -1 for null (the language slot) */
    int n_langs;
    char lang_tok[MMC_WHISPER_MAX_LANGS][24];   /* "<|en|>" */
    int32_t lang_id[MMC_WHISPER_MAX_LANGS];
    int32_t transcribe_id, translate_id;        /* task_to_id; -1 absent */
    int n_suppress, n_begin_suppress;
    int32_t suppress[MMC_WHISPER_MAX_SUPPRESS], begin_suppress[16];
} mmc_whisper_gen_config;
mmc_status mmc_whisper_gen_config_load(const char *dir, mmc_whisper_gen_config *g);

typedef struct {
    const char *language;   /* "en", "<|en|>", "english", or NULL: detected at the first window */
    const char *task;       /* "transcribe", "translate" or NULL (generation config's) */
    bool timestamps;        /* return_timestamps (on as well when generation_config.json says so) */
    int max_new_tokens;     /* 0: generation_config max_length rules */
} mmc_whisper_opts;

typedef struct {
    double start, end;      /* seconds */
    int64_t first, n;       /* tokens[first .. first+n) of the result */
} mmc_whisper_segment;

typedef struct {
    int32_t *tokens;        /* what transformers' generate() returns: every segment's tokens */
    int64_t n;
    mmc_whisper_segment *segs;
    int n_segs;
    int32_t language_id;    /* the language token used (given or detected); -1 none */
    int32_t prompt[8];      /* the decoder prompt of every window */
    int n_prompt;
    int n_windows;
} mmc_whisper_result;

/* Greedy transcription of features [n_mels, frames] (any frames >= 1), as
 * model.generate(input_features, language=, task=, return_timestamps=, max_new_tokens=) does for
 * one clip with the generation config's defaults (temperature 0, no fallback thresholds,
 * condition_on_prev_tokens off): windows of 2 * max_source_positions frames (zero-padded at the
 * end) starting at `seek`, each decoded from <|startoftranscript|><|lang|><|task|>[<|notimestamps|>]
 * with the suppress / begin-suppress / timestamp logits rules, then seek moves to the last
 * complete timestamp pair (or to the window's end). */
mmc_status mmc_whisper_transcribe(const mmc_whisper *m, const mmc_whisper_gen_config *g, const float *feats,
                                  int64_t frames, const mmc_whisper_opts *o, mmc_whisper_result *r);
void mmc_whisper_result_free(mmc_whisper_result *r);
/* The text of ids as WhisperTokenizer.decode(ids, skip_special_tokens=True) gives it: timestamp
 * tokens and special tokens dropped. *out malloc'd. (The generic mmc_tokenizer_decode keeps the
 * timestamps, which are ordinary added tokens in tokenizer.json.) */
mmc_status mmc_whisper_text(const mmc_tokenizer *tok, const mmc_whisper_gen_config *g, const int32_t *ids, int64_t n,
                            char **out);
/* The first token id that is a timestamp (<|0.00|>): no_timestamps_token_id + 1. */
int32_t mmc_whisper_timestamp_begin(const mmc_whisper_gen_config *g);

#ifdef __cplusplus
}
#endif
#endif
