/* safetensors.c — reader (mmap, zero-copy) and atomic writer for the safetensors format
 * (https://github.com/huggingface/safetensors: 8-byte little-endian header length N, N
 * bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {}},
 * then the data buffer; offsets are relative to the buffer start).
 *
 * Validation follows what the Python `safetensors` package (0.8) rejects: header shorter
 * than 8 bytes, N + 8 beyond the file or N over 100 MB, non-UTF-8 header, invalid JSON or
 * trailing non-whitespace after it, a header that is not an object, missing/mistyped
 * dtype/shape/data_offsets, unknown dtypes, negative or non-integer dims, shape overflow,
 * a byte span that does not match shape x dtype size, and offsets that (sorted) do not
 * tile the data buffer exactly (no gaps, no overlaps, nothing left over). Out-of-order
 * offsets are fine. mmc is stricter in two places: a tensor name may appear only once
 * (Python keeps the last), and dtypes mmc cannot compute with (F8_*, I16, U32 ...) are
 * MMC_ERR_UNSUPPORTED.
 *
 * Sharded checkpoints are opened through model.safetensors.index.json ("weight_map":
 * name -> shard file); all shards are mapped and their entries merged. Lookup by name is
 * an open-addressing hash table (real checkpoints have ~1000 tensors).
 *
 * The writer produces the same bytes as safetensors.torch.save_file: __metadata__ first
 * (keys sorted), tensors ordered by dtype (largest alignment first, the Rust enum order)
 * then name, header padded with spaces so the data start at a multiple of 8. */
#include "mmc_io.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER 100000000ull   /* same limit as the Rust crate */

typedef struct {
    char *path;
    void *map;        /* mmapped file, or an external buffer (mapped == false) */
    size_t size;
    bool mapped;
    cJSON *meta;      /* __metadata__ object (owned by header tree) */
    cJSON *header;
} st_file;

struct mmc_st {
    st_file *files;
    int n_files;
    mmc_st_entry *entries;
    char **names;     /* owned copies of entry names */
    int n, cap;
    int *table;       /* hash table of entry indices (-1 empty), size table_cap (power of 2) */
    int table_cap;
};

static void st_file_close(st_file *f) {
    if (f->mapped && f->map) munmap(f->map, f->size);
    cJSON_Delete(f->header);
    free(f->path);
}

void mmc_st_close(mmc_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) st_file_close(&st->files[i]);
    for (int i = 0; i < st->n; i++) free(st->names[i]);
    free(st->files);
    free(st->entries);
    free(st->names);
    free(st->table);
    free(st);
}

/* ------------------------------------------------------------------ name index */
static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;      /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int table_lookup(const mmc_st *st, const char *name) {
    if (!st->table_cap) return -1;
    size_t mask = (size_t)st->table_cap - 1;
    for (size_t i = hash_str(name) & mask;; i = (i + 1) & mask) {
        int k = st->table[i];
        if (k < 0) return -1;
        if (strcmp(st->entries[k].name, name) == 0) return k;
    }
}

static void table_insert(mmc_st *st, int k) {
    size_t mask = (size_t)st->table_cap - 1;
    size_t i = hash_str(st->entries[k].name) & mask;
    while (st->table[i] >= 0) i = (i + 1) & mask;
    st->table[i] = k;
}

static mmc_status table_grow(mmc_st *st, int need) {
    if (st->table_cap >= 2 * need && st->table_cap) return MMC_OK;
    int cap = st->table_cap ? st->table_cap : 128;
    while (cap < 2 * need) cap *= 2;
    int *t = malloc((size_t)cap * sizeof *t);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory (safetensors index of %d entries)", need);
    free(st->table);
    st->table = t;
    st->table_cap = cap;
    for (int i = 0; i < cap; i++) t[i] = -1;
    for (int k = 0; k < st->n; k++) table_insert(st, k);
    return MMC_OK;
}

static mmc_status add_entry(mmc_st *st, const char *name, mmc_st_entry e) {
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 64;
        mmc_st_entry *ne = realloc(st->entries, (size_t)cap * sizeof *ne);
        if (!ne) return mmc_error(MMC_ERR_OOM, "out of memory");
        st->entries = ne;
        char **nn = realloc(st->names, (size_t)cap * sizeof *nn);
        if (!nn) return mmc_error(MMC_ERR_OOM, "out of memory");
        st->names = nn;
        st->cap = cap;
    }
    mmc_status rc = table_grow(st, st->n + 1);
    if (rc) return rc;
    st->names[st->n] = strdup(name);
    if (!st->names[st->n]) return mmc_error(MMC_ERR_OOM, "out of memory");
    e.name = st->names[st->n];
    st->entries[st->n] = e;
    table_insert(st, st->n);
    st->n++;
    return MMC_OK;
}

/* ------------------------------------------------------------------ header parsing */
/* safetensors dtype spellings mmc can hold (exact, case-sensitive like the Rust enum). */
static bool st_dtype(const char *s, mmc_dtype *dt) {
    static const struct { const char *s; mmc_dtype dt; } tab[] = {
        {"F32", MMC_F32}, {"BF16", MMC_BF16}, {"F16", MMC_F16}, {"F64", MMC_F64},
        {"I32", MMC_I32}, {"I64", MMC_I64},   {"U8", MMC_U8},   {"I8", MMC_I8},
        {"BOOL", MMC_BOOL},
    };
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        if (strcmp(s, tab[i].s) == 0) { *dt = tab[i].dt; return true; }
    return false;
}
/* Dtypes valid in safetensors that mmc does not support (error message differs). */
static bool st_dtype_known(const char *s) {
    static const char *known[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                  "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "U32", "C64", "U64"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strcmp(s, known[i]) == 0) return true;
    return false;
}

static bool valid_utf8(const unsigned char *s, size_t n, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { k = 1; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { k = 2; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { k = 3; cp = c & 0x07; }
        else { *bad = i; return false; }
        if ((size_t)k >= n - i) { *bad = i; return false; }
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) { *bad = i; return false; }
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) { *bad = i; return false; }
        i += (size_t)k + 1;
    }
    return true;
}

/* A JSON number that is a non-negative integer exactly representable (<= 2^53). */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static const char *json_type(const cJSON *v) {
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "nothing";
}

typedef struct { uint64_t b, e; int k; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return x->k - y->k;
}

/* Parse one file's header (map/size already set) and append its entries. */
static mmc_status parse_file(mmc_st *st, st_file *f) {
    const char *p = f->path;
    if (f->size < 8)
        return mmc_error(MMC_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header "
                         "length", p, f->size);
    const unsigned char *b8 = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b8[i];   /* little-endian */
    if (hlen > ST_MAX_HEADER)
        return mmc_error(MMC_ERR_FORMAT, "%s: header length %llu is over the 100 MB limit "
                         "(not a safetensors file?)", p, (unsigned long long)hlen);
    if (hlen > f->size - 8)
        return mmc_error(MMC_ERR_FORMAT, "%s: header length %llu exceeds the %zu bytes after the "
                         "length field (truncated file?)", p, (unsigned long long)hlen, f->size - 8);
    const char *hdr = (const char *)f->map + 8;
    size_t bad = 0;
    if (!valid_utf8((const unsigned char *)hdr, (size_t)hlen, &bad))
        return mmc_error(MMC_ERR_FORMAT, "%s: header is not valid UTF-8 (byte %zu)", p, bad + 8);
    char what[4200];
    snprintf(what, sizeof what, "%s: header", p);
    f->header = mmc_io_json_parse(hdr, (size_t)hlen, what);
    if (!f->header) return MMC_ERR_FORMAT;
    if (!cJSON_IsObject(f->header))
        return mmc_error(MMC_ERR_FORMAT, "%s: header is %s, expected a JSON object", p,
                         json_type(f->header));
    uint64_t data_len = f->size - 8 - hlen;
    const char *data = hdr + hlen;
    int first = st->n, ntensors = 0;
    for (cJSON *it = f->header->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        if (strcmp(name, "__metadata__") == 0) {
            if (cJSON_IsNull(it)) continue;
            if (!cJSON_IsObject(it))
                return mmc_error(MMC_ERR_FORMAT, "%s: __metadata__ is %s, expected an object of "
                                 "strings", p, json_type(it));
            for (cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m))
                    return mmc_error(MMC_ERR_FORMAT, "%s: __metadata__['%s'] is %s, expected a "
                                     "string", p, m->string, json_type(m));
            f->meta = it;
            continue;
        }
        if (!cJSON_IsObject(it))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': entry is %s, expected an object", p,
                             name, json_type(it));
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(jd))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': 'dtype' is %s, expected a string", p,
                             name, jd ? json_type(jd) : "missing");
        if (!cJSON_IsArray(js))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': 'shape' is %s, expected an array", p,
                             name, js ? json_type(js) : "missing");
        if (!cJSON_IsArray(jo))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' is %s, expected "
                             "[begin, end]", p, name, jo ? json_type(jo) : "missing");
        mmc_st_entry e = {0};
        if (!st_dtype(jd->valuestring, &e.dtype)) {
            if (st_dtype_known(jd->valuestring))
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported "
                                 "by mmc", p, name, jd->valuestring);
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s' (expected F32, BF16, "
                             "F16, F64, I32, I64, U8, I8 or BOOL)", p, name, jd->valuestring);
        }
        int nd = cJSON_GetArraySize(js);
        if (nd > MMC_MAX_DIMS)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: tensor '%s': %d dims (at most %d supported)", p,
                             name, nd, MMC_MAX_DIMS);
        e.ndim = nd;
        uint64_t numel = 1;
        bool overflow = false;
        int d = 0;
        for (cJSON *s = js->child; s; s = s->next, d++) {
            uint64_t v;
            if (!json_uint(s, &v))
                return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative "
                                 "integer", p, name, d);
            e.shape[d] = (int64_t)v;
            if (v && numel > UINT64_MAX / v) overflow = true;
            else numel *= v;
        }
        size_t esz = mmc_dtype_size(e.dtype);
        if (overflow || numel > (uint64_t)INT64_MAX / esz)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': shape overflows the byte size", p, name);
        if (cJSON_GetArraySize(jo) != 2)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets has %d elements, expected "
                             "[begin, end]", p, name, cJSON_GetArraySize(jo));
        uint64_t ob, oe;
        if (!json_uint(jo->child, &ob) || !json_uint(jo->child->next, &oe))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets must be non-negative "
                             "integers", p, name);
        if (oe < ob || oe > data_len)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] outside the "
                             "%llu-byte data buffer", p, name, (unsigned long long)ob,
                             (unsigned long long)oe, (unsigned long long)data_len);
        if (oe - ob != numel * esz)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': %s shape needs %llu bytes but "
                             "data_offsets [%llu, %llu] span %llu", p, name, jd->valuestring,
                             (unsigned long long)(numel * esz), (unsigned long long)ob,
                             (unsigned long long)oe, (unsigned long long)(oe - ob));
        e.data = data + ob;
        e.nbytes = (size_t)(oe - ob);
        if (table_lookup(st, name) >= 0)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s' appears twice%s", p, name,
                             first > 0 && table_lookup(st, name) < first ? " (also in another shard)" : "");
        mmc_status rc = add_entry(st, name, e);
        if (rc) return rc;
        ntensors++;
    }
    /* offsets, sorted, must tile [0, data_len) exactly */
    span *sp = malloc((size_t)(ntensors ? ntensors : 1) * sizeof *sp);
    if (!sp) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int k = 0; k < ntensors; k++) {
        const mmc_st_entry *e = &st->entries[first + k];
        uint64_t b = (uint64_t)((const char *)e->data - data);
        sp[k] = (span){b, b + e->nbytes, first + k};
    }
    qsort(sp, (size_t)ntensors, sizeof *sp, span_cmp);
    uint64_t at = 0;
    mmc_status rc = MMC_OK;
    for (int k = 0; k < ntensors && !rc; k++) {
        if (sp[k].b != at)
            rc = mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] %s (the "
                           "previous tensor ends at %llu; offsets must be contiguous)", p,
                           st->entries[sp[k].k].name, (unsigned long long)sp[k].b,
                           (unsigned long long)sp[k].e, sp[k].b > at ? "leave a gap" : "overlap",
                           (unsigned long long)at);
        at = sp[k].e;
    }
    if (!rc && at != data_len)
        rc = mmc_error(MMC_ERR_FORMAT, "%s: tensors cover %llu bytes of the %llu-byte data buffer "
                       "(truncated file or trailing bytes)", p, (unsigned long long)at,
                       (unsigned long long)data_len);
    free(sp);
    return rc;
}

static mmc_status map_file(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return mmc_error(MMC_ERR_OOM, "out of memory");
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mmc_error(errno == ENOENT ? MMC_ERR_NOT_FOUND : MMC_ERR_IO, "%s: cannot open: %s",
                         path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return mmc_error(MMC_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return mmc_error(MMC_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size == 0) {
        close(fd);
        return mmc_error(MMC_ERR_FORMAT, "%s: empty file (0 bytes)", path);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return mmc_error(MMC_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    }
    f->mapped = true;
    return MMC_OK;
}

static st_file *new_file(mmc_st *st) {
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return NULL;
    st->files = nf;
    st_file *f = &st->files[st->n_files++];
    memset(f, 0, sizeof *f);
    return f;
}

static mmc_status open_one(mmc_st *st, const char *path) {
    st_file *f = new_file(st);
    if (!f) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status rc = map_file(path, f);
    if (rc) return rc;
    return parse_file(st, f);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static mmc_status open_index(mmc_st *st, const char *path) {
    char *text = NULL;
    size_t len = 0;
    mmc_status rc = mmc_read_file(path, &text, &len);
    if (rc) return rc;
    cJSON *j = mmc_io_json_parse(text, len, path);
    free(text);
    if (!j) return MMC_ERR_FORMAT;
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return mmc_error(MMC_ERR_FORMAT, "%s: no 'weight_map' object", path);
    }
    char *dir_copy = strdup(path);
    if (!dir_copy) { cJSON_Delete(j); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    const char *dir = dirname(dir_copy);
    const char **shards = NULL;   /* distinct shard names, in order of first appearance */
    int n_shards = 0;
    for (cJSON *it = wm->child; it && rc == MMC_OK; it = it->next) {
        if (!cJSON_IsString(it)) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: weight_map['%s'] is %s, expected a file name",
                           path, it->string, json_type(it));
            break;
        }
        const char *s = it->valuestring;
        if (!*s || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: weight_map['%s']: shard name '%s' must be a plain "
                           "file name", path, it->string, s);
            break;
        }
        bool seen = false;
        for (int k = n_shards - 1; k >= 0 && !seen; k--) seen = strcmp(shards[k], s) == 0;
        if (seen) continue;
        const char **ns = realloc(shards, (size_t)(n_shards + 1) * sizeof *ns);
        if (!ns) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
        shards = ns;
        shards[n_shards++] = s;
        char shard[4096];
        if ((size_t)snprintf(shard, sizeof shard, "%s/%s", dir, s) >= sizeof shard) {
            rc = mmc_error(MMC_ERR_INVALID, "%s: shard path too long", path);
            break;
        }
        rc = open_one(st, shard);
        if (rc == MMC_ERR_NOT_FOUND)
            mmc_error_prefix(rc, "%s: shard '%s' (listed for tensor '%s') is missing", path, s,
                             it->string);
    }
    /* every mapped name must be present */
    for (cJSON *it = wm->child; it && rc == MMC_OK; it = it->next)
        if (table_lookup(st, it->string) < 0)
            rc = mmc_error(MMC_ERR_NOT_FOUND, "%s: tensor '%s' is listed for shard %s but not in it",
                           path, it->string, it->valuestring);
    free(shards);
    free(dir_copy);
    cJSON_Delete(j);
    return rc;
}

mmc_status mmc_st_open(const char *path, mmc_st **out) {
    *out = NULL;
    mmc_st *st = calloc(1, sizeof *st);
    if (!st) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status rc;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        rc = mmc_error(errno == ENOENT ? MMC_ERR_NOT_FOUND : MMC_ERR_IO, "%s: %s", path,
                       strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors", path);
        if (access(p, F_OK) == 0) rc = open_one(st, p);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
            if (access(p, F_OK) == 0) rc = open_index(st, p);
            else rc = mmc_error(MMC_ERR_NOT_FOUND, "%s: no model.safetensors or "
                                "model.safetensors.index.json in this directory", path);
        }
    } else if (ends_with(path, ".json")) {
        rc = open_index(st, path);
    } else {
        rc = open_one(st, path);
    }
    if (rc) { mmc_st_close(st); return rc; }
    *out = st;
    return MMC_OK;
}

mmc_status mmc_st_open_memory(const void *buf, size_t n, const char *what, mmc_st **out) {
    *out = NULL;
    mmc_st *st = calloc(1, sizeof *st);
    if (!st) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status rc;
    st_file *f = new_file(st);
    if (!f) rc = mmc_error(MMC_ERR_OOM, "out of memory");
    else if (!(f->path = strdup(what ? what : "<memory>"))) rc = mmc_error(MMC_ERR_OOM, "out of memory");
    else {
        f->map = (void *)buf;
        f->size = n;
        rc = n == 0 ? mmc_error(MMC_ERR_FORMAT, "%s: empty buffer (0 bytes)", f->path)
                    : parse_file(st, f);
    }
    if (rc) { mmc_st_close(st); return rc; }
    *out = st;
    return MMC_OK;
}

mmc_status mmc_st_new_view(mmc_st **out) {
    *out = calloc(1, sizeof **out);
    return *out ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
}

mmc_status mmc_st_add_view(mmc_st *st, const char *name, mmc_dtype dt, int ndim, const int64_t *shape,
                           const void *data) {
    if (table_lookup(st, name) >= 0) return mmc_error(MMC_ERR_FORMAT, "tensor '%s' appears twice", name);
    if (ndim < 0 || ndim > MMC_MAX_DIMS) return mmc_error(MMC_ERR_INVALID, "tensor '%s': %d dims", name, ndim);
    mmc_st_entry e = {.dtype = dt, .ndim = ndim, .data = data};
    size_t n = mmc_dtype_size(dt);
    for (int d = 0; d < ndim; d++) e.shape[d] = shape[d], n *= (size_t)shape[d];
    e.nbytes = n;
    return add_entry(st, name, e);
}

int mmc_st_count(const mmc_st *st) { return st->n; }
const mmc_st_entry *mmc_st_at(const mmc_st *st, int i) {
    return i >= 0 && i < st->n ? &st->entries[i] : NULL;
}

const mmc_st_entry *mmc_st_find(const mmc_st *st, const char *name) {
    int k = table_lookup(st, name);
    return k >= 0 ? &st->entries[k] : NULL;
}

const char *mmc_st_metadata(const mmc_st *st, const char *key) {
    if (st->n_files == 0 || !st->files[0].meta) return NULL;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(st->files[0].meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

mmc_tensor *mmc_st_tensor(const mmc_st *st, const char *name) {
    const mmc_st_entry *e = mmc_st_find(st, name);
    if (!e) {
        mmc_error(MMC_ERR_NOT_FOUND, "tensor '%s' not found", name);
        return NULL;
    }
    size_t esz = mmc_dtype_size(e->dtype);
    if (esz > 1 && ((uintptr_t)e->data % esz) != 0) {
        mmc_error(MMC_ERR_UNSUPPORTED, "tensor '%s': data are not %zu-byte aligned in the file (its "
                  "header was not padded); use mmc_st_read_into", name, esz);
        return NULL;
    }
    mmc_tensor *t = mmc_tensor_wrap(e->dtype, e->ndim, e->shape, (void *)e->data);
    if (t) snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

mmc_status mmc_st_read_into(const mmc_st *st, const char *name, mmc_tensor *dst) {
    const mmc_st_entry *e = mmc_st_find(st, name);
    if (!e) return mmc_error(MMC_ERR_NOT_FOUND, "tensor '%s' not found", name);
    int64_t numel = 1;
    for (int i = 0; i < e->ndim; i++) numel *= e->shape[i];
    mmc_tensor tmp = {.ndim = e->ndim};
    memcpy(tmp.shape, e->shape, sizeof tmp.shape);
    if (numel != mmc_numel(dst) || !mmc_is_contiguous(dst)) {
        char a[128], b[128];
        return mmc_error(MMC_ERR_SHAPE, "tensor '%s': expected shape %s%s, found %s", name,
                         mmc_shape_str(dst, a, sizeof a),
                         mmc_is_contiguous(dst) ? "" : " (contiguous)",
                         mmc_shape_str(&tmp, b, sizeof b));
    }
    if (mmc_dtype_size(dst->dtype) == 0 || dst->device != MMC_CPU)
        return mmc_error(MMC_ERR_UNSUPPORTED, "tensor '%s': cannot convert %s into a %s %s tensor",
                         name, mmc_dtype_name(e->dtype), mmc_dtype_name(dst->dtype),
                         dst->device == MMC_CPU ? "CPU" : "device");
    size_t esz = mmc_dtype_size(e->dtype), dsz = mmc_dtype_size(dst->dtype);
    if (((uintptr_t)e->data % esz) == 0) {
        if (numel) mmc_convert(dst->data, dst->dtype, e->data, e->dtype, numel);
        return MMC_OK;
    }
    /* unaligned data (a writer that does not pad the header): go through an aligned buffer */
    _Alignas(64) unsigned char buf[4096];
    int64_t per = (int64_t)(sizeof buf / esz);
    for (int64_t i = 0; i < numel; i += per) {
        int64_t n = numel - i < per ? numel - i : per;
        memcpy(buf, (const char *)e->data + (size_t)i * esz, (size_t)n * esz);
        mmc_convert((char *)dst->data + (size_t)i * dsz, dst->dtype, buf, e->dtype, n);
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ writer */
typedef struct {
    char *name;
    mmc_dtype dtype;
    int ndim;
    int64_t shape[MMC_MAX_DIMS];
    const void *data;
    size_t nbytes;
} stw_item;

struct mmc_stw {
    stw_item *items;
    int n, cap;
    char **mkeys, **mvals;
    int nm;
};

mmc_stw *mmc_stw_new(void) { return calloc(1, sizeof(mmc_stw)); }

void mmc_stw_free(mmc_stw *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i].name);
    for (int i = 0; i < w->nm; i++) { free(w->mkeys[i]); free(w->mvals[i]); }
    free(w->items);
    free(w->mkeys);
    free(w->mvals);
    free(w);
}

mmc_status mmc_stw_add_raw(mmc_stw *w, const char *name, mmc_dtype dt, int ndim,
                           const int64_t *shape, const void *data) {
    if (!name || !*name) return mmc_error(MMC_ERR_INVALID, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return mmc_error(MMC_ERR_INVALID, "safetensors writer: '__metadata__' is reserved");
    if ((unsigned)dt >= MMC_DTYPE_COUNT || mmc_dtype_size(dt) == 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "safetensors writer: tensor '%s': dtype %s cannot be "
                         "written", name, mmc_dtype_name(dt));
    if (ndim < 0 || ndim > MMC_MAX_DIMS)
        return mmc_error(MMC_ERR_INVALID, "safetensors writer: tensor '%s': %d dims", name, ndim);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return mmc_error(MMC_ERR_INVALID, "safetensors writer: tensor '%s': shape[%d] = %lld",
                             name, i, (long long)shape[i]);
        numel *= (uint64_t)shape[i];
    }
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i].name, name) == 0)
            return mmc_error(MMC_ERR_INVALID, "safetensors writer: tensor '%s' added twice", name);
    if (numel && !data)
        return mmc_error(MMC_ERR_INVALID, "safetensors writer: tensor '%s': no data", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        stw_item *ni = realloc(w->items, (size_t)cap * sizeof *ni);
        if (!ni) return mmc_error(MMC_ERR_OOM, "out of memory");
        w->items = ni;
        w->cap = cap;
    }
    stw_item *it = &w->items[w->n];
    memset(it, 0, sizeof *it);
    if (!(it->name = strdup(name))) return mmc_error(MMC_ERR_OOM, "out of memory");
    it->dtype = dt;
    it->ndim = ndim;
    for (int i = 0; i < ndim; i++) it->shape[i] = shape[i];
    it->data = data;
    it->nbytes = (size_t)numel * mmc_dtype_size(dt);
    w->n++;
    return MMC_OK;
}

mmc_status mmc_stw_add(mmc_stw *w, const char *name, const mmc_tensor *t) {
    if (!mmc_is_contiguous(t) || t->device != MMC_CPU)
        return mmc_error(MMC_ERR_INVALID, "safetensors writer: tensor '%s' must be a contiguous "
                         "CPU tensor", name);
    return mmc_stw_add_raw(w, name, t->dtype, t->ndim, t->shape, t->data);
}

mmc_status mmc_stw_set_metadata(mmc_stw *w, const char *key, const char *value) {
    if (!key || !value) return mmc_error(MMC_ERR_INVALID, "safetensors writer: NULL metadata");
    for (int i = 0; i < w->nm; i++)
        if (strcmp(w->mkeys[i], key) == 0) {
            char *v = strdup(value);
            if (!v) return mmc_error(MMC_ERR_OOM, "out of memory");
            free(w->mvals[i]);
            w->mvals[i] = v;
            return MMC_OK;
        }
    char **nk = realloc(w->mkeys, (size_t)(w->nm + 1) * sizeof *nk);
    if (!nk) return mmc_error(MMC_ERR_OOM, "out of memory");
    w->mkeys = nk;
    char **nv = realloc(w->mvals, (size_t)(w->nm + 1) * sizeof *nv);
    if (!nv) return mmc_error(MMC_ERR_OOM, "out of memory");
    w->mvals = nv;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) { free(k); free(v); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    w->mkeys[w->nm] = k;
    w->mvals[w->nm] = v;
    w->nm++;
    return MMC_OK;
}

/* growable string */
typedef struct { char *s; size_t n, cap; bool oom; } sbuf;
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) { b->oom = true; return; }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
/* JSON string literal, escaped like serde_json (what the Rust writer uses). */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_str(b, esc);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

/* Position of the dtype in the Rust Dtype enum (the writer sorts by it, descending). */
static int dtype_rank(mmc_dtype dt) {
    switch (dt) {
    case MMC_BOOL: return 0;
    case MMC_U8: return 4;
    case MMC_I8: return 5;
    case MMC_F16: return 13;
    case MMC_BF16: return 14;
    case MMC_I32: return 15;
    case MMC_F32: return 17;
    case MMC_F64: return 19;
    case MMC_I64: return 20;
    default: return -1;
    }
}
static int item_cmp(const void *a, const void *b) {
    const stw_item *x = *(const stw_item *const *)a, *y = *(const stw_item *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}
static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static mmc_status write_all(int fd, const void *data, size_t n, const char *tmp) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mmc_error(MMC_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return MMC_OK;
}

static void fsync_dir_of(const char *path) {
    char *dcopy = strdup(path);
    if (!dcopy) return;
    int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    free(dcopy);
}

mmc_status mmc_stw_write(mmc_stw *w, const char *path) {
    mmc_status rc = MMC_OK;
    sbuf h = {0};
    int fd = -1;
    char tmp[4096];
    bool made_tmp = false;
    stw_item **order = malloc((size_t)(w->n ? w->n : 1) * sizeof *order);
    char **mk = malloc((size_t)(w->nm ? w->nm : 1) * sizeof *mk);
    if (!order || !mk) { rc = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 0; i < w->n; i++) order[i] = &w->items[i];
    qsort(order, (size_t)w->n, sizeof *order, item_cmp);
    for (int i = 0; i < w->nm; i++) mk[i] = w->mkeys[i];
    qsort(mk, (size_t)w->nm, sizeof *mk, str_cmp);

    /* header */
    sb_str(&h, "{");
    bool first = true;
    if (w->nm) {
        sb_str(&h, "\"__metadata__\":{");
        for (int i = 0; i < w->nm; i++) {
            const char *v = NULL;
            for (int k = 0; k < w->nm; k++) if (w->mkeys[k] == mk[i]) v = w->mvals[k];
            if (i) sb_str(&h, ",");
            sb_json_str(&h, mk[i]);
            sb_str(&h, ":");
            sb_json_str(&h, v);
        }
        sb_str(&h, "}");
        first = false;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const stw_item *it = order[i];
        char num[64];
        if (!first) sb_str(&h, ",");
        first = false;
        sb_json_str(&h, it->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, mmc_dtype_name(it->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < it->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)it->shape[d]);
            sb_str(&h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + it->nbytes));
        sb_str(&h, num);
        off += it->nbytes;
    }
    sb_str(&h, "}");
    while ((8 + h.n) % 8) sb_str(&h, " ");
    if (h.oom) { rc = mmc_error(MMC_ERR_OOM, "out of memory (safetensors header)"); goto done; }

    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp) {
        rc = mmc_error(MMC_ERR_INVALID, "%s: path too long", path);
        goto done;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = mmc_error(MMC_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    made_tmp = true;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    if ((rc = write_all(fd, len8, 8, tmp))) goto done;
    if ((rc = write_all(fd, h.s, h.n, tmp))) goto done;
    for (int i = 0; i < w->n; i++)
        if (order[i]->nbytes && (rc = write_all(fd, order[i]->data, order[i]->nbytes, tmp))) goto done;
    if (fsync(fd) != 0) {
        rc = mmc_error(MMC_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto done;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = mmc_error(MMC_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        goto done;
    }
    if (rename(tmp, path) != 0) {
        rc = mmc_error(MMC_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
        goto done;
    }
    made_tmp = false;
    fsync_dir_of(path);
done:
    if (fd >= 0) close(fd);
    if (made_tmp) unlink(tmp);
    free(h.s);
    free(order);
    free(mk);
    return rc;
}

/* ------------------------------------------------------------------ files */
char *mmc_next_line(char **cursor, int *lineno) {
    for (char *s = *cursor; s && *s; s = *cursor) {
        char *e = strchr(s, '\n');
        if (e) *e = 0;
        *cursor = e ? e + 1 : NULL;
        (*lineno)++;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s) return s;
    }
    *cursor = NULL;
    return NULL;
}

mmc_status mmc_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    if (len) *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mmc_error(errno == ENOENT ? MMC_ERR_NOT_FOUND : MMC_ERR_IO, "%s: cannot open: %s",
                         path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mmc_error(MMC_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) { close(fd); return mmc_error(MMC_ERR_OOM, "%s: out of memory (%zu bytes)", path, n); }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) { free(buf); return mmc_error(MMC_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n); }
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return MMC_OK;
}

mmc_status mmc_write_file_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp)
        return mmc_error(MMC_ERR_INVALID, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return mmc_error(MMC_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    mmc_status rc = write_all(fd, data, n, tmp);
    if (rc) { close(fd); unlink(tmp); return rc; }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "%s: fsync/close failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return mmc_error(MMC_ERR_IO, "%s: rename failed: %s", path, strerror(e));
    }
    fsync_dir_of(path);
    return MMC_OK;
}
