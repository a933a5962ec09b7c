/* tok_internal.h — private layout of mmc_tokenizer shared by tokenizer.c and chat.c, and the
 * regex helper the CLIP and T5 tokenizers share. */
#ifndef MMC_TOK_INTERNAL_H
#define MMC_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "mmc_tokenizer.h"

#define TOK_MAX_SPLITS 4

/* A tokenizers (Onig) regex compiled with PCRE2 (UTF, UCP), \s widened to onig's, which also
 * matches U+0085; NULL with *st set (MMC_ERR_UNSUPPORTED naming path and where) when it does not
 * compile. Defined in clip_bpe.c; the CLIP and T5 tokenizers' normalizers use it. */
pcre2_code *tok_compile_onig(const char *pat, const char *path, const char *where, mmc_status *st);

typedef struct {
    char *content;         /* as in tokenizer.json */
    char *match;           /* the text matched (NFC of content when normalized) */
    int len;               /* strlen(match) */
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* open-addressing hash: bytes -> id; kept at most half full (it grows), so a probe always
 * ends at an empty slot whatever the file holds */
typedef struct {
    uint64_t *hash;        /* 0 = empty */
    int32_t *id;
    uint32_t mask, count;
} tok_strmap;

typedef struct tok_scratch tok_scratch;

/* A SentencePiece model file (tokenizer.model), read and encoded as sentencepiece does:
 * src/tokenizer/spm_model.c. */
typedef struct tok_spm tok_spm;
mmc_status tok_spm_parse(const char *buf, size_t n, const char *path, tok_spm **out);
void tok_spm_free(tok_spm *m);
/* Normalize + encode s[0, n) (the input's bytes [base, base + n)): push(ctx, id, start, end)
 * per token, start / end its span of the input. */
mmc_status tok_spm_encode(const tok_spm *m, const char *s, int64_t n, int64_t base,
                          void (*push)(void *ctx, int32_t id, int64_t start, int64_t end), void *ctx);
/* The pieces spm_model.c and siglip_spm.c share. One protobuf field at *p (< end): its number;
 * a varint's value in *val (data NULL), else the field's bytes in data / len; false when malformed
 * or truncated. */
bool tok_pb_field(const uint8_t **p, const uint8_t *end, uint32_t *num, uint64_t *val, const uint8_t **data,
                  size_t *len);
/* The longest match at s[0, n) in a precompiled charsmap (its Darts double array `units`, n_units
 * entries, any alignment; the replacement strings str[0, str_len)): the match's length, the
 * NUL-terminated replacement in *rep; 0 if none. Every index is checked. */
size_t tok_charsmap_longest(const void *units, uint32_t n_units, const char *str, size_t str_len, const uint8_t *s,
                            size_t n, const char **rep);
int32_t tok_spm_size(const tok_spm *m);
const char *tok_spm_piece(const tok_spm *m, int32_t id, int32_t *len);
int32_t tok_spm_id(const tok_spm *m, const char *piece);   /* -1 if none */
int32_t tok_spm_bos(const tok_spm *m);                     /* trainer_spec's, -1 if none */
int32_t tok_spm_eos(const tok_spm *m);
int32_t tok_spm_unk(const tok_spm *m);
bool tok_spm_byte_fallback(const tok_spm *m);
bool tok_spm_dummy_prefix(const tok_spm *m);

struct mmc_tokenizer {
    int32_t n_ids;              /* 1 + max id */
    char **id_str;              /* [n_ids] token text as in tokenizer.json, NULL for gaps */
    uint8_t **id_bytes;         /* [n_ids] bytes the token decodes to */
    int32_t *id_nbytes;
    uint8_t *is_special;        /* [n_ids] added token with special = true */
    uint8_t *is_added;
    tok_strmap vocab_bytes;     /* model vocab: decoded bytes -> id */
    tok_strmap vocab_str;       /* model vocab + added: token text -> id */
    /* merges: key (left << 32 | right) -> rank, merged id */
    uint64_t *mkey;
    int32_t *mrank, *mid;
    uint32_t mmask;
    int32_t byte_id[256];       /* id of the single-byte token, -1 if none */
    int32_t unk_id;             /* model unk_token id or -1 */
    bool ignore_merges;
    /* SentencePiece-style BPE (Llama, Mistral, LLaVA-1.5, Vicuna ...): symbols start from
     * characters, spaces are "▁" (U+2581), a character missing from the vocab becomes its UTF-8
     * bytes as "<0xXX>" tokens (byte_fallback) or unk (consecutive unks fused with fuse_unk). */
    bool spm;
    bool byte_fallback, fuse_unk;
    int32_t fallback_id[256];   /* id of "<0xXX>", -1 if absent */
    bool spm_norm_prepend;      /* normalizer Prepend("▁") (the Hub's legacy layout): every section */
    bool spm_norm_replace;      /* normalizer Replace(" " -> "▁") */
    bool spm_meta;              /* pre_tokenizer Metaspace("▁") */
    int spm_prepend;            /* Metaspace prepend_scheme: 0 never, 1 always, 2 first */
    bool spm_split;             /* Metaspace split: pieces start at each "▁" */
    bool spm_word_split;        /* no merge joins a character to a following "▁": BPE per "▁" run + word */
    bool dec_byte_fallback;     /* decoder turns "<0xXX>" tokens into bytes */
    int dec_strip_left;         /* decoder strips this many leading spaces of the text */
    bool tf5_llama;             /* tokenizer_class LlamaTokenizer: transformers 5's own pipeline */
    tok_spm *spmodel;           /* tokenizer.model (no tokenizer.json): sentencepiece encodes each section */
    char model_type[64];        /* config.json beside tokenizer.json ("" if none) */
    /* added tokens, and for each first byte the candidates (longest first) */
    tok_added *added;
    int n_added, cap_added;
    int *first_idx[2][256];     /* [normalized?][byte] -> indices into added, -1 terminated */
    bool has_norm_added;
    /* pipeline */
    bool nfc;
    int n_splits;
    pcre2_code *re[TOK_MAX_SPLITS];
    bool re_jit[TOK_MAX_SPLITS];
    int32_t pp_pre[8], pp_post[8];  /* TemplateProcessing "single" special ids */
    int n_pp_pre, n_pp_post;
    bool pp_unsupported;
    char pp_type[48];
    /* tokenizer_config.json */
    int32_t role_id[MMC_TOK_ROLE_COUNT];
    char *chat_template;
    char *chat_template_name;   /* which of several named templates (NULL: "default") */
    bool chat_template_override; /* chat_template was given by the caller: it wins over the files */
    /* per-thread work areas, reused */
    pthread_mutex_t mu;
    tok_scratch *pool;
    char path[1024];
};

#endif
