/* mmc_encoders.h — the text encoders of diffusion pipelines, transformers-exact:
 * CLIPTextModel / CLIPTextModelWithProjection (text_encoder of SD 1.x / Flux, text_encoder /
 * text_encoder_2 of SDXL and SD3) and T5EncoderModel (text_encoder_2 of Flux, _3 of SD3).
 * Implemented in src/models/encoders/{clip_text,t5}.c; the shared loader and attention in
 * src/models/encoders/encoder_common.c.
 *
 * Inference only (no tape is recorded: call with grad mode off). Weights load from a
 * pipeline's component folder (config.json + model.safetensors, or sharded with
 * model.safetensors.index.json), f32 / bf16 / f16, computed in f32. Both the names
 * transformers 4.x writes (text_model.embeddings...) and those 5.x writes for a plain
 * CLIPTextModel (embeddings...) are read.
 *
 * Inputs: ids [B, T] (i32 or i64), mask [B, T] (i32 or i64; nonzero = a real token) or NULL
 * (the diffusion pipelines pass none). Outputs are activations of ctx, f32.
 */
#ifndef MMC_ENCODERS_H
#define MMC_ENCODERS_H

#include "mmc.h"
#include "mmc_io.h"
#include "mmc_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mmc_act (activations named as transformers' ACT2FN keys) is in mmc_ops.h. */
/* "quick_gelu", "gelu", "gelu_new" / "gelu_pytorch_tanh", "relu", "silu" / "swish";
 * MMC_ERR_UNSUPPORTED naming `what` otherwise. */
mmc_status mmc_act_parse(const char *name, const char *what, mmc_act *out);

/* ---------------------------------------------------------------- CLIP text model
 * transformers' models/clip/modeling_clip.py: token + position embeddings, pre-LN encoder
 * layers with a causal mask, final LayerNorm, pooled output at the EOS token. */
typedef struct {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
    int64_t max_position_embeddings, projection_dim;
    double layer_norm_eps;
    int64_t eos_token_id;      /* 2 (the legacy value): pooled at argmax(ids) instead */
    mmc_act hidden_act;
    bool with_projection;      /* CLIPTextModelWithProjection: text_projection [P, C] */
} mmc_clip_text_config;

typedef struct mmc_clip_text mmc_clip_text;

mmc_status mmc_clip_text_config_read(const mmc_json *cfg, const char *what, mmc_clip_text_config *out);
/* dir: a component folder (text_encoder/). Every missing or mis-shaped tensor is listed. */
mmc_status mmc_clip_text_load(const char *dir, mmc_clip_text **out);
/* The same with f32 weights flagged MMC_PARAM | MMC_REQUIRES_GRAD (contrastive training). */
mmc_status mmc_clip_text_load_trainable(const char *dir, mmc_clip_text **out);
/* Up to cap of its bound weights and their checkpoint names (valid while m lives); returns the count. */
int mmc_clip_text_params(mmc_clip_text *m, mmc_tensor **params, const char **names, int cap);
/* config.json from config_dir, the weights from `weights` (taken; as mmc_unet_load_st) */
mmc_status mmc_clip_text_load_st(const char *config_dir, mmc_st *weights, const char *what, mmc_clip_text **out);
void mmc_clip_text_free(mmc_clip_text *m);
const mmc_clip_text_config *mmc_clip_text_cfg(const mmc_clip_text *m);
/* W += scale · B [N, r] · A [r, K] on the linear `module` ("encoder.layers.0.self_attn.q_proj", with or without
 * "text_model."; "text_projection"), in f32 (a view of the checkpoint becomes a copy): a LoRA merged at load, as
 * the pipelines apply a kohya file's text-encoder adapters (src/diffusion/lora_kohya.c). */
mmc_status mmc_clip_text_merge_lora(mmc_clip_text *m, const char *module, const mmc_tensor *A, const mmc_tensor *B,
                                    float scale);
int64_t mmc_clip_text_param_count(const mmc_clip_text *m);

typedef struct {
    mmc_tensor *last_hidden_state;   /* [B, T, C] after final_layer_norm */
    mmc_tensor *penultimate;         /* [B, T, C] hidden_states[-2]: the last layer's input, no final LN */
    mmc_tensor *pooled;              /* [B, C] pooler_output: last_hidden_state at the EOS */
    mmc_tensor *text_embeds;         /* [B, P] text_projection(pooled); NULL without projection */
    /* output_hidden_states: [num_hidden_layers + 1] of [B, T, C], the embeddings first, no final
     * LN; hidden_states[n_hidden - k] is Python's hidden_states[-k] (SD's clip_skip takes
     * -(clip_skip + 1) and applies final_layer_norm; SDXL / SD3 take -(clip_skip + 2)). */
    mmc_tensor **hidden_states;
    int n_hidden;
} mmc_clip_text_out;
/* T <= max_position_embeddings and ids < vocab_size, else MMC_ERR_INVALID. */
mmc_status mmc_clip_text_forward(mmc_ctx *ctx, mmc_clip_text *m, const mmc_tensor *ids, const mmc_tensor *mask,
                                 mmc_clip_text_out *out);

/* ---------------------------------------------------------------- T5 encoder
 * transformers' models/t5/modeling_t5.py (T5EncoderModel = shared embedding + T5Stack), and
 * models/umt5/modeling_umt5.py (UMT5EncoderModel, model_type "umt5": the same blocks, but every
 * layer has its own relative attention bias table). */
typedef struct {
    int64_t vocab_size, d_model, d_kv, d_ff, num_layers, num_heads;
    int64_t num_buckets, max_distance;   /* relative_attention_num_buckets / _max_distance */
    double layer_norm_epsilon;
    bool gated;                          /* feed_forward_proj "gated-*" (v1.1): wi_0, wi_1 */
    mmc_act act;                         /* "gated-gelu" -> gelu_new (tanh) as transformers maps it */
    bool per_layer_bias;                 /* UMT5: relative_attention_bias in every block, not block 0's shared */
} mmc_t5_config;

typedef struct mmc_t5_encoder mmc_t5_encoder;

mmc_status mmc_t5_config_read(const mmc_json *cfg, const char *what, mmc_t5_config *out);
mmc_status mmc_t5_encoder_load(const char *dir, mmc_t5_encoder **out);
void mmc_t5_encoder_free(mmc_t5_encoder *m);
const mmc_t5_config *mmc_t5_encoder_cfg(const mmc_t5_encoder *m);
int64_t mmc_t5_encoder_param_count(const mmc_t5_encoder *m);
/* last_hidden_state [B, T, d_model] (after the final layer norm); penultimate (may be NULL)
 * gets hidden_states[-2], the last block's input. ids < vocab_size, else MMC_ERR_INVALID. */
mmc_status mmc_t5_encoder_forward(mmc_ctx *ctx, mmc_t5_encoder *m, const mmc_tensor *ids, const mmc_tensor *mask,
                                  mmc_tensor **last_hidden_state, mmc_tensor **penultimate);
/* T5Attention._relative_position_bucket (bidirectional), relative = key pos - query pos. */
int mmc_t5_relative_position_bucket(int64_t relative, bool bidirectional, int num_buckets, int max_distance);

/* ---------------------------------------------------------------- BERT encoder
 * transformers' models/bert/modeling_bert.py (BertModel: embeddings with token types, post-LN
 * layers): HunyuanDiT's first text encoder. See src/models/encoders/bert.c. */
typedef struct {
    int64_t vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
    int64_t max_position_embeddings, type_vocab_size;
    double layer_norm_eps;
    mmc_act hidden_act;                  /* "gelu": the erf form */
} mmc_bert_config;

typedef struct mmc_bert mmc_bert;

mmc_status mmc_bert_config_read(const mmc_json *cfg, const char *what, mmc_bert_config *out);
mmc_status mmc_bert_load(const char *dir, mmc_bert **out);
void mmc_bert_free(mmc_bert *m);
const mmc_bert_config *mmc_bert_cfg(const mmc_bert *m);
int64_t mmc_bert_param_count(const mmc_bert *m);
/* last_hidden_state [B, T, hidden_size]; ids [B, T] (T <= max_position_embeddings, ids <
 * vocab_size, else MMC_ERR_INVALID), mask [B, T] key padding or NULL; token types all 0. */
mmc_status mmc_bert_forward(mmc_ctx *ctx, mmc_bert *m, const mmc_tensor *ids, const mmc_tensor *mask,
                            mmc_tensor **last_hidden_state);

/* ---------------------------------------------------------------- BERT tokenizer
 * BERT's WordPiece from a tokenizer.json as transformers' BertTokenizer writes it (BertNormalizer,
 * BertPreTokenizer, WordPiece, "[CLS] $A [SEP]"): HunyuanDiT's first tokenizer. See
 * src/tokenizer/bert_wordpiece.c. Ids equal HF tokenizers'. */
typedef struct mmc_bert_tokenizer mmc_bert_tokenizer;
/* dir: a tokenizer folder (tokenizer.json; tokenizer_config.json for model_max_length) */
mmc_status mmc_bert_tokenizer_load(const char *dir, mmc_bert_tokenizer **out);
void mmc_bert_tokenizer_free(mmc_bert_tokenizer *t);
int mmc_bert_tokenizer_model_max_length(const mmc_bert_tokenizer *t);
int32_t mmc_bert_tokenizer_vocab_size(const mmc_bert_tokenizer *t);
/* The word pieces of text without [CLS] / [SEP]: *n of them, the first cap written. */
mmc_status mmc_bert_tokenizer_encode(const mmc_bert_tokenizer *t, const char *text, int32_t *ids, int cap, int *n);
/* tokenizer(text, padding="max_length", max_length, truncation=True): ids and mask [max_length]. */
mmc_status mmc_bert_tokenizer_encode_padded(const mmc_bert_tokenizer *t, const char *text, int max_length,
                                            int32_t *ids, int32_t *mask);

/* ---------------------------------------------------------------- CLIP tokenizer
 * CLIP's BPE from a tokenizer.json as transformers' CLIPTokenizer writes it (tokenizers
 * backend): added tokens split off the raw text; normalizer NFC, \s+ -> " ", lowercase;
 * pre-tokenizer Split(CLIP's regex, keeping the matches) then ByteLevel; BPE whose word-final
 * symbols carry the "</w>" suffix; RobertaProcessing's bos / eos around the tokens. See
 * src/tokenizer/clip_bpe.c. Ids equal HF tokenizers'. */
typedef struct mmc_clip_tokenizer mmc_clip_tokenizer;

/* dir: a tokenizer folder (tokenizer.json, tokenizer_config.json for pad_token) or the path of
 * a tokenizer.json. A tokenizer.json that is not CLIP's pipeline is MMC_ERR_UNSUPPORTED
 * naming the part (model type, normalizer, pre-tokenizer). */
mmc_status mmc_clip_tokenizer_load(const char *dir, mmc_clip_tokenizer **out);
void mmc_clip_tokenizer_free(mmc_clip_tokenizer *t);
/* bos, eos, pad ids (pad -1 when the tokenizer has none) */
void mmc_clip_tokenizer_special_ids(const mmc_clip_tokenizer *t, int32_t *bos, int32_t *eos, int32_t *pad);
/* tokenizer.model_max_length from tokenizer_config.json (77 for CLIP's checkpoints; the max_length
 * the pipelines pad to); 77 when absent or the "unlimited" sentinel (1e30) transformers writes
 * for tokenizers built without one. */
int mmc_clip_tokenizer_model_max_length(const mmc_clip_tokenizer *t);
/* tokenizer(text).input_ids (special tokens added): into ids[cap], the count in *n;
 * MMC_ERR_INVALID when it exceeds cap. */
mmc_status mmc_clip_tokenizer_encode(const mmc_clip_tokenizer *t, const char *text, int32_t *ids, int cap, int *n);
/* tokenizer(text, padding="max_length", max_length=L, truncation=True), as the diffusion
 * pipelines call it (L = 77): ids[L] (bos, at most L - 2 tokens, eos, then pad), mask[L]
 * (may be NULL; 1 for bos..eos). *n_real (may be NULL) = the unpadded length. */
mmc_status mmc_clip_tokenizer_encode_padded(const mmc_clip_tokenizer *t, const char *text, int max_length,
                                            int32_t *ids, int32_t *mask, int *n_real);

/* ---------------------------------------------------------------- T5 tokenizer
 * T5's SentencePiece Unigram from a tokenizer.json (T5TokenizerFast: tokenizer_2 of Flux,
 * tokenizer_3 of SD3), run as HF tokenizers runs the file: added tokens (<pad>, </s>, <unk>,
 * <extra_id_N>) split off the raw text; normalizers Precompiled (SentencePiece's charsmap,
 * per grapheme), Replace, Strip; pre-tokenizers WhitespaceSplit and Metaspace ("▁", prepend
 * always / never, split); Unigram Viterbi with fused unknowns; TemplateProcessing's "single"
 * (T5: $A </s>). Both the layout the Hub's files have (Sequence[Precompiled, Replace(" {2,}",
 * " ")], Metaspace) and the one transformers 5 writes (Precompiled, Sequence[WhitespaceSplit,
 * Metaspace]) are read. See src/tokenizer/t5_unigram.c. Ids equal HF tokenizers' on the file.
 * The API mirrors the CLIP tokenizer's above. */
typedef struct mmc_t5_tokenizer mmc_t5_tokenizer;

/* dir: a tokenizer folder (tokenizer.json, tokenizer_config.json for pad_token and
 * model_max_length) or the path of a tokenizer.json. A file that is not this pipeline is
 * MMC_ERR_UNSUPPORTED naming the part; a malformed one MMC_ERR_FORMAT naming the key. */
mmc_status mmc_t5_tokenizer_load(const char *dir, mmc_t5_tokenizer **out);
/* Which pipeline runs: FILE (the default above) is tokenizer.json's own, as HF tokenizers and
 * transformers 4.x's T5TokenizerFast run it. TRANSFORMERS5 is what transformers >= 5's T5Tokenizer
 * (T5TokenizerFast) builds from the same folder whatever the file's normalizer / pre-tokenizer /
 * post-processor say: the file's vocabulary, added tokens and charsmap, unk_id 2, normalizer
 * Precompiled alone, Sequence[WhitespaceSplit, Metaspace(always, split)], $A eos_token. On the
 * Hub's T5 files they differ where the text has trailing spaces, is only whitespace, or has a
 * space before an added token (the file's pipeline keeps a "▁" token there). */
typedef enum { MMC_T5_PIPELINE_FILE, MMC_T5_PIPELINE_TRANSFORMERS5 } mmc_t5_pipeline;
mmc_status mmc_t5_tokenizer_load_pipeline(const char *dir, mmc_t5_pipeline pipeline, mmc_t5_tokenizer **out);
void mmc_t5_tokenizer_free(mmc_t5_tokenizer *t);
/* eos ("</s>" from the post-processor, -1 without one), pad (tokenizer_config.json's
 * pad_token, else "<pad>", -1 when neither resolves), unk (the model's unk_id, -1 if none). */
void mmc_t5_tokenizer_special_ids(const mmc_t5_tokenizer *t, int32_t *eos, int32_t *pad, int32_t *unk);
/* 1 + the largest id of the model vocabulary and the added tokens */
int32_t mmc_t5_tokenizer_vocab_size(const mmc_t5_tokenizer *t);
/* tokenizer_config.json's model_max_length (512 for T5's checkpoints); 512 when absent or the
 * "unlimited" sentinel transformers writes (1e30). Flux pads to 512 (schnell 256), SD3 to 256. */
int mmc_t5_tokenizer_model_max_length(const mmc_t5_tokenizer *t);
/* tokenizer(text).input_ids (special tokens added): into ids[cap], the count in *n;
 * MMC_ERR_INVALID when it exceeds cap or text is not valid UTF-8. */
mmc_status mmc_t5_tokenizer_encode(const mmc_t5_tokenizer *t, const char *text, int32_t *ids, int cap, int *n);
/* tokenizer(text, padding="max_length", max_length=L, truncation=True, add_special_tokens=True),
 * as the pipelines call it: ids[L] (at most L - 1 tokens, </s>, then pad), mask[L] (may be NULL;
 * 1 for the real tokens). *n_real (may be NULL) = the unpadded length. */
mmc_status mmc_t5_tokenizer_encode_padded(const mmc_t5_tokenizer *t, const char *text, int max_length,
                                          int32_t *ids, int32_t *mask, int *n_real);

#ifdef __cplusplus
}
#endif
#endif /* MMC_ENCODERS_H */
