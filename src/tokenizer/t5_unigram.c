/* t5_unigram.c — T5's SentencePiece Unigram tokenizer from tokenizer.json, mirroring HF tokenizers
 * (the Rust crate, 0.2x) on the files T5TokenizerFast reads (Flux's tokenizer_2, SD3's tokenizer_3):
 *
 *   added tokens (normalized false: <pad>, </s>, <unk>, <extra_id_N>) split off the raw text,
 *   leftmost and longest first (AddedVocabulary's LeftmostLongest matcher);
 *   each remaining piece through the normalizers in order:
 *     Precompiled: SentencePiece's precompiled_charsmap (spm_precompiled crate), applied per
 *       extended grapheme cluster: a cluster under 6 bytes with a trie match is replaced whole
 *       by the string of its FIRST (shortest) prefix match; otherwise each code point by its own
 *       first match, or kept. (Not SentencePiece's own greedy longest match: HF's, which is what
 *       the ids must equal);
 *     Replace (regex via PCRE2 as onig matches it, or a literal), Strip (char::is_whitespace);
 *   pre-tokenizers: WhitespaceSplit (drop Unicode White_Space, split there), then Metaspace:
 *   ' ' -> "▁", "▁" prepended to a piece that does not start with it (prepend_scheme "always";
 *   "never" too), split before each "▁" (MergedWithNext); empty pieces vanish;
 *   Unigram per piece: Viterbi over a byte trie of the vocabulary, as tokenizers'
 *   encode_optimized: positions visited left to right, a candidate replaces the best path
 *   into a position only when strictly better (ties keep the earliest start), a code point
 *   with no single-character piece gets the unk node (score min_score - 10); consecutive unk
 *   nodes fuse into one token whose id is looked up again (unk_id unless the fused text is a
 *   piece);
 *   TemplateProcessing's "single": special ids before / after (T5: $A </s>); truncation to
 *   max_length keeps room for them, then right padding with the pad id.
 *
 * Precompiled charsmap (little endian): u32 trie_size (bytes), trie_size / 4 u32 units of a Darts
 * double array, then NUL-terminated normalized strings. A unit: bits 0-7 label (bit 31 too, so a
 * leaf never equals a byte), bit 8 has_leaf, bit 9 offset scale (<< 8), bits 10-30 offset;
 * a leaf's value (bits 0-30) is the offset of its string. Lookup walks the input bytes:
 * pos ^= offset(unit), pos ^= byte, label check, has_leaf -> value at pos ^ offset.
 * Every index is bounds-checked here (a bad blob is no match, not a crash).
 *
 * Known divergences: grapheme clusters come from utf8proc (its Unicode version); HF uses the
 * unicode-segmentation crate, which may differ on the newest rules (Indic conjuncts, GB9c).
 * transformers 5's T5Tokenizer rebuilds its own pipeline (Precompiled, WhitespaceSplit,
 * Metaspace) whatever tokenizer.json says: MMC_T5_PIPELINE_TRANSFORMERS5 does the same; the
 * default runs what the file says, as tokenizers and transformers 4.x do. On the Hub's files the
 * two differ on trailing spaces, whitespace-only text and spaces next to added tokens (a "▁"
 * token the file's pipeline keeps). */
#include "mmc_encoders.h"
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define MAX_NORMALIZERS 8
#define MAX_SPECIAL 8
#define UNK_PENALTY 10.0      /* tokenizers' K_UNK_PENALTY */
#define GRAPHEME_WHOLE 6      /* clusters shorter than this (bytes) are looked up whole */

typedef enum { NORM_PRECOMPILED, NORM_REPLACE, NORM_STRIP } norm_kind;
typedef struct {
    norm_kind kind;
    /* NORM_PRECOMPILED */
    uint32_t *units;          /* [n_units] the double array */
    size_t n_units;
    char *strings;            /* [n_strings] normalized strings, NUL-separated (valid UTF-8) */
    size_t n_strings;
    /* NORM_REPLACE */
    pcre2_code *re;
    char *content;
    /* NORM_STRIP */
    bool left, right;
} normalizer;

typedef struct { char *content; int len; int32_t id; } added_token;

/* the vocabulary as a byte trie: edges in an open-addressing table keyed (node << 8 | byte) */
typedef struct { uint64_t key; int32_t child; } edge;

struct mmc_t5_tokenizer {
    char path[1024];
    /* Unigram */
    double *score;            /* [n_vocab] */
    int32_t n_vocab;
    int32_t *node_tok;        /* [n_nodes] piece id ending at the node, -1 none; node 0 = root */
    int32_t n_nodes, cap_nodes;
    edge *edges;
    uint32_t edge_mask;
    int32_t unk;              /* unk_id, -1 if none */
    double min_score;
    /* pipeline */
    normalizer norms[MAX_NORMALIZERS];
    int n_norms;
    bool ws_split;            /* WhitespaceSplit before Metaspace */
    bool metaspace, prepend, ms_split;
    char repl[8];             /* Metaspace replacement (UTF-8) */
    int repl_len;
    added_token *added;
    int n_added;
    bool added_first[256];    /* a byte some added token starts with: only there is a match tried */
    int32_t pre[MAX_SPECIAL], post[MAX_SPECIAL];   /* TemplateProcessing "single" */
    int n_pre, n_post;
    int32_t eos, pad, max_id;
    int model_max_length;
    bool tf5;                 /* MMC_T5_PIPELINE_TRANSFORMERS5: only the charsmap of the pipeline is read */
};

/* ------------------------------------------------------------------ UTF-8 and whitespace */
static int utf8_len(uint8_t b) { return b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2; }

/* well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as a Rust &str is */
static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || n - i < (size_t)k) return false;
        for (int j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += (size_t)k;
    }
    return true;
}

/* Rust's char::is_whitespace (Unicode White_Space) */
static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ------------------------------------------------------------------ growable byte / id buffers */
typedef struct { char *s; size_t n, cap; } sbuf;
static bool sb_put(sbuf *b, const char *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) return false;
        b->s = s, b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return true;
}

typedef struct { int32_t *v; int n, cap; } ids_buf;
static bool ids_push(ids_buf *b, int32_t id) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        int32_t *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = id;
    return true;
}

/* ------------------------------------------------------------------ the vocabulary trie */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb3f97f4a7c15ull;
    return x ^ (x >> 33);
}
static int32_t trie_step(const mmc_t5_tokenizer *t, int32_t node, uint8_t byte) {
    uint64_t key = (uint64_t)node << 8 | byte;
    for (uint32_t i = (uint32_t)mix64(key) & t->edge_mask;; i = (i + 1) & t->edge_mask) {
        if (t->edges[i].child < 0) return -1;
        if (t->edges[i].key == key) return t->edges[i].child;
    }
}
/* Adds piece s as id; a repeated piece takes the later id, as tokenizers' token_to_ids does. */
static mmc_status trie_add(mmc_t5_tokenizer *t, const char *s, int32_t id) {
    int32_t node = 0;
    for (const uint8_t *p = (const uint8_t *)s; *p; p++) {
        int32_t next = trie_step(t, node, *p);
        if (next < 0) {
            if (t->n_nodes == t->cap_nodes) return mmc_error(MMC_ERR_INVALID, "%s: trie overflow", t->path);
            next = t->n_nodes++;
            t->node_tok[next] = -1;
            uint64_t key = (uint64_t)node << 8 | *p;
            uint32_t i = (uint32_t)mix64(key) & t->edge_mask;
            while (t->edges[i].child >= 0) i = (i + 1) & t->edge_mask;
            t->edges[i] = (edge){key, next};
        }
        node = next;
    }
    if (node) t->node_tok[node] = id;   /* an empty piece never matches (as tokenizers' trie) */
    return MMC_OK;
}
/* id of the piece equal to s[0, n), -1 if none */
static int32_t piece_id(const mmc_t5_tokenizer *t, const char *s, size_t n) {
    int32_t node = 0;
    for (size_t i = 0; i < n && node >= 0; i++) node = trie_step(t, node, (uint8_t)s[i]);
    return node > 0 ? t->node_tok[node] : -1;
}

/* ------------------------------------------------------------------ loading */
static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static bool jtrue(const cJSON *o, const char *k) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k)); }

static int b64_val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}
/* standard alphabet, '=' padding optional; NULL on a bad character */
static uint8_t *b64_decode(const char *s, size_t *n_out) {
    size_t n = strlen(s);
    uint8_t *out = malloc(n / 4 * 3 + 3);
    if (!out) return NULL;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=') {
            for (size_t k = i; k < n; k++)
                if (s[k] != '=') { free(out); return NULL; }
            break;
        }
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) { free(out); return NULL; }
        acc = acc << 6 | (uint32_t)v, bits += 6;
        if (bits >= 8) bits -= 8, out[o++] = (uint8_t)(acc >> bits);
    }
    *n_out = o;
    return out;
}

static mmc_status read_precompiled(mmc_t5_tokenizer *t, normalizer *nm, const cJSON *n) {
    const char *b64 = jstr(n, "precompiled_charsmap");
    if (!b64) {
        /* tokenizers accepts none (an empty charsmap): nothing is rewritten */
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(n, "precompiled_charsmap"))) return MMC_OK;
        return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Precompiled: precompiled_charsmap missing", t->path);
    }
    size_t len = 0;
    uint8_t *blob = b64_decode(b64, &len);
    if (!blob) return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Precompiled: precompiled_charsmap is not base64", t->path);
    mmc_status st = MMC_OK;
    uint32_t trie_size = len >= 4 ? (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24 : 0;
    size_t n_units = trie_size / 4;
    if (len < 4 || n_units > (len - 4) / 4) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: normalizer Precompiled: precompiled_charsmap is truncated (%zu bytes, trie %u)",
                       t->path, len, trie_size);
        goto done;
    }
    nm->n_units = n_units;
    nm->n_strings = len - 4 - 4 * n_units;
    nm->units = malloc((n_units ? n_units : 1) * sizeof *nm->units);
    nm->strings = malloc(nm->n_strings + 1);
    if (!nm->units || !nm->strings) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (size_t i = 0; i < n_units; i++) {
        const uint8_t *u = blob + 4 + 4 * i;
        nm->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(nm->strings, blob + 4 + 4 * n_units, nm->n_strings);
    nm->strings[nm->n_strings] = 0;
    /* spm_precompiled rejects strings that are not UTF-8 */
    if (!utf8_valid((const uint8_t *)nm->strings, nm->n_strings)) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: normalizer Precompiled: the normalized strings are not valid UTF-8", t->path);
    }
done:
    free(blob);
    return st;
}

static mmc_status read_normalizers(mmc_t5_tokenizer *t, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return MMC_OK;
    const char *type = jstr(n, "type");
    if (!type) return mmc_error(MMC_ERR_FORMAT, "%s: normalizer without \"type\"", t->path);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
        if (!cJSON_IsArray(list)) return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Sequence without \"normalizers\" array", t->path);
        cJSON_ArrayForEach(it, list) {
            mmc_status st = read_normalizers(t, it);
            if (st) return st;
        }
        return MMC_OK;
    }
    if (t->tf5 && (strcmp(type, "Precompiled") || t->n_norms)) return MMC_OK;   /* the first charsmap only */
    if (t->n_norms == MAX_NORMALIZERS)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than %d normalizers", t->path, MAX_NORMALIZERS);
    normalizer *nm = &t->norms[t->n_norms++];
    if (!strcmp(type, "Precompiled")) {
        nm->kind = NORM_PRECOMPILED;
        return read_precompiled(t, nm, n);
    }
    if (!strcmp(type, "Strip")) {
        nm->kind = NORM_STRIP;
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(n, "strip_left"), *r = cJSON_GetObjectItemCaseSensitive(n, "strip_right");
        if ((l && !cJSON_IsBool(l)) || (r && !cJSON_IsBool(r)))
            return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Strip: strip_left / strip_right are not booleans", t->path);
        nm->left = cJSON_IsTrue(l), nm->right = cJSON_IsTrue(r);
        return MMC_OK;
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String"), *content = jstr(n, "content");
        if ((!re && !lit) || !content)
            return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Replace needs pattern.Regex / pattern.String and content", t->path);
        nm->kind = NORM_REPLACE;
        mmc_status st = MMC_OK;
        if (re) {
            nm->re = tok_compile_onig(re, t->path, "normalizer Replace", &st);
        } else {
            int err;
            PCRE2_SIZE off;
            nm->re = pcre2_compile((PCRE2_SPTR)lit, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_LITERAL, &err, &off, NULL);
            if (!nm->re) st = mmc_error(MMC_ERR_FORMAT, "%s: normalizer Replace: pattern.String is not valid UTF-8", t->path);
        }
        if (st) return st;
        if (!(nm->content = strdup(content))) return mmc_error(MMC_ERR_OOM, "out of memory");
        return MMC_OK;
    }
    t->n_norms--;
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported by the T5 tokenizer (Precompiled, "
                     "Replace, Strip)", t->path, type);
}

static mmc_status read_metaspace(mmc_t5_tokenizer *t, const cJSON *p) {
    const char *repl = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
    if (!repl || !*repl || (size_t)utf8_len((uint8_t)repl[0]) != strlen(repl) || strlen(repl) >= sizeof t->repl)
        return mmc_error(MMC_ERR_FORMAT, "%s: pre_tokenizer Metaspace: \"replacement\" is not one character", t->path);
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"), *split = cJSON_GetObjectItemCaseSensitive(p, "split");
    /* tokenizers: prepend_scheme defaults to "always"; add_prefix_space false means "never" */
    bool never = scheme && !strcmp(scheme, "never");
    if (scheme && !never && strcmp(scheme, "always"))
        /* "first" asks whether a piece starts at original offset 0, which needs tokenizers' offset
         * alignments through the charsmap; T5's files say "always" */
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer Metaspace: prepend_scheme '%s' is not supported "
                         "(always, never)", t->path, scheme);
    if (cJSON_IsFalse(aps)) {
        if (scheme && !never)
            return mmc_error(MMC_ERR_FORMAT, "%s: pre_tokenizer Metaspace: add_prefix_space false does not match "
                             "prepend_scheme '%s'", t->path, scheme);
        never = true;
    }
    if (split && !cJSON_IsBool(split))
        return mmc_error(MMC_ERR_FORMAT, "%s: pre_tokenizer Metaspace: \"split\" is not a boolean", t->path);
    t->metaspace = true;
    t->prepend = !never;
    t->ms_split = !split || cJSON_IsTrue(split);
    strcpy(t->repl, repl);
    t->repl_len = (int)strlen(repl);
    return MMC_OK;
}

/* Metaspace alone, or Sequence[WhitespaceSplit, Metaspace], or null */
static mmc_status read_pre_tokenizer(mmc_t5_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return MMC_OK;
    const char *type = jstr(p, "type");
    if (type && !strcmp(type, "Metaspace")) return read_metaspace(t, p);
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *it;
        if (!cJSON_IsArray(list)) return mmc_error(MMC_ERR_FORMAT, "%s: pre_tokenizer Sequence without \"pretokenizers\" array", t->path);
        int i = 0;
        cJSON_ArrayForEach(it, list) {
            const char *ty = jstr(it, "type");
            if (ty && !strcmp(ty, "WhitespaceSplit") && i == 0 && !t->metaspace) {
                t->ws_split = true;
            } else if (ty && !strcmp(ty, "Metaspace") && !t->metaspace) {
                mmc_status st = read_metaspace(t, it);
                if (st) return st;
            } else {
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer Sequence item %d ('%s') is not supported by the "
                                 "T5 tokenizer (WhitespaceSplit then Metaspace)", t->path, i, ty ? ty : "?");
            }
            i++;
        }
        return MMC_OK;
    }
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer '%s' is not supported by the T5 tokenizer (Metaspace, "
                     "Sequence[WhitespaceSplit, Metaspace])", t->path, type ? type : "?");
}

static mmc_status read_model(mmc_t5_tokenizer *t, const cJSON *m) {
    const char *type = jstr(m, "type");
    if (!m) return mmc_error(MMC_ERR_FORMAT, "%s: \"model\" missing", t->path);
    if (!type || strcmp(type, "Unigram"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model type '%s' is not Unigram", t->path, type ? type : "?");
    if (jtrue(m, "byte_fallback") && !t->tf5)   /* transformers 5 builds the model with byte_fallback false */
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: Unigram byte_fallback is not supported by the T5 tokenizer", t->path);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id");
    if (!cJSON_IsArray(vocab) || cJSON_GetArraySize(vocab) == 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab is not a non-empty array of [piece, score]", t->path);
    int nv = cJSON_GetArraySize(vocab);
    size_t bytes = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        const cJSON *p = cJSON_GetArrayItem(it, 0), *s = cJSON_GetArrayItem(it, 1);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsString(p) || !cJSON_IsNumber(s))
            return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab entry is not [piece, score]", t->path);
        bytes += strlen(p->valuestring);
    }
    if (bytes > (size_t)INT32_MAX / 4) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.vocab too large", t->path);
    t->n_vocab = nv;
    t->cap_nodes = (int32_t)bytes + 1;
    t->edge_mask = 15;
    while (t->edge_mask + 1 < 2 * (uint64_t)t->cap_nodes) t->edge_mask = t->edge_mask * 2 + 1;
    t->score = malloc((size_t)nv * sizeof *t->score);
    t->node_tok = malloc((size_t)t->cap_nodes * sizeof *t->node_tok);
    t->edges = malloc(((size_t)t->edge_mask + 1) * sizeof *t->edges);
    if (!t->score || !t->node_tok || !t->edges) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (uint32_t i = 0; i <= t->edge_mask; i++) t->edges[i].child = -1;
    t->n_nodes = 1;
    t->node_tok[0] = -1;
    t->min_score = INFINITY;
    int32_t id = 0;
    cJSON_ArrayForEach(it, vocab) {
        double s = cJSON_GetArrayItem(it, 1)->valuedouble;
        t->score[id] = s;
        if (s < t->min_score) t->min_score = s;
        mmc_status st = trie_add(t, cJSON_GetArrayItem(it, 0)->valuestring, id);
        if (st) return st;
        id++;
    }
    t->unk = -1;
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsNumber(unk) || unk->valuedouble < 0 || unk->valuedouble >= nv ||
            unk->valuedouble != (double)(int64_t)unk->valuedouble)
            return mmc_error(MMC_ERR_FORMAT, "%s: model.unk_id is not an id inside the vocabulary (%d pieces)", t->path,
                             nv);
        t->unk = (int32_t)unk->valuedouble;
    }
    t->max_id = nv - 1;
    return MMC_OK;
}

static int32_t token_id(const mmc_t5_tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return piece_id(t, s, strlen(s));
}

static mmc_status read_added(mmc_t5_tokenizer *t, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return MMC_OK;
    if (!cJSON_IsArray(list)) return mmc_error(MMC_ERR_FORMAT, "%s: \"added_tokens\" is not an array", t->path);
    if (!(t->added = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *t->added))) return mmc_error(MMC_ERR_OOM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        const char *c = jstr(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!c || !*c || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1 ||
            id->valuedouble != (double)(int64_t)id->valuedouble)
            return mmc_error(MMC_ERR_FORMAT, "%s: added_tokens entry without content / a valid id", t->path);
        if (jtrue(it, "normalized") || jtrue(it, "lstrip") || jtrue(it, "rstrip") || jtrue(it, "single_word"))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: added token '%s': normalized / lstrip / rstrip / single_word are "
                             "not supported by the T5 tokenizer", t->path, c);
        added_token *a = &t->added[t->n_added++];
        if (!(a->content = strdup(c))) return mmc_error(MMC_ERR_OOM, "out of memory");
        a->len = (int)strlen(c);
        a->id = (int32_t)id->valuedouble;
        t->added_first[(uint8_t)c[0]] = true;
        if (a->id > t->max_id) t->max_id = a->id;
    }
    return MMC_OK;
}

/* TemplateProcessing "single": [SpecialToken*, Sequence A, SpecialToken*] */
static mmc_status read_post_processor(mmc_t5_tokenizer *t, const cJSON *p) {
    t->eos = -1;
    if (!p || cJSON_IsNull(p)) return MMC_OK;
    const char *type = jstr(p, "type");
    if (!type || strcmp(type, "TemplateProcessing"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor '%s' is not supported by the T5 tokenizer "
                         "(TemplateProcessing)", t->path, type ? type : "?");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens"), *it;
    if (!cJSON_IsArray(single)) return mmc_error(MMC_ERR_FORMAT, "%s: post_processor.single is not an array", t->path);
    bool seen_a = false;
    cJSON_ArrayForEach(it, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence"), *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (seq) {
            const char *sid = jstr(seq, "id");
            if (!sid || strcmp(sid, "A") || seen_a)
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor.single: only one Sequence A", t->path);
            seen_a = true;
            continue;
        }
        const char *name = jstr(sp, "id");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids"), *x;
        if (!name || !cJSON_IsArray(ids))
            return mmc_error(MMC_ERR_FORMAT, "%s: post_processor.single: a SpecialToken without special_tokens[id].ids", t->path);
        cJSON_ArrayForEach(x, ids) {
            int *n = seen_a ? &t->n_post : &t->n_pre;
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX)
                return mmc_error(MMC_ERR_FORMAT, "%s: post_processor.special_tokens['%s'].ids: not an id", t->path, name);
            if (*n == MAX_SPECIAL)
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor: more than %d special tokens", t->path, MAX_SPECIAL);
            (seen_a ? t->post : t->pre)[(*n)++] = (int32_t)x->valuedouble;
            if ((int32_t)x->valuedouble > t->max_id) t->max_id = (int32_t)x->valuedouble;
        }
    }
    if (!seen_a) return mmc_error(MMC_ERR_FORMAT, "%s: post_processor.single has no Sequence A", t->path);
    int32_t eos = token_id(t, "</s>");
    for (int i = 0; i < t->n_post; i++)
        if (t->post[i] == eos || i == t->n_post - 1) { t->eos = t->post[i]; break; }
    return MMC_OK;
}

static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
}

/* the project's JSON reader (errors name line:col); mmc_json is a cJSON node, walked here as
 * the other tokenizers walk tokenizer.json */
static cJSON *load_json(const char *path, mmc_status *st) {
    mmc_json *j = NULL;
    *st = mmc_json_load(path, &j);
    return (cJSON *)j;
}

/* transformers 5's T5Tokenizer.__init__ keeps the file's vocabulary, added tokens and charsmap
 * and rebuilds the rest: Unigram(unk_id=2), normalizer Precompiled alone (none without a
 * charsmap), Sequence[WhitespaceSplit, Metaspace("▁", always, split)], TemplateProcessing
 * $A eos_token. */
static mmc_status rebuild_as_transformers5(mmc_t5_tokenizer *t, const char *eos_token) {
    t->ws_split = t->metaspace = t->prepend = t->ms_split = true;
    strcpy(t->repl, "\xe2\x96\x81");
    t->repl_len = 3;
    if (t->n_vocab <= 2) return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab: T5Tokenizer's unk_id 2 is outside it", t->path);
    t->unk = 2;
    int32_t eos = token_id(t, eos_token);
    if (eos < 0) return mmc_error(MMC_ERR_FORMAT, "%s: eos_token '%s' is not in the vocabulary", t->path, eos_token);
    t->n_pre = 0, t->n_post = 1, t->post[0] = t->eos = eos;
    return MMC_OK;
}

mmc_status mmc_t5_tokenizer_load(const char *dir, mmc_t5_tokenizer **out) {
    return mmc_t5_tokenizer_load_pipeline(dir, MMC_T5_PIPELINE_FILE, out);
}

mmc_status mmc_t5_tokenizer_load_pipeline(const char *dir, mmc_t5_pipeline pipeline, mmc_t5_tokenizer **out) {
    *out = NULL;
    mmc_status st = MMC_OK;
    cJSON *j = NULL, *cfg = NULL;
    mmc_t5_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
    size_t dl = strlen(dir);
    bool is_file = dl >= 5 && !strcmp(dir + dl - 5, ".json");
    snprintf(t->path, sizeof t->path, is_file ? "%s" : "%s/tokenizer.json", dir);
    t->tf5 = pipeline == MMC_T5_PIPELINE_TRANSFORMERS5;
    if (!(j = load_json(t->path, &st))) goto fail;
    if (!cJSON_IsObject(j)) { st = mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", t->path); goto fail; }
    if ((st = read_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"))) ||
        (st = read_normalizers(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"))) ||
        (!t->tf5 && (st = read_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer")))) ||
        (st = read_added(t, cJSON_GetObjectItemCaseSensitive(j, "added_tokens"))) ||
        (!t->tf5 && (st = read_post_processor(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor")))))
        goto fail;
    /* tokenizer_config.json beside it: pad_token, model_max_length */
    char cpath[1100];
    if (is_file) {
        const char *slash = strrchr(dir, '/');
        snprintf(cpath, sizeof cpath, "%.*stokenizer_config.json", slash ? (int)(slash - dir + 1) : 0, dir);
    } else {
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    }
    const char *pad = "<pad>", *eos = "</s>";   /* T5Tokenizer's defaults */
    FILE *f = fopen(cpath, "rb");
    if (f) {
        fclose(f);
        if (!(cfg = load_json(cpath, &st))) goto fail;
        const cJSON *mml = cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length");
        if (cJSON_IsNumber(mml) && mml->valuedouble >= 1 && mml->valuedouble <= 1e7) t->model_max_length = (int)mml->valuedouble;
        const char *p = config_token(cfg, "pad_token");
        if (p) {
            if (token_id(t, p) < 0) {
                st = mmc_error(MMC_ERR_FORMAT, "%s: pad_token '%s' is not in the vocabulary", cpath, p);
                goto fail;
            }
            pad = p;
        }
        if ((p = config_token(cfg, "eos_token"))) eos = p;
    }
    t->pad = token_id(t, pad);
    if (pipeline == MMC_T5_PIPELINE_TRANSFORMERS5 && (st = rebuild_as_transformers5(t, eos))) goto fail;
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    *out = t;
    return MMC_OK;
fail:
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    mmc_t5_tokenizer_free(t);
    return st;
}

void mmc_t5_tokenizer_free(mmc_t5_tokenizer *t) {
    if (!t) return;
    free(t->score);
    free(t->node_tok);
    free(t->edges);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].units);
        free(t->norms[i].strings);
        pcre2_code_free(t->norms[i].re);
        free(t->norms[i].content);
    }
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t);
}

void mmc_t5_tokenizer_special_ids(const mmc_t5_tokenizer *t, int32_t *eos, int32_t *pad, int32_t *unk) {
    if (eos) *eos = t->eos;
    if (pad) *pad = t->pad;
    if (unk) *unk = t->unk;
}
int32_t mmc_t5_tokenizer_vocab_size(const mmc_t5_tokenizer *t) { return t->max_id + 1; }
int mmc_t5_tokenizer_model_max_length(const mmc_t5_tokenizer *t) { return t->model_max_length ? t->model_max_length : 512; }

/* ------------------------------------------------------------------ normalizers */
/* spm_precompiled's transform: the string of the first (shortest) prefix of key[0, n) that is
 * a leaf, or NULL. Out-of-range indices (a corrupt blob) end the search. */
static const char *charsmap_lookup(const normalizer *nm, const uint8_t *key, size_t n) {
    if (!nm->n_units) return NULL;
    const uint32_t *a = nm->units;
#define OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
    size_t pos = OFFSET(a[0]);
    for (size_t i = 0; i < n && key[i]; i++) {
        pos ^= key[i];
        if (pos >= nm->n_units) return NULL;
        uint32_t u = a[pos];
        if ((u & (0x80000000u | 0xFF)) != key[i]) return NULL;
        pos ^= OFFSET(u);
        if (pos >= nm->n_units) return NULL;
        if ((u >> 8) & 1) {
            size_t off = a[pos] & 0x7FFFFFFFu;
            /* past the end reads as "" (Rust slices [len..len]); a mid-character offset as no match */
            if (off >= nm->n_strings) return "";
            if (((uint8_t)nm->strings[off] & 0xC0) == 0x80) return NULL;
            return nm->strings + off;
        }
    }
#undef OFFSET
    return NULL;
}

static bool precompiled(const normalizer *nm, const char *s, size_t n, sbuf *out) {
    utf8proc_int32_t state = 0, prev = -1;
    size_t g0 = 0;   /* start of the current grapheme */
    for (size_t i = 0; i <= n;) {
        utf8proc_int32_t c = -1;
        int k = 0;
        if (i < n) {
            k = utf8_len((uint8_t)s[i]);
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, k, &c);
        }
        /* a grapheme ends before c (or at the end) */
        if (i > g0 && (i == n || utf8proc_grapheme_break_stateful(prev, c, &state))) {
            const char *rep = i - g0 < GRAPHEME_WHOLE ? charsmap_lookup(nm, (const uint8_t *)s + g0, i - g0) : NULL;
            if (rep) {
                if (!sb_put(out, rep, strlen(rep))) return false;
            } else {
                for (size_t p = g0; p < i;) {
                    int cl = utf8_len((uint8_t)s[p]);
                    const char *r = charsmap_lookup(nm, (const uint8_t *)s + p, (size_t)cl);
                    if (!(r ? sb_put(out, r, strlen(r)) : sb_put(out, s + p, (size_t)cl))) return false;
                    p += (size_t)cl;
                }
            }
            g0 = i;
        }
        if (i == n) break;
        prev = c;
        i += (size_t)k;
    }
    return true;
}

static bool strip(const normalizer *nm, const char *s, size_t n, sbuf *out) {
    size_t a = 0, b = n;
    utf8proc_int32_t c;
    while (nm->left && a < b) {
        int k = utf8_len((uint8_t)s[a]);
        utf8proc_iterate((const utf8proc_uint8_t *)s + a, k, &c);
        if (!is_ws(c)) break;
        a += (size_t)k;
    }
    while (nm->right && b > a) {
        size_t p = b - 1;
        while (p > a && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
        utf8proc_iterate((const utf8proc_uint8_t *)s + p, (utf8proc_ssize_t)(b - p), &c);
        if (!is_ws(c)) break;
        b = p;
    }
    return sb_put(out, s + a, b - a);
}

static mmc_status replace(const mmc_t5_tokenizer *t, const normalizer *nm, const char *s, size_t n, sbuf *out) {
    PCRE2_SIZE cap = 2 * n + 64;
    for (int attempt = 0; attempt < 2; attempt++) {
        out->n = 0;
        if (out->cap < cap) {
            char *p = realloc(out->s, cap);
            if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
            out->s = p, out->cap = cap;
        }
        PCRE2_SIZE olen = out->cap;
        int rc = pcre2_substitute(nm->re, (PCRE2_SPTR)s, n, 0, PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL |
                                  PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, NULL, NULL, (PCRE2_SPTR)nm->content,
                                  PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out->s, &olen);
        if (rc >= 0) { out->n = olen; return MMC_OK; }
        if (rc == PCRE2_ERROR_NOMEMORY && attempt == 0) { cap = olen + 1; continue; }
        return mmc_error(MMC_ERR_INVALID, "%s: normalizer Replace failed (%d)", t->path, rc);
    }
    return mmc_error(MMC_ERR_INVALID, "%s: normalizer Replace failed", t->path);
}

/* ------------------------------------------------------------------ Unigram */
typedef struct { double score; int32_t id, start; } best_node;   /* start -1: not reached */

/* Viterbi of piece w[0, n) (non-empty, valid UTF-8), ids appended to b; nodes: scratch [n + 1] */
static mmc_status unigram(const mmc_t5_tokenizer *t, const char *w, int n, best_node *nodes, ids_buf *b) {
    const double unk_score = t->min_score - UNK_PENALTY;
    for (int i = 0; i <= n; i++) nodes[i] = (best_node){0.0, -1, -1};
    for (int s = 0; s < n;) {
        const double here = nodes[s].score;
        const int mblen = utf8_len((uint8_t)w[s]);
        bool single = false;
        int32_t node = 0;
        for (int e = s; e < n; e++) {   /* every piece that is a prefix of w[s..], shortest first */
            if ((node = trie_step(t, node, (uint8_t)w[e])) < 0) break;
            int32_t id = t->node_tok[node];
            if (id < 0) continue;
            best_node *tn = &nodes[e + 1];
            double cand = t->score[id] + here;
            if (tn->start < 0 || cand > tn->score) *tn = (best_node){cand, id, s};
            if (e + 1 - s == mblen) single = true;
        }
        if (!single) {
            if (t->unk < 0) return mmc_error(MMC_ERR_INVALID, "%s: a character is not in the vocabulary and the "
                                             "model has no unk_id", t->path);
            best_node *tn = &nodes[s + mblen];
            double cand = unk_score + here;
            if (tn->start < 0 || cand > tn->score) *tn = (best_node){cand, t->unk, s};
        }
        s += mblen;
    }
    /* backtrack: ids in reverse into the tail of b, unk runs fused */
    int first = b->n;
    for (int e = n; e > 0;) {
        int s = nodes[e].start;
        if (nodes[e].id == t->unk) {
            int run_end = e;
            while (s > 0 && nodes[s].id == t->unk) s = nodes[s].start;
            int32_t id = piece_id(t, w + s, (size_t)(run_end - s));   /* tokenizers looks the fused text up */
            if (!ids_push(b, id >= 0 ? id : t->unk)) return mmc_error(MMC_ERR_OOM, "out of memory");
        } else if (!ids_push(b, nodes[e].id)) {
            return mmc_error(MMC_ERR_OOM, "out of memory");
        }
        e = s;
    }
    for (int i = first, j = b->n - 1; i < j; i++, j--) {
        int32_t x = b->v[i];
        b->v[i] = b->v[j], b->v[j] = x;
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ pre-tokenization + model */
typedef struct { sbuf a, b, piece; best_node *nodes; int cap_nodes; } scratch;

static mmc_status model_piece(const mmc_t5_tokenizer *t, const char *w, size_t n, scratch *sc, ids_buf *b) {
    if (!n) return MMC_OK;
    if (n > (size_t)INT32_MAX / 2) return mmc_error(MMC_ERR_INVALID, "%s: text too long", t->path);
    if ((int)n + 1 > sc->cap_nodes) {
        best_node *p = realloc(sc->nodes, (n + 1) * sizeof *p);
        if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
        sc->nodes = p, sc->cap_nodes = (int)n + 1;
    }
    return unigram(t, w, (int)n, sc->nodes, b);
}

/* Metaspace on one pre-token w[0, n), then the model on each of its pieces */
static mmc_status metaspace_word(const mmc_t5_tokenizer *t, const char *w, size_t n, scratch *sc, ids_buf *b) {
    if (!n) return MMC_OK;   /* prepend does nothing to an empty string; empty splits are dropped */
    if (!t->metaspace) return model_piece(t, w, n, sc, b);
    sbuf *p = &sc->piece;
    p->n = 0;
    /* "starts with the replacement" is asked after ' ' became it */
    bool starts = w[0] == ' ' || (n >= (size_t)t->repl_len && !memcmp(w, t->repl, (size_t)t->repl_len));
    if (t->prepend && !starts && !sb_put(p, t->repl, (size_t)t->repl_len)) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (!(w[i] == ' ' ? sb_put(p, t->repl, (size_t)t->repl_len) : sb_put(p, w + i, 1))) return mmc_error(MMC_ERR_OOM, "out of memory");
    if (!t->ms_split) return model_piece(t, p->s, p->n, sc, b);
    /* MergedWithNext: each replacement starts a piece */
    size_t start = 0;
    for (size_t i = 0; i + (size_t)t->repl_len <= p->n; i += (size_t)utf8_len((uint8_t)p->s[i])) {
        if (i > start && !memcmp(p->s + i, t->repl, (size_t)t->repl_len)) {
            mmc_status st = model_piece(t, p->s + start, i - start, sc, b);
            if (st) return st;
            start = i;
        }
    }
    return model_piece(t, p->s + start, p->n - start, sc, b);
}

/* normalize + pre-tokenize + model one stretch of text without added tokens */
static mmc_status encode_stretch(const mmc_t5_tokenizer *t, const char *text, size_t n, scratch *sc, ids_buf *b) {
    sbuf *cur = &sc->a, *nxt = &sc->b;
    cur->n = 0;
    if (!sb_put(cur, text, n)) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_norms; i++) {
        const normalizer *nm = &t->norms[i];
        nxt->n = 0;
        mmc_status st = MMC_OK;
        if (nm->kind == NORM_REPLACE) st = replace(t, nm, cur->s, cur->n, nxt);
        else if (!(nm->kind == NORM_PRECOMPILED ? (nm->n_units ? precompiled(nm, cur->s, cur->n, nxt) : sb_put(nxt, cur->s, cur->n))
                                                 : strip(nm, cur->s, cur->n, nxt)))
            st = mmc_error(MMC_ERR_OOM, "out of memory");
        if (st) return st;
        sbuf *x = cur;
        cur = nxt, nxt = x;
    }
    if (!cur->n) return MMC_OK;
    if (!t->ws_split) return metaspace_word(t, cur->s, cur->n, sc, b);
    const char *s = cur->s;
    size_t len = cur->n, w0 = 0;
    for (size_t i = 0; i <= len;) {
        utf8proc_int32_t c = 0;
        int k = i < len ? utf8_len((uint8_t)s[i]) : 0;
        if (i < len) utf8proc_iterate((const utf8proc_uint8_t *)s + i, k, &c);
        if (i == len || is_ws(c)) {
            mmc_status st = metaspace_word(t, s + w0, i - w0, sc, b);
            if (st) return st;
            if (i == len) break;
            w0 = i + (size_t)k;
        }
        i += (size_t)k;
    }
    return MMC_OK;
}

/* Content tokens (no post-processor specials) of text. */
static mmc_status encode_tokens(const mmc_t5_tokenizer *t, const char *text, ids_buf *b) {
    size_t n = strlen(text);
    if (!utf8_valid((const uint8_t *)text, n))
        return mmc_error(MMC_ERR_INVALID, "%s: text is not valid UTF-8", t->path);
    scratch sc = {0};
    mmc_status st = MMC_OK;
    size_t start = 0;
    for (size_t i = 0; i <= n && !st;) {
        int best = -1;   /* the longest added token starting at i */
        for (int a = 0; a < t->n_added && i < n && t->added_first[(uint8_t)text[i]]; a++)
            if ((size_t)t->added[a].len <= n - i && !memcmp(text + i, t->added[a].content, (size_t)t->added[a].len) &&
                (best < 0 || t->added[a].len > t->added[best].len))
                best = a;
        if (best < 0 && i < n) { i++; continue; }
        if (i > start) st = encode_stretch(t, text + start, i - start, &sc, b);
        if (best < 0 || st) break;
        if (!ids_push(b, t->added[best].id)) st = mmc_error(MMC_ERR_OOM, "out of memory");
        i += (size_t)t->added[best].len;
        start = i;
    }
    free(sc.a.s);
    free(sc.b.s);
    free(sc.piece.s);
    free(sc.nodes);
    return st;
}

mmc_status mmc_t5_tokenizer_encode(const mmc_t5_tokenizer *t, const char *text, int32_t *ids, int cap, int *n) {
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    *n = 0;
    const int total = b.n + t->n_pre + t->n_post;
    if (!st && total > cap) st = mmc_error(MMC_ERR_INVALID, "T5 tokenizer: %d ids do not fit in %d", total, cap);
    if (!st) {
        memcpy(ids, t->pre, (size_t)t->n_pre * sizeof *ids);
        if (b.n) memcpy(ids + t->n_pre, b.v, (size_t)b.n * sizeof *ids);
        memcpy(ids + t->n_pre + b.n, t->post, (size_t)t->n_post * sizeof *ids);
        *n = total;
    }
    free(b.v);
    return st;
}

mmc_status mmc_t5_tokenizer_encode_padded(const mmc_t5_tokenizer *t, const char *text, int max_length,
                                          int32_t *ids, int32_t *mask, int *n_real) {
    const int n_special = t->n_pre + t->n_post;
    if (max_length <= n_special)
        return mmc_error(MMC_ERR_INVALID, "T5 tokenizer: max_length %d leaves no room beside %d special tokens", max_length,
                         n_special);
    if (t->pad < 0) return mmc_error(MMC_ERR_INVALID, "%s: padding to max_length needs a pad_token", t->path);
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    if (st) { free(b.v); return st; }
    int keep = b.n < max_length - n_special ? b.n : max_length - n_special;   /* truncation keeps room for specials */
    memcpy(ids, t->pre, (size_t)t->n_pre * sizeof *ids);
    if (keep) memcpy(ids + t->n_pre, b.v, (size_t)keep * sizeof *ids);
    memcpy(ids + t->n_pre + keep, t->post, (size_t)t->n_post * sizeof *ids);
    const int real = keep + n_special;
    for (int i = 0; i < max_length; i++) {
        if (i >= real) ids[i] = t->pad;
        if (mask) mask[i] = i < real;
    }
    if (n_real) *n_real = real;
    free(b.v);
    return MMC_OK;
}
