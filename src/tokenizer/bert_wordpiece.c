/* bert_wordpiece.c — BERT's WordPiece tokenizer from a tokenizer.json as transformers' BertTokenizer
 * writes it (tokenizers backend), mirroring HF tokenizers' BertNormalizer, BertPreTokenizer,
 * WordPiece model and the TemplateProcessing "[CLS] $A [SEP]":
 *
 *   added tokens ([CLS], [MASK], ...) are split off the raw text first (exact match, longest first)
 *   normalizer, per code point in order:
 *       clean_text: drop NUL, U+FFFD and controls (Cc / Cf / Cn / Co but \t \n \r); whitespace
 *                   (\t \n \r, Zs) -> ' '
 *       handle_chinese_chars: CJK ideographs get a space either side
 *       strip_accents (null means: as lowercase): NFD, then the Mn marks dropped
 *       lowercase: each code point's lowercase (utf8proc's simple mapping)
 *   pre-tokenizer: split on whitespace (dropped) and around each punctuation character (ASCII
 *       punctuation or a P* category), which stands alone
 *   WordPiece: per word, greedy longest match from the left, continuation pieces prefixed "##";
 *       a word with any unmatched remainder, or longer than max_input_chars_per_word characters,
 *       is one unk_token
 *   post: [CLS] + ids + [SEP]; truncation keeps max_length - 2 word pieces; padding with [PAD]
 *
 * Without a tokenizer.json (the Hub's older folders) the same pipeline is built from vocab.txt and
 * tokenizer_config.json's do_lower_case / tokenize_chinese_chars / strip_accents, as transformers does.
 * Ids equal HF tokenizers' for these components. Only this layout is accepted: other model,
 * normalizer or pre-tokenizer types are UNSUPPORTED errors naming the key. */
#include "mmc_encoders.h"
#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define WP_MAX_ADDED 64

struct mmc_bert_tokenizer {
    char **tok;                 /* [n] vocab strings */
    int32_t *tok_id;            /* [n] */
    int32_t n;
    int32_t *slot;              /* open addressing: index into tok, -1 empty */
    uint32_t mask;
    int32_t n_ids;              /* 1 + max id */
    int32_t unk, cls, sep, pad;
    char prefix[16];            /* continuing_subword_prefix */
    int64_t max_chars;          /* max_input_chars_per_word */
    bool clean_text, chinese, strip_accents, lowercase;
    struct { char *s; int len; int32_t id; } added[WP_MAX_ADDED];
    int n_added;
    int model_max_length;
};

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int32_t vocab_get(const mmc_bert_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)fnv(s, n) & t->mask;; i = (i + 1) & t->mask) {
        const int32_t k = t->slot[i];
        if (k < 0) return -1;
        if (strlen(t->tok[k]) == n && !memcmp(t->tok[k], s, n)) return t->tok_id[k];
    }
}

void mmc_bert_tokenizer_free(mmc_bert_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n; i++) free(t->tok[i]);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].s);
    free(t->tok);
    free(t->tok_id);
    free(t->slot);
    free(t);
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *k, bool def, bool *is_null) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (is_null) *is_null = !v || cJSON_IsNull(v);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static mmc_status vocab_alloc(mmc_bert_tokenizer *t, int32_t n) {
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap <<= 1;
    t->tok = calloc((size_t)n, sizeof *t->tok);
    t->tok_id = calloc((size_t)n, sizeof *t->tok_id);
    t->slot = malloc(cap * sizeof *t->slot);
    if (!t->tok || !t->tok_id || !t->slot) return mmc_error(MMC_ERR_OOM, "out of memory");
    memset(t->slot, 0xff, cap * sizeof *t->slot);
    t->mask = cap - 1;
    return MMC_OK;
}

/* one vocabulary entry; a repeated token keeps its first id */
static mmc_status vocab_add(mmc_bert_tokenizer *t, const char *s, size_t len, int32_t id) {
    if (vocab_get(t, s, len) >= 0) return MMC_OK;
    t->tok[t->n] = strndup(s, len);
    if (!t->tok[t->n]) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->tok_id[t->n] = id;
    if (id + 1 > t->n_ids) t->n_ids = id + 1;
    uint32_t i = (uint32_t)fnv(s, len) & t->mask;
    while (t->slot[i] >= 0) i = (i + 1) & t->mask;
    t->slot[i] = t->n++;
    return MMC_OK;
}

static mmc_status parse(mmc_bert_tokenizer *t, const cJSON *root, const char *path) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mt = jstr(model, "type");
    if (!mt || strcmp(mt, "WordPiece") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model.type \"%s\": the BERT tokenizer reads a WordPiece model "
                         "(transformers' BertTokenizer)", path, mt ? mt : "(missing)");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *nt = jstr(norm, "type");
    if (!nt || strcmp(nt, "BertNormalizer") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: normalizer.type \"%s\": only BertNormalizer is supported", path,
                         nt ? nt : "(missing)");
    bool sa_null = false;
    t->clean_text = jbool(norm, "clean_text", true, NULL);
    t->chinese = jbool(norm, "handle_chinese_chars", true, NULL);
    t->lowercase = jbool(norm, "lowercase", true, NULL);
    t->strip_accents = jbool(norm, "strip_accents", false, &sa_null);
    if (sa_null) t->strip_accents = t->lowercase;
    const char *pt = jstr(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "type");
    if (!pt || strcmp(pt, "BertPreTokenizer") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer.type \"%s\": only BertPreTokenizer is supported",
                         path, pt ? pt : "(missing)");
    const char *pre = jstr(model, "continuing_subword_prefix");
    snprintf(t->prefix, sizeof t->prefix, "%s", pre ? pre : "##");
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
    t->max_chars = cJSON_IsNumber(mc) ? (int64_t)mc->valuedouble : 100;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab) || !vocab->child)
        return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab must be a non-empty object of token -> id", path);
    mmc_status st = vocab_alloc(t, cJSON_GetArraySize(vocab));
    if (st) return st;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e8 || !e->string)
            return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab[\"%s\"] must be a non-negative id", path,
                             e->string ? e->string : "?");
        if ((st = vocab_add(t, e->string, strlen(e->string), (int32_t)e->valuedouble))) return st;
    }
    const char *unk = jstr(model, "unk_token");
    t->unk = unk ? vocab_get(t, unk, strlen(unk)) : -1;
    if (t->unk < 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in the vocabulary", path,
                         unk ? unk : "(missing)");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const char *s = jstr(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!s || !*s || !cJSON_IsNumber(id) || id->valuedouble < 0)
            return mmc_error(MMC_ERR_FORMAT, "%s: added_tokens entries need a content string and an id", path);
        if (t->n_added == WP_MAX_ADDED)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than %d added_tokens", path, WP_MAX_ADDED);
        t->added[t->n_added].s = strdup(s);
        if (!t->added[t->n_added].s) return mmc_error(MMC_ERR_OOM, "out of memory");
        t->added[t->n_added].len = (int)strlen(s);
        t->added[t->n_added++].id = (int32_t)id->valuedouble;
        if ((int32_t)id->valuedouble + 1 > t->n_ids) t->n_ids = (int32_t)id->valuedouble + 1;
    }
    t->cls = vocab_get(t, "[CLS]", 5), t->sep = vocab_get(t, "[SEP]", 5), t->pad = vocab_get(t, "[PAD]", 5);
    /* the post-processor's special tokens, when it names them */
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                                       "special_tokens");
    const cJSON *ci = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sp, "[CLS]"),
                                                                          "ids"), 0);
    const cJSON *si = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sp, "[SEP]"),
                                                                          "ids"), 0);
    if (cJSON_IsNumber(ci)) t->cls = (int32_t)ci->valuedouble;
    if (cJSON_IsNumber(si)) t->sep = (int32_t)si->valuedouble;
    if (t->cls < 0 || t->sep < 0 || t->pad < 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: [CLS], [SEP] and [PAD] must be in the vocabulary", path);
    return MMC_OK;
}

/* The Hub's older layout: vocab.txt (one token per line, id = line number) and tokenizer_config.json's
 * do_lower_case / tokenize_chinese_chars / strip_accents, as transformers builds the same pipeline from
 * them; the special tokens are [UNK] [CLS] [SEP] [PAD] and [MASK] (added when in the vocabulary). */
static mmc_status load_vocab_txt(mmc_bert_tokenizer *t, const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    char *buf = NULL;
    size_t n = 0;
    mmc_status st = mmc_read_file(path, &buf, &n);
    if (st) return st;
    int32_t lines = 1;
    for (size_t i = 0; i < n; i++) lines += buf[i] == '\n';
    if ((st = vocab_alloc(t, lines))) goto done;
    int32_t id = 0;
    for (size_t i = 0; i < n;) {
        size_t e = i;
        while (e < n && buf[e] != '\n') e++;
        size_t len = e - i;
        if (len && buf[i + len - 1] == '\r') len--;
        if (len && (st = vocab_add(t, buf + i, len, id))) goto done;
        id++;
        i = e + 1;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    mmc_json *cfg = NULL;
    bool lower = true, chinese = true;
    const mmc_json *sa = NULL;
    if (mmc_json_load(path, &cfg) == MMC_OK) {
        mmc_json_bool(cfg, "do_lower_case", true, &lower);
        mmc_json_bool(cfg, "tokenize_chinese_chars", true, &chinese);
        sa = mmc_json_get(cfg, "strip_accents");
    }
    mmc_clear_error();
    t->clean_text = true, t->chinese = chinese, t->lowercase = lower;
    bool sab = lower;
    if (sa && mmc_json_bool(cfg, "strip_accents", lower, &sab) != MMC_OK) { mmc_clear_error(); sab = lower; }
    t->strip_accents = sab;
    mmc_json_free(cfg);
    snprintf(t->prefix, sizeof t->prefix, "##");
    t->max_chars = 100;
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int k = 0; k < 5; k++) {
        const int32_t sid = vocab_get(t, specials[k], strlen(specials[k]));
        if (sid < 0) continue;
        t->added[t->n_added].s = strdup(specials[k]);
        if (!t->added[t->n_added].s) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        t->added[t->n_added].len = (int)strlen(specials[k]);
        t->added[t->n_added++].id = sid;
    }
    t->unk = vocab_get(t, "[UNK]", 5), t->cls = vocab_get(t, "[CLS]", 5), t->sep = vocab_get(t, "[SEP]", 5);
    t->pad = vocab_get(t, "[PAD]", 5);
    if (t->unk < 0 || t->cls < 0 || t->sep < 0 || t->pad < 0) {
        snprintf(path, sizeof path, "%s/vocab.txt", dir);
        st = mmc_error(MMC_ERR_FORMAT, "%s: [UNK], [CLS], [SEP] and [PAD] must be in the vocabulary", path);
    }
done:
    free(buf);
    return st;
}

mmc_status mmc_bert_tokenizer_load(const char *dir, mmc_bert_tokenizer **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *buf = NULL;
    size_t n = 0;
    FILE *probe = fopen(path, "rb");
    if (!probe) {   /* no tokenizer.json: the vocab.txt layout */
        snprintf(path, sizeof path, "%s/vocab.txt", dir);
        FILE *v = fopen(path, "rb");
        if (!v)
            return mmc_error(MMC_ERR_NOT_FOUND, "%s: neither tokenizer.json nor vocab.txt: not a BERT tokenizer folder",
                             dir);
        fclose(v);
        mmc_bert_tokenizer *t = calloc(1, sizeof *t);
        if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
        t->model_max_length = 512;
        mmc_status st = load_vocab_txt(t, dir);
        if (st) { mmc_bert_tokenizer_free(t); return st; }
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        mmc_json *cfg = NULL;
        if (mmc_json_load(path, &cfg) == MMC_OK) {
            int64_t ml = 0;
            if (mmc_json_int(cfg, "model_max_length", 512, &ml) == MMC_OK && ml > 0 && ml < 1000000)
                t->model_max_length = (int)ml;
            mmc_json_free(cfg);
        }
        mmc_clear_error();
        *out = t;
        return MMC_OK;
    }
    fclose(probe);
    mmc_status st = mmc_read_file(path, &buf, &n);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!root) return mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON (regenerate it with save_pretrained)", path);
    mmc_bert_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { cJSON_Delete(root); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    t->model_max_length = 512;
    st = parse(t, root, path);
    cJSON_Delete(root);
    if (!st) {   /* model_max_length from tokenizer_config.json (77 for HunyuanDiT's), when present */
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        mmc_json *cfg = NULL;
        if (mmc_json_load(path, &cfg) == MMC_OK) {
            int64_t ml = 0;
            if (mmc_json_int(cfg, "model_max_length", 512, &ml) == MMC_OK && ml > 0 && ml < 1000000)
                t->model_max_length = (int)ml;
            mmc_json_free(cfg);
        }
        mmc_clear_error();
    }
    if (st) { mmc_bert_tokenizer_free(t); return st; }
    *out = t;
    return MMC_OK;
}

int mmc_bert_tokenizer_model_max_length(const mmc_bert_tokenizer *t) { return t->model_max_length; }
int32_t mmc_bert_tokenizer_vocab_size(const mmc_bert_tokenizer *t) { return t->n_ids; }

/* ---- normalizer and pre-tokenizer */
static bool is_chinese(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}
static bool is_bert_whitespace(int32_t c) {
    return c == '\t' || c == '\n' || c == '\r' || c == ' ' || utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}
static bool is_control(int32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO;
}
static bool is_rust_whitespace(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
static bool is_punct(int32_t c) {
    if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

typedef struct { int32_t *c; int64_t n, cap; } cpbuf;
static bool push(cpbuf *b, int32_t c) {
    if (b->n == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 256;
        int32_t *p = realloc(b->c, (size_t)cap * sizeof *p);
        if (!p) return false;
        b->c = p, b->cap = cap;
    }
    b->c[b->n++] = c;
    return true;
}

/* normalize s[0..n) (UTF-8; invalid bytes become U+FFFD, then dropped by clean_text) into b */
static bool normalize(const mmc_bert_tokenizer *t, const char *s, int64_t n, cpbuf *b) {
    for (int64_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const uint8_t *)s + i, n - i, &c);
        if (k < 1) c = 0xFFFD, k = 1;
        i += k;
        if (t->clean_text) {
            if (c == 0 || c == 0xFFFD || is_control(c)) continue;
            if (is_bert_whitespace(c)) c = ' ';
        }
        int32_t dec[8];
        int nd = 1;
        if (t->strip_accents) {   /* NFD of this code point (canonical decomposition) */
            int last = 0;
            utf8proc_ssize_t m = utf8proc_decompose_char(c, dec, 8, UTF8PROC_DECOMPOSE, &last);
            nd = m >= 1 && m <= 8 ? (int)m : 0;
        }
        if (nd == 0 || !t->strip_accents) dec[0] = c, nd = 1;
        const bool cjk = t->chinese && is_chinese(c);
        if (cjk && !push(b, ' ')) return false;
        for (int d = 0; d < nd; d++) {
            int32_t x = dec[d];
            if (t->strip_accents && utf8proc_category(x) == UTF8PROC_CATEGORY_MN) continue;
            if (t->lowercase) x = utf8proc_tolower(x);
            if (!push(b, x)) return false;
        }
        if (cjk && !push(b, ' ')) return false;
    }
    return true;
}

/* WordPiece of one word w[0..n) code points, appended to ids (cap) */
typedef struct { char *bytes; int64_t *off; int32_t *piece; } wp_scratch;   /* sized for the longest word */

static void wordpiece(const mmc_bert_tokenizer *t, const int32_t *w, int64_t n, int32_t *ids, int cap, int *nid,
                      const wp_scratch *sc) {
    char *tmp = sc->bytes;
    int64_t *off = sc->off;
    int32_t *piece = sc->piece;
    if (n > t->max_chars) {
        if (*nid < cap) ids[*nid] = t->unk;
        (*nid)++;
        return;
    }
    /* the UTF-8 of the word, with each code point's byte offset */
    size_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        off[i] = (int64_t)len;
        len += (size_t)utf8proc_encode_char(w[i], (uint8_t *)tmp + len);
    }
    off[n] = (int64_t)len;
    const size_t pl = strlen(t->prefix);
    char *cand = tmp + len + 1;
    int np = 0;
    for (int64_t start = 0; start < n;) {
        int64_t end = n;
        int32_t id = -1;
        for (; end > start; end--) {
            size_t cl = 0;
            if (start > 0) memcpy(cand, t->prefix, pl), cl = pl;
            memcpy(cand + cl, tmp + off[start], (size_t)(off[end] - off[start]));
            cl += (size_t)(off[end] - off[start]);
            if ((id = vocab_get(t, cand, cl)) >= 0) break;
        }
        if (id < 0) {   /* the whole word is unknown */
            if (*nid < cap) ids[*nid] = t->unk;
            (*nid)++;
            return;
        }
        piece[np++] = id;
        start = end;
    }
    for (int i = 0; i < np; i++) {
        if (*nid < cap) ids[*nid] = piece[i];
        (*nid)++;
    }
}

/* the word pieces of a text span without added tokens */
static mmc_status encode_span(const mmc_bert_tokenizer *t, const char *s, int64_t n, int32_t *ids, int cap, int *nid) {
    cpbuf b = {0};
    if (!normalize(t, s, n, &b)) { free(b.c); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    wp_scratch sc = {malloc((size_t)b.n * 2 * 4 + 2 * 16 + 8), malloc((size_t)(b.n + 1) * sizeof(int64_t)),
                     malloc((size_t)(b.n + 1) * sizeof(int32_t))};
    if (!sc.bytes || !sc.off || !sc.piece) {
        free(sc.bytes), free(sc.off), free(sc.piece), free(b.c);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    int64_t ws = 0;
    for (int64_t i = 0; i <= b.n; i++) {
        const bool end = i == b.n;
        const int32_t c = end ? ' ' : b.c[i];
        if (end || is_rust_whitespace(c) || is_punct(c)) {
            if (i > ws) wordpiece(t, b.c + ws, i - ws, ids, cap, nid, &sc);
            if (!end && is_punct(c)) wordpiece(t, b.c + i, 1, ids, cap, nid, &sc);
            ws = i + 1;
        }
    }
    free(sc.bytes), free(sc.off), free(sc.piece), free(b.c);
    return MMC_OK;
}

mmc_status mmc_bert_tokenizer_encode(const mmc_bert_tokenizer *t, const char *text, int32_t *ids, int cap, int *n) {
    *n = 0;
    const int64_t len = (int64_t)strlen(text);
    int64_t seg = 0;
    mmc_status st;
    for (int64_t i = 0; i < len;) {
        int best = -1;
        for (int a = 0; a < t->n_added; a++)
            if (t->added[a].len <= len - i && !memcmp(text + i, t->added[a].s, (size_t)t->added[a].len) &&
                (best < 0 || t->added[a].len > t->added[best].len))
                best = a;
        if (best < 0) { i++; continue; }
        if ((st = encode_span(t, text + seg, i - seg, ids, cap, n))) return st;
        if (*n < cap) ids[*n] = t->added[best].id;
        (*n)++;
        i += t->added[best].len;
        seg = i;
    }
    return encode_span(t, text + seg, len - seg, ids, cap, n);
}

mmc_status mmc_bert_tokenizer_encode_padded(const mmc_bert_tokenizer *t, const char *text, int max_length,
                                            int32_t *ids, int32_t *mask) {
    if (max_length < 2)
        return mmc_error(MMC_ERR_INVALID, "BERT tokenizer: max_length %d leaves no room for [CLS] and [SEP]",
                         max_length);
    int n = 0;
    mmc_status st = mmc_bert_tokenizer_encode(t, text, ids + 1, max_length - 2, &n);
    if (st) return st;
    if (n > max_length - 2) n = max_length - 2;   /* truncation: the word pieces past the room are dropped */
    ids[0] = t->cls;
    ids[n + 1] = t->sep;
    for (int i = 0; i < max_length; i++) {
        mask[i] = i < n + 2;
        if (i >= n + 2) ids[i] = t->pad;
    }
    return MMC_OK;
}
