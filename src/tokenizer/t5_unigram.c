/* t5_unigram.c — T5's tokenizer from tokenizer.json, mirroring HF tokenizers as transformers'
 * T5TokenizerFast configures it (Flux's tokenizer_2, SD3's tokenizer_3):
 *
 *   added tokens (<pad>, </s>, <unk>, <extra_id_N>; normalized false) split off the raw text,
 *   leftmost and longest first;
 *   each remaining piece: the normalizer (none, or Replace of a literal / " {2,}" pattern);
 *   Metaspace: spaces become U+2581 "▁", one is prepended when the piece does not start with it
 *   (prepend_scheme "always"; "first" only for the text's first piece; "never"), and with split
 *   the piece breaks before every "▁" (MergedWithNext);
 *   Unigram: the Viterbi segmentation of each word maximising the summed piece scores (f64),
 *   candidates tried by start position then length and replaced only by a strictly better score
 *   (tokenizers' order); a character no piece covers becomes unk scored min_score - 10, and
 *   consecutive unks fuse into one;
 *   TemplateProcessing: [$A </s>] (the post_processor's special tokens); truncation keeps room
 *   for them.
 *
 * The SentencePiece "Precompiled" normalizer (an NFKC-like character map shipped as a binary blob
 * in the real checkpoints) is not read yet: such a file is MMC_ERR_UNSUPPORTED naming it. */
#include "mmc_encoders.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T5_MAX_ADDED 512
#define T5_MAX_POST 8

typedef struct { char *key; uint32_t len; int32_t id; } piece_slot;

struct mmc_t5_tokenizer {
    char path[1024];
    piece_slot *slots;                  /* open addressing: piece -> id */
    uint32_t mask;
    double *scores;                     /* [vocab] */
    int32_t vocab;
    int32_t unk, eos, pad;
    double unk_score;                   /* min score - 10 */
    int max_piece;                      /* longest piece in bytes */
    char *repl_from, *repl_to;          /* a literal Replace normalizer, or NULL */
    bool collapse_spaces;               /* Replace(Regex " {2,}", " ") */
    int prepend;                        /* 0 never, 1 always, 2 first */
    bool split;
    struct { char *content; int len; int32_t id; } added[T5_MAX_ADDED];
    int n_added;
    int32_t post[T5_MAX_POST];          /* ids after the sequence ([</s>]) */
    int n_post;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int32_t piece_find(const mmc_t5_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->mask;; i = (i + 1) & t->mask) {
        const piece_slot *p = &t->slots[i];
        if (!p->key) return -1;
        if (p->len == n && !memcmp(p->key, s, n)) return p->id;
    }
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static mmc_status read_model(mmc_t5_tokenizer *t, const cJSON *m) {
    const char *type = jstr(m, "type");
    if (!type || strcmp(type, "Unigram") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model type %s: the T5 tokenizer is a Unigram model", t->path,
                         type ? type : "(none)");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback")))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.byte_fallback is not supported", t->path);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_id");
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n < 1) return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab must be a list of [piece, score]", t->path);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    t->slots = calloc(cap, sizeof *t->slots);
    t->scores = malloc((size_t)n * sizeof *t->scores);
    if (!t->slots || !t->scores) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->mask = cap - 1;
    t->vocab = n;
    double min_score = INFINITY;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        const cJSON *p = cJSON_GetArrayItem(e, 0), *s = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsString(p) || !cJSON_IsNumber(s))
            return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab[%d] must be [piece, score]", t->path, i);
        size_t len = strlen(p->valuestring);
        t->scores[i] = s->valuedouble;
        if (s->valuedouble < min_score) min_score = s->valuedouble;
        if ((int)len > t->max_piece) t->max_piece = (int)len;
        if (piece_find(t, p->valuestring, len) < 0) {   /* the first of duplicates wins */
            uint32_t k = (uint32_t)hash_bytes(p->valuestring, len) & t->mask;
            while (t->slots[k].key) k = (k + 1) & t->mask;
            if (!(t->slots[k].key = strdup(p->valuestring))) return mmc_error(MMC_ERR_OOM, "out of memory");
            t->slots[k].len = (uint32_t)len;
            t->slots[k].id = i;
        }
        i++;
    }
    t->unk = cJSON_IsNumber(unk) ? unk->valueint : -1;
    if (t->unk < 0 || t->unk >= n) return mmc_error(MMC_ERR_FORMAT, "%s: model.unk_id missing or out of range", t->path);
    t->unk_score = min_score - 10.0;
    return MMC_OK;
}

static mmc_status read_normalizer(mmc_t5_tokenizer *t, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return MMC_OK;
    const char *type = jstr(n, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            mmc_status st = read_normalizer(t, e);
            if (st) return st;
        }
        return MMC_OK;
    }
    if (type && !strcmp(type, "Replace")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const char *to = jstr(n, "content"), *lit = jstr(pat, "String"), *re = jstr(pat, "Regex");
        if (to && re && !strcmp(re, " {2,}") && !strcmp(to, " ")) { t->collapse_spaces = true; return MMC_OK; }
        if (to && lit && *lit && !t->repl_from) {
            t->repl_from = strdup(lit), t->repl_to = strdup(to);
            return t->repl_from && t->repl_to ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
        }
    }
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: normalizer %s is not supported by the T5 tokenizer yet%s", t->path,
                     type ? type : "(untyped)",
                     type && !strcmp(type, "Precompiled") ? " (SentencePiece's precompiled character map)" : "");
}

static mmc_status read_pre_tokenizer(mmc_t5_tokenizer *t, const cJSON *p) {
    const char *type = jstr(p, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *e;
        int k = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "pretokenizers")) {
            if (k++) return mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than one pre-tokenizer", t->path);
            p = e;
        }
        type = jstr(p, "type");
    }
    if (!type || strcmp(type, "Metaspace") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer %s: the T5 tokenizer takes Metaspace", t->path,
                         type ? type : "(none)");
    const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
    if (rep && strcmp(rep, "\xe2\x96\x81") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: Metaspace replacement other than U+2581", t->path);
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"), *sp = cJSON_GetObjectItemCaseSensitive(p, "split");
    t->prepend = scheme ? (!strcmp(scheme, "always") ? 1 : !strcmp(scheme, "first") ? 2 : 0) : (cJSON_IsFalse(aps) ? 0 : 1);
    t->split = !cJSON_IsFalse(sp);
    return MMC_OK;
}

static int32_t token_id(const mmc_t5_tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++) if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return s ? piece_find(t, s, strlen(s)) : -1;
}

mmc_status mmc_t5_tokenizer_load(const char *dir, mmc_t5_tokenizer **out) {
    *out = NULL;
    mmc_t5_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
    size_t dl = strlen(dir);
    if (dl >= 5 && !strcmp(dir + dl - 5, ".json")) snprintf(t->path, sizeof t->path, "%s", dir);
    else snprintf(t->path, sizeof t->path, "%s/tokenizer.json", dir);
    char *text = NULL, cfgp[1100];
    size_t len = 0;
    cJSON *j = NULL, *cfg = NULL;
    mmc_status st = mmc_read_file(t->path, &text, &len);
    if (st) goto fail;
    j = cJSON_ParseWithLength(text, len);
    free(text), text = NULL;
    if (!j) { st = mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", t->path); goto fail; }
    if ((st = read_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"))) ||
        (st = read_normalizer(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"))) ||
        (st = read_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"))))
        goto fail;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "added_tokens")) {
        const char *c = jstr(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!c || !*c || !cJSON_IsNumber(id) || id->valueint < 0) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: added_tokens entries need content and id", t->path);
            goto fail;
        }
        if (t->n_added == T5_MAX_ADDED) { st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than %d added tokens", t->path, T5_MAX_ADDED); goto fail; }
        if (!(t->added[t->n_added].content = strdup(c))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        t->added[t->n_added].len = (int)strlen(c);
        t->added[t->n_added++].id = id->valueint;
    }
    /* TemplateProcessing "single": $A then special tokens (T5: </s>) */
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(j, "post_processor");
    if (pp && !cJSON_IsNull(pp)) {
        const char *type = jstr(pp, "type");
        if (!type || strcmp(type, "TemplateProcessing") != 0) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor %s (T5 uses TemplateProcessing)", t->path, type ? type : "?");
            goto fail;
        }
        bool seen_a = false;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "single")) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) { seen_a = true; continue; }
            int32_t id = token_id(t, jstr(sp, "id"));
            if (!seen_a || id < 0 || t->n_post == T5_MAX_POST) {
                st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor.single must be $A followed by known special tokens",
                               t->path);
                goto fail;
            }
            t->post[t->n_post++] = id;
        }
    }
    t->eos = t->n_post ? t->post[0] : token_id(t, "</s>");
    t->pad = token_id(t, "<pad>");
    const char *sl = strrchr(t->path, '/');
    snprintf(cfgp, sizeof cfgp, "%.*s/tokenizer_config.json", sl ? (int)(sl - t->path) : 1, sl ? t->path : ".");
    if (mmc_read_file(cfgp, &text, &len) == MMC_OK) {     /* pad_token, when the config names one */
        cfg = cJSON_ParseWithLength(text, len);
        free(text);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(cfg, "pad_token");
        const char *ps = cJSON_IsString(p) ? p->valuestring : jstr(p, "content");
        if (ps && token_id(t, ps) >= 0) t->pad = token_id(t, ps);
        cJSON_Delete(cfg);
    }
    cJSON_Delete(j);
    *out = t;
    return MMC_OK;
fail:
    cJSON_Delete(j);
    mmc_t5_tokenizer_free(t);
    return st;
}

void mmc_t5_tokenizer_free(mmc_t5_tokenizer *t) {
    if (!t) return;
    for (uint32_t i = 0; t->slots && i <= t->mask; i++) free(t->slots[i].key);
    free(t->slots);
    free(t->scores);
    free(t->repl_from);
    free(t->repl_to);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t);
}

void mmc_t5_tokenizer_special_ids(const mmc_t5_tokenizer *t, int32_t *eos, int32_t *pad, int32_t *unk) {
    if (eos) *eos = t->eos;
    if (pad) *pad = t->pad;
    if (unk) *unk = t->unk;
}

/* ------------------------------------------------------------------ encoding */
typedef struct { int32_t *v; int n, cap; } ids_buf;

static mmc_status push(ids_buf *b, int32_t id) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        int32_t *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) return mmc_error(MMC_ERR_OOM, "out of memory");
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = id;
    return MMC_OK;
}

static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* Viterbi over one word w[0..n) (byte offsets at character starts). */
static mmc_status unigram_word(const mmc_t5_tokenizer *t, const char *w, size_t n, ids_buf *b) {
    double *best = malloc((n + 1) * sizeof *best);
    int32_t *from = malloc((n + 1) * sizeof *from), *tok = malloc((n + 1) * sizeof *tok);
    if (!best || !from || !tok) { free(best); free(from); free(tok); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    for (size_t i = 0; i <= n; i++) best[i] = -INFINITY, from[i] = -1;
    best[0] = 0;
    for (size_t s = 0; s < n; s += utf8_len((unsigned char)w[s])) {
        if (from[s] < 0 && s) continue;                       /* unreachable start */
        const size_t c1 = utf8_len((unsigned char)w[s]);
        bool single = false;
        for (size_t e = s + c1; e <= n && (int)(e - s) <= t->max_piece; e += e < n ? utf8_len((unsigned char)w[e]) : 1) {
            int32_t id = piece_find(t, w + s, e - s);
            if (id >= 0) {
                if (e == s + c1) single = true;
                const double sc = best[s] + t->scores[id];
                if (from[e] < 0 || sc > best[e]) best[e] = sc, from[e] = (int32_t)s, tok[e] = id;
            }
            if (e == n) break;
        }
        if (!single) {                                        /* the character as unk */
            const size_t e = s + c1 <= n ? s + c1 : n;
            const double sc = best[s] + t->unk_score;
            if (from[e] < 0 || sc > best[e]) best[e] = sc, from[e] = (int32_t)s, tok[e] = t->unk;
        }
    }
    /* backtrack, then emit in order with consecutive unks fused */
    int k = 0;
    for (size_t e = n; e > 0; e = (size_t)from[e]) k++;
    int32_t *seq = malloc((size_t)(k ? k : 1) * sizeof *seq);
    mmc_status st = seq ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
    if (seq) {
        int i = k;
        for (size_t e = n; e > 0; e = (size_t)from[e]) seq[--i] = tok[e];
        for (i = 0; i < k && !st; i++)
            if (!(seq[i] == t->unk && i > 0 && seq[i - 1] == t->unk)) st = push(b, seq[i]);
    }
    free(seq);
    free(best);
    free(from);
    free(tok);
    return st;
}

static const char SP[] = "\xe2\x96\x81";   /* U+2581 */

/* normalizer + Metaspace + Unigram on a piece of text between added tokens */
static mmc_status encode_piece(const mmc_t5_tokenizer *t, const char *text, size_t n, bool first, ids_buf *b) {
    char *s = malloc(4 * n + 8);
    if (!s) return mmc_error(MMC_ERR_OOM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if (t->repl_from && !strncmp(text + i, t->repl_from, strlen(t->repl_from)) && strlen(t->repl_from) <= n - i) {
            size_t lt = strlen(t->repl_to);
            char *q = realloc(s, 4 * n + 8 + m + lt);
            if (!q) { free(s); return mmc_error(MMC_ERR_OOM, "out of memory"); }
            s = q;
            memcpy(s + m, t->repl_to, lt), m += lt, i += strlen(t->repl_from);
            continue;
        }
        if (t->collapse_spaces && text[i] == ' ' && i + 1 < n && text[i + 1] == ' ') {
            while (i + 1 < n && text[i + 1] == ' ') i++;
        }
        s[m++] = text[i++];
    }
    /* Metaspace: ' ' -> U+2581, prepend one, split before each */
    char *u = malloc(3 * m + 8);
    if (!u) { free(s); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    size_t k = 0;
    const bool starts = m >= 3 ? !memcmp(s, SP, 3) : (m >= 1 && s[0] == ' ');
    if ((t->prepend == 1 || (t->prepend == 2 && first)) && !starts) memcpy(u, SP, 3), k = 3;
    for (size_t i = 0; i < m; i++) {
        if (s[i] == ' ') memcpy(u + k, SP, 3), k += 3;
        else u[k++] = s[i];
    }
    free(s);
    mmc_status st = MMC_OK;
    if (!t->split) {
        if (k) st = unigram_word(t, u, k, b);
    } else {
        size_t w0 = 0;
        for (size_t i = 3; i + 3 <= k && !st; i++)
            if (!memcmp(u + i, SP, 3)) { st = unigram_word(t, u + w0, i - w0, b); w0 = i; i += 2; }
        if (!st && k > w0) st = unigram_word(t, u + w0, k - w0, b);
    }
    free(u);
    return st;
}

static mmc_status encode_tokens(const mmc_t5_tokenizer *t, const char *text, ids_buf *b) {
    mmc_status st = MMC_OK;
    size_t n = strlen(text), start = 0;
    bool first = true;
    for (size_t i = 0; i <= n && !st;) {
        int best = -1;   /* the longest added token starting at i */
        for (int a = 0; a < t->n_added && i < n; a++)
            if ((size_t)t->added[a].len <= n - i && !memcmp(text + i, t->added[a].content, (size_t)t->added[a].len) &&
                (best < 0 || t->added[a].len > t->added[best].len))
                best = a;
        if (best < 0 && i < n) { i++; continue; }
        if (i > start) st = encode_piece(t, text + start, i - start, first, b);
        first = false;
        if (best < 0 || st) break;
        st = push(b, t->added[best].id);
        i += (size_t)t->added[best].len;
        start = i;
    }
    return st;
}

mmc_status mmc_t5_tokenizer_encode(const mmc_t5_tokenizer *t, const char *text, int32_t *ids, int cap, int *n) {
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    *n = 0;
    if (!st && b.n + t->n_post > cap) st = mmc_error(MMC_ERR_INVALID, "T5 tokenizer: %d ids do not fit in %d", b.n + t->n_post, cap);
    if (!st) {
        if (b.n) memcpy(ids, b.v, (size_t)b.n * sizeof *ids);
        memcpy(ids + b.n, t->post, (size_t)t->n_post * sizeof *ids);
        *n = b.n + t->n_post;
    }
    free(b.v);
    return st;
}

mmc_status mmc_t5_tokenizer_encode_padded(const mmc_t5_tokenizer *t, const char *text, int max_length, int32_t *ids,
                                          int32_t *mask, int *n_real) {
    if (max_length < t->n_post + 1)
        return mmc_error(MMC_ERR_INVALID, "T5 tokenizer: max_length %d leaves no room for the text", max_length);
    if (t->pad < 0) return mmc_error(MMC_ERR_INVALID, "%s: padding to max_length needs a pad token", t->path);
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    if (st) { free(b.v); return st; }
    const int keep = b.n < max_length - t->n_post ? b.n : max_length - t->n_post;   /* room for </s> */
    if (keep) memcpy(ids, b.v, (size_t)keep * sizeof *ids);
    memcpy(ids + keep, t->post, (size_t)t->n_post * sizeof *ids);
    const int real = keep + t->n_post;
    for (int i = 0; i < max_length; i++) {
        if (i >= real) ids[i] = t->pad;
        if (mask) mask[i] = i < real;
    }
    if (n_real) *n_real = real;
    free(b.v);
    return MMC_OK;
}
