/* clip_bpe.c — CLIP's tokenizer from tokenizer.json, mirroring HF tokenizers as transformers'
 * CLIPTokenizer (models/clip/tokenization_clip.py) configures it:
 *
 *   added tokens ("<|startoftext|>", "<|endoftext|>": normalized false) split off the raw text,
 *   leftmost and longest first;
 *   each remaining piece: normalizers in order (NFC via libutf8proc, Replace(regex, content)
 *   via PCRE2, Lowercase = Rust's char::to_lowercase, one code point at a time);
 *   Split(CLIP's regex, behavior Removed, invert true): the matches are the words, the rest
 *   (spaces) is dropped; ByteLevel (add_prefix_space false) maps each byte to GPT-2's printable
 *   alphabet (its regex cannot split a CLIP word further);
 *   BPE per word: one symbol per byte-level character, the last with end_of_word_suffix
 *   "</w>", a character missing from the vocabulary becomes unk (fuse_unk false); then the
 *   adjacent pair of lowest merge rank (the leftmost among equals) merges until none applies;
 *   RobertaProcessing: [bos] tokens [eos]; truncation to max_length keeps room for both.
 *
 * Onig's \s (tokenizers' regex engine) also matches U+0085, which PCRE2's UCP \s does not:
 * the pattern "\s" is widened to [\s\x{85}] when compiled. A separate file from
 * tokenizer.c (the byte-level BPE of the LMs) because CLIP's pipeline shares little with it:
 * a normalizer chain, word-end suffixes, symbols that start from characters, not bytes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "mmc_encoders.h"
#include "tok_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#define MAX_NORMALIZERS 8
#define MAX_ADDED 64

typedef enum { NORM_NFC, NORM_LOWERCASE, NORM_REPLACE } norm_kind;
typedef struct {
    norm_kind kind;
    pcre2_code *re;           /* NORM_REPLACE */
    char *content;
} normalizer;

/* open addressing: string -> id, and (id, id) -> (rank, merged id) */
typedef struct { char *key; int32_t id; } str_slot;
typedef struct { uint64_t key; int32_t rank, id; bool used; } pair_slot;

struct mmc_clip_tokenizer {
    char path[1024];
    str_slot *vocab;
    uint32_t vocab_mask;
    pair_slot *merges;
    uint32_t merges_mask;
    char suffix[32];          /* end_of_word_suffix, "</w>" */
    int32_t unk, bos, eos, pad;
    int model_max_length;
    normalizer norms[MAX_NORMALIZERS];
    int n_norms;
    pcre2_code *split;        /* the words are its matches */
    pcre2_match_data *md;
    struct { char *content; int len; int32_t id; } added[MAX_ADDED];
    int n_added;
    char byte_char[256][3];   /* ByteLevel: byte -> UTF-8 of its printable stand-in */
};

/* ------------------------------------------------------------------ hash maps */
static uint64_t hash_str(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb3f97f4a7c15ull;
    return x ^ (x >> 33);
}
static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < 2 * n) c <<= 1;
    return c;
}
static int32_t vocab_find(const mmc_clip_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_str(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const str_slot *e = &t->vocab[i];
        if (!e->key) return -1;
        if (strlen(e->key) == n && !memcmp(e->key, s, n)) return e->id;
    }
}
static const pair_slot *merge_find(const mmc_clip_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)mix64(key) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        const pair_slot *e = &t->merges[i];
        if (!e->used) return NULL;
        if (e->key == key) return e;
    }
}

/* ------------------------------------------------------------------ loading */
/* Declared in tok_internal.h: t5_unigram.c compiles its Replace patterns with it too. */
pcre2_code *tok_compile_onig(const char *pat, const char *path, const char *where, mmc_status *st) {
    /* onig's Unicode \s includes U+0085 (NEL); PCRE2's UCP \s does not */
    char buf[1024];
    size_t o = 0;
    bool in_class = false;
    for (const char *p = pat; *p && o + 16 < sizeof buf; p++) {
        if (p[0] == '\\' && p[1] == 's') {
            o += (size_t)snprintf(buf + o, sizeof buf - o, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]");
            p++;
        } else if (p[0] == '\\' && p[1]) {
            buf[o++] = *p++, buf[o++] = *p;
        } else {
            if (*p == '[') in_class = true;
            else if (*p == ']') in_class = false;
            buf[o++] = *p;
        }
    }
    buf[o] = 0;
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        *st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s regex '%s' does not compile at offset %zu: %s", path, where, pat,
                        (size_t)off, (const char *)msg);
    }
    return re;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static mmc_status read_normalizers(mmc_clip_tokenizer *t, const cJSON *n) {
    mmc_status st = MMC_OK;
    if (!n || cJSON_IsNull(n)) return MMC_OK;
    const char *type = jstr(n, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
            if ((st = read_normalizers(t, it))) return st;
        }
        return MMC_OK;
    }
    if (t->n_norms == MAX_NORMALIZERS)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than %d normalizers", t->path, MAX_NORMALIZERS);
    normalizer *nm = &t->norms[t->n_norms];
    if (type && !strcmp(type, "NFC")) nm->kind = NORM_NFC;
    else if (type && !strcmp(type, "Lowercase")) nm->kind = NORM_LOWERCASE;
    else if (type && !strcmp(type, "Replace")) {
        const char *re = jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "Regex");
        const char *lit = jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
        const char *content = jstr(n, "content");
        if ((!re && !lit) || !content)
            return mmc_error(MMC_ERR_FORMAT, "%s: normalizer Replace needs pattern.Regex / pattern.String and content",
                             t->path);
        nm->kind = NORM_REPLACE;
        if (re) nm->re = tok_compile_onig(re, t->path, "normalizer Replace", &st);
        else {
            int err;
            PCRE2_SIZE off;
            nm->re = pcre2_compile((PCRE2_SPTR)lit, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_LITERAL, &err, &off, NULL);
        }
        if (!nm->re) return st ? st : mmc_error(MMC_ERR_FORMAT, "%s: bad Replace pattern", t->path);
        nm->content = strdup(content);
    } else {
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported by the CLIP tokenizer "
                         "(NFC, Replace, Lowercase)", t->path, type ? type : "?");
    }
    t->n_norms++;
    return MMC_OK;
}

static mmc_status read_pre_tokenizer(mmc_clip_tokenizer *t, const cJSON *p) {
    const char *type = jstr(p, "type");
    const cJSON *list = p && type && !strcmp(type, "Sequence") ? cJSON_GetObjectItemCaseSensitive(p, "pretokenizers") : NULL;
    const cJSON *split = cJSON_GetArrayItem(list, 0), *bl = cJSON_GetArrayItem(list, 1);
    const char *pat = jstr(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    const char *beh = jstr(split, "behavior"), *bl_type = jstr(bl, "type");
    if (!split || cJSON_GetArraySize(list) != 2 || !pat || !jstr(split, "type") || strcmp(jstr(split, "type"), "Split") ||
        !beh || strcmp(beh, "Removed") || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert")) ||
        !bl_type || strcmp(bl_type, "ByteLevel") || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bl, "add_prefix_space")))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pre_tokenizer is not CLIP's (Sequence of Split(regex, Removed, "
                         "invert) and ByteLevel without prefix space)", t->path);
    mmc_status st = MMC_OK;
    t->split = tok_compile_onig(pat, t->path, "pre_tokenizer Split", &st);
    if (!t->split) return st;
    t->md = pcre2_match_data_create_from_pattern(t->split, NULL);
    return t->md ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
}

static mmc_status read_model(mmc_clip_tokenizer *t, const cJSON *m) {
    const char *type = jstr(m, "type"), *suffix = jstr(m, "end_of_word_suffix"), *prefix = jstr(m, "continuing_subword_prefix");
    if (!type || strcmp(type, "BPE") || !suffix || strlen(suffix) >= sizeof t->suffix || (prefix && *prefix))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model is not CLIP's BPE (type BPE, end_of_word_suffix, no "
                         "continuing_subword_prefix)", t->path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "ignore_merges")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "byte_fallback")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "fuse_unk")))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: BPE ignore_merges / byte_fallback / fuse_unk are not supported", t->path);
    strcpy(t->suffix, suffix);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return mmc_error(MMC_ERR_FORMAT, "%s: model.vocab (object) or model.merges (array) missing", t->path);
    int nv = cJSON_GetArraySize(vocab), nm = cJSON_GetArraySize(merges);
    t->vocab_mask = pow2_at_least((size_t)nv) - 1;
    t->merges_mask = pow2_at_least((size_t)nm) - 1;
    t->vocab = calloc((size_t)t->vocab_mask + 1, sizeof *t->vocab);
    t->merges = calloc((size_t)t->merges_mask + 1, sizeof *t->merges);
    if (!t->vocab || !t->merges) return mmc_error(MMC_ERR_OOM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it)) return mmc_error(MMC_ERR_FORMAT, "%s: vocab entry '%s' is not a number", t->path, it->string);
        size_t n = strlen(it->string);
        uint32_t i = (uint32_t)hash_str(it->string, n) & t->vocab_mask;
        while (t->vocab[i].key) i = (i + 1) & t->vocab_mask;
        if (!(t->vocab[i].key = strdup(it->string))) return mmc_error(MMC_ERR_OOM, "out of memory");
        t->vocab[i].id = (int32_t)it->valuedouble;
    }
    int32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        /* ["a", "b"] (tokenizers >= 0.20) or "a b" */
        char a[256], b[256];
        if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
            cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            snprintf(a, sizeof a, "%s", cJSON_GetArrayItem(it, 0)->valuestring);
            snprintf(b, sizeof b, "%s", cJSON_GetArrayItem(it, 1)->valuestring);
        } else if (cJSON_IsString(it) && strchr(it->valuestring, ' ')) {
            const char *sp = strchr(it->valuestring, ' ');
            snprintf(a, sizeof a, "%.*s", (int)(sp - it->valuestring), it->valuestring);
            snprintf(b, sizeof b, "%s", sp + 1);
        } else {
            return mmc_error(MMC_ERR_FORMAT, "%s: merges[%d] is neither [\"a\", \"b\"] nor \"a b\"", t->path, rank);
        }
        char ab[512];
        snprintf(ab, sizeof ab, "%s%s", a, b);
        int32_t ia = vocab_find(t, a, strlen(a)), ib = vocab_find(t, b, strlen(b)), iab = vocab_find(t, ab, strlen(ab));
        if (ia < 0 || ib < 0 || iab < 0)
            return mmc_error(MMC_ERR_FORMAT, "%s: merges[%d] (\"%s\", \"%s\") uses a token missing from the vocab",
                             t->path, rank, a, b);
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint32_t i = (uint32_t)mix64(key) & t->merges_mask;
        while (t->merges[i].used && t->merges[i].key != key) i = (i + 1) & t->merges_mask;
        if (!t->merges[i].used)   /* a repeated pair keeps its first (lowest) rank */
            t->merges[i] = (pair_slot){.key = key, .rank = rank, .id = iab, .used = true};
        rank++;
    }
    const char *unk = jstr(m, "unk_token");
    t->unk = unk ? vocab_find(t, unk, strlen(unk)) : -1;
    return MMC_OK;
}

/* GPT-2's bytes_to_unicode */
static void init_byte_chars(mmc_clip_tokenizer *t) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + n++;
        uint8_t buf[4] = {0};
        utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
        memcpy(t->byte_char[b], buf, (size_t)k);
        if (k < 3) t->byte_char[b][k] = 0;
    }
}

static int32_t token_id(const mmc_clip_tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return vocab_find(t, s, strlen(s));
}

/* tokenizer_config.json's "pad_token": a string or {"content": ...} */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

static cJSON *parse_file(const char *path, mmc_status *st) {
    char *text = NULL;
    size_t len = 0;
    if ((*st = mmc_read_file(path, &text, &len))) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) *st = mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", path);
    return j;
}

/* The Hub's layout of CLIP's tokenizer (the SD 1.x / SDXL / Flux repos): vocab.json + merges.txt and a
 * tokenizer_config.json naming the special tokens, no tokenizer.json. transformers' CLIPTokenizer
 * builds its pipeline from the two files — NFC, \s+ -> " ", lowercase; Split(CLIP's regex, removed,
 * inverted) + ByteLevel; BPE with "</w>" word ends, unk <|endoftext|>; RobertaProcessing(bos, eos) —
 * and this writes that pipeline as the tokenizer.json the rest of the loader reads. merges.txt: an
 * optional "#version" line, then one "a b" pair per line. */
static cJSON *hub_pipeline(const char *dir, mmc_status *st) {
    char path[1100];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    cJSON *vocab = parse_file(path, st), *cfg = NULL, *j = NULL;
    char *merges = NULL;
    size_t mlen = 0;
    if (!vocab) return NULL;
    if (!cJSON_IsObject(vocab)) { *st = mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object of token -> id", path); goto done; }
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    if ((*st = mmc_read_file(path, &merges, &mlen))) goto done;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (f) { fclose(f); if (!(cfg = parse_file(path, st))) goto done; }
    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token"),
               *unk = config_token(cfg, "unk_token"), *pad = config_token(cfg, "pad_token");
    bos = bos ? bos : "<|startoftext|>", eos = eos ? eos : "<|endoftext|>", unk = unk ? unk : "<|endoftext|>";
    const cJSON *ib = cJSON_GetObjectItemCaseSensitive(vocab, bos), *ie = cJSON_GetObjectItemCaseSensitive(vocab, eos);
    if (!cJSON_IsNumber(ib) || !cJSON_IsNumber(ie)) {
        *st = mmc_error(MMC_ERR_FORMAT, "%s/vocab.json: the bos / eos tokens '%s' / '%s' are not in the vocabulary", dir,
                        bos, eos);
        goto done;
    }
    j = cJSON_CreateObject();
    cJSON *model = cJSON_AddObjectToObject(j, "model"), *ml = NULL;
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddStringToObject(model, "end_of_word_suffix", "</w>");
    cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
    cJSON_AddStringToObject(model, "unk_token", unk);
    cJSON_AddItemToObject(model, "vocab", vocab);
    vocab = NULL;
    ml = cJSON_AddArrayToObject(model, "merges");
    int line = 0;
    for (char *p = merges, *next; p && *p; p = next) {
        line++;
        char *nl = strchr(p, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        size_t n = strlen(p);
        if (n && p[n - 1] == '\r') p[--n] = 0;
        if (!n || (line == 1 && !strncmp(p, "#version", 8))) continue;
        if (!strchr(p, ' ')) {
            *st = mmc_error(MMC_ERR_FORMAT, "%s/merges.txt:%d: not an \"a b\" pair", dir, line);
            goto done;
        }
        cJSON_AddItemToArray(ml, cJSON_CreateString(p));
    }
    cJSON *norm = cJSON_AddObjectToObject(j, "normalizer"), *nl = NULL, *n;
    cJSON_AddStringToObject(norm, "type", "Sequence");
    nl = cJSON_AddArrayToObject(norm, "normalizers");
    n = cJSON_CreateObject(), cJSON_AddStringToObject(n, "type", "NFC"), cJSON_AddItemToArray(nl, n);
    n = cJSON_CreateObject(), cJSON_AddStringToObject(n, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(n, "pattern"), "Regex", "\\s+");
    cJSON_AddStringToObject(n, "content", " "), cJSON_AddItemToArray(nl, n);
    n = cJSON_CreateObject(), cJSON_AddStringToObject(n, "type", "Lowercase"), cJSON_AddItemToArray(nl, n);
    cJSON *pre = cJSON_AddObjectToObject(j, "pre_tokenizer"), *pl;
    cJSON_AddStringToObject(pre, "type", "Sequence");
    pl = cJSON_AddArrayToObject(pre, "pretokenizers");
    n = cJSON_CreateObject(), cJSON_AddStringToObject(n, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(n, "pattern"), "Regex",
                            "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+");
    cJSON_AddStringToObject(n, "behavior", "Removed"), cJSON_AddTrueToObject(n, "invert"), cJSON_AddItemToArray(pl, n);
    n = cJSON_CreateObject(), cJSON_AddStringToObject(n, "type", "ByteLevel");
    cJSON_AddFalseToObject(n, "add_prefix_space"), cJSON_AddItemToArray(pl, n);
    /* the special tokens split off the raw text, as transformers adds them */
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    const char *specials[4] = {bos, eos, unk, pad ? pad : eos};   /* SDXL's tokenizer_2 pads with "!" */
    for (int k = 0; k < 4; k++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "vocab"), specials[k]);
        bool dup = false;
        for (int q = 0; q < k; q++) dup |= !strcmp(specials[q], specials[k]);
        if (!cJSON_IsNumber(id) || dup) continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id->valuedouble);
        cJSON_AddStringToObject(a, "content", specials[k]);
        cJSON_AddItemToArray(added, a);
    }
    cJSON *pp = cJSON_AddObjectToObject(j, "post_processor"), *cls, *sep;
    cJSON_AddStringToObject(pp, "type", "RobertaProcessing");
    cls = cJSON_AddArrayToObject(pp, "cls"), sep = cJSON_AddArrayToObject(pp, "sep");
    cJSON_AddItemToArray(cls, cJSON_CreateString(bos)), cJSON_AddItemToArray(cls, cJSON_CreateNumber(ib->valuedouble));
    cJSON_AddItemToArray(sep, cJSON_CreateString(eos)), cJSON_AddItemToArray(sep, cJSON_CreateNumber(ie->valuedouble));
done:
    if (*st) { cJSON_Delete(j); j = NULL; }
    cJSON_Delete(vocab);
    cJSON_Delete(cfg);
    free(merges);
    return j;
}

mmc_status mmc_clip_tokenizer_load(const char *dir, mmc_clip_tokenizer **out) {
    *out = NULL;
    mmc_status st = MMC_OK;
    cJSON *j = NULL, *cfg = NULL;
    mmc_clip_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory");
    size_t dl = strlen(dir);
    bool is_file = dl >= 5 && !strcmp(dir + dl - 5, ".json");
    if (is_file) snprintf(t->path, sizeof t->path, "%s", dir);
    else snprintf(t->path, sizeof t->path, "%s/tokenizer.json", dir);
    char vpath[1100];
    snprintf(vpath, sizeof vpath, "%s/vocab.json", dir);
    if (!is_file && access(t->path, F_OK) != 0 && access(vpath, F_OK) == 0) {   /* the Hub's vocab + merges */
        snprintf(t->path, sizeof t->path, "%s/vocab.json + merges.txt", dir);
        if (!(j = hub_pipeline(dir, &st))) goto fail;
    } else if (!(j = parse_file(t->path, &st))) goto fail;
    if ((st = read_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"))) ||
        (st = read_normalizers(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"))) ||
        (st = read_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"))))
        goto fail;
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "added_tokens")) {
        const char *c = jstr(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!c || !cJSON_IsNumber(id) || !*c) { st = mmc_error(MMC_ERR_FORMAT, "%s: added_tokens entry without content / id", t->path); goto fail; }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "normalized")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "lstrip")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "rstrip")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "single_word"))) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: added token '%s': normalized / lstrip / rstrip / single_word "
                           "are not supported by the CLIP tokenizer", t->path, c);
            goto fail;
        }
        if (t->n_added == MAX_ADDED) { st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than %d added tokens", t->path, MAX_ADDED); goto fail; }
        t->added[t->n_added].content = strdup(c);
        t->added[t->n_added].len = (int)strlen(c);
        t->added[t->n_added++].id = (int32_t)id->valuedouble;
    }
    /* RobertaProcessing: cls = [bos, id], sep = [eos, id] */
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(j, "post_processor");
    const char *ppt = jstr(pp, "type");
    const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "cls"), 1);
    const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "sep"), 1);
    if (!ppt || strcmp(ppt, "RobertaProcessing") || !cJSON_IsNumber(cls) || !cJSON_IsNumber(sep)) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: post_processor is not RobertaProcessing with cls / sep", t->path);
        goto fail;
    }
    t->bos = (int32_t)cls->valuedouble, t->eos = (int32_t)sep->valuedouble, t->pad = -1;
    /* pad_token from tokenizer_config.json beside it (CLIPTokenizer's default: the eos) */
    char cpath[1100];
    if (is_file) {
        const char *slash = strrchr(dir, '/');
        snprintf(cpath, sizeof cpath, "%.*stokenizer_config.json", slash ? (int)(slash - dir + 1) : 0, dir);
    } else {
        snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    }
    FILE *f = fopen(cpath, "rb");
    if (f) {
        fclose(f);
        if (!(cfg = parse_file(cpath, &st))) goto fail;
        const cJSON *mml = cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length");
        if (cJSON_IsNumber(mml) && mml->valuedouble >= 2 && mml->valuedouble <= 1e6) t->model_max_length = (int)mml->valuedouble;
        const char *pad = config_token(cfg, "pad_token");
        if (pad && (t->pad = token_id(t, pad)) < 0) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: pad_token '%s' is not in the vocabulary", cpath, pad);
            goto fail;
        }
    }
    init_byte_chars(t);
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    *out = t;
    return MMC_OK;
fail:
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    mmc_clip_tokenizer_free(t);
    return st;
}

void mmc_clip_tokenizer_free(mmc_clip_tokenizer *t) {
    if (!t) return;
    if (t->vocab)
        for (uint32_t i = 0; i <= t->vocab_mask; i++) free(t->vocab[i].key);
    free(t->vocab);
    free(t->merges);
    for (int i = 0; i < t->n_norms; i++) {
        pcre2_code_free(t->norms[i].re);
        free(t->norms[i].content);
    }
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    pcre2_match_data_free(t->md);
    pcre2_code_free(t->split);
    free(t);
}

int mmc_clip_tokenizer_model_max_length(const mmc_clip_tokenizer *t) {
    return t->model_max_length ? t->model_max_length : 77;
}

void mmc_clip_tokenizer_special_ids(const mmc_clip_tokenizer *t, int32_t *bos, int32_t *eos, int32_t *pad) {
    if (bos) *bos = t->bos;
    if (eos) *eos = t->eos;
    if (pad) *pad = t->pad;
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

/* One normalizer over s (malloc'd, NUL-terminated); returns the new string, NULL on error. */
static char *normalize_step(const mmc_clip_tokenizer *t, const normalizer *nm, char *s, mmc_status *st) {
    size_t n = strlen(s);
    char *out = NULL;
    if (nm->kind == NORM_NFC) {
        out = (char *)utf8proc_NFC((const utf8proc_uint8_t *)s);
        if (!out) *st = mmc_error(MMC_ERR_INVALID, "%s: text is not valid UTF-8", t->path);
    } else if (nm->kind == NORM_LOWERCASE) {
        /* char::to_lowercase per code point: U+0130 is the one with a two-code-point lowercase */
        out = malloc(3 * n + 1);
        size_t o = 0;
        for (utf8proc_ssize_t i = 0; out && i < (utf8proc_ssize_t)n;) {
            utf8proc_int32_t c;
            utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &c);
            if (k <= 0) { free(out); out = NULL; *st = mmc_error(MMC_ERR_INVALID, "%s: text is not valid UTF-8", t->path); break; }
            i += k;
            if (c == 0x130) { memcpy(out + o, "i\xcc\x87", 3); o += 3; continue; }
            o += (size_t)utf8proc_encode_char(utf8proc_tolower(c), (utf8proc_uint8_t *)out + o);
        }
        if (out) out[o] = 0;
        else if (!*st) *st = mmc_error(MMC_ERR_OOM, "out of memory");
    } else {
        PCRE2_SIZE cap = 2 * n + 64;
        for (int attempt = 0; attempt < 2; attempt++) {
            out = malloc(cap);
            if (!out) { *st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            PCRE2_SIZE olen = cap;
            int rc = pcre2_substitute(nm->re, (PCRE2_SPTR)s, n, 0, PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL |
                                      PCRE2_SUBSTITUTE_OVERFLOW_LENGTH, NULL, NULL, (PCRE2_SPTR)nm->content,
                                      PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out, &olen);
            if (rc >= 0) break;
            free(out);
            out = NULL;
            if (rc == PCRE2_ERROR_NOMEMORY && attempt == 0) { cap = olen + 1; continue; }
            *st = mmc_error(MMC_ERR_INVALID, "%s: normalizer Replace failed (%d)", t->path, rc);
            break;
        }
    }
    free(s);
    return out;
}

/* BPE of one word (bytes w[0, n)) appended to b */
static mmc_status bpe_word(const mmc_clip_tokenizer *t, const char *w, size_t n, ids_buf *b) {
    /* one symbol per byte: ByteLevel maps every byte to one character */
    int32_t stack_sym[128];
    int32_t *sym = n <= 128 ? stack_sym : malloc(n * sizeof *sym);
    if (!sym) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char s[3 + sizeof t->suffix];
        snprintf(s, sizeof s, "%s%s", t->byte_char[(uint8_t)w[i]], i + 1 == n ? t->suffix : "");
        int32_t id = vocab_find(t, s, strlen(s));
        sym[i] = id >= 0 ? id : t->unk;
    }
    size_t m = n;
    for (;;) {
        int32_t best_rank = INT32_MAX, best_id = -1;
        size_t best = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            if (sym[i] < 0 || sym[i + 1] < 0) continue;
            const pair_slot *e = merge_find(t, sym[i], sym[i + 1]);
            if (e && e->rank < best_rank) best_rank = e->rank, best_id = e->id, best = i;
        }
        if (best_id < 0) break;
        sym[best] = best_id;
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        m--;
    }
    mmc_status st = MMC_OK;
    for (size_t i = 0; i < m && !st; i++) {
        if (sym[i] < 0) st = mmc_error(MMC_ERR_INVALID, "%s: a character is not in the vocabulary and there is no "
                                       "unk_token", t->path);
        else st = push(b, sym[i]);
    }
    if (sym != stack_sym) free(sym);
    return st;
}

/* normalize + pre-tokenize + BPE one stretch of text without added tokens */
static mmc_status encode_piece(const mmc_clip_tokenizer *t, const char *text, size_t n, pcre2_match_data *md, ids_buf *b) {
    mmc_status st = MMC_OK;
    char *s = malloc(n + 1);
    if (!s) return mmc_error(MMC_ERR_OOM, "out of memory");
    memcpy(s, text, n);
    s[n] = 0;
    for (int i = 0; i < t->n_norms && s; i++) s = normalize_step(t, &t->norms[i], s, &st);
    if (!s) return st;
    size_t len = strlen(s);
    PCRE2_SIZE pos = 0;
    while (pos < len) {
        int rc = pcre2_match(t->split, (PCRE2_SPTR)s, len, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { st = mmc_error(MMC_ERR_INVALID, "%s: pre_tokenizer regex failed (%d)", t->path, rc); break; }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) { pos = ov[1] + 1; continue; }   /* empty match: advance */
        if ((st = bpe_word(t, s + ov[0], ov[1] - ov[0], b))) break;
        pos = ov[1];
    }
    free(s);
    return st;
}

/* Content tokens (no bos / eos) of text. */
static mmc_status encode_tokens(const mmc_clip_tokenizer *t, const char *text, ids_buf *b) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->split, NULL);   /* per call: thread-safe */
    if (!md) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    size_t n = strlen(text), start = 0;
    for (size_t i = 0; i <= n && !st;) {
        int best = -1;   /* the longest added token starting at i */
        for (int a = 0; a < t->n_added && i < n; a++)
            if ((size_t)t->added[a].len <= n - i && !memcmp(text + i, t->added[a].content, (size_t)t->added[a].len) &&
                (best < 0 || t->added[a].len > t->added[best].len))
                best = a;
        if (best < 0 && i < n) { i++; continue; }
        if (i > start) st = encode_piece(t, text + start, i - start, md, b);
        if (best < 0 || st) break;
        st = push(b, t->added[best].id);
        i += (size_t)t->added[best].len;
        start = i;
    }
    pcre2_match_data_free(md);
    return st;
}

mmc_status mmc_clip_tokenizer_encode(const mmc_clip_tokenizer *t, const char *text, int32_t *ids, int cap, int *n) {
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    *n = 0;
    if (!st && b.n + 2 > cap)
        st = mmc_error(MMC_ERR_INVALID, "CLIP tokenizer: %d ids do not fit in %d", b.n + 2, cap);
    if (!st) {
        ids[0] = t->bos;
        if (b.n) memcpy(ids + 1, b.v, (size_t)b.n * sizeof *ids);
        ids[b.n + 1] = t->eos;
        *n = b.n + 2;
    }
    free(b.v);
    return st;
}

mmc_status mmc_clip_tokenizer_encode_padded(const mmc_clip_tokenizer *t, const char *text, int max_length,
                                            int32_t *ids, int32_t *mask, int *n_real) {
    if (max_length < 2) return mmc_error(MMC_ERR_INVALID, "CLIP tokenizer: max_length %d leaves no room for bos / eos", max_length);
    if (t->pad < 0)
        return mmc_error(MMC_ERR_INVALID, "%s: padding to max_length needs a pad_token (tokenizer_config.json)", t->path);
    ids_buf b = {0};
    mmc_status st = encode_tokens(t, text, &b);
    if (st) { free(b.v); return st; }
    int keep = b.n < max_length - 2 ? b.n : max_length - 2;   /* truncation: the tokens, not bos / eos */
    ids[0] = t->bos;
    if (keep) memcpy(ids + 1, b.v, (size_t)keep * sizeof *ids);
    ids[keep + 1] = t->eos;
    for (int i = 0; i < max_length; i++) {
        if (i >= keep + 2) ids[i] = t->pad;
        if (mask) mask[i] = i < keep + 2;
    }
    if (n_real) *n_real = keep + 2;
    free(b.v);
    return MMC_OK;
}
