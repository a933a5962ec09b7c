/* spm_model.c — a SentencePiece model file (tokenizer.model: InternLM2, InternVL2 / 2.5 with
 * InternLM2, and other checkpoints that ship no tokenizer.json) read in C and encoded as the
 * sentencepiece library (0.2.x) does, for the tokenizer of tokenizer.c (which splits off the added
 * tokens first and adds bos / eos, as transformers' slow PreTrainedTokenizer does around
 * InternLM2Tokenizer._tokenize = sp_model.encode(text)).
 *
 * The file is a protobuf ModelProto (untrusted: every length and index is bounds-checked, see
 * fuzz/fuzz_spm_model.c):
 *   1 pieces (SentencePiece: 1 piece, 2 score (float), 3 type NORMAL 1 / UNKNOWN 2 / CONTROL 3 /
 *     USER_DEFINED 4 / UNUSED 5 / BYTE 6);
 *   2 trainer_spec: 3 model_type (UNIGRAM 1 default, BPE 2, WORD 3, CHAR 4), 24
 *     treat_whitespace_as_suffix, 35 byte_fallback, 41 bos_id / 42 eos_id (defaults 1 / 2);
 *   3 normalizer_spec: 2 precompiled_charsmap (a Darts double array and its strings), 3
 *     add_dummy_prefix, 4 remove_extra_whitespaces, 5 escape_whitespaces (all default true).
 * Refused with a message naming the file: malformed protobuf, empty or duplicate pieces, not
 * exactly one UNKNOWN piece, byte_fallback without all 256 "<0xXX>" pieces, WORD / CHAR models,
 * treat_whitespace_as_suffix, a charsmap whose array does not fit its bytes.
 *
 * Encoding (sentencepiece's Normalizer::Normalize, then bpe_model.cc, then the processor):
 *   normalize: at each position a USER_DEFINED piece (longest) is kept as is; else the longest
 *     charsmap match is replaced by its string; else one UTF-8 character is kept (an ill-formed
 *     byte becomes U+FFFD); remove_extra_whitespaces drops leading spaces, spaces after a space
 *     and trailing ones; add_dummy_prefix puts one space first (not for an empty text); spaces
 *     become "▁" (escape_whitespaces);
 *   BPE: symbols are the characters (a USER_DEFINED piece one frozen symbol); repeatedly the
 *     adjacent pair whose concatenation is a piece (NORMAL, USER_DEFINED or UNUSED) with the
 *     highest score merges, the leftmost on ties; a merged UNUSED piece is split back into the
 *     two symbols it was made of (recursively);
 *   or Unigram: the Viterbi best segmentation (unigram_cuts below);
 *   ids: a symbol's piece id (CONTROL / UNKNOWN / BYTE pieces first, as PieceToId), else unknown:
 *     with byte_fallback its UTF-8 bytes as "<0xXX>" pieces, else the unknown id, consecutive
 *     unknown symbols fused into one.
 * Offsets: each token's bytes of the input (the normalized text keeps, per byte, the span of the
 * input it came from; the dummy prefix maps to the first character).
 * Not handled: word / char models (an error says so). */
#include "tok_internal.h"
#include "mmc_io.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { P_NORMAL = 1, P_UNKNOWN = 2, P_CONTROL = 3, P_USER = 4, P_UNUSED = 5, P_BYTE = 6 };
#define SPACE_SYM "\xE2\x96\x81" /* U+2581 */

struct tok_spm {
    int32_t n;
    char **piece;               /* [n] malloc'd, NUL-terminated (a piece may hold a NUL: see plen) */
    int32_t *plen;
    float *score;
    uint8_t *type;
    /* open addressing, piece -> id: [0] pieces_ (NORMAL, USER_DEFINED, UNUSED), [1] the others */
    int32_t *tab[2];
    uint32_t mask;
    int32_t unk, bos, eos;
    int32_t byte_id[256];
    bool byte_fallback, unigram;
    bool word_split;            /* no piece has a character then "▁", and none is UNUSED: BPE per word */
    int32_t max_len;            /* the longest piece's bytes */
    float min_score, max_score; /* over NORMAL pieces, as unigram_model.cc sets them (max from FLT_MIN) */
    /* user-defined pieces, longest first, per first byte */
    int32_t *user;              /* ids */
    int32_t user_first[257];    /* user[user_first[b] .. user_first[b + 1]) start with byte b */
    /* normalizer */
    uint32_t *units;            /* the charsmap's double array (copied: aligned), NULL: none */
    uint32_t n_units;
    char *norm_str;
    size_t norm_len;
    bool dummy_prefix, remove_ws, escape_ws;
};

/* ---------------------------------------------------------------- protobuf */
static bool pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int sh = 0; sh < 64 && *p < end; sh += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7F) << sh;
        if (!(b & 0x80)) return true;
    }
    return false;
}

bool tok_pb_field(const uint8_t **p, const uint8_t *end, uint32_t *num, uint64_t *val, const uint8_t **data,
                     size_t *len) {
    uint64_t key;
    if (!pb_varint(p, end, &key)) return false;
    *num = (uint32_t)(key >> 3);
    *data = NULL, *len = 0, *val = 0;
    switch (key & 7) {
    case 0: return pb_varint(p, end, val);
    case 1: if (end - *p < 8) return false; *data = *p; *len = 8; *p += 8; return true;
    case 5: if (end - *p < 4) return false; *data = *p; *len = 4; *p += 4; return true;
    case 2:
        if (!pb_varint(p, end, val) || *val > (uint64_t)(end - *p)) return false;
        *data = *p, *len = (size_t)*val, *p += *len;
        return true;
    default: return false;
    }
}

/* ---------------------------------------------------------------- tables */
static uint32_t phash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h ? h : 1;
}
static int32_t tab_get(const tok_spm *m, int k, const char *s, size_t n) {
    for (uint32_t i = phash(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t id = m->tab[k][i];
        if (id < 0) return -1;
        if ((size_t)m->plen[id] == n && !memcmp(m->piece[id], s, n)) return id;
    }
}
/* PieceToId: the reserved pieces first, then the others; -1 when neither (the caller's unknown) */
static int32_t piece_to_id(const tok_spm *m, const char *s, size_t n) {
    int32_t id = tab_get(m, 1, s, n);
    return id >= 0 ? id : tab_get(m, 0, s, n);
}

void tok_spm_free(tok_spm *m) {
    if (!m) return;
    for (int32_t i = 0; m->piece && i < m->n; i++) free(m->piece[i]);
    free(m->piece); free(m->plen); free(m->score); free(m->type);
    free(m->tab[0]); free(m->tab[1]); free(m->user);
    free(m->units); free(m->norm_str);
    free(m);
}

int32_t tok_spm_size(const tok_spm *m) { return m->n; }
const char *tok_spm_piece(const tok_spm *m, int32_t id, int32_t *len) { *len = m->plen[id]; return m->piece[id]; }
int32_t tok_spm_id(const tok_spm *m, const char *s) { return piece_to_id(m, s, strlen(s)); }
int32_t tok_spm_bos(const tok_spm *m) { return m->bos; }
int32_t tok_spm_eos(const tok_spm *m) { return m->eos; }
int32_t tok_spm_unk(const tok_spm *m) { return m->unk; }
bool tok_spm_byte_fallback(const tok_spm *m) { return m->byte_fallback; }
bool tok_spm_dummy_prefix(const tok_spm *m) { return m->dummy_prefix; }

static int cmp_user(const void *a, const void *b, void *ctx) {
    const tok_spm *m = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint8_t fx = (uint8_t)m->piece[x][0], fy = (uint8_t)m->piece[y][0];
    if (fx != fy) return fx - fy;
    if (m->plen[x] != m->plen[y]) return m->plen[y] - m->plen[x];
    return x - y;
}

mmc_status tok_spm_parse(const char *buf, size_t size, const char *path, tok_spm **out) {
    *out = NULL;
    tok_spm *m = calloc(1, sizeof *m);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    const uint8_t *p = (const uint8_t *)buf, *end = p + size, *d;
    uint32_t num;
    uint64_t v;
    size_t len;
    int32_t cap = 0;
    int64_t model_type = 1, bos = 1, eos = 2;
    bool suffix = false;
    const uint8_t *cm = NULL;
    size_t cm_len = 0;
    m->dummy_prefix = m->remove_ws = m->escape_ws = true;
    m->unk = -1;
    while (p < end) {
        if (!tok_pb_field(&p, end, &num, &v, &d, &len)) goto bad;
        if (num == 1 && d) {                                   /* SentencePiece */
            if (m->n == cap) {
                if (cap >= (1 << 24)) { st = mmc_error(MMC_ERR_FORMAT, "%s: more than %d pieces", path, 1 << 24); goto fail; }
                cap = cap ? 2 * cap : 256;
                void *a = realloc(m->piece, (size_t)cap * sizeof *m->piece), *b = realloc(m->plen, (size_t)cap * 4),
                     *c = realloc(m->score, (size_t)cap * 4), *e = realloc(m->type, (size_t)cap);
                if (a) m->piece = a;
                if (b) m->plen = b;
                if (c) m->score = c;
                if (e) m->type = e;
                if (!a || !b || !c || !e) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
            }
            const uint8_t *q = d, *qe = d + len, *pd = NULL, *pc;
            size_t pl = 0, l2;
            int32_t i = m->n;
            m->score[i] = 0, m->type[i] = P_NORMAL;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pc, &l2)) goto bad;
                if (num == 1 && pc) pd = pc, pl = l2;
                else if (num == 2 && pc && l2 == 4) memcpy(&m->score[i], pc, 4);
                else if (num == 3 && !pc) {
                    if (v < P_NORMAL || v > P_BYTE) {
                        st = mmc_error(MMC_ERR_FORMAT, "%s: piece %d has type %llu (known: 1 to 6)", path, i,
                                       (unsigned long long)v);
                        goto fail;
                    }
                    m->type[i] = (uint8_t)v;
                }
            }
            if (!pd || !pl) { st = mmc_error(MMC_ERR_FORMAT, "%s: piece %d is empty", path, i); goto fail; }
            if (!(m->piece[i] = malloc(pl + 1))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
            memcpy(m->piece[i], pd, pl);
            m->piece[i][pl] = 0;
            m->plen[i] = (int32_t)pl;
            m->n++;
        } else if (num == 2 && d) {                            /* TrainerSpec */
            const uint8_t *q = d, *qe = d + len, *pc;
            size_t l2;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pc, &l2)) goto bad;
                if (pc) continue;
                if (num == 3) model_type = (int64_t)v;
                else if (num == 24) suffix = v != 0;
                else if (num == 35) m->byte_fallback = v != 0;
                else if (num == 41) bos = (int32_t)(uint32_t)v;   /* int32 varints: negatives are 10 bytes */
                else if (num == 42) eos = (int32_t)(uint32_t)v;
            }
        } else if (num == 3 && d) {                            /* NormalizerSpec */
            const uint8_t *q = d, *qe = d + len, *pc;
            size_t l2;
            while (q < qe) {
                if (!tok_pb_field(&q, qe, &num, &v, &pc, &l2)) goto bad;
                if (num == 2 && pc) cm = pc, cm_len = l2;
                else if (num == 3 && !pc) m->dummy_prefix = v != 0;
                else if (num == 4 && !pc) m->remove_ws = v != 0;
                else if (num == 5 && !pc) m->escape_ws = v != 0;
            }
        }
    }
    if (m->n < 1) { st = mmc_error(MMC_ERR_FORMAT, "%s: no pieces: not a SentencePiece model", path); goto fail; }
    if (model_type != 1 && model_type != 2) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: SentencePiece model type %s is not supported (BPE, as InternLM2 uses, "
                       "and UNIGRAM are)", path, model_type == 3 ? "WORD" : model_type == 4 ? "CHAR" : "(unknown)");
        goto fail;
    }
    m->unigram = model_type == 1;
    if (suffix) { st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: treat_whitespace_as_suffix is not supported", path); goto fail; }
    if (cm && cm_len) {   /* precompiled_charsmap: uint32 size of the array, the array, its strings */
        uint32_t ts;
        if (cm_len < 4) goto bad_cm;
        memcpy(&ts, cm, 4);
        if (ts % 4 || ts == 0 || ts > cm_len - 4) goto bad_cm;
        m->n_units = ts / 4;
        m->norm_len = cm_len - 4 - ts;
        m->units = malloc(ts);
        m->norm_str = malloc(m->norm_len + 1);
        if (!m->units || !m->norm_str) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        memcpy(m->units, cm + 4, ts);
        memcpy(m->norm_str, cm + 4 + ts, m->norm_len);
        m->norm_str[m->norm_len] = 0;
    }
    /* the piece tables */
    uint32_t sz = 16;
    while (sz < 2u * (uint32_t)m->n) sz <<= 1;
    m->mask = sz - 1;
    for (int k = 0; k < 2; k++) {
        if (!(m->tab[k] = malloc(sz * sizeof *m->tab[k]))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        for (uint32_t i = 0; i < sz; i++) m->tab[k][i] = -1;
    }
    int n_user = 0;
    m->min_score = FLT_MAX, m->max_score = FLT_MIN;
    for (int32_t i = 0; i < m->n; i++) {
        if (m->plen[i] > m->max_len) m->max_len = m->plen[i];
        if (m->type[i] == P_NORMAL && m->score[i] < m->min_score) m->min_score = m->score[i];
        if (m->type[i] == P_NORMAL && m->score[i] > m->max_score) m->max_score = m->score[i];
        int k = (m->type[i] == P_NORMAL || m->type[i] == P_USER || m->type[i] == P_UNUSED) ? 0 : 1;
        if (tab_get(m, 0, m->piece[i], (size_t)m->plen[i]) >= 0 || tab_get(m, 1, m->piece[i], (size_t)m->plen[i]) >= 0) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: piece %d '%.40s' appears twice", path, i, m->piece[i]);
            goto fail;
        }
        uint32_t h = phash(m->piece[i], (size_t)m->plen[i]) & m->mask;
        while (m->tab[k][h] >= 0) h = (h + 1) & m->mask;
        m->tab[k][h] = i;
        if (m->type[i] == P_UNKNOWN) {
            if (m->unk >= 0) { st = mmc_error(MMC_ERR_FORMAT, "%s: pieces %d and %d are both UNKNOWN", path, m->unk, i); goto fail; }
            m->unk = i;
        }
        if (m->type[i] == P_USER) n_user++;
    }
    if (m->unk < 0) { st = mmc_error(MMC_ERR_FORMAT, "%s: no piece of type UNKNOWN (<unk>)", path); goto fail; }
    m->bos = bos >= 0 && bos < m->n ? (int32_t)bos : -1;
    m->eos = eos >= 0 && eos < m->n ? (int32_t)eos : -1;
    for (int b = 0; b < 256; b++) {
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        int32_t id = tab_get(m, 1, fb, 6);
        m->byte_id[b] = id >= 0 && m->type[id] == P_BYTE ? id : -1;
        if (m->byte_fallback && m->byte_id[b] < 0) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: byte_fallback is set but there is no BYTE piece '%s'", path, fb);
            goto fail;
        }
    }
    /* word_split: no NORMAL / USER_DEFINED piece holds "▁" after another character, and no UNUSED
     * piece (sentencepiece's rev_merge keeps the last split proposed anywhere in the text) */
    m->word_split = true;
    for (int32_t i = 0; i < m->n && m->word_split; i++) {
        if (m->type[i] == P_UNUSED) m->word_split = false;
        if (m->type[i] != P_NORMAL && m->type[i] != P_USER) continue;
        for (int32_t k = 1; k + 3 <= m->plen[i]; k++)
            if (!memcmp(m->piece[i] + k, SPACE_SYM, 3) && (k < 3 || memcmp(m->piece[i] + k - 3, SPACE_SYM, 3))) {
                m->word_split = false;
                break;
            }
    }
    if (!(m->user = malloc((size_t)(n_user + 1) * sizeof *m->user))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    n_user = 0;
    for (int32_t i = 0; i < m->n; i++) if (m->type[i] == P_USER) m->user[n_user++] = i;
    qsort_r(m->user, (size_t)n_user, sizeof *m->user, cmp_user, m);
    for (int b = 0, j = 0; b <= 256; b++) {
        while (j < n_user && (uint8_t)m->piece[m->user[j]][0] < b) j++;
        m->user_first[b] = b == 256 ? n_user : j;
    }
    *out = m;
    return MMC_OK;
bad_cm:
    st = mmc_error(MMC_ERR_FORMAT, "%s: the normalizer's precompiled_charsmap is malformed (its array size does not fit "
                   "its %zu bytes)", path, cm_len);
    goto fail;
bad:
    st = mmc_error(MMC_ERR_FORMAT, "%s: not a valid SentencePiece model (malformed or truncated protobuf)", path);
fail:
    tok_spm_free(m);
    return st;
}

/* ---------------------------------------------------------------- normalizer */
/* Length of the longest USER_DEFINED piece at s[0, n), 0 if none. */
static size_t user_match(const tok_spm *m, const char *s, size_t n) {
    uint8_t b = (uint8_t)s[0];
    for (int32_t j = m->user_first[b]; j < m->user_first[b + 1]; j++) {
        int32_t id = m->user[j];
        if ((size_t)m->plen[id] <= n && !memcmp(m->piece[id], s, (size_t)m->plen[id])) return (size_t)m->plen[id];
    }
    return 0;
}

/* Length of one well-formed UTF-8 character at s (1-4), 0 if ill-formed (sentencepiece's
 * IsValidDecodeUTF8: overlong forms, surrogates and code points above U+10FFFF are not). */
static int utf8_char(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else return 0;
    if ((size_t)need >= n) return 0;
    for (int i = 1; i <= need; i++) {
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return need + 1;
}

size_t tok_charsmap_longest(const void *units, uint32_t n_units, const char *str, size_t str_len, const uint8_t *s,
                            size_t n, const char **rep) {
    if (!units || !n_units) return 0;
    const uint8_t *u = units;
#define UNIT(i) (memcpy(&x_, u + 4 * (size_t)(i), 4), x_)
#define OFF(x) (((x) >> 10) << (((x) & (1u << 9)) >> 6))
    uint32_t x_, pos = OFF(UNIT(0));
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        pos ^= s[i];
        if (pos >= n_units) break;
        uint32_t unit = UNIT(pos);
        if ((unit & ((1u << 31) | 0xFF)) != s[i]) break;
        pos ^= OFF(unit);
        if ((unit >> 8) & 1) {
            if (pos >= n_units) break;
            uint32_t val = UNIT(pos) & 0x7FFFFFFFu;
            if (val < str_len) {
                best = i + 1;
                *rep = str + val;
            }
        }
    }
#undef OFF
#undef UNIT
    return best;
}

typedef struct {
    char *s;            /* normalized bytes */
    int64_t *src0, *src1;   /* per byte: the input span it came from */
    int64_t n, cap;
} nbuf;

static bool nput(nbuf *b, const char *s, size_t n, int64_t s0, int64_t s1) {
    if (b->n + (int64_t)n + 1 > b->cap) {
        int64_t c = (b->n + (int64_t)n + 1) * 2;
        char *x = realloc(b->s, (size_t)c);
        if (x) b->s = x;
        int64_t *y = realloc(b->src0, (size_t)c * sizeof *y);
        if (y) b->src0 = y;
        int64_t *z = realloc(b->src1, (size_t)c * sizeof *z);
        if (z) b->src1 = z;
        if (!x || !y || !z) return false;
        b->cap = c;
    }
    for (size_t i = 0; i < n; i++) {
        b->s[b->n] = s[i];
        b->src0[b->n] = s0;
        b->src1[b->n] = s1;
        b->n++;
    }
    return true;
}

/* One normalization unit at s[0, n): its replacement in *rep (*rep_n bytes), the bytes consumed. */
static size_t norm_prefix(const tok_spm *m, const char *s, size_t n, const char **rep, size_t *rep_n) {
    size_t k = user_match(m, s, n);
    if (k) { *rep = s; *rep_n = k; return k; }
    const char *r = NULL;
    k = tok_charsmap_longest(m->units, m->n_units, m->norm_str, m->norm_len, (const uint8_t *)s, n, &r);
    if (k) { *rep = r; *rep_n = strlen(r); return k; }
    int l = utf8_char((const uint8_t *)s, n);
    if (!l) { *rep = "\xEF\xBF\xBD"; *rep_n = 3; return 1; }
    *rep = s;
    *rep_n = (size_t)l;
    return (size_t)l;
}

static bool normalize(const tok_spm *m, const char *s, int64_t n, int64_t base, nbuf *o) {
    o->n = 0;
    if (n <= 0) return true;
    size_t i = 0;
    const char *rep;
    size_t rn;
    if (m->remove_ws) {   /* leading spaces go */
        while (i < (size_t)n) {
            size_t k = norm_prefix(m, s + i, (size_t)n - i, &rep, &rn);
            if (rn != 1 || rep[0] != ' ') break;
            i += k;
        }
        if (i == (size_t)n) return true;
    }
    if (m->dummy_prefix) {
        size_t k = norm_prefix(m, s + i, (size_t)n - i, &rep, &rn);
        if (!(m->escape_ws ? nput(o, SPACE_SYM, 3, base + (int64_t)i, base + (int64_t)(i + k))
                           : nput(o, " ", 1, base + (int64_t)i, base + (int64_t)(i + k)))) return false;
    }
    bool prev_space = m->remove_ws;
    while (i < (size_t)n) {
        size_t k = norm_prefix(m, s + i, (size_t)n - i, &rep, &rn);
        int64_t s0 = base + (int64_t)i, s1 = base + (int64_t)(i + k);
        size_t a = 0;
        while (prev_space && a < rn && rep[a] == ' ') a++;
        if (a < rn) {
            for (size_t b = a; b < rn; b++) {
                bool ok = (m->escape_ws && rep[b] == ' ') ? nput(o, SPACE_SYM, 3, s0, s1) : nput(o, rep + b, 1, s0, s1);
                if (!ok) return false;
            }
            prev_space = rep[rn - 1] == ' ';
        }
        i += k;
        if (!m->remove_ws) prev_space = false;
    }
    if (m->remove_ws) {   /* trailing spaces go */
        const char *sp = m->escape_ws ? SPACE_SYM : " ";
        int64_t l = m->escape_ws ? 3 : 1;
        while (o->n >= l && !memcmp(o->s + o->n - l, sp, (size_t)l)) o->n -= l;
    }
    return true;
}

/* ---------------------------------------------------------------- BPE */
typedef struct { int64_t start, len, prev, next; bool freeze; } sym;
typedef struct { float score; int64_t left, right, size; } pair;

static bool pair_before(const pair *a, const pair *b) {   /* higher score first, then the leftmost */
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}
static void hpush(pair *h, int64_t *n, pair x) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!pair_before(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}
static pair hpop(pair *h, int64_t *n) {
    pair top = h[0], x = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_before(&h[c + 1], &h[c])) c++;
        if (!pair_before(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

typedef struct {
    const tok_spm *m;
    const nbuf *nb;
    void (*push)(void *, int32_t, int64_t, int64_t);
    void *ctx;
    int64_t unk0, unk1;     /* a pending run of unknown symbols (unk0 < 0: none) */
} emitter;

static void flush_unk(emitter *e) {
    if (e->unk0 >= 0) e->push(e->ctx, e->m->unk, e->unk0, e->unk1);
    e->unk0 = -1;
}

static void emit(emitter *e, int64_t a, int64_t b) {   /* the symbol nb->s[a, b) */
    const tok_spm *m = e->m;
    const nbuf *nb = e->nb;
    int64_t s0 = nb->src0[a], s1 = nb->src1[b - 1];
    int32_t id = piece_to_id(m, nb->s + a, (size_t)(b - a));
    if (id >= 0 && id != m->unk) {
        flush_unk(e);
        e->push(e->ctx, id, s0, s1);
    } else if (m->byte_fallback) {
        flush_unk(e);
        for (int64_t k = a; k < b; k++) e->push(e->ctx, m->byte_id[(uint8_t)nb->s[k]], s0, s1);
    } else if (e->unk0 >= 0) e->unk1 = s1;   /* consecutive unknown symbols: one token */
    else e->unk0 = s0, e->unk1 = s1;
}

/* sentencepiece's rev_merge: for each UNUSED piece, the length of the left part of the last
 * candidate pair that would have made it (recorded when the pair is proposed) */
typedef struct { int32_t id; int64_t left_len; } rev_entry;
typedef struct { rev_entry *v; int64_t n, cap; } rev_log;

static bool rev_put(rev_log *rl, int32_t id, int64_t left_len) {
    for (int64_t k = 0; k < rl->n; k++) if (rl->v[k].id == id) { rl->v[k].left_len = left_len; return true; }
    if (rl->n == rl->cap) {
        int64_t c = rl->cap ? 2 * rl->cap : 16;
        rev_entry *x = realloc(rl->v, (size_t)c * sizeof *x);
        if (!x) return false;
        rl->v = x, rl->cap = c;
    }
    rl->v[rl->n++] = (rev_entry){id, left_len};
    return true;
}

/* The symbol [a, b): an UNUSED piece is emitted as the two it was merged from, recursively. */
static void resegment(emitter *e, const rev_log *rl, int64_t a, int64_t b, int depth) {
    const tok_spm *m = e->m;
    int32_t id = piece_to_id(m, e->nb->s + a, (size_t)(b - a));
    if (id >= 0 && m->type[id] == P_UNUSED && depth < 256)
        for (int64_t k = 0; k < rl->n; k++)
            if (rl->v[k].id == id && rl->v[k].left_len > 0 && rl->v[k].left_len < b - a) {
                resegment(e, rl, a, a + rl->v[k].left_len, depth + 1);
                resegment(e, rl, a + rl->v[k].left_len, b, depth + 1);
                return;
            }
    emit(e, a, b);
}

/* Unigram (unigram_model.cc's EncodeOptimized): Viterbi over the normalized bytes in float, as
 * sentencepiece sums; from each character start every piece (NORMAL, USER_DEFINED: length in bytes
 * times max_score less 0.1) ending later replaces the best path into its end when strictly better
 * (or when none came yet); where no piece is exactly that character, the unknown node (min_score -
 * 10) spans it. *cut gets the token boundaries, last to first: cut[0] = n, ... */
static mmc_status unigram_cuts(const tok_spm *m, const nbuf *nb, int64_t *cut, int64_t *ncut) {
    const int64_t n = nb->n;
    float *best = malloc((size_t)(n + 1) * sizeof *best);
    int64_t *from = malloc((size_t)(n + 1) * sizeof *from);
    if (!best || !from) { free(best); free(from); return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory"); }
    for (int64_t i = 0; i <= n; i++) best[i] = 0, from[i] = -1;
    const float unk_score = m->min_score - 10.0f;
    for (int64_t i = 0; i < n;) {
        int cl = utf8_char((const uint8_t *)nb->s + i, (size_t)(n - i));
        if (!cl) cl = 1;
        bool single = false;
        for (int64_t l = 1; l <= m->max_len && i + l <= n; l++) {
            int32_t id = tab_get(m, 0, nb->s + i, (size_t)l);
            if (id < 0 || m->type[id] == P_UNUSED) continue;
            float sc = (m->type[id] == P_USER ? (float)l * m->max_score - 0.1f : m->score[id]) + best[i];
            if (from[i + l] < 0 || sc > best[i + l]) best[i + l] = sc, from[i + l] = i;
            if (l == cl) single = true;
        }
        if (!single) {
            float sc = unk_score + best[i];
            if (from[i + cl] < 0 || sc > best[i + cl]) best[i + cl] = sc, from[i + cl] = i;
        }
        i += cl;
    }
    int64_t k = 0;
    for (int64_t e = n; e > 0 && from[e] >= 0; e = from[e]) cut[k++] = e;
    cut[k++] = 0;
    *ncut = k;
    free(best);
    free(from);
    return MMC_OK;
}

mmc_status tok_spm_encode(const tok_spm *m, const char *s, int64_t n, int64_t base,
                          void (*push)(void *ctx, int32_t id, int64_t start, int64_t end), void *ctx) {
    nbuf nb = {0};
    sym *sy = NULL;
    pair *h = NULL;
    rev_log rl = {0};
    mmc_status st = MMC_OK;
    if (!normalize(m, s, n, base, &nb)) goto oom;
    if (nb.n == 0) goto done;
    if (m->unigram) {
        int64_t *cut = malloc((size_t)(nb.n + 2) * sizeof *cut), nc = 0;
        if (!cut) goto oom;
        if ((st = unigram_cuts(m, &nb, cut, &nc))) { free(cut); goto done; }
        emitter e = {m, &nb, push, ctx, -1, -1};
        for (int64_t k = nc - 1; k > 0; k--) emit(&e, cut[k], cut[k - 1]);
        flush_unk(&e);
        free(cut);
        goto done;
    }
    sy = malloc((size_t)nb.n * sizeof *sy);
    int64_t nh = 0, hcap = 64;
    h = malloc((size_t)hcap * sizeof *h);
    if (!sy || !h) goto oom;
    emitter e = {m, &nb, push, ctx, -1, -1};
#define TRY_PAIR(L, R) do { \
        int64_t l_ = (L), r_ = (R); \
        if (l_ >= 0 && r_ >= 0 && !sy[l_].freeze && !sy[r_].freeze) { \
            int64_t sz_ = sy[l_].len + sy[r_].len; \
            int32_t id_ = tab_get(m, 0, nb.s + sy[l_].start, (size_t)sz_); \
            if (id_ >= 0) { \
                if (m->type[id_] == P_UNUSED && !rev_put(&rl, id_, sy[l_].len)) goto oom; \
                if (nh == hcap) { pair *nh_ = realloc(h, (size_t)(hcap *= 2) * sizeof *h); if (!nh_) goto oom; h = nh_; } \
                hpush(h, &nh, (pair){m->score[id_], l_, r_, sz_}); \
            } \
        } \
    } while (0)
    /* chunks: the whole text, or (word_split) each stretch that ends before a "▁" following another
     * character: no piece can span such a boundary, so BPE per chunk merges the same */
    for (int64_t c0 = 0, c1; c0 < nb.n; c0 = c1) {
        c1 = nb.n;
        if (m->word_split)
            for (int64_t i = c0 + 3; i + 3 <= nb.n; i++)
                if (!memcmp(nb.s + i, SPACE_SYM, 3) && memcmp(nb.s + i - 3, SPACE_SYM, 3)) { c1 = i; break; }
        int64_t ns = 0;
        for (int64_t i = c0; i < c1;) {
            size_t k = user_match(m, nb.s + i, (size_t)(c1 - i));
            bool fr = k > 0;
            if (!k) {
                k = (size_t)utf8_char((const uint8_t *)nb.s + i, (size_t)(c1 - i));
                if (!k) k = 1;
            }
            sy[ns] = (sym){i, (int64_t)k, ns - 1, i + (int64_t)k < c1 ? ns + 1 : -1, fr};
            ns++;
            i += (int64_t)k;
        }
        nh = 0;
        for (int64_t i = 0; i + 1 < ns; i++) TRY_PAIR(i, i + 1);
        while (nh > 0) {
            pair top = hpop(h, &nh);
            sym *L = &sy[top.left], *R = &sy[top.right];
            if (L->len == 0 || R->len == 0 || L->len + R->len != top.size) continue;   /* stale */
            L->len += R->len;
            L->next = R->next;
            if (R->next >= 0) sy[R->next].prev = top.left;
            R->len = 0;
            TRY_PAIR(L->prev, top.left);
            TRY_PAIR(top.left, L->next);
        }
        for (int64_t i = 0; i >= 0; i = sy[i].next) resegment(&e, &rl, sy[i].start, sy[i].start + sy[i].len, 0);
    }
#undef TRY_PAIR
    flush_unk(&e);
    goto done;
oom:
    st = mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
done:
    free(nb.s); free(nb.src0); free(nb.src1);
    free(sy); free(h); free(rl.v);
    return st;
}
