/* mmc_tokenizer.h — Hugging Face tokenizer.json (byte-level BPE, as used by Qwen2 /
 * Qwen2-VL) and the Qwen2-VL ChatML chat template, in C.
 *
 * Encoding follows HF `tokenizers` exactly for the pipelines it supports:
 *   added/special tokens (matched first, leftmost-longest, on the raw text)
 *   -> normalizer (NFC or none) -> pre-tokenizer (Sequence of Split(regex, Isolated) and
 *   ByteLevel) -> BPE (merges by rank, ignore_merges) -> post-processor (ByteLevel: nothing
 *   added; TemplateProcessing "single": its special tokens when add_special is true).
 * Anything else (WordPiece, Unigram, other normalizers ...) fails at load with
 * MMC_ERR_UNSUPPORTED and a message naming the component.
 *
 * Text is UTF-8. Invalid UTF-8 given to encode is first repaired the way Python's
 * bytes.decode('utf-8', errors='replace') does it (each maximal ill-formed subpart becomes
 * one U+FFFD), so ids equal HF's for the repaired string. Decode reassembles the token
 * bytes and replaces ill-formed sequences the same way (HF: String::from_utf8_lossy).
 *
 * A loaded tokenizer is immutable and may be used from several threads at once.
 */
#ifndef MMC_TOKENIZER_H
#define MMC_TOKENIZER_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_tokenizer mmc_tokenizer;

/* Load from a directory (tokenizer.json [+ tokenizer_config.json]; without tokenizer.json, its
 * tokenizer.model) or from the path of a tokenizer.json or a *.model (tokenizer_config.json is
 * then looked for beside it). */
mmc_status mmc_tokenizer_load(const char *path, mmc_tokenizer **out);
/* The same from memory: the bytes of tokenizer.json and (config may be NULL) of
 * tokenizer_config.json; `name` names them in messages. */
mmc_status mmc_tokenizer_load_memory(const char *json, size_t n, const char *config, size_t config_n,
                                     const char *name, mmc_tokenizer **out);
/* The same for a SentencePiece model (the bytes of tokenizer.model; config may be NULL): what
 * mmc_tokenizer_load reads from a folder with a tokenizer.model and no tokenizer.json (InternLM2,
 * InternVL with InternLM2), or from a path ending in ".model" (src/tokenizer/spm_model.c). */
mmc_status mmc_tokenizer_load_spm_memory(const char *model, size_t n, const char *config, size_t config_n,
                                         const char *name, mmc_tokenizer **out);
void mmc_tokenizer_free(mmc_tokenizer *tok);

/* Encode `len` bytes of UTF-8 text (len < 0: NUL-terminated). *ids is malloc'd (free()),
 * *n its length. add_special: apply the post-processor's special tokens (none for Qwen2). */
mmc_status mmc_tokenizer_encode(const mmc_tokenizer *tok, const char *text, int64_t len,
                                bool add_special, int32_t **ids, int64_t *n);
/* Same, with byte offsets: (*offsets)[2*i], [2*i+1] = [start, end) of token i in `text`
 * (for tokens inside text that NFC changed, the span of the changed characters). */
mmc_status mmc_tokenizer_encode_offsets(const mmc_tokenizer *tok, const char *text, int64_t len,
                                        bool add_special, int32_t **ids, int64_t **offsets,
                                        int64_t *n);
/* Decode ids to a malloc'd NUL-terminated UTF-8 string. skip_special drops added tokens
 * flagged "special". Unknown ids fail with MMC_ERR_INVALID. */
mmc_status mmc_tokenizer_decode(const mmc_tokenizer *tok, const int32_t *ids, int64_t n,
                                bool skip_special, char **out);

/* Id of a token (model vocabulary or added token, exact content), or -1. */
int32_t mmc_tokenizer_token_to_id(const mmc_tokenizer *tok, const char *token);
/* Token string as stored in tokenizer.json (byte-level alphabet for BPE tokens), or NULL. */
const char *mmc_tokenizer_id_to_token(const mmc_tokenizer *tok, int32_t id);
/* 1 + the largest id (model vocabulary and added tokens): HF get_vocab_size(True). */
int32_t mmc_tokenizer_vocab_size(const mmc_tokenizer *tok);
bool mmc_tokenizer_is_special(const mmc_tokenizer *tok, int32_t id);
/* The bytes token id stands for in decoded text (ByteLevel: its bytes; SentencePiece: "▁" as a
 * space, a byte-fallback token "<0xXX>" as its byte): copied to buf when they fit in cap; returns
 * their count (-1: no such id). */
int64_t mmc_tokenizer_token_bytes(const mmc_tokenizer *tok, int32_t id, uint8_t *buf, int64_t cap);

/* Special-token roles from tokenizer_config.json (-1 when absent). */
typedef enum { MMC_TOK_BOS = 0, MMC_TOK_EOS, MMC_TOK_PAD, MMC_TOK_UNK, MMC_TOK_ROLE_COUNT } mmc_tok_role;
int32_t mmc_tokenizer_special_id(const mmc_tokenizer *tok, mmc_tok_role role);
/* Ids that end generation: eos_token, plus <|im_end|> and <|endoftext|> when present.
 * Returns how many were written (at most cap). */
int mmc_tokenizer_eos_ids(const mmc_tokenizer *tok, int32_t *ids, int cap);
/* The chat_template string of tokenizer_config.json, or NULL. */
const char *mmc_tokenizer_chat_template(const mmc_tokenizer *tok);
/* Override the template source for every later render (src: a template's text, which then wins
 * over the directory's files, as `--chat-template FILE` does), and/or pick one of several named
 * templates (name: as transformers' chat_template=NAME). Either may be NULL. Not thread-safe
 * against renders in flight: set it before rendering. */
mmc_status mmc_tokenizer_set_chat_template(mmc_tokenizer *tok, const char *src, const char *name);

/* ------------------------------------------------------------------ chat template
 * Messages rendered with the model's own chat template by the Jinja engine (mmc_template.h),
 * exactly as transformers' apply_chat_template(tokenize=False): the template of the
 * tokenizer's directory in transformers 5's precedence (chat_template.jinja,
 * chat_template.json, processor_config.json, tokenizer_config.json), else the one the
 * tokenizer loaded; content parts become {"type": "text"|"image"|"video"|"audio"}; bos/eos from
 * tokenizer_config.json. mmc_chat_* return MMC_ERR_UNSUPPORTED when there is no chat
 * template, and the template's own error (raise_exception ...) otherwise. */
typedef enum { MMC_CHAT_TEXT = 0, MMC_CHAT_IMAGE, MMC_CHAT_VIDEO, MMC_CHAT_AUDIO } mmc_chat_part_type;
typedef struct {
    mmc_chat_part_type type;
    const char *text; /* MMC_CHAT_TEXT only */
} mmc_chat_part;
typedef struct {
    const char *role;            /* "system", "user", "assistant" */
    const char *content;         /* plain string content, or NULL to use parts */
    const mmc_chat_part *parts;
    int n_parts;
    /* tool use (OpenAI's fields, as transformers' templates read them): an assistant turn's
     * tool_calls (JSON array text; a string "arguments" that holds JSON becomes that object), a
     * tool result's name and tool_call_id; NULL when absent */
    const char *tool_calls, *name, *tool_call_id;
} mmc_chat_message;
typedef struct {
    bool add_generation_prompt;
    bool add_vision_id;
    /* mmc_chat_encode: apply the tokenizer's post-processor (Llama's <s>) to the rendered text,
     * as a processor call does (LlavaProcessor(text=...) tokenizes with add_special_tokens=True);
     * tokenizer.apply_chat_template(tokenize=True) does not (false). */
    bool add_special_tokens;
    /* the template's `tools` (JSON array text of tool schemas), or NULL */
    const char *tools;
} mmc_chat_options;

/* Byte span [start, end) of one assistant turn in the rendered string: what the template adds
 * for it after the generation prompt, trailing whitespace excluded — for ChatML the content
 * plus its closing <|im_end|> (not the role header, not the trailing "\n"). */
typedef struct { int64_t start, end; } mmc_chat_span;

/* Render to a malloc'd string; *spans (malloc'd, may be NULL if spans == NULL) gets one span
 * per assistant message. */
mmc_status mmc_chat_render(const mmc_tokenizer *tok, const mmc_chat_message *msgs, int n_msgs,
                           const mmc_chat_options *opt, char **out, mmc_chat_span **spans,
                           int *n_spans);
/* Render and encode; *mask (malloc'd, may pass NULL) is 1 for tokens that start inside an
 * assistant span (training labels), else 0. */
mmc_status mmc_chat_encode(const mmc_tokenizer *tok, const mmc_chat_message *msgs, int n_msgs,
                           const mmc_chat_options *opt, int32_t **ids, uint8_t **mask, int64_t *n);

/* ftfy.fix_text's character-level fixes (src/tokenizer/ftfy_lite.c: C1 controls as Windows-1252, Latin
 * ligatures, full/half-width forms, curly quotes, line breaks, terminal escapes, control characters,
 * NFC; not the mojibake repair), as diffusers' Wan pipelines apply it to prompts. Malloc'ed; NULL on
 * out of memory. */
char *mmc_ftfy_fix_text(const char *text);

#ifdef __cplusplus
}
#endif
#endif
