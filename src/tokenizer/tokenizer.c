/* tokenizer.c — Hugging Face tokenizer.json byte-level BPE (the Qwen2 / Qwen2-VL pipeline)
 * in C: loading (tokenizer.json + tokenizer_config.json), encoding and decoding.
 *
 * Mirrors HF `tokenizers` (Rust): AddedVocabulary (non-normalized added tokens split off the
 * raw text, leftmost-longest; normalized ones after normalization), NFC normalizer (here
 * libutf8proc, applied only to the chunks of text that are not already NFC), pre-tokenizer
 * Split(regex, Isolated) (here PCRE2 with UTF+UCP and JIT) then ByteLevel, BPE with a
 * priority queue of merges ordered by (rank, position) and ignore_merges, and the ByteLevel
 * decoder (per-token byte mapping, String::from_utf8_lossy). BPE runs on raw bytes: every
 * vocab entry is mapped back from the byte-level alphabet at load, so no alphabet mapping
 * is needed while encoding. Encoded words are cached per work area.
 * The files are untrusted (fuzz/fuzz_tokenizer_load.c): ids must be integers below the number
 * of entries read, so no table is sized by a number in the file; two vocab entries with one
 * id, and malformed sections, are refused with a message naming the file and the entry.
 */
#include "tok_internal.h"
#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------ utilities */
#define SPM_SPACE "\xE2\x96\x81" /* U+2581, SentencePiece's space */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ (v * 0xbf58476d1ce4e5b9ull)) * 0x94d049bb133111ebull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ (v * 0xbf58476d1ce4e5b9ull)) * 0x94d049bb133111ebull;
    h ^= h >> 32;
    return h ? h : 1;
}
static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* ---- UTF-8: maximal-subpart repair (Python errors='replace', Rust from_utf8_lossy) */
/* Length of the well-formed sequence at s (1..4), or -(k) where k >= 1 is the length of the
 * maximal ill-formed subpart to replace with one U+FFFD. */
static int utf8_seq(const uint8_t *s, int64_t avail) {
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
    else return -1;
    for (int i = 1; i <= need; i++) {
        if (i >= avail) return -i;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -i;
    }
    return need + 1;
}
static bool utf8_valid(const uint8_t *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int k = utf8_seq(s + i, n - i);
        if (k < 0) return false;
        i += k;
    }
    return true;
}
/* Repaired copy (malloc'd, NUL-terminated); *out_n its length. */
static char *utf8_repair(const uint8_t *s, int64_t n, int64_t *out_n) {
    char *o = malloc((size_t)n * 3 + 1);
    if (!o) return NULL;
    int64_t i = 0, j = 0;
    while (i < n) {
        int k = s[i] < 0x80 ? 1 : utf8_seq(s + i, n - i);
        if (k > 0) {
            memcpy(o + j, s + i, (size_t)k);
            j += k;
            i += k;
        } else {
            memcpy(o + j, "\xEF\xBF\xBD", 3);
            j += 3;
            i += -k;
        }
    }
    o[j] = 0;
    *out_n = j;
    return o;
}
static int32_t utf8_decode(const uint8_t *s, int *len) {
    uint8_t c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((c & 0x1F) << 6) | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *len = 4;
    return ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}
static bool cp_is_whitespace(int32_t c) { /* Rust char::is_whitespace (Unicode White_Space) */
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}
static bool cp_is_word(int32_t c) {
    if (c == '_') return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* ---- GPT-2 byte-level alphabet: byte <-> code point */
static int16_t g_cp2byte[512];
static int32_t g_byte2cp[256];
static uint8_t *g_nfc_safe; /* bit per code point: stable under NFC, blocks composition */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void global_init(void) {
    for (int i = 0; i < 512; i++) g_cp2byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        g_byte2cp[b] = direct ? b : 256 + n++;
        g_cp2byte[g_byte2cp[b]] = (int16_t)b;
    }
    /* NFC quick check: a code point is "safe" when NFC leaves it unchanged and no
     * preceding character can compose with it or be reordered across it. Text made of
     * safe code points only is already NFC, and NFC never crosses a safe code point. */
    g_nfc_safe = calloc(0x110000 / 8, 1);
    if (!g_nfc_safe) return;
    for (int32_t c = 0; c < 0x110000; c++) {
        bool safe;
        if (c < 0x300) safe = true;
        else if (c >= 0xD800 && c <= 0xDFFF) safe = false;
        else if ((c >= 0x1100 && c <= 0x11FF) || (c >= 0xA960 && c <= 0xA97F) ||
                 (c >= 0xD7B0 && c <= 0xD7FF)) safe = false; /* Hangul jamo */
        else {
            const utf8proc_property_t *p = utf8proc_get_property(c);
            safe = p->combining_class == 0 && !(p->comb_index != UINT16_MAX && p->comb_index >= 0x8000);
            if (safe && p->decomp_type == 0 && p->decomp_seqindex != UINT16_MAX) {
                uint8_t in[8], *outp = NULL;
                utf8proc_ssize_t k = utf8proc_encode_char(c, in);
                utf8proc_ssize_t m = utf8proc_map(in, k, &outp, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                safe = m == k && memcmp(outp, in, (size_t)k) == 0;
                free(outp);
            }
        }
        if (safe) g_nfc_safe[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
}
static inline bool nfc_safe(int32_t c) { return (g_nfc_safe[c >> 3] >> (c & 7)) & 1; }

/* Bytes a token string decodes to under the ByteLevel decoder: each char mapped through the
 * alphabet, or (if any char is outside it) the string's own UTF-8 bytes. */
static uint8_t *bytelevel_bytes(const char *s, int32_t *nout) {
    size_t n = strlen(s);
    uint8_t *o = malloc(n + 1);
    if (!o) return NULL;
    int32_t j = 0;
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    bool ok = true;
    while (i < n) {
        int k = utf8_seq(p + i, (int64_t)(n - i));
        if (k < 0) { ok = false; break; }
        int l;
        int32_t c = utf8_decode(p + i, &l);
        if (c >= 512 || g_cp2byte[c] < 0) { ok = false; break; }
        o[j++] = (uint8_t)g_cp2byte[c];
        i += (size_t)k;
    }
    if (!ok) { memcpy(o, s, n); j = (int32_t)n; }
    *nout = j;
    return o;
}

/* Bytes a SentencePiece-style token decodes to: its text with each "▁" replaced by a space. */
static uint8_t *spm_bytes(const char *s, int32_t *nout) {
    size_t n = strlen(s);
    uint8_t *o = malloc(n + 1);
    if (!o) return NULL;
    int32_t j = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && !memcmp(s + i, SPM_SPACE, 3)) { o[j++] = ' '; i += 3; }
        else o[j++] = (uint8_t)s[i++];
    }
    *nout = j;
    return o;
}

/* ------------------------------------------------------------------ hash maps */
static mmc_status strmap_init(tok_strmap *m, size_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 16) cap <<= 1;
    m->hash = calloc(cap, sizeof *m->hash);
    m->id = malloc(cap * sizeof *m->id);
    m->mask = cap - 1;
    m->count = 0;
    if (!m->hash || !m->id) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    return MMC_OK;
}
static void strmap_free(tok_strmap *m) { free(m->hash); free(m->id); }
/* keys are compared through the tokenizer's arrays: by_str ? id_str : id_bytes */
static int32_t strmap_get(const mmc_tokenizer *t, const tok_strmap *m, bool by_str, const void *k,
                          size_t n) {
    uint64_t h = hash_bytes(k, n);
    for (uint32_t i = (uint32_t)h & m->mask;; i = (i + 1) & m->mask) {
        if (!m->hash[i]) return -1;
        if (m->hash[i] != h) continue;
        int32_t id = m->id[i];
        if (by_str) {
            if (strlen(t->id_str[id]) == n && memcmp(t->id_str[id], k, n) == 0) return id;
        } else if ((size_t)t->id_nbytes[id] == n && memcmp(t->id_bytes[id], k, n) == 0) return id;
    }
}
static void strmap_insert(tok_strmap *m, uint64_t h, int32_t id) {
    uint32_t i = (uint32_t)h & m->mask;
    while (m->hash[i]) i = (i + 1) & m->mask;
    m->hash[i] = h;
    m->id[i] = id;
    m->count++;
}
static mmc_status strmap_put(const mmc_tokenizer *t, tok_strmap *m, bool by_str, const void *k, size_t n,
                             int32_t id) {
    if (strmap_get(t, m, by_str, k, n) >= 0) return MMC_OK; /* keep the first */
    if (2 * ((size_t)m->count + 1) > (size_t)m->mask + 1) { /* rehash from the stored hashes */
        tok_strmap g = {0};
        if (m->mask >= 0x7fffffffu || strmap_init(&g, (size_t)m->mask + 1)) {
            strmap_free(&g);
            return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
        }
        for (uint32_t i = 0; i <= m->mask; i++) if (m->hash[i]) strmap_insert(&g, m->hash[i], m->id[i]);
        strmap_free(m);
        *m = g;
    }
    strmap_insert(m, hash_bytes(k, n), id);
    return MMC_OK;
}
static inline bool merge_get(const mmc_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = (uint32_t)hash_u64(key) & t->mmask;; i = (i + 1) & t->mmask) {
        if (t->mrank[i] < 0) return false;
        if (t->mkey[i] == key) { *rank = t->mrank[i]; *id = t->mid[i]; return true; }
    }
}

/* ------------------------------------------------------------------ scratch */
typedef struct { int32_t rank, pos, left, right; } tok_merge;
typedef struct { uint64_t h; uint32_t koff, ioff; uint16_t klen, nid; } tok_centry;

struct tok_scratch {
    tok_scratch *next;
    pcre2_match_data *md[TOK_MAX_SPLITS];
    pcre2_match_context *mctx;
    pcre2_jit_stack *js;
    int32_t *sid, *sprev, *snext, *sstart, *slen;
    int64_t cap_sym;
    tok_merge *heap;
    int64_t cap_heap;
    char *nbuf;
    int64_t *nmap_s, *nmap_e, ncap, ms_cap, me_cap;   /* normalized text, and each byte's input span */
    tok_centry *cache;
    uint32_t cmask, ccount;
    char *ckeys;
    uint32_t ckeys_len, ckeys_cap;
    int32_t *cids; /* pairs (id, byte length) */
    uint32_t cids_len, cids_cap;
};
#define CACHE_BITS 15
#define CACHE_MAX_WORD 128

static void scratch_free(tok_scratch *s) {
    if (!s) return;
    for (int i = 0; i < TOK_MAX_SPLITS; i++) if (s->md[i]) pcre2_match_data_free(s->md[i]);
    if (s->mctx) pcre2_match_context_free(s->mctx);
    if (s->js) pcre2_jit_stack_free(s->js);
    free(s->sid); free(s->sprev); free(s->snext); free(s->sstart); free(s->slen);
    free(s->heap); free(s->nbuf); free(s->nmap_s); free(s->nmap_e);
    free(s->cache); free(s->ckeys); free(s->cids);
    free(s);
}
static tok_scratch *scratch_get(const mmc_tokenizer *ct) {
    mmc_tokenizer *t = (mmc_tokenizer *)ct; /* the pool is the only mutable part */
    pthread_mutex_lock(&t->mu);
    tok_scratch *s = t->pool;
    if (s) t->pool = s->next;
    pthread_mutex_unlock(&t->mu);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    for (int i = 0; i < t->n_splits; i++) {
        s->md[i] = pcre2_match_data_create_from_pattern(t->re[i], NULL);
        if (!s->md[i]) goto fail;
    }
    s->mctx = pcre2_match_context_create(NULL);
    s->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!s->mctx || !s->js) goto fail;
    pcre2_jit_stack_assign(s->mctx, NULL, s->js);
    s->cmask = (1u << CACHE_BITS) - 1;
    s->cache = calloc((size_t)s->cmask + 1, sizeof *s->cache);
    s->ckeys_cap = 1u << 20;
    s->cids_cap = 1u << 19;
    s->ckeys = malloc(s->ckeys_cap);
    s->cids = malloc(s->cids_cap * sizeof *s->cids);
    if (!s->cache || !s->ckeys || !s->cids) goto fail;
    return s;
fail:
    scratch_free(s);
    return NULL;
}
static void scratch_put(const mmc_tokenizer *ct, tok_scratch *s) {
    mmc_tokenizer *t = (mmc_tokenizer *)ct;
    pthread_mutex_lock(&t->mu);
    s->next = t->pool;
    t->pool = s;
    pthread_mutex_unlock(&t->mu);
}
static bool grow(void **p, int64_t *cap, int64_t need, size_t elt) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elt);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ------------------------------------------------------------------ output */
typedef struct {
    int32_t *ids;
    int64_t *offs; /* pairs, or NULL when not wanted */
    int64_t n, cap;
    bool want_offs;
    bool oom;
} tok_out;
static inline void out_push(tok_out *o, int32_t id, int64_t s, int64_t e) {
    if (o->n == o->cap) {
        int64_t c = o->cap ? o->cap * 2 : 256;
        int32_t *ni = realloc(o->ids, (size_t)c * sizeof *ni);
        if (!ni) { o->oom = true; return; }
        o->ids = ni;
        if (o->want_offs) {
            int64_t *no = realloc(o->offs, (size_t)c * 2 * sizeof *no);
            if (!no) { o->oom = true; return; }
            o->offs = no;
        }
        o->cap = c;
    }
    o->ids[o->n] = id;
    if (o->want_offs) { o->offs[2 * o->n] = s; o->offs[2 * o->n + 1] = e; }
    o->n++;
}

/* ------------------------------------------------------------------ BPE */
static inline bool merge_less(const tok_merge *a, const tok_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}
static void heap_push(tok_merge *h, int64_t *n, tok_merge m) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}
static tok_merge heap_pop(tok_merge *h, int64_t *n) {
    tok_merge top = h[0], last = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        const tok_merge *best = &last;
        if (l < *n && merge_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && merge_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* BPE over the bytes w[0, n); appends ids with offsets base + [start, end). */
static bool bpe_word(const mmc_tokenizer *t, tok_scratch *sc, const uint8_t *w, int64_t n,
                     int64_t base, tok_out *o) {
    if (t->ignore_merges) {
        int32_t id = strmap_get(t, &t->vocab_bytes, t->spm, w, (size_t)n);
        if (id >= 0) { out_push(o, id, base, base + n); return true; }
    }
    uint64_t h = 0;
    uint32_t slot = 0;
    bool cacheable = n <= CACHE_MAX_WORD;
    if (cacheable) {
        h = hash_bytes(w, (size_t)n);
        for (slot = (uint32_t)h & sc->cmask;; slot = (slot + 1) & sc->cmask) {
            tok_centry *e = &sc->cache[slot];
            if (!e->h) break;
            if (e->h == h && e->klen == n && memcmp(sc->ckeys + e->koff, w, (size_t)n) == 0) {
                int64_t off = base;
                for (int k = 0; k < e->nid; k++) {
                    int32_t len = sc->cids[e->ioff + 2 * k + 1];
                    out_push(o, sc->cids[e->ioff + 2 * k], off, off + len);
                    off += len;
                }
                return true;
            }
        }
    }
    if (!grow((void **)&sc->sid, &sc->cap_sym, n, sizeof(int32_t))) return false;
    int32_t *tmp;
#define GROWTO(p) do { tmp = realloc(p, (size_t)sc->cap_sym * sizeof(int32_t)); if (!tmp) return false; p = tmp; } while (0)
    GROWTO(sc->sprev); GROWTO(sc->snext); GROWTO(sc->sstart); GROWTO(sc->slen);
#undef GROWTO
    if (!grow((void **)&sc->heap, &sc->cap_heap, n + 1, sizeof(tok_merge))) return false;
    int32_t *sid = sc->sid, *prev = sc->sprev, *next = sc->snext, *len = sc->slen;
    int64_t ns = 0;
#define PUSH_SYM(ID, AT, LEN) do { sid[ns] = (ID); sc->sstart[ns] = (int32_t)(AT); len[ns] = (LEN); ns++; } while (0)
    if (t->spm) { /* one symbol per character; bytes or unk for characters the vocab lacks */
        bool unk_last = false;
        for (int64_t i = 0; i < n;) {
            int l = utf8_seq(w + i, n - i);
            if (l <= 0) l = 1;
            int32_t id = strmap_get(t, &t->vocab_bytes, true, w + i, (size_t)l);
            bool fb = id < 0 && t->byte_fallback;
            for (int k = 0; fb && k < l; k++) fb = t->fallback_id[w[i + k]] >= 0;
            if (id >= 0) { PUSH_SYM(id, i, l); unk_last = false; }
            else if (fb) { for (int k = 0; k < l; k++) PUSH_SYM(t->fallback_id[w[i + k]], i + k, 1); unk_last = false; }
            else if (t->unk_id >= 0) {
                if (unk_last && t->fuse_unk) len[ns - 1] += l;
                else { PUSH_SYM(t->unk_id, i, l); unk_last = true; }
            } /* no unk token: HF drops the character */
            i += l;
        }
    } else
        for (int64_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[w[i]];
            if (id < 0) {
                if (t->unk_id < 0) continue; /* HF: a char missing from the vocab is dropped */
                id = t->unk_id;
            }
            PUSH_SYM(id, i, 1);
        }
#undef PUSH_SYM
    for (int64_t i = 0; i < ns; i++) { prev[i] = (int32_t)i - 1; next[i] = i + 1 < ns ? (int32_t)i + 1 : -1; }
    int64_t nh = 0;
    tok_merge *heap = sc->heap;
    for (int64_t i = 0; i + 1 < ns; i++) {
        int32_t r, m;
        if (merge_get(t, sid[i], sid[i + 1], &r, &m))
            heap_push(heap, &nh, (tok_merge){r, (int32_t)i, sid[i], sid[i + 1]});
    }
    while (nh > 0) {
        tok_merge m = heap_pop(heap, &nh);
        int32_t p = m.pos;
        if (len[p] == 0 || sid[p] != m.left) continue;
        int32_t q = next[p];
        if (q < 0 || sid[q] != m.right) continue;
        int32_t r = 0, nid = -1;
        merge_get(t, m.left, m.right, &r, &nid);
        sid[p] = nid;
        len[p] += len[q];
        len[q] = 0;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0 && merge_get(t, sid[prev[p]], sid[p], &r, &nid))
            heap_push(heap, &nh, (tok_merge){r, prev[p], sid[prev[p]], sid[p]});
        if (next[p] >= 0 && merge_get(t, sid[p], sid[next[p]], &r, &nid))
            heap_push(heap, &nh, (tok_merge){r, p, sid[p], sid[next[p]]});
    }
    int64_t first_out = o->n;
    int nid_out = 0;
    for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = next[i]) {
        out_push(o, sid[i], base + sc->sstart[i], base + sc->sstart[i] + len[i]);
        nid_out++;
    }
    if (o->oom) return false;
    if (cacheable && nid_out < 65535) {
        if (sc->ccount * 2 > sc->cmask || sc->ckeys_len + n > sc->ckeys_cap ||
            sc->cids_len + 2u * nid_out > sc->cids_cap) {
            memset(sc->cache, 0, ((size_t)sc->cmask + 1) * sizeof *sc->cache);
            sc->ccount = sc->ckeys_len = sc->cids_len = 0;
            for (slot = (uint32_t)h & sc->cmask; sc->cache[slot].h; slot = (slot + 1) & sc->cmask) {}
        }
        if (sc->cids_len + 2u * nid_out <= sc->cids_cap) {
            tok_centry *e = &sc->cache[slot];
            e->h = h;
            e->koff = sc->ckeys_len;
            e->klen = (uint16_t)n;
            e->ioff = sc->cids_len;
            e->nid = (uint16_t)nid_out;
            memcpy(sc->ckeys + sc->ckeys_len, w, (size_t)n);
            sc->ckeys_len += (uint32_t)n;
            for (int k = 0; k < nid_out; k++) {
                sc->cids[sc->cids_len++] = o->ids[first_out + k];
                sc->cids[sc->cids_len++] = o->want_offs ? (int32_t)(o->offs[2 * (first_out + k) + 1] -
                                                                    o->offs[2 * (first_out + k)])
                                                        : 0;
            }
            if (!o->want_offs) { /* recompute lengths from the symbol list */
                int k = 0;
                for (int32_t i = ns > 0 ? 0 : -1; i >= 0; i = next[i], k++)
                    sc->cids[e->ioff + 2 * k + 1] = len[i];
            }
            sc->ccount++;
        }
    }
    return true;
}

/* ------------------------------------------------------------------ pre-tokenization */
/* Split s[0, n) with regex `level` (Isolated: matches and the gaps between them are pieces),
 * recursing into the next level; BPE at the last. off = offset of s in the segment. */
static mmc_status split_level(const mmc_tokenizer *t, tok_scratch *sc, int level, const char *s,
                              int64_t n, int64_t off, tok_out *o) {
    if (n <= 0) return MMC_OK;
    if (level == t->n_splits) {
        int64_t start = 0;
        /* Metaspace split (MergedWithNext): a piece starts at each "▁". Without it, a piece may still
         * start at each run of "▁" when no merge can join a character to a following "▁"
         * (spm_word_split, checked at load): the same tokens, and the word cache applies. */
        if (t->spm && (t->spm_split || t->spm_word_split))
            for (int64_t p = 1; p + 3 <= n; p++)
                if (!memcmp(s + p, SPM_SPACE, 3) && (t->spm_split || p < 3 || memcmp(s + p - 3, SPM_SPACE, 3))) {
                    if (!bpe_word(t, sc, (const uint8_t *)s + start, p - start, off + start, o))
                        return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
                    start = p;
                    p += 2;
                }
        if (!bpe_word(t, sc, (const uint8_t *)s + start, n - start, off + start, o))
            return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
        return MMC_OK;
    }
    pcre2_match_data *md = sc->md[level];
    const pcre2_code *re = t->re[level];
    PCRE2_SIZE p = 0, gap = 0;
    mmc_status st;
    while (p < (PCRE2_SIZE)n) {
        int rc = t->re_jit[level]
                     ? pcre2_jit_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)n, p, 0, md, sc->mctx)
                     : pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)n, p, PCRE2_NO_UTF_CHECK, md, sc->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)n, p, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                             sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mmc_error(MMC_ERR_INVALID, "tokenizer: regex match failed at byte %lld: %s",
                             (long long)(off + (int64_t)p), (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: not a piece; step one character */
            int l = 1;
            if (ms < (PCRE2_SIZE)n) utf8_decode((const uint8_t *)s + ms, &l);
            p = ms + (PCRE2_SIZE)l;
            continue;
        }
        if (ms > gap && (st = split_level(t, sc, level + 1, s + gap, (int64_t)(ms - gap), off + (int64_t)gap, o))) return st;
        if ((st = split_level(t, sc, level + 1, s + ms, (int64_t)(me - ms), off + (int64_t)ms, o))) return st;
        p = gap = me;
    }
    if ((PCRE2_SIZE)n > gap) return split_level(t, sc, level + 1, s + gap, n - (int64_t)gap, off + (int64_t)gap, o);
    return MMC_OK;
}

/* ------------------------------------------------------------------ added tokens */
/* Next added-token match in s[from, n) for set k (0: non-normalized, 1: normalized).
 * Returns the token index or -1; [*ms, *me) is the matched span after lstrip/rstrip. */
static int find_added(const mmc_tokenizer *t, int k, const char *s, int64_t n, int64_t from,
                      int64_t floor, int64_t *ms, int64_t *me) {
    const uint8_t *u = (const uint8_t *)s;
    for (int64_t p = from; p < n; p++) {
        const int *cand = t->first_idx[k][u[p]];
        if (!cand) continue;
        for (; *cand >= 0; cand++) {
            const tok_added *a = &t->added[*cand];
            if (a->len > n - p || memcmp(s + p, a->match, (size_t)a->len) != 0) continue;
            int64_t s0 = p, e0 = p + a->len;
            if (a->single_word) {
                bool ok = true;
                if (s0 > 0) {
                    int64_t q = s0 - 1;
                    while (q > 0 && (u[q] & 0xC0) == 0x80) q--;
                    int l;
                    if (cp_is_word(utf8_decode(u + q, &l))) ok = false;
                }
                if (e0 < n) {
                    int l;
                    if (cp_is_word(utf8_decode(u + e0, &l))) ok = false;
                }
                if (!ok) continue;
            }
            if (a->lstrip) {
                while (s0 > floor) {
                    int64_t q = s0 - 1;
                    while (q > floor && (u[q] & 0xC0) == 0x80) q--;
                    int l;
                    if (!cp_is_whitespace(utf8_decode(u + q, &l))) break;
                    s0 = q;
                }
            }
            if (a->rstrip) {
                while (e0 < n) {
                    int l;
                    if (!cp_is_whitespace(utf8_decode(u + e0, &l))) break;
                    e0 += l;
                }
            }
            *ms = s0;
            *me = e0;
            return *cand;
        }
    }
    return -1;
}

/* Pre-tokenize + BPE one normalized piece, splitting off normalized added tokens first. */
static mmc_status process_normalized(const mmc_tokenizer *t, tok_scratch *sc, const char *s,
                                     int64_t n, tok_out *o) {
    if (!t->has_norm_added) return split_level(t, sc, 0, s, n, 0, o);
    int64_t pos = 0, ms, me;
    int a;
    mmc_status st;
    while (pos < n && (a = find_added(t, 1, s, n, pos, pos, &ms, &me)) >= 0) {
        if ((st = split_level(t, sc, 0, s + pos, ms - pos, pos, o))) return st;
        out_push(o, t->added[a].id, ms, me);
        pos = me;
    }
    return split_level(t, sc, 0, s + pos, n - pos, pos, o);
}

/* SentencePiece-style segment: spaces become "▁", a "▁" is prepended (the Hub's legacy
 * Prepend normalizer: every section; Metaspace: "always", or "first" for the section at the
 * start of the input, and only when it does not already start with one), then BPE over the
 * characters. Offsets map back to the input: a "▁" to its space, the prepended one to the
 * first character. */
static mmc_status process_segment_spm(const mmc_tokenizer *t, tok_scratch *sc, const char *seg, int64_t n,
                                      int64_t base, tok_out *o) {
    if (n <= 0) return MMC_OK;
    const int64_t need = 3 * n + 3;
    const bool om = o->want_offs;   /* the byte -> input span maps only when offsets are asked for */
    if (!grow((void **)&sc->nbuf, &sc->ncap, need, 1) ||
        (om && (!grow((void **)&sc->nmap_s, &sc->ms_cap, need, sizeof(int64_t)) ||
                !grow((void **)&sc->nmap_e, &sc->me_cap, need, sizeof(int64_t)))))
        return mmc_error(MMC_ERR_OOM, "tokenizer: OOM");
    const uint8_t *u = (const uint8_t *)seg;
    int first_len = utf8_seq(u, n);
    if (first_len <= 0) first_len = 1;
    bool replace = t->spm_norm_replace || t->spm_meta;
    bool starts_space = (replace && seg[0] == ' ') || (n >= 3 && !memcmp(seg, SPM_SPACE, 3));
    bool prepend = t->spm_norm_prepend ||
                   (t->spm_meta && !starts_space && (t->spm_prepend == 1 || (t->spm_prepend == 2 && base == 0)));
    int64_t j = 0;
#define PUT(byte, s0, e0) do { sc->nbuf[j] = (byte); if (om) sc->nmap_s[j] = (s0), sc->nmap_e[j] = (e0); j++; } while (0)
    if (prepend)
        for (int k = 0; k < 3; k++) PUT(SPM_SPACE[k], base, base + first_len);
    for (int64_t i = 0; i < n;) {
        int l = utf8_seq(u + i, n - i);
        if (l <= 0) l = 1;
        if (replace && seg[i] == ' ') for (int k = 0; k < 3; k++) PUT(SPM_SPACE[k], base + i, base + i + 1);
        else for (int k = 0; k < l; k++) PUT(seg[i + k], base + i, base + i + l);
        i += l;
    }
#undef PUT
    int64_t first = o->n;
    mmc_status st = process_normalized(t, sc, sc->nbuf, j, o);
    if (!st && om)
        for (int64_t k = first; k < o->n; k++) {
            int64_t s0 = o->offs[2 * k], e0 = o->offs[2 * k + 1];
            o->offs[2 * k] = s0 < j ? sc->nmap_s[s0] : base + n;
            o->offs[2 * k + 1] = e0 > 0 ? sc->nmap_e[e0 - 1] : base;
        }
    return st;
}

static void spmodel_push(void *ctx, int32_t id, int64_t start, int64_t end) { out_push(ctx, id, start, end); }

/* Normalize (NFC) + encode seg[0, n), which starts at byte `base` of the input. */
static mmc_status process_segment(const mmc_tokenizer *t, tok_scratch *sc, const char *seg, int64_t n,
                                  int64_t base, tok_out *o) {
    if (n <= 0) return MMC_OK;
    if (t->spmodel) return tok_spm_encode(t->spmodel, seg, n, base, spmodel_push, o);
    if (t->spm) return process_segment_spm(t, sc, seg, n, base, o);
    int64_t first = o->n;
    bool identity = true;
    const uint8_t *u = (const uint8_t *)seg;
    if (t->nfc) {
        int64_t i = 0;
        while (i < n) {
            if (u[i] < 0x80) { i++; continue; }
            int l;
            int32_t c = utf8_decode(u + i, &l);
            if (!nfc_safe(c)) { identity = false; break; }
            i += l;
        }
    }
    mmc_status st;
    if (identity) {
        st = process_normalized(t, sc, seg, n, o);
    } else {
        /* chunks = a code point followed by unsafe code points; NFC each changed chunk */
        if (!grow((void **)&sc->nbuf, &sc->ncap, 4 * n + 16, 1)) return mmc_error(MMC_ERR_OOM, "tokenizer: OOM");
        if (!grow((void **)&sc->nmap_s, &sc->ms_cap, 4 * n + 16, sizeof(int64_t)) ||
            !grow((void **)&sc->nmap_e, &sc->me_cap, 4 * n + 16, sizeof(int64_t)))
            return mmc_error(MMC_ERR_OOM, "tokenizer: OOM");
        int64_t i = 0, j = 0;
        while (i < n) {
            int l;
            utf8_decode(u + i, &l);
            int64_t e = i + l;
            bool simple = true;
            while (e < n) {
                int l2;
                int32_t c2 = utf8_decode(u + e, &l2);
                if (nfc_safe(c2)) break;
                simple = false;
                e += l2;
            }
            if (simple) {
                int l1;
                int32_t c1 = utf8_decode(u + i, &l1);
                simple = nfc_safe(c1);
            }
            if (simple) {
                for (int64_t k = i; k < e; k++) { sc->nbuf[j] = seg[k]; sc->nmap_s[j] = base + i; sc->nmap_e[j] = base + e; j++; }
            } else {
                uint8_t *out = NULL;
                utf8proc_ssize_t m = utf8proc_map(u + i, e - i, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                if (m < 0) return mmc_error(MMC_ERR_INVALID, "tokenizer: NFC failed: %s", utf8proc_errmsg(m));
                if (j + m > sc->ncap) { free(out); return mmc_error(MMC_ERR_INVALID, "tokenizer: NFC expansion too large"); }
                for (utf8proc_ssize_t k = 0; k < m; k++) { sc->nbuf[j] = (char)out[k]; sc->nmap_s[j] = base + i; sc->nmap_e[j] = base + e; j++; }
                free(out);
            }
            i = e;
        }
        /* single safe code points map exactly: refine their spans */
        st = process_normalized(t, sc, sc->nbuf, j, o);
        if (!st && o->want_offs) {
            for (int64_t k = first; k < o->n; k++) {
                int64_t s0 = o->offs[2 * k], e0 = o->offs[2 * k + 1];
                o->offs[2 * k] = s0 < j ? sc->nmap_s[s0] : base + n;
                o->offs[2 * k + 1] = e0 > 0 ? sc->nmap_e[e0 - 1] : base;
            }
        }
        return st;
    }
    if (!st && o->want_offs)
        for (int64_t k = first; k < o->n; k++) { o->offs[2 * k] += base; o->offs[2 * k + 1] += base; }
    return st;
}

static mmc_status encode_impl(const mmc_tokenizer *t, const char *text, int64_t len, bool add_special,
                              int32_t **ids, int64_t **offsets, int64_t *n) {
    if (!t || !ids || !n || (!text && len != 0)) return mmc_error(MMC_ERR_INVALID, "mmc_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    if (offsets) *offsets = NULL;
    if (len < 0) len = (int64_t)strlen(text);
    if (add_special && t->pp_unsupported)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: post_processor '%s' is not supported (encode with add_special = false)",
                         t->path, t->pp_type);
    char *fixed = NULL;
    if (!utf8_valid((const uint8_t *)text, len)) {
        fixed = utf8_repair((const uint8_t *)text, len, &len);
        if (!fixed) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
        text = fixed;
    }
    tok_scratch *sc = scratch_get(t);
    if (!sc) { free(fixed); return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory (work area)"); }
    tok_out o = {0};
    o.want_offs = offsets != NULL;
    mmc_status st = MMC_OK;
    if (add_special) for (int i = 0; i < t->n_pp_pre; i++) out_push(&o, t->pp_pre[i], 0, 0);
    int64_t pos = 0, ms, me;
    int a;
    while (pos < len && t->n_added && (a = find_added(t, 0, text, len, pos, pos, &ms, &me)) >= 0) {
        if ((st = process_segment(t, sc, text + pos, ms - pos, pos, &o))) goto done;
        out_push(&o, t->added[a].id, ms, me);
        pos = me;
    }
    if ((st = process_segment(t, sc, text + pos, len - pos, pos, &o))) goto done;
    if (add_special) for (int i = 0; i < t->n_pp_post; i++) out_push(&o, t->pp_post[i], len, len);
    if (o.oom) st = mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
done:
    scratch_put(t, sc);
    free(fixed);
    if (st) { free(o.ids); free(o.offs); return st; }
    if (!o.ids) { o.ids = malloc(sizeof(int32_t)); if (o.want_offs) o.offs = malloc(2 * sizeof(int64_t)); }
    *ids = o.ids;
    if (offsets) *offsets = o.offs;
    *n = o.n;
    return MMC_OK;
}

mmc_status mmc_tokenizer_encode(const mmc_tokenizer *t, const char *text, int64_t len, bool add_special,
                                int32_t **ids, int64_t *n) {
    return encode_impl(t, text, len, add_special, ids, NULL, n);
}
mmc_status mmc_tokenizer_encode_offsets(const mmc_tokenizer *t, const char *text, int64_t len,
                                        bool add_special, int32_t **ids, int64_t **offsets, int64_t *n) {
    if (!offsets) return mmc_error(MMC_ERR_INVALID, "mmc_tokenizer_encode_offsets: offsets is NULL");
    return encode_impl(t, text, len, add_special, ids, offsets, n);
}

/* ------------------------------------------------------------------ decode */
/* The byte a ByteFallback decoder reads from a token "<0xXX>", or -1. */
static int fallback_byte(const char *tok) {
    if (!tok || strlen(tok) != 6 || memcmp(tok, "<0x", 3) != 0 || tok[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = tok[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = 16 * v + d;
    }
    return v;
}

/* Decoder Sequence[Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", k, 0)] (or Metaspace):
 * id_bytes already hold each token with "▁" replaced; a run of "<0xXX>" tokens becomes its bytes
 * when they are valid UTF-8, else one U+FFFD per token (as tokenizers' ByteFallback); then up
 * to k leading spaces of the whole text are stripped. */
static mmc_status decode_spm(const mmc_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special,
                             size_t total, char **out) {
    uint8_t *b = malloc(3 * total + 4 * (size_t)n + 1); /* U+FFFD (3 bytes) may stand for a 1-byte token */
    if (!b) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    size_t j = 0, run = 0, nrun = 0; /* pending fallback bytes start at b + run; nrun tokens */
    bool in_run = false;
    for (int64_t i = 0; i <= n; i++) {
        int v = -1;
        if (i < n) {
            if (skip_special && t->is_special[ids[i]]) continue;
            if (t->dec_byte_fallback) v = fallback_byte(t->id_str[ids[i]]);
        }
        if (v >= 0) {
            if (!in_run) { in_run = true; run = j; nrun = 0; }
            b[j++] = (uint8_t)v;
            nrun++;
            continue;
        }
        if (in_run) {
            if (!utf8_valid(b + run, (int64_t)(j - run))) {
                j = run;
                for (size_t k = 0; k < nrun; k++) { memcpy(b + j, "\xEF\xBF\xBD", 3); j += 3; }
            }
            in_run = false;
        }
        if (i == n) break;
        memcpy(b + j, t->id_bytes[ids[i]], (size_t)t->id_nbytes[ids[i]]);
        j += (size_t)t->id_nbytes[ids[i]];
    }
    size_t skip = 0;
    while ((int)skip < t->dec_strip_left && skip < j && b[skip] == ' ') skip++;
    if (skip) { memmove(b, b + skip, j - skip); j -= skip; }
    b[j] = 0;
    if (utf8_valid(b, (int64_t)j)) { *out = (char *)b; return MMC_OK; }
    int64_t m;
    *out = utf8_repair(b, (int64_t)j, &m);
    free(b);
    return *out ? MMC_OK : mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
}

mmc_status mmc_tokenizer_decode(const mmc_tokenizer *t, const int32_t *ids, int64_t n, bool skip_special,
                                char **out) {
    if (!t || !out || (!ids && n)) return mmc_error(MMC_ERR_INVALID, "mmc_tokenizer_decode: NULL argument");
    *out = NULL;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->id_str[ids[i]])
            return mmc_error(MMC_ERR_INVALID, "mmc_tokenizer_decode: id %d at position %lld is not in the vocabulary",
                             ids[i], (long long)i);
        total += (size_t)t->id_nbytes[ids[i]];
    }
    if (t->spm) return decode_spm(t, ids, n, skip_special, total, out);
    uint8_t *b = malloc(total + 1);
    if (!b) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    size_t j = 0;
    for (int64_t i = 0; i < n; i++) {
        if (skip_special && t->is_special[ids[i]]) continue;
        memcpy(b + j, t->id_bytes[ids[i]], (size_t)t->id_nbytes[ids[i]]);
        j += (size_t)t->id_nbytes[ids[i]];
    }
    b[j] = 0;
    if (utf8_valid(b, (int64_t)j)) { *out = (char *)b; return MMC_OK; }
    int64_t m;
    *out = utf8_repair(b, (int64_t)j, &m);
    free(b);
    return *out ? MMC_OK : mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
}

/* ------------------------------------------------------------------ lookups */
int32_t mmc_tokenizer_token_to_id(const mmc_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    return strmap_get(t, &t->vocab_str, true, token, strlen(token));
}
const char *mmc_tokenizer_id_to_token(const mmc_tokenizer *t, int32_t id) {
    return (t && id >= 0 && id < t->n_ids) ? t->id_str[id] : NULL;
}
int32_t mmc_tokenizer_vocab_size(const mmc_tokenizer *t) { return t ? t->n_ids : 0; }
bool mmc_tokenizer_is_special(const mmc_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_ids && t->is_special[id];
}
int64_t mmc_tokenizer_token_bytes(const mmc_tokenizer *t, int32_t id, uint8_t *buf, int64_t cap) {
    if (!t || id < 0 || id >= t->n_ids || !t->id_str[id]) return -1;
    int v = t->spm && t->dec_byte_fallback ? fallback_byte(t->id_str[id]) : -1;
    if (v >= 0) {
        if (cap >= 1) buf[0] = (uint8_t)v;
        return 1;
    }
    int64_t n = t->id_nbytes[id];
    if (n <= cap) memcpy(buf, t->id_bytes[id], (size_t)n);
    return n;
}
int32_t mmc_tokenizer_special_id(const mmc_tokenizer *t, mmc_tok_role r) {
    return (t && r >= 0 && r < MMC_TOK_ROLE_COUNT) ? t->role_id[r] : -1;
}
int mmc_tokenizer_eos_ids(const mmc_tokenizer *t, int32_t *ids, int cap) {
    int32_t c[3] = {t->role_id[MMC_TOK_EOS], mmc_tokenizer_token_to_id(t, "<|im_end|>"),
                    mmc_tokenizer_token_to_id(t, "<|endoftext|>")};
    int k = 0;
    for (int i = 0; i < 3; i++) {
        if (c[i] < 0) continue;
        bool dup = false;
        for (int j = 0; j < k; j++) dup |= ids[j] == c[i];
        if (!dup && k < cap) ids[k++] = c[i];
    }
    return k;
}
const char *mmc_tokenizer_chat_template(const mmc_tokenizer *t) { return t ? t->chat_template : NULL; }

mmc_status mmc_tokenizer_set_chat_template(mmc_tokenizer *t, const char *src, const char *name) {
    char *s = src ? strdup(src) : NULL, *n = name ? strdup(name) : NULL;
    if ((src && !s) || (name && !n)) { free(s); free(n); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    if (src) { free(t->chat_template); t->chat_template = s; t->chat_template_override = true; }
    if (name) { free(t->chat_template_name); t->chat_template_name = n; }
    return MMC_OK;
}

/* ------------------------------------------------------------------ loading */
void mmc_tokenizer_free(mmc_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_ids; i++) {
        if (t->id_str) free(t->id_str[i]);
        if (t->id_bytes) free(t->id_bytes[i]);
    }
    free(t->id_str); free(t->id_bytes); free(t->id_nbytes); free(t->is_special); free(t->is_added);
    strmap_free(&t->vocab_bytes);
    strmap_free(&t->vocab_str);
    free(t->mkey); free(t->mrank); free(t->mid);
    for (int i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].match); }
    free(t->added);
    for (int k = 0; k < 2; k++) for (int b = 0; b < 256; b++) free(t->first_idx[k][b]);
    for (int i = 0; i < t->n_splits; i++) pcre2_code_free(t->re[i]);
    free(t->chat_template);
    free(t->chat_template_name);
    tok_spm_free(t->spmodel);
    while (t->pool) { tok_scratch *s = t->pool; t->pool = s->next; scratch_free(s); }
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static bool jbool(const cJSON *o, const char *k, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static mmc_status add_regex(mmc_tokenizer *t, const char *pat, bool literal) {
    if (t->n_splits == TOK_MAX_SPLITS)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: more than %d Split pre-tokenizers", t->path, TOK_MAX_SPLITS);
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer regex does not compile at offset %zu: %s",
                         t->path, (size_t)eoff, (const char *)msg);
    }
    t->re_jit[t->n_splits] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    t->re[t->n_splits++] = re;
    return MMC_OK;
}

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static mmc_status parse_pretok(mmc_tokenizer *t, const cJSON *p, bool *saw_bytelevel) {
    if (!p || cJSON_IsNull(p)) return MMC_OK;
    const char *type = jstr(p, "type");
    if (!type) return mmc_error(MMC_ERR_FORMAT, "tokenizer %s: pre_tokenizer without \"type\"", t->path);
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *e;
        cJSON_ArrayForEach(e, a) {
            mmc_status st = parse_pretok(t, e, saw_bytelevel);
            if (st) return st;
        }
        return MMC_OK;
    }
    if (*saw_bytelevel)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer '%s' after ByteLevel is not supported", t->path, type);
    if (!strcmp(type, "Split")) {
        const char *beh = jstr(p, "behavior");
        if (!beh || strcmp(beh, "Isolated") || jbool(p, "invert", false))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: Split pre_tokenizer with behavior '%s'%s is not supported (only Isolated)",
                             t->path, beh ? beh : "?", jbool(p, "invert", false) ? " and invert" : "");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *rx = jstr(pat, "Regex"), *lit = jstr(pat, "String");
        if (!rx && !lit) return mmc_error(MMC_ERR_FORMAT, "tokenizer %s: Split pre_tokenizer without a pattern", t->path);
        return add_regex(t, rx ? rx : lit, !rx);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(p, "replacement"), *ps = jstr(p, "prepend_scheme");
        if (!r || strcmp(r, SPM_SPACE))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer Metaspace with replacement '%s' is not "
                             "supported (only \"\u2581\")", t->path, r ? r : "?");
        if (t->spm_meta || t->n_splits)
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer Metaspace combined with another "
                             "pre_tokenizer is not supported", t->path);
        if (ps) {
            if (!strcmp(ps, "always")) t->spm_prepend = 1;
            else if (!strcmp(ps, "first")) t->spm_prepend = 2;
            else if (!strcmp(ps, "never")) t->spm_prepend = 0;
            else return mmc_error(MMC_ERR_FORMAT, "tokenizer %s: pre_tokenizer Metaspace: prepend_scheme '%s' is not "
                                  "always / first / never", t->path, ps);
        } else t->spm_prepend = jbool(p, "add_prefix_space", true) ? 1 : 0; /* the older key */
        t->spm_split = jbool(p, "split", true);
        t->spm_meta = true;
        return MMC_OK;
    }
    if (t->spm_meta)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer '%s' after Metaspace is not supported", t->path, type);
    if (!strcmp(type, "ByteLevel")) {
        if (jbool(p, "add_prefix_space", false))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: ByteLevel add_prefix_space = true is not supported", t->path);
        *saw_bytelevel = true;
        if (jbool(p, "use_regex", true)) return add_regex(t, GPT2_PATTERN, false);
        return MMC_OK;
    }
    return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: pre_tokenizer '%s' is not supported", t->path, type);
}

static mmc_status parse_normalizer(mmc_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return MMC_OK;
    const char *type = jstr(p, "type");
    if (type && !strcmp(type, "NFC")) { t->nfc = true; return MMC_OK; }
    if (type && !strcmp(type, "Prepend")) { /* the Hub's Llama layout: Prepend("▁"), Replace(" ", "▁") */
        const char *c = jstr(p, "prepend");
        if (!c || strcmp(c, SPM_SPACE))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: normalizer Prepend('%s') is not supported (only \"\u2581\")",
                             t->path, c ? c : "?");
        t->spm_norm_prepend = true;
        return MMC_OK;
    }
    if (type && !strcmp(type, "Replace")) {
        const char *pat = jstr(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "String"), *c = jstr(p, "content");
        if (!pat || !c || strcmp(pat, " ") || strcmp(c, SPM_SPACE))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: normalizer Replace is supported only as Replace(\" \" -> "
                             "\"\u2581\") (SentencePiece's spaces)", t->path);
        t->spm_norm_replace = true;
        return MMC_OK;
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "normalizers")) {
            mmc_status st = parse_normalizer(t, e);
            if (st) return st;
        }
        return MMC_OK;
    }
    return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: normalizer '%s' is not supported (NFC, Prepend, Replace)", t->path,
                     type ? type : "?");
}

/* decoder of a SentencePiece-style tokenizer: Sequence[Replace("▁" -> " "), ByteFallback, Fuse,
 * Strip(" ", k, 0)] as transformers' LlamaConverter writes it, or Metaspace. */
static mmc_status parse_spm_decoder(mmc_tokenizer *t, const cJSON *d) {
    const char *type = jstr(d, "type");
    if (type && !strcmp(type, "Metaspace")) {
        const char *r = jstr(d, "replacement"), *ps = jstr(d, "prepend_scheme");
        if (!r || strcmp(r, SPM_SPACE))
            return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: decoder Metaspace with replacement '%s' is not supported",
                             t->path, r ? r : "?");
        t->dec_strip_left = (ps ? strcmp(ps, "never") != 0 : jbool(d, "add_prefix_space", true)) ? 1 : 0;
        return MMC_OK;
    }
    if (!type || strcmp(type, "Sequence"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: decoder '%s' is not supported for a SentencePiece-style "
                         "tokenizer (Metaspace, or Sequence[Replace, ByteFallback, Fuse, Strip])", t->path, type ? type : "null");
    bool replace = false, fused = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders")) {
        const char *ty = jstr(e, "type");
        if (ty && !strcmp(ty, "Replace")) {
            const char *pat = jstr(cJSON_GetObjectItemCaseSensitive(e, "pattern"), "String"), *c = jstr(e, "content");
            if (!pat || !c || strcmp(pat, SPM_SPACE) || strcmp(c, " ")) break;
            replace = true;
        } else if (ty && !strcmp(ty, "ByteFallback")) t->dec_byte_fallback = true;
        else if (ty && !strcmp(ty, "Fuse")) fused = true;
        else if (ty && !strcmp(ty, "Strip")) {
            const char *c = jstr(e, "content");
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "start"), *z = cJSON_GetObjectItemCaseSensitive(e, "stop");
            if (!fused || !c || strcmp(c, " ") || !cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 16 ||
                (cJSON_IsNumber(z) && z->valuedouble != 0)) break;
            t->dec_strip_left = (int)a->valuedouble;
        } else break;
        continue;
    }
    if (e || !replace)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: decoder Sequence is supported as [Replace(\"\u2581\" -> \" \"), "
                         "ByteFallback, Fuse, Strip(\" \", k, 0)] (Llama's)%s%s", t->path, e ? "; not its entry " : "",
                         e ? (jstr(e, "type") ? jstr(e, "type") : "?") : "");
    return MMC_OK;
}

/* tokenizer_config.json fields that choose transformers 5's own pipeline: LlamaTokenizer (and
 * its alias LlamaTokenizerFast) rebuilds BPE(byte_fallback, fuse_unk) + Metaspace from the vocab
 * and merges, whatever tokenizer.json's normalizer / pre_tokenizer / decoder say. */
typedef struct {
    bool llama, add_prefix_space, legacy, add_bos, add_eos;
    char bos[64], eos[64];
    /* WhisperTokenizer: its post-processor is rebuilt from the prefix tokens <|startoftranscript|>
     * [<|lang|>] [<|task|>] [<|notimestamps|>] ... <|endoftext|> (set_prefix_tokens) */
    bool whisper, predict_timestamps;
    char language[32], task[32];
} tok_cfg_peek;

/* Model types whose tokenizer transformers 5.23 loads as TokenizersBackend, i.e. tokenizer.json as
 * written, even when tokenizer_config.json names LlamaTokenizer (its TOKENIZER_MAPPING_NAMES and
 * MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS): LLaVA-1.5 / NeXT, Mistral, InternLM2, Phi-3 ... */
static const char *const TF5_FILE_AS_WRITTEN[] = {
    "EvollaModel", "arctic", "aria", "beam", "bigbird_pegasus", "camembertv2-base", "canary", "chatlm", "cohere_asr",
    "ernie4_5", "ernie4_5_moe", "flex_olmo", "fuyu", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm4v", "glm4v_moe",
    "glm_image", "glmasr", "got_ocr2", "gpt_bigcode", "gradium_phonon_tts", "granite", "granitemoe", "granitemoehybrid",
    "granitemoeshared", "h2ovl_chat", "hyperclovax", "hyperclovax_vlm", "internlm2", "internlm3", "iquestcoder", "jamba",
    "kimi_k25", "kimi_linear", "kosmos-2", "llava", "llava_next", "mimo_v2_flash", "minicpm3", "minicpm_ocr", "minicpmv",
    "minicpmv4_6", "minicpmv4_7", "minimax_m2", "ministral", "ministral3", "mistral", "mistral3", "mistral_large4",
    "mixtral", "modernbert", "modernbert-decoder", "molmo", "molmo2", "nemo_speechlm", "nemotron", "nvfp4",
    "nystromformer", "olmo2", "olmo3", "olmo_hybrid", "opencua", "openvla", "paddleocr_vl", "pegasus_x", "persimmon",
    "phi3", "phi3_v", "phimoe", "pix2struct", "pixtral", "pocket_tts", "smolvlm", "stablelm", "step3_vl", "umt5",
    "vipllava", "voxtral", "voxtral_realtime", "xlm-roberta-xl"};

static bool tf5_file_as_written(const char *model_type) {
    for (size_t i = 0; i < sizeof TF5_FILE_AS_WRITTEN / sizeof *TF5_FILE_AS_WRITTEN; i++)
        if (!strcmp(model_type, TF5_FILE_AS_WRITTEN[i])) return true;
    return false;
}

static void peek_config(const char *cbuf, size_t cn, tok_cfg_peek *pk) {
    memset(pk, 0, sizeof *pk);
    pk->add_prefix_space = true;
    pk->add_bos = true;
    snprintf(pk->bos, sizeof pk->bos, "<s>");
    snprintf(pk->eos, sizeof pk->eos, "</s>");
    if (!cbuf) return;
    cJSON *cfg = cJSON_ParseWithLength(cbuf, cn);
    if (!cJSON_IsObject(cfg)) { cJSON_Delete(cfg); return; }
    const char *cls = jstr(cfg, "tokenizer_class");
    pk->llama = cls && (!strcmp(cls, "LlamaTokenizer") || !strcmp(cls, "LlamaTokenizerFast"));
    pk->whisper = cls && (!strcmp(cls, "WhisperTokenizer") || !strcmp(cls, "WhisperTokenizerFast"));
    pk->predict_timestamps = jbool(cfg, "predict_timestamps", false);
    if (jstr(cfg, "language") && strlen(jstr(cfg, "language")) < 24) snprintf(pk->language, sizeof pk->language, "%s", jstr(cfg, "language"));
    if (jstr(cfg, "task") && strlen(jstr(cfg, "task")) < 24) snprintf(pk->task, sizeof pk->task, "%s", jstr(cfg, "task"));
    pk->add_prefix_space = jbool(cfg, "add_prefix_space", true);
    pk->legacy = jbool(cfg, "legacy", false);
    pk->add_bos = jbool(cfg, "add_bos_token", true);
    pk->add_eos = jbool(cfg, "add_eos_token", false);
    const char *keys[2] = {"bos_token", "eos_token"};
    char *dst[2] = {pk->bos, pk->eos};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[k]);
        const char *c = cJSON_IsString(v) ? v->valuestring : jstr(v, "content");
        if (c && strlen(c) < 64) snprintf(dst[k], 64, "%s", c);
    }
    cJSON_Delete(cfg);
}

static int32_t lookup_name(mmc_tokenizer *t, const char *s) {
    return s ? strmap_get(t, &t->vocab_str, true, s, strlen(s)) : -1;
}

static void parse_postproc(mmc_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return;
    const char *type = jstr(p, "type");
    if (!type) return;
    if (!strcmp(type, "ByteLevel")) return;
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors")) parse_postproc(t, e);
        return;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *e, *sp = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
        bool after = false;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "single")) {
            const cJSON *tokn = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            if (!tokn) { after = true; continue; }
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(sp, jstr(tokn, "id") ? jstr(tokn, "id") : "");
            const cJSON *idv, *ida = cJSON_GetObjectItemCaseSensitive(ent, "ids");
            cJSON_ArrayForEach(idv, ida) {
                if (after && t->n_pp_post < 8) t->pp_post[t->n_pp_post++] = idv->valueint;
                if (!after && t->n_pp_pre < 8) t->pp_pre[t->n_pp_pre++] = idv->valueint;
            }
        }
        return;
    }
    t->pp_unsupported = true;
    snprintf(t->pp_type, sizeof t->pp_type, "%s", type);
}

/* Entries are named in messages by their text, cut to this many bytes: a token may be long. */
#define NAME_MAX_SHOWN 80

static mmc_status set_token(mmc_tokenizer *t, int32_t id, const char *s) {
    if (id < 0 || id >= t->n_ids) return mmc_error(MMC_ERR_FORMAT, "tokenizer %s: token id %d out of range", t->path, id);
    if (t->id_str[id]) return MMC_OK;
    t->id_str[id] = strdup(s);
    t->id_bytes[id] = t->spm ? spm_bytes(s, &t->id_nbytes[id]) : bytelevel_bytes(s, &t->id_nbytes[id]);
    if (!t->id_str[id] || !t->id_bytes[id]) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    return MMC_OK;
}

/* `what` names the file and the entry in messages. id < n_ids (checked by the callers). */
static mmc_status add_added(mmc_tokenizer *t, const cJSON *a, int32_t id, const char *what) {
    const char *content = jstr(a, "content");
    if (!content || !*content)
        return mmc_error(MMC_ERR_FORMAT, "%s: added token %d has no \"content\" string", what, id);
    if (t->is_added[id]) return MMC_OK; /* the first entry for an id wins */
    if (t->n_added == t->cap_added) {
        int cap = t->cap_added ? 2 * t->cap_added : 16;
        tok_added *na = realloc(t->added, (size_t)cap * sizeof *na);
        if (!na) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
        t->added = na;
        t->cap_added = cap;
    }
    tok_added *x = &t->added[t->n_added++];
    memset(x, 0, sizeof *x);
    t->is_added[id] = 1;
    x->id = id;
    x->content = strdup(content);
    x->special = jbool(a, "special", false);
    x->lstrip = jbool(a, "lstrip", false);
    x->rstrip = jbool(a, "rstrip", false);
    x->single_word = jbool(a, "single_word", false);
    x->normalized = jbool(a, "normalized", !x->special);
    if (!x->content) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    if (x->normalized && t->nfc) {
        /* utf8proc refuses ill-formed UTF-8 (cJSON passes it through) */
        if (!utf8_valid((const uint8_t *)content, (int64_t)strlen(content)))
            return mmc_error(MMC_ERR_FORMAT, "%s: added token %d '%.*s' is not valid UTF-8", what, id,
                             NAME_MAX_SHOWN, content);
        x->match = (char *)utf8proc_NFC((const uint8_t *)content);
    } else x->match = strdup(content);
    if (!x->match) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    x->len = (int)strlen(x->match);
    if (!x->len) return mmc_error(MMC_ERR_FORMAT, "%s: added token %d has empty content", what, id);
    return MMC_OK;
}

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const tok_added *ad = ctx;
    return ad[*(const int *)b].len - ad[*(const int *)a].len;
}

static mmc_status build_added_index(mmc_tokenizer *t) {
    mmc_status st;
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        int32_t id = a->id;
        t->is_special[id] = a->special;
        if (!t->id_str[id] && (st = set_token(t, id, a->content))) return st;
        if ((st = strmap_put(t, &t->vocab_str, true, a->content, strlen(a->content), id))) return st;
    }
    for (int k = 0; k < 2; k++)
        for (int b = 0; b < 256; b++) {
            int cnt = 0;
            for (int i = 0; i < t->n_added; i++)
                if (t->added[i].normalized == (k == 1) && (uint8_t)t->added[i].match[0] == b) cnt++;
            if (!cnt) continue;
            int *l = malloc((size_t)(cnt + 1) * sizeof *l);
            if (!l) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
            cnt = 0;
            for (int i = 0; i < t->n_added; i++)
                if (t->added[i].normalized == (k == 1) && (uint8_t)t->added[i].match[0] == b) l[cnt++] = i;
            qsort_r(l, (size_t)cnt, sizeof *l, cmp_added_len, t->added);
            l[cnt] = -1;
            t->first_idx[k][b] = l;
            if (k == 1) t->has_norm_added = true;
        }
    return MMC_OK;
}

static int32_t config_token(mmc_tokenizer *t, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return lookup_name(t, v->valuestring);
    if (cJSON_IsObject(v)) return lookup_name(t, jstr(v, "content"));
    return -1;
}

static cJSON *parse_json(const char *buf, size_t n, const char *name, const char *what) {
    cJSON *j = cJSON_ParseWithLength(buf, n);
    if (!j) {
        const char *ep = cJSON_GetErrorPtr();
        long long off = (ep && ep >= buf && ep <= buf + n) ? (long long)(ep - buf) : -1;
        mmc_error(MMC_ERR_FORMAT, "%s %s: malformed JSON near byte %lld", what, name, off);
    }
    return j;
}

/* A slow tokenizer (transformers 4.x PreTrainedTokenizer, as InternLM2Tokenizer) also splits its
 * special tokens off the text when added_tokens_decoder does not list them: bos / eos / unk / pad
 * (a string or an AddedToken object; sentencepiece's names by default) and
 * additional_special_tokens, each where it names a piece. */
static mmc_status add_implicit_specials(mmc_tokenizer *t, const cJSON *cfg, const char *cname) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    static const char *const defs[] = {"<s>", "</s>", "<unk>", NULL};
    char what[1100];
    snprintf(what, sizeof what, "tokenizer config %s", cname);
    mmc_status st = MMC_OK;
    for (int k = 0; k < 5 && !st; k++) {
        const cJSON *v = k < 4 ? cJSON_GetObjectItemCaseSensitive(cfg, keys[k])
                               : cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens");
        const cJSON *e, *one[1] = {v};
        int cnt = k < 4 ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
        for (int i = 0; i < cnt && !st; i++) {
            e = k < 4 ? one[0] : cJSON_GetArrayItem(v, i);
            const char *c = cJSON_IsString(e) ? e->valuestring : cJSON_IsObject(e) ? jstr(e, "content")
                          : (k < 4 && !e) ? defs[k] : NULL;
            int32_t id = c && *c ? lookup_name(t, c) : -1;
            if (id < 0 || t->is_added[id]) continue;
            cJSON *a = cJSON_IsObject(e) ? cJSON_Duplicate(e, true) : cJSON_CreateObject();
            if (!a) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
            if (!cJSON_IsObject(e)) cJSON_AddStringToObject(a, "content", c);
            cJSON_DeleteItemFromObjectCaseSensitive(a, "special");
            cJSON_AddBoolToObject(a, "special", true);
            if (!cJSON_HasObjectItem(a, "normalized")) cJSON_AddBoolToObject(a, "normalized", false);
            st = add_added(t, a, id, what);
            cJSON_Delete(a);
        }
    }
    return st;
}

/* tokenizer_config.json (cbuf, may be NULL: the file is optional): added_tokens_decoder, the
 * special-token roles and the chat template. */
static mmc_status load_config(mmc_tokenizer *t, const char *cbuf, size_t cn, const char *cname) {
    cJSON *cfg = NULL;
    if (cbuf && !(cfg = parse_json(cbuf, cn, cname, "tokenizer config"))) return MMC_ERR_FORMAT;
    if (cfg && !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return mmc_error(MMC_ERR_FORMAT, "tokenizer config %s: not a JSON object", cname);
    }
    mmc_status st = MMC_OK;
    const cJSON *e, *atd = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
    if (atd && !cJSON_IsNull(atd) && !cJSON_IsObject(atd)) {
        st = mmc_error(MMC_ERR_FORMAT, "tokenizer config %s: \"added_tokens_decoder\" must be an object "
                       "{\"<id>\": {\"content\": ...}}, not %s", cname, cJSON_IsArray(atd) ? "an array" : "a scalar");
        goto done;
    }
    char what[1100];
    snprintf(what, sizeof what, "tokenizer config %s: added_tokens_decoder", cname);
    cJSON_ArrayForEach(e, atd) { /* an object or null here */
        const char *k = e->string;
        bool digits = k && *k && strlen(k) <= 10;
        for (const char *c = k; digits && *c; c++) digits = *c >= '0' && *c <= '9';
        if (!digits) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: key '%.*s' is not a token id", what, NAME_MAX_SHOWN, k ? k : "");
            goto done;
        }
        long long id = strtoll(k, NULL, 10);
        if (id >= t->n_ids) continue; /* beyond tokenizer.json: ignored */
        if ((st = add_added(t, e, (int32_t)id, what))) goto done;
    }
    if (t->spmodel && (st = add_implicit_specials(t, cfg, cname))) goto done;
    if ((st = build_added_index(t)) || !cfg) goto done;
    t->role_id[MMC_TOK_BOS] = config_token(t, cfg, "bos_token");
    t->role_id[MMC_TOK_EOS] = config_token(t, cfg, "eos_token");
    t->role_id[MMC_TOK_PAD] = config_token(t, cfg, "pad_token");
    if (config_token(t, cfg, "unk_token") >= 0) t->role_id[MMC_TOK_UNK] = config_token(t, cfg, "unk_token");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(ct)) t->chat_template = strdup(ct->valuestring);
    else if (cJSON_IsArray(ct)) {
        cJSON_ArrayForEach(e, ct) {
            const char *nm = jstr(e, "name"), *tp = jstr(e, "template");
            if (nm && tp && !strcmp(nm, "default") && !t->chat_template) t->chat_template = strdup(tp);
        }
    }
done:
    cJSON_Delete(cfg);
    return st;
}

/* A token id from the file: an integer below `bound`, the number of entries read (vocab +
 * added_tokens), so that every per-id table is bounded by what the file holds. */
static bool valid_id(const cJSON *v, int64_t bound) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (double)bound &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}
static const char *id_text(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsNumber(v)) snprintf(buf, cap, "%.17g", v->valuedouble);
    else snprintf(buf, cap, "%s", v ? "that is not a number" : "missing");
    return buf;
}

static mmc_status load_buffers(mmc_tokenizer *t, const char *buf, size_t n, const char *cbuf, size_t cn,
                               const char *cname) {
    const char *jpath = t->path;
    cJSON *root = parse_json(buf, n, jpath, "tokenizer");
    if (!root) return MMC_ERR_FORMAT;
    mmc_status st = MMC_OK;
    char *tmp = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) { st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: no \"model\" object", jpath); goto fail; }
    const char *mtype = jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (mtype ? strcmp(mtype, "BPE") != 0 : !merges) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: model type '%s' is not supported (only byte-level BPE)", jpath,
                       mtype ? mtype : "?");
        goto fail;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: BPE model needs a \"vocab\" object and a \"merges\" array", jpath);
        goto fail;
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0) { st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: BPE dropout is not supported", jpath); goto fail; }
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow)) { st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: BPE subword prefix/suffix is not supported", jpath); goto fail; }
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    tok_cfg_peek pk;
    peek_config(cbuf, cn, &pk);
    /* transformers 5 keeps the file's pipeline for these model types, and for a ByteLevel file */
    const char *ptype = jstr(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "type");
    if (pk.llama && (tf5_file_as_written(t->model_type) || (ptype && !strcmp(ptype, "ByteLevel")) ||
                     memmem(buf, n, "\"ByteLevel\"", 11))) pk.llama = false;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (pk.llama) { /* transformers 5's LlamaTokenizer.__init__, whatever the file's pipeline */
        t->tf5_llama = t->spm = t->spm_meta = true;
        t->spm_prepend = pk.add_prefix_space ? (pk.legacy ? 1 : 2) : 0;
        t->spm_split = false;
        t->byte_fallback = t->fuse_unk = t->dec_byte_fallback = true;
        t->ignore_merges = false;
        t->dec_strip_left = pk.add_prefix_space ? 1 : 0;
    } else {
        if ((st = parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer")))) goto fail;
        bool bl = false;
        if ((st = parse_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &bl))) goto fail;
        t->spm = t->spm_norm_prepend || t->spm_norm_replace || t->spm_meta;
        if (t->spm) {
            if (bl || t->nfc || t->n_splits) {
                st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: a SentencePiece-style pipeline (Metaspace / Prepend / "
                               "Replace) mixed with %s is not supported", jpath, bl ? "ByteLevel" : t->nfc ? "NFC" : "Split");
                goto fail;
            }
            if ((st = parse_spm_decoder(t, dec))) goto fail;
        } else {
            if (!bl) { st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: no ByteLevel pre_tokenizer (supported: byte-level BPE, "
                                      "and SentencePiece-style BPE with Metaspace or Prepend/Replace)", jpath); goto fail; }
            if (t->byte_fallback) { st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: BPE byte_fallback with a ByteLevel pre_tokenizer is not supported", jpath); goto fail; }
            if (!jstr(dec, "type") || strcmp(jstr(dec, "type"), "ByteLevel")) {
                st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: decoder '%s' is not supported for byte-level BPE (only ByteLevel)", jpath,
                               jstr(dec, "type") ? jstr(dec, "type") : "null");
                goto fail;
            }
        }
        parse_postproc(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    }

    /* ids: every id must lie below the number of entries read, so a file cannot make the
     * per-id tables (and the maps sized from them) larger than itself */
    const cJSON *e, *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) {
        st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: \"added_tokens\" must be an array", jpath);
        goto fail;
    }
    if (!cJSON_IsArray(added)) added = NULL;
    int64_t nv = cJSON_GetArraySize(vocab), na = cJSON_GetArraySize(added), bound = nv + na;
    if (bound > INT32_MAX / 2) { st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: too many entries (%lld)", jpath, (long long)bound); goto fail; }
    int32_t maxid = -1;
    char num[32];
    cJSON_ArrayForEach(e, vocab) {
        if (!valid_id(e, bound)) {
            st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: vocab entry '%.*s' has id %s; ids must be integers from 0 to "
                           "%lld (the number of vocab + added_tokens entries read, minus one)", jpath, NAME_MAX_SHOWN,
                           e->string, id_text(e, num, sizeof num), (long long)bound - 1);
            goto fail;
        }
        if (e->valueint > maxid) maxid = e->valueint;
    }
    int ai = 0;
    cJSON_ArrayForEach(e, added) {
        const cJSON *idv = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!valid_id(idv, bound)) {
            st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: added_tokens[%d] ('%.*s') has id %s; ids must be integers from "
                           "0 to %lld (the number of vocab + added_tokens entries read, minus one)", jpath, ai,
                           NAME_MAX_SHOWN, jstr(e, "content") ? jstr(e, "content") : "?",
                           id_text(idv, num, sizeof num), (long long)bound - 1);
            goto fail;
        }
        if (idv->valueint > maxid) maxid = idv->valueint;
        ai++;
    }
    t->n_ids = maxid + 1;
    t->id_str = calloc((size_t)t->n_ids + 1, sizeof *t->id_str);
    t->id_bytes = calloc((size_t)t->n_ids + 1, sizeof *t->id_bytes);
    t->id_nbytes = calloc((size_t)t->n_ids + 1, sizeof *t->id_nbytes);
    t->is_special = calloc((size_t)t->n_ids + 1, 1);
    t->is_added = calloc((size_t)t->n_ids + 1, 1);
    if (!t->id_str || !t->id_bytes || !t->id_nbytes || !t->is_special || !t->is_added) { st = mmc_error(MMC_ERR_OOM, "tokenizer: OOM"); goto fail; }
    if ((st = strmap_init(&t->vocab_bytes, (size_t)nv)) || (st = strmap_init(&t->vocab_str, (size_t)bound))) goto fail;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = e->valueint;
        if (t->id_str[id]) { /* two tokens, one id: lookups by id would lie */
            st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: vocab entries '%.*s' and '%.*s' both have id %d", jpath,
                           NAME_MAX_SHOWN, t->id_str[id], NAME_MAX_SHOWN, e->string, id);
            goto fail;
        }
        if ((st = set_token(t, id, e->string)) ||
            (st = strmap_put(t, &t->vocab_str, true, e->string, strlen(e->string), id)) ||
            (st = t->spm ? strmap_put(t, &t->vocab_bytes, true, e->string, strlen(e->string), id) /* by text */
                         : strmap_put(t, &t->vocab_bytes, false, t->id_bytes[id], (size_t)t->id_nbytes[id], id)))
            goto fail;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->byte_id[b] = t->spm ? -1 : strmap_get(t, &t->vocab_bytes, false, &c, 1);
        t->fallback_id[b] = t->spm && t->byte_fallback ? strmap_get(t, &t->vocab_bytes, true, fb, strlen(fb)) : -1;
    }
    if (jstr(model, "unk_token")) t->unk_id = t->role_id[MMC_TOK_UNK] = lookup_name(t, jstr(model, "unk_token"));
    if (t->tf5_llama) t->unk_id = -1; /* its BPE is built without an unk token: unknown characters are dropped */

    /* merges */
    t->spm_word_split = t->spm && !t->spm_split && !t->ignore_merges &&
                        strmap_get(t, &t->vocab_bytes, true, SPM_SPACE, 3) >= 0;
    int nm = cJSON_GetArraySize(merges);
    uint32_t cap = 16;
    while (cap < (uint32_t)nm * 2 + 16) cap <<= 1;
    t->mmask = cap - 1;
    t->mkey = malloc(cap * sizeof *t->mkey);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->mid = malloc(cap * sizeof *t->mid);
    if (!t->mkey || !t->mrank || !t->mid) { st = mmc_error(MMC_ERR_OOM, "tokenizer: OOM"); goto fail; }
    for (uint32_t i = 0; i < cap; i++) t->mrank[i] = -1;
    int rank = 0;
    size_t tmpcap = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: merge %d '%.*s' is not \"a b\"", jpath, rank,
                               NAME_MAX_SHOWN, e->valuestring);
                goto fail;
            }
            a = e->valuestring; la = (size_t)(sp - a);
            b = sp + 1; lb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring; la = strlen(a);
            b = cJSON_GetArrayItem(e, 1)->valuestring; lb = strlen(b);
        } else { st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: merge %d is neither \"a b\" nor [a, b]", jpath, rank); goto fail; }
        if (la + lb + 1 > tmpcap) {
            tmpcap = (la + lb + 1) * 2;
            char *nt = realloc(tmp, tmpcap);
            if (!nt) { st = mmc_error(MMC_ERR_OOM, "tokenizer: out of memory"); goto fail; }
            tmp = nt;
        }
        int32_t ia = strmap_get(t, &t->vocab_str, true, a, la), ib = strmap_get(t, &t->vocab_str, true, b, lb);
        memcpy(tmp, a, la); memcpy(tmp + la, b, lb); tmp[la + lb] = 0;
        int32_t im = strmap_get(t, &t->vocab_str, true, tmp, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            st = mmc_error(MMC_ERR_FORMAT, "tokenizer %s: merge %d ('%.*s' + '%.*s') uses a token missing from the vocab", jpath, rank,
                           (int)(la < NAME_MAX_SHOWN ? la : NAME_MAX_SHOWN), a, (int)(lb < NAME_MAX_SHOWN ? lb : NAME_MAX_SHOWN), b);
            goto fail;
        }
        if (t->spm_word_split) /* a merged token with a character then "▁" forbids splitting at "▁" runs */
            for (size_t q = 1; q + 3 <= la + lb; q++)
                if (!memcmp(tmp + q, SPM_SPACE, 3) && (q < 3 || memcmp(tmp + q - 3, SPM_SPACE, 3))) {
                    t->spm_word_split = false;
                    break;
                }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        uint32_t i = (uint32_t)hash_u64(key) & t->mmask;
        while (t->mrank[i] >= 0 && t->mkey[i] != key) i = (i + 1) & t->mmask;
        if (t->mrank[i] < 0) { t->mkey[i] = key; t->mrank[i] = rank; t->mid[i] = im; }
        rank++;
    }
    free(tmp);
    tmp = NULL;

    char what[1100];
    snprintf(what, sizeof what, "tokenizer %s: added_tokens", jpath);
    cJSON_ArrayForEach(e, added)
        if ((st = add_added(t, e, cJSON_GetObjectItemCaseSensitive(e, "id")->valueint, what))) goto fail;
    cJSON_Delete(root);
    root = NULL;
    if ((st = load_config(t, cbuf, cn, cname))) goto fail;
    if (t->tf5_llama) { /* update_post_processor: [bos] $A [eos] by add_bos_token / add_eos_token */
        t->n_pp_pre = t->n_pp_post = 0;
        t->pp_unsupported = false;
        int32_t b = lookup_name(t, pk.bos), e2 = lookup_name(t, pk.eos);
        if (pk.add_bos) { if (b < 0) t->pp_unsupported = true; else t->pp_pre[t->n_pp_pre++] = b; }
        if (pk.add_eos) { if (e2 < 0) t->pp_unsupported = true; else t->pp_post[t->n_pp_post++] = e2; }
        snprintf(t->pp_type, sizeof t->pp_type, "LlamaTokenizer bos/eos");
    }
    if (pk.whisper) { /* WhisperTokenizer.set_prefix_tokens: the post-processor transformers 5 installs */
        t->n_pp_pre = t->n_pp_post = 0;
        t->pp_unsupported = false;
        char name[48];
        int32_t sot = lookup_name(t, "<|startoftranscript|>"), eot = lookup_name(t, "<|endoftext|>");
        int32_t lang = -1, task = -1, nots = pk.predict_timestamps ? -2 : lookup_name(t, "<|notimestamps|>");
        if (pk.language[0]) {   /* a code ("en") or the token itself; a language name needs transformers' table */
            snprintf(name, sizeof name, pk.language[0] == '<' ? "%s" : "<|%s|>", pk.language);
            lang = lookup_name(t, name);
        }
        if (pk.task[0]) {
            snprintf(name, sizeof name, "<|%s|>", pk.task);
            task = lookup_name(t, name);
        }
        if (sot < 0 || eot < 0 || nots == -1 || (pk.language[0] && lang < 0) || (pk.task[0] && task < 0)) {
            t->pp_unsupported = true;
            snprintf(t->pp_type, sizeof t->pp_type, "WhisperTokenizer prefix (language '%.8s')", pk.language);
        } else {
            t->pp_pre[t->n_pp_pre++] = sot;
            if (lang >= 0) t->pp_pre[t->n_pp_pre++] = lang;
            if (task >= 0) t->pp_pre[t->n_pp_pre++] = task;
            if (nots >= 0) t->pp_pre[t->n_pp_pre++] = nots;
            t->pp_post[t->n_pp_post++] = eot;
        }
    }
    for (int i = 0; i < t->n_pp_pre; i++) if (t->pp_pre[i] < 0 || t->pp_pre[i] >= t->n_ids) t->pp_unsupported = true;
    for (int i = 0; i < t->n_pp_post; i++) if (t->pp_post[i] < 0 || t->pp_post[i] >= t->n_ids) t->pp_unsupported = true;
    return MMC_OK;
fail:
    free(tmp);
    cJSON_Delete(root);
    return st;
}

/* tokenizer.model (a SentencePiece model, spm_model.c) with tokenizer_config.json, as transformers
 * 4.x's slow tokenizers use it: InternLM2Tokenizer (InternLM2, InternVL2 / 2.5 with InternLM2; its
 * _tokenize is sp_model.encode(text)), and LlamaTokenizer in its legacy mode (the same). The added
 * tokens of added_tokens_decoder and the special tokens are split off first (leftmost longest, with
 * their lstrip / rstrip), each section between them is sentencepiece's; bos first when
 * add_bos_token (default true: sentencepiece's bos_id for InternLM2Tokenizer, bos_token for
 * LlamaTokenizer), eos last when add_eos_token. Decoding is sentencepiece's: "▁" a space, byte
 * pieces their bytes, the first space dropped when the model adds a dummy prefix. */
static mmc_status load_spm_model(mmc_tokenizer *t, const char *buf, size_t n, const char *cbuf, size_t cn,
                                 const char *cname) {
    mmc_status st = tok_spm_parse(buf, n, t->path, &t->spmodel);
    if (st) return st;
    const tok_spm *m = t->spmodel;
    int32_t np = tok_spm_size(m);
    cJSON *cfg = NULL;
    if (cbuf && !(cfg = parse_json(cbuf, cn, cname, "tokenizer config"))) return MMC_ERR_FORMAT;
    const char *cls = jstr(cfg, "tokenizer_class");
    bool llama = cls && (!strcmp(cls, "LlamaTokenizer") || !strcmp(cls, "LlamaTokenizerFast"));
    if (cls && !llama && strcmp(cls, "InternLM2Tokenizer") && strcmp(cls, "InternLM2TokenizerFast")) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: tokenizer_class '%.60s' with only a tokenizer.model is not "
                       "supported (InternLM2Tokenizer and LlamaTokenizer are; give a tokenizer.json)", cname, cls);
        goto done;
    }
    if (llama && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "legacy"))) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s: LlamaTokenizer with legacy false over a tokenizer.model is not "
                       "supported (give a tokenizer.json)", cname);
        goto done;
    }
    /* ids: the pieces, then added_tokens_decoder's (each below pieces + entries, so no table is
     * sized by a number in the file) */
    const cJSON *e, *atd = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
    int64_t bound = (int64_t)np + cJSON_GetArraySize(cJSON_IsObject(atd) ? atd : NULL), maxid = np - 1;
    if (cJSON_IsObject(atd))
        cJSON_ArrayForEach(e, atd) {
            long long id = e->string ? strtoll(e->string, NULL, 10) : -1;
            if (id >= bound) {
                st = mmc_error(MMC_ERR_FORMAT, "tokenizer config %s: added_tokens_decoder id %lld is beyond the %d pieces "
                               "of tokenizer.model plus its %lld entries", cname, id, np, (long long)(bound - np));
                goto done;
            }
            if (id > maxid) maxid = id;
        }
    t->n_ids = (int32_t)maxid + 1;
    t->id_str = calloc((size_t)t->n_ids + 1, sizeof *t->id_str);
    t->id_bytes = calloc((size_t)t->n_ids + 1, sizeof *t->id_bytes);
    t->id_nbytes = calloc((size_t)t->n_ids + 1, sizeof *t->id_nbytes);
    t->is_special = calloc((size_t)t->n_ids + 1, 1);
    t->is_added = calloc((size_t)t->n_ids + 1, 1);
    if (!t->id_str || !t->id_bytes || !t->id_nbytes || !t->is_special || !t->is_added) { st = mmc_error(MMC_ERR_OOM, "tokenizer: OOM"); goto done; }
    if ((st = strmap_init(&t->vocab_bytes, 1)) || (st = strmap_init(&t->vocab_str, (size_t)bound))) goto done;
    t->spm = true;
    t->byte_fallback = t->dec_byte_fallback = tok_spm_byte_fallback(m);
    t->dec_strip_left = tok_spm_dummy_prefix(m) ? 1 : 0;
    for (int32_t i = 0; i < np; i++) {
        int32_t pl;
        const char *p = tok_spm_piece(m, i, &pl);
        uint8_t *b = malloc((size_t)pl + 1);
        if (!(t->id_str[i] = strdup(p)) || !b) { free(b); st = mmc_error(MMC_ERR_OOM, "tokenizer: OOM"); goto done; }
        int32_t j = 0;
        for (int32_t k = 0; k < pl;) {
            if (k + 3 <= pl && !memcmp(p + k, SPM_SPACE, 3)) { b[j++] = ' '; k += 3; }
            else b[j++] = (uint8_t)p[k++];
        }
        t->id_bytes[i] = b;
        t->id_nbytes[i] = j;
        if ((st = strmap_put(t, &t->vocab_str, true, t->id_str[i], strlen(t->id_str[i]), i))) goto done;
    }
    for (int b = 0; b < 256; b++) {
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->byte_id[b] = -1;
        t->fallback_id[b] = t->byte_fallback ? tok_spm_id(m, fb) : -1;
    }
    t->unk_id = tok_spm_unk(m);
    cJSON_Delete(cfg);
    cfg = NULL;
    if ((st = load_config(t, cbuf, cn, cname))) return st;
    if (t->role_id[MMC_TOK_UNK] < 0) t->role_id[MMC_TOK_UNK] = t->unk_id;
    if (t->role_id[MMC_TOK_BOS] < 0 && !cbuf) t->role_id[MMC_TOK_BOS] = tok_spm_bos(m);
    if (t->role_id[MMC_TOK_EOS] < 0 && !cbuf) t->role_id[MMC_TOK_EOS] = tok_spm_eos(m);
    tok_cfg_peek pk;
    peek_config(cbuf, cn, &pk);
    int32_t bos = llama ? t->role_id[MMC_TOK_BOS] : tok_spm_bos(m), eos = llama ? t->role_id[MMC_TOK_EOS] : tok_spm_eos(m);
    if (pk.add_bos) { if (bos < 0) t->pp_unsupported = true; else t->pp_pre[t->n_pp_pre++] = bos; }
    if (pk.add_eos) { if (eos < 0) t->pp_unsupported = true; else t->pp_post[t->n_pp_post++] = eos; }
    snprintf(t->pp_type, sizeof t->pp_type, "%s bos/eos", llama ? "LlamaTokenizer" : "InternLM2Tokenizer");
    return MMC_OK;
done:
    cJSON_Delete(cfg);
    return st;
}

static mmc_status tokenizer_new(const char *name, mmc_tokenizer **out) {
    *out = NULL;
    pthread_once(&g_once, global_init);
    if (!g_nfc_safe) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    mmc_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "tokenizer: out of memory");
    pthread_mutex_init(&t->mu, NULL);
    snprintf(t->path, sizeof t->path, "%s", name);
    for (int r = 0; r < MMC_TOK_ROLE_COUNT; r++) t->role_id[r] = -1;
    t->unk_id = -1;
    *out = t;
    return MMC_OK;
}

/* A tokenizer from buffers in memory through one of the file loaders (tokenizer.json's or
 * tokenizer.model's), named `name` (or "memory") in its errors. */
typedef mmc_status (*buffers_loader)(mmc_tokenizer *, const char *, size_t, const char *, size_t, const char *);
static mmc_status load_memory_with(buffers_loader load, const char *fn, const char *buf, size_t n, const char *config,
                                   size_t config_n, const char *name, mmc_tokenizer **out) {
    if (!buf || !out) return mmc_error(MMC_ERR_INVALID, "%s: NULL argument", fn);
    char cname[1100];
    snprintf(cname, sizeof cname, "%s (tokenizer_config.json)", name ? name : "memory");
    mmc_tokenizer *t;
    mmc_status st = tokenizer_new(name ? name : "memory", &t);
    if (!st && (st = load(t, buf, n, config, config ? config_n : 0, cname))) { mmc_tokenizer_free(t); t = NULL; }
    *out = t;
    return st;
}

mmc_status mmc_tokenizer_load_memory(const char *json, size_t n, const char *config, size_t config_n,
                                     const char *name, mmc_tokenizer **out) {
    return load_memory_with(load_buffers, "mmc_tokenizer_load_memory", json, n, config, config_n, name, out);
}

mmc_status mmc_tokenizer_load_spm_memory(const char *model, size_t n, const char *config, size_t config_n,
                                         const char *name, mmc_tokenizer **out) {
    return load_memory_with(load_spm_model, "mmc_tokenizer_load_spm_memory", model, n, config, config_n, name, out);
}

mmc_status mmc_tokenizer_load(const char *path, mmc_tokenizer **out) {
    if (!path || !out) return mmc_error(MMC_ERR_INVALID, "mmc_tokenizer_load: NULL argument");
    *out = NULL;
    char jpath[1024], cpath[1024];
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mmc_error(MMC_ERR_NOT_FOUND, "tokenizer: %s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(jpath, sizeof jpath, "%s/tokenizer.json", path);
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", path);
    } else {
        snprintf(jpath, sizeof jpath, "%s", path);
        const char *sl = strrchr(path, '/');
        int dl = sl ? (int)(sl - path) : 0;
        snprintf(cpath, sizeof cpath, "%.*s%stokenizer_config.json", dl, path, sl ? "/" : "");
    }
    /* no tokenizer.json but a tokenizer.model (InternLM2's layout), or a .model file named */
    size_t pl = strlen(path);
    bool spmodel = !S_ISDIR(sb.st_mode) && pl >= 6 && !strcmp(path + pl - 6, ".model");
    if (S_ISDIR(sb.st_mode) && stat(jpath, &sb) != 0) {
        char mp[1024];
        if (snprintf(mp, sizeof mp, "%s/tokenizer.model", path) < (int)sizeof mp && stat(mp, &sb) == 0) {
            spmodel = true;
            memcpy(jpath, mp, sizeof jpath);
        }
    }
    char *buf = NULL, *cbuf = NULL;
    size_t n = 0, cn = 0;
    mmc_status st = mmc_read_file(jpath, &buf, &n);
    if (st) return mmc_error_prefix(st, "tokenizer");
    st = mmc_read_file(cpath, &cbuf, &cn);
    if (st == MMC_ERR_NOT_FOUND) st = MMC_OK; /* tokenizer_config.json is optional */
    else if (st) st = mmc_error_prefix(st, "tokenizer config");
    mmc_tokenizer *t = NULL;
    if (!st) st = tokenizer_new(jpath, &t);
    if (!st) { /* the model's config.json beside it: its model_type decides transformers 5's class */
        char mpath[1040], *mb = NULL;
        size_t mn = 0;
        const char *sl = strrchr(cpath, '/');
        snprintf(mpath, sizeof mpath, "%.*s%sconfig.json", sl ? (int)(sl - cpath) : 0, cpath, sl ? "/" : "");
        if (mmc_read_file(mpath, &mb, &mn) == MMC_OK) {
            cJSON *mj = cJSON_ParseWithLength(mb, mn);
            const char *mt = jstr(mj, "model_type");
            if (mt) snprintf(t->model_type, sizeof t->model_type, "%s", mt);
            cJSON_Delete(mj);
            free(mb);
        }
        mmc_clear_error();
    }
    if (!st && (st = spmodel ? load_spm_model(t, buf, n, cbuf, cbuf ? cn : 0, cpath)
                             : load_buffers(t, buf, n, cbuf, cn, cpath))) { mmc_tokenizer_free(t); t = NULL; }
    free(buf);
    free(cbuf);
    *out = t;
    return st;
}
