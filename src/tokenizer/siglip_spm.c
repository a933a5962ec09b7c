/* siglip_spm.c — SigLIP's tokenizer from spiece.model, mirroring transformers' SiglipTokenizer
 * (models/siglip/tokenization_siglip.py, the SentencePiece backend transformers 5 saves as
 * spiece.model + tokenizer_config.json) over the sentencepiece library (0.2.x) it calls:
 *
 *   canonicalize_text: lower-case (do_lower_case; utf8proc's simple case mapping per code point,
 *     str.lower on everything but its few one-to-many cases), drop ASCII punctuation
 *     (string.punctuation), each run of whitespace -> one space, strip;
 *   SentencePiece's normalizer: at each position the LONGEST prefix in precompiled_charsmap's
 *     double array (Darts) is replaced by its string, else one UTF-8 character is kept (text that is
 *     not valid UTF-8 is an error); remove_extra_whitespaces drops leading, trailing and repeated spaces;
 *     add_dummy_prefix puts one in front; spaces become "▁";
 *   Unigram Viterbi over the whole normalized text (EncodeOptimized): positions left to right, a
 *     piece (NORMAL or USER_DEFINED) replaces the best path into its end only when strictly better;
 *     a character no piece starts with gets the unknown node (min score - 10); consecutive unknown
 *     tokens merge into one unk id;
 *   then at most max_length - 1 ids, </s>, and padding="max_length" with pad_token (</s> for SigLIP),
 *     the attention mask 1 on the real tokens and the </s>.
 * As SiglipTokenizer.tokenize / _tokenize do: "▁" in the text becomes a space; the special tokens
 * (eos, unk, pad: "</s>", "<unk>") are split off the raw text first (leftmost, longest) and give
 * their ids; each stretch between them is canonicalized ("▁" prepended to the first one only), then
 * "<unk>" + it goes through SentencePiece and the first len(encode("<unk>")) tokens are dropped
 * (all kept when fewer came: a stretch whose first characters are unknown merges into the unknown
 * run of "<unk>" and vanishes, as in transformers); a lone "▁" token before a split-off special
 * token goes. The empty text (or one only of punctuation) is just </s>.
 * spiece.model is a protobuf ModelProto: pieces (field 1: piece 1, score 2, type 3), normalizer_spec
 * (field 3: precompiled_charsmap 2, add_dummy_prefix 3, remove_extra_whitespaces 4), read here with
 * every length bounds-checked. Not supported (an error names the file): byte_fallback models.
 * Known divergence: user-defined pieces are matched in the Viterbi (with sentencepiece's score: length
 * times the best score - 0.1) but not protected from the charsmap first as sentencepiece does. */
#include "mmc_embed.h"
#include "mmc_io.h"
#include "tok_internal.h"   /* the protobuf field reader and the charsmap lookup, shared with spm_model.c */

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };

typedef struct { char *s; int32_t len, id; } slot;

struct mmc_siglip_tokenizer {
    char *blob;                 /* the file */
    size_t blob_len;
    int32_t n;                  /* pieces */
    const char **piece;         /* into blob, not NUL-terminated: see plen */
    int32_t *plen;
    float *score;
    uint8_t *type;
    slot *tab;                  /* open addressing, piece -> id */
    uint32_t tab_mask;
    int32_t max_piece_len;
    const uint32_t *units;      /* the charsmap's double array (into blob; NULL: identity) */
    uint32_t n_units;
    const char *norm_str;       /* its strings */
    size_t norm_len;
    bool dummy_prefix, remove_ws, lower;
    int32_t unk, eos, pad, space;   /* space: the id of "▁" (-1 none) */
    int unk_len;                    /* unk_token_length: len(sp_model.encode("<unk>")) */
    double min_score, max_score;
    int model_max_length;
};

/* ---------------------------------------------------------------- piece table (the protobuf reader: tok_pb_field) */
static uint32_t hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int32_t lookup(const mmc_siglip_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = hash(s, n) & t->tab_mask;; i = (i + 1) & t->tab_mask) {
        const slot *e = &t->tab[i];
        if (!e->s) return -1;
        if ((size_t)e->len == n && !memcmp(e->s, s, n)) return e->id;
    }
}

void mmc_siglip_tokenizer_free(mmc_siglip_tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->piece);
    free(t->plen);
    free(t->score);
    free(t->type);
    free(t->tab);
    free(t);
}

static mmc_status encode_segment(const mmc_siglip_tokenizer *t, const char *text, size_t len, bool first,
                                 int unk_len, int32_t **ids, int *n_ids, int *cap);

static int32_t config_id(const mmc_siglip_tokenizer *t, const mmc_json *cfg, const char *key, const char *dflt) {
    const char *s = NULL;
    if (!cfg || mmc_json_str(cfg, key, dflt, &s)) s = dflt;
    return lookup(t, s, strlen(s));
}

mmc_status mmc_siglip_tokenizer_load(const char *dir, mmc_siglip_tokenizer **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/spiece.model", dir);
    mmc_siglip_tokenizer *t = calloc(1, sizeof *t);
    mmc_json *cfg = NULL;
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = mmc_read_file(path, &t->blob, &t->blob_len);
    if (st) goto fail;
    const uint8_t *p = (const uint8_t *)t->blob, *end = p + t->blob_len, *d;
    uint32_t num;
    uint64_t v;
    size_t len;
    int32_t cap = 0;
    t->dummy_prefix = t->remove_ws = t->lower = true;
    t->unk = -1;
    while (p < end) {
        if (!tok_pb_field(&p, end, &num, &v, &d, &len)) goto bad;
        if (num == 1 && d) {                                   /* SentencePiece */
            if (t->n == cap) {
                cap = cap ? 2 * cap : 1024;
                void *a = realloc(t->piece, (size_t)cap * sizeof *t->piece), *b = realloc(t->plen, (size_t)cap * 4),
                     *c = realloc(t->score, (size_t)cap * 4), *e = realloc(t->type, (size_t)cap);
                if (a) t->piece = a;
                if (b) t->plen = b;
                if (c) t->score = c;
                if (e) t->type = e;
                if (!a || !b || !c || !e) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
            }
            const uint8_t *q = d, *qe = d + len, *pd;
            size_t pl;
            int32_t i = t->n++;
            t->piece[i] = NULL, t->plen[i] = 0, t->score[i] = 0, t->type[i] = T_NORMAL;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pd, &pl)) goto bad;
                if (num == 1 && pd) t->piece[i] = (const char *)pd, t->plen[i] = (int32_t)pl;
                else if (num == 2 && pd && pl == 4) memcpy(&t->score[i], pd, 4);
                else if (num == 3 && !pd) t->type[i] = (uint8_t)v;
            }
            if (!t->piece[i] || !t->plen[i]) goto bad;
        } else if (num == 2 && d) {                            /* TrainerSpec: byte_fallback (35) */
            const uint8_t *q = d, *qe = d + len, *pd;
            size_t pl;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pd, &pl)) goto bad;
                if (num == 35 && !pd && v) {
                    st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: a byte_fallback SentencePiece model is not supported "
                                   "(SigLIP's spiece.model has none)", path);
                    goto fail;
                }
            }
        } else if (num == 3 && d) {                            /* NormalizerSpec */
            const uint8_t *q = d, *qe = d + len, *pd;
            size_t pl;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pd, &pl)) goto bad;
                if (num == 2 && pd && pl) {
                    uint32_t ts;
                    if (pl < 4) goto bad;
                    memcpy(&ts, pd, 4);
                    if (ts % 4 || ts > pl - 4) goto bad;
                    t->units = (const uint32_t *)(pd + 4);
                    t->n_units = ts / 4;
                    t->norm_str = (const char *)pd + 4 + ts;
                    t->norm_len = pl - 4 - ts;
                } else if (num == 3 && !pd) t->dummy_prefix = v != 0;
                else if (num == 4 && !pd) t->remove_ws = v != 0;
            }
        }
    }
    if (t->n < 1) goto bad;
    /* the piece table */
    uint32_t sz = 16;
    while (sz < 2u * (uint32_t)t->n) sz <<= 1;
    t->tab = calloc(sz, sizeof *t->tab);
    if (!t->tab) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    t->tab_mask = sz - 1;
    t->min_score = 1e300, t->max_score = -1e300;
    for (int32_t i = 0; i < t->n; i++) {
        if (t->type[i] == T_UNKNOWN && t->unk < 0) t->unk = i;
        if (t->type[i] == T_NORMAL && t->score[i] < t->min_score) t->min_score = t->score[i];
        if (t->type[i] == T_NORMAL && t->score[i] > t->max_score) t->max_score = t->score[i];
        if (t->plen[i] > t->max_piece_len) t->max_piece_len = t->plen[i];
        if (lookup(t, t->piece[i], (size_t)t->plen[i]) >= 0) continue;   /* the first one wins */
        uint32_t h = hash(t->piece[i], (size_t)t->plen[i]) & t->tab_mask;
        while (t->tab[h].s) h = (h + 1) & t->tab_mask;
        t->tab[h] = (slot){(char *)t->piece[i], t->plen[i], i};
    }
    if (t->min_score > 1e299) t->min_score = t->max_score = 0;
    if (t->unk < 0) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: no piece of type UNKNOWN: not a SentencePiece unigram model", path);
        goto fail;
    }
    /* tokenizer_config.json: eos / pad tokens, model_max_length, do_lower_case (SiglipTokenizer's defaults) */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        if ((st = mmc_json_load(path, &cfg))) goto fail;
    }
    int64_t mml = 64;
    bool lower = true;
    if (cfg && ((st = mmc_json_int(cfg, "model_max_length", 64, &mml)) ||
                (st = mmc_json_bool(cfg, "do_lower_case", true, &lower))))
        goto fail;
    t->lower = lower;
    t->model_max_length = mml >= 2 && mml <= 1 << 20 ? (int)mml : 64;
    t->eos = config_id(t, cfg, "eos_token", "</s>");
    t->pad = config_id(t, cfg, "pad_token", "</s>");
    if (t->eos < 0 || t->pad < 0) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: eos_token / pad_token are not pieces of spiece.model", dir);
        goto fail;
    }
    t->space = lookup(t, "\xe2\x96\x81", 3);
    {   /* unk_token_length: "<unk>" through the same encoder, nothing dropped */
        int32_t *ids = NULL;
        int n = 0, cap = 0;
        if ((st = encode_segment(t, "", 0, false, 0, &ids, &n, &cap))) goto fail;
        free(ids);
        t->unk_len = n;
    }
    mmc_json_free(cfg);
    *out = t;
    return MMC_OK;
bad:
    st = mmc_error(MMC_ERR_FORMAT, "%s: not a valid SentencePiece model (malformed or truncated protobuf)", path);
fail:
    mmc_json_free(cfg);
    mmc_siglip_tokenizer_free(t);
    return st;
}

int mmc_siglip_tokenizer_model_max_length(const mmc_siglip_tokenizer *t) { return t->model_max_length; }
int32_t mmc_siglip_tokenizer_vocab_size(const mmc_siglip_tokenizer *t) { return t->n; }

/* ---------------------------------------------------------------- encoding */
typedef struct { char *p; size_t n, cap; } buf;
static bool put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = (b->n + n + 1) * 2;
        char *q = realloc(b->p, c);
        if (!q) return false;
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool py_space(int32_t c) {   /* str.isspace: Unicode White_Space plus the C0 separators 0x1C-0x1F */
    if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
        return true;
    return false;
}

/* "<unk>" + canonicalize_text(("▁" if first) + text), then SentencePiece's normalizer ->
 * "▁<unk>▁a▁red▁cat" in *out, as _tokenize hands it to sp_model.encode */
static mmc_status normalize(const mmc_siglip_tokenizer *t, const char *text, size_t n, bool first, buf *out) {
    buf c = {0};
    const uint8_t *s = (const uint8_t *)text;
    bool space = false;
    if (!put(&c, t->piece[t->unk], (size_t)(t->plen[t->unk] > 0 ? t->plen[t->unk] : 0))) goto oom;
    const size_t c0 = c.n;   /* where canonicalize_text's output starts (its strip) */
    if (first && !put(&c, "\xe2\x96\x81", 3)) goto oom;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k < 1) { free(c.p); return mmc_error(MMC_ERR_INVALID, "SigLIP tokenizer: the text is not valid UTF-8"); }
        i += (size_t)k;
        if (cp < 128 && strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", (int)cp) && cp) continue;
        if (py_space(cp)) { space = true; continue; }
        if (space && c.n > c0 && !put(&c, " ", 1)) goto oom;   /* leading spaces vanish (strip) */
        space = false;
        if (t->lower && cp == 0x130) {            /* str.lower: U+0130 -> "i" + U+0307 */
            if (!put(&c, "i\xcc\x87", 3)) goto oom;
            continue;
        }
        if (t->lower && cp == 0x3A3) {            /* final sigma: after a letter, not before one */
            utf8proc_int32_t nx = -1, pv = -1;
            if (i < n) utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &nx);
            size_t b = c.n;
            while (b && (c.p[b - 1] & 0xC0) == 0x80) b--;
            if (b < c.n) utf8proc_iterate((const uint8_t *)c.p + b, (utf8proc_ssize_t)(c.n - b), &pv);
            else if (c.n) pv = (uint8_t)c.p[c.n - 1];
            const bool after = pv >= 0 && utf8proc_category(pv) >= UTF8PROC_CATEGORY_LU &&
                               utf8proc_category(pv) <= UTF8PROC_CATEGORY_LO;
            const bool before = nx >= 0 && utf8proc_category(nx) >= UTF8PROC_CATEGORY_LU &&
                                utf8proc_category(nx) <= UTF8PROC_CATEGORY_LO;
            if (!put(&c, after && !before ? "\xcf\x82" : "\xcf\x83", 2)) goto oom;
            continue;
        }
        if (t->lower) cp = utf8proc_tolower(cp);
        if (cp == 0x2581) cp = ' ';                  /* tokenize(): "\u2581" in the text is a space */
        uint8_t e[4];
        if (!put(&c, (const char *)e, (size_t)utf8proc_encode_char(cp, e))) goto oom;
    }
    /* SentencePiece: charsmap, whitespace, dummy prefix, "▁" */
    buf m = {0};
    if (!put(&m, "", 0)) goto oom;
    const uint8_t *cs = (const uint8_t *)(c.p ? c.p : "");
    for (size_t i = 0; i < c.n;) {
        const char *rep = NULL;
        size_t k = tok_charsmap_longest(t->units, t->n_units, t->norm_str, t->norm_len, cs + i, c.n - i, &rep);
        const char *piece;
        size_t pl;
        if (k) piece = rep, pl = strnlen(rep, t->norm_len - (size_t)(rep - t->norm_str)), i += k;
        else {
            utf8proc_int32_t cp;
            utf8proc_ssize_t u = utf8proc_iterate(cs + i, (utf8proc_ssize_t)(c.n - i), &cp);
            piece = (const char *)cs + i, pl = (size_t)(u > 0 ? u : 1), i += pl;
        }
        for (size_t j = 0; j < pl; j++) {
            if (piece[j] == ' ') {
                if (t->remove_ws && (m.n == 0 || m.p[m.n - 1] == ' ')) continue;
            }
            if (!put(&m, piece + j, 1)) { free(m.p); goto oom; }
        }
    }
    if (t->remove_ws)
        while (m.n && m.p[m.n - 1] == ' ') m.p[--m.n] = 0;
    free(c.p);
    out->n = 0;
    if (!put(out, "", 0)) { free(m.p); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    if (m.n && t->dummy_prefix && !put(out, "\xe2\x96\x81", 3)) { free(m.p); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    for (size_t i = 0; i < m.n; i++)
        if (!(m.p[i] == ' ' ? put(out, "\xe2\x96\x81", 3) : put(out, m.p + i, 1))) {
            free(m.p);
            return mmc_error(MMC_ERR_OOM, "out of memory");
        }
    free(m.p);
    return MMC_OK;
oom:
    free(c.p);
    return mmc_error(MMC_ERR_OOM, "out of memory");
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (s[i] & 0xC0) != 0x80;
    return c;
}

/* one stretch between special tokens: normalized, Viterbi, unknowns merged, the first unk_len
 * tokens (those of "<unk>") dropped unless fewer came, appended to *ids */
static mmc_status encode_segment(const mmc_siglip_tokenizer *t, const char *text, size_t len, bool first,
                                 int unk_len, int32_t **ids, int *n_ids, int *cap) {
    buf s = {0};
    mmc_status st = normalize(t, text, len, first, &s);
    if (st) { free(s.p); return st; }
    const size_t n = s.n;
    double *best = malloc((n + 1) * sizeof *best);
    int32_t *from = malloc((n + 1) * sizeof *from), *tok = malloc((n + 1) * sizeof *tok), *path = NULL;
    if (!best || !from || !tok) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (size_t i = 0; i <= n; i++) from[i] = -1, best[i] = 0;
    from[0] = 0;
    const double unk_score = t->min_score - 10.0;
    for (size_t i = 0; i < n; i++) {
        if (from[i] < 0 && i) continue;   /* not a character boundary reached */
        const size_t cl = (s.p[i] & 0x80) == 0 ? 1 : (s.p[i] & 0xE0) == 0xC0 ? 2 : (s.p[i] & 0xF0) == 0xE0 ? 3 : 4;
        bool single = false;
        for (size_t l = 1; l <= (size_t)t->max_piece_len && i + l <= n; l++) {
            if (i + l < n && (s.p[i + l] & 0xC0) == 0x80) continue;   /* inside a character */
            int32_t id = lookup(t, s.p + i, l);
            if (id < 0 || (t->type[id] != T_NORMAL && t->type[id] != T_USER)) continue;
            if (l == cl) single = true;
            /* a user-defined piece scores its length in characters times the best score, less 0.1 */
            const double sc = best[i] + (t->type[id] == T_USER ? (double)utf8_chars(s.p + i, l) * t->max_score - 0.1
                                                                 : t->score[id]);
            if (from[i + l] < 0 || sc > best[i + l]) best[i + l] = sc, from[i + l] = (int32_t)i, tok[i + l] = id;
        }
        if (!single && i + cl <= n) {
            const double sc = best[i] + unk_score;
            if (from[i + cl] < 0 || sc > best[i + cl]) best[i + cl] = sc, from[i + cl] = (int32_t)i, tok[i + cl] = t->unk;
        }
    }
    path = malloc((n + 1) * sizeof *path);
    if (!path) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    int np = 0;
    for (size_t e = n; e > 0 && from[e] >= 0; e = (size_t)from[e]) path[np++] = tok[e];
    if (*n_ids + np > *cap) {
        int c = (*n_ids + np) * 2 + 16;
        int32_t *q = realloc(*ids, (size_t)c * sizeof *q);
        if (!q) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        *ids = q, *cap = c;
    }
    /* back to front, then forward with consecutive unknowns merged into one */
    int got = 0;
    for (int i = np - 1; i >= 0; i--) {
        if (path[i] == t->unk && i < np - 1 && path[i + 1] == t->unk) continue;
        tok[got++] = path[i];
    }
    const int drop = got >= unk_len ? unk_len : 0;
    for (int i = drop; i < got; i++) (*ids)[(*n_ids)++] = tok[i];
done:
    free(s.p);
    free(best);
    free(from);
    free(tok);
    free(path);
    return st;
}

mmc_status mmc_siglip_tokenizer_encode_padded(const mmc_siglip_tokenizer *t, const char *text, int max_length,
                                              int32_t *ids, int32_t *mask, int *n_real) {
    if (max_length < 1) return mmc_error(MMC_ERR_INVALID, "SigLIP tokenizer: max_length %d < 1", max_length);
    /* the special tokens (eos, unk, pad) split off the raw text first, leftmost then longest */
    const int32_t sp[3] = {t->eos, t->unk, t->pad};
    int32_t *all = NULL;
    int n_all = 0, cap = 0;
    mmc_status st = MMC_OK;
    const size_t n = strlen(text);
    size_t seg = 0;
    bool first = true;
    int first_special = -1;   /* where the first split-off special token went */
    for (size_t i = 0; i <= n && !st;) {
        int32_t hit = -1;
        size_t hl = 0;
        for (int k = 0; k < 3 && i < n; k++) {
            const size_t l = (size_t)t->plen[sp[k]];
            if (l > hl && i + l <= n && !memcmp(text + i, t->piece[sp[k]], l)) hit = sp[k], hl = l;
        }
        if (hit < 0 && i < n) { i++; continue; }
        if (i > seg || first) st = encode_segment(t, text + seg, i - seg, first, t->unk_len, &all, &n_all, &cap);
        first = false;
        if (st || hit < 0) break;
        if (n_all + 1 > cap) {
            int c = n_all * 2 + 16;
            int32_t *q = realloc(all, (size_t)c * sizeof *q);
            if (!q) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            all = q, cap = c;
        }
        if (first_special < 0) first_special = n_all;
        all[n_all++] = hit;
        i += hl;
        seg = i;
    }
    /* tokenize(): a lone "▁" before a special token (one split off the text, not an unknown piece) goes */
    if (!st && n_all > 1 && all[0] == t->space && first_special == 1)
        memmove(all, all + 1, (size_t)--n_all * sizeof *all);
    if (!st) {
        int k = n_all < max_length - 1 ? n_all : max_length - 1;
        if (k > 0) memcpy(ids, all, (size_t)k * sizeof *ids);
        ids[k++] = t->eos;
        if (n_real) *n_real = k;
        for (int i = 0; i < max_length; i++) {
            if (mask) mask[i] = i < k;
            if (i >= k) ids[i] = t->pad;
        }
    }
    free(all);
    return st;
}
