/* safetensors.c — reader (mmap, zero-copy) and atomic writer for the safetensors format
 * (https://github.com/huggingface/safetensors: 8-byte little-endian header length N, N
 * bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {}},
 * then the data buffer; offsets are relative to the buffer start).
 *
 * Sharded checkpoints are opened through model.safetensors.index.json ("weight_map":
 * name -> shard file); all shards are mapped and their entries merged. */
#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *path;
    void *map;
    size_t size;
    cJSON *meta;      /* __metadata__ object (owned by header tree) */
    cJSON *header;
} st_file;

struct mmc_st {
    st_file *files;
    int n_files;
    mmc_st_entry *entries;
    char **names;     /* owned copies of entry names */
    int n, cap;
};

static void st_file_close(st_file *f) {
    if (f->map && f->map != MAP_FAILED) munmap(f->map, f->size);
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
    free(st);
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
    st->names[st->n] = strdup(name);
    if (!st->names[st->n]) return mmc_error(MMC_ERR_OOM, "out of memory");
    e.name = st->names[st->n];
    st->entries[st->n++] = e;
    return MMC_OK;
}

/* Parse one mapped file's header and append its entries. */
static mmc_status parse_file(mmc_st *st, st_file *f) {
    const char *p = f->path;
    if (f->size < 8)
        return mmc_error(MMC_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length",
                         p, f->size);
    uint64_t hlen = 0;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->size - 8)
        return mmc_error(MMC_ERR_FORMAT, "%s: header length %llu exceeds the file size %zu (truncated file?)",
                         p, (unsigned long long)hlen, f->size);
    if (hlen > (100u << 20))
        return mmc_error(MMC_ERR_FORMAT, "%s: header length %llu is over the 100 MiB limit", p,
                         (unsigned long long)hlen);
    const char *hdr = (const char *)f->map + 8;
    const char *end = NULL;
    f->header = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!f->header) {
        size_t off = end ? (size_t)(end - hdr) : 0;
        return mmc_error(MMC_ERR_FORMAT, "%s: header JSON is invalid near byte %zu", p, off + 8);
    }
    if (!cJSON_IsObject(f->header))
        return mmc_error(MMC_ERR_FORMAT, "%s: header is not a JSON object", p);
    size_t data_len = f->size - 8 - (size_t)hlen;
    const char *data = hdr + hlen;
    for (cJSON *it = f->header->child; it; it = it->next) {
        const char *name = it->string;
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(it))
                return mmc_error(MMC_ERR_FORMAT, "%s: __metadata__ is not an object", p);
            for (cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m))
                    return mmc_error(MMC_ERR_FORMAT, "%s: __metadata__.%s is not a string", p, m->string);
            f->meta = it;
            continue;
        }
        if (!cJSON_IsObject(it))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': entry is not an object", p, name);
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': needs string 'dtype', array 'shape' and "
                             "array 'data_offsets'", p, name);
        mmc_st_entry e = {0};
        if (mmc_dtype_parse(jd->valuestring, &e.dtype) != MMC_OK)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype '%s'", p, name,
                             jd->valuestring);
        int nd = cJSON_GetArraySize(js);
        if (nd > MMC_MAX_DIMS)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: tensor '%s': %d dims (at most %d supported)", p,
                             name, nd, MMC_MAX_DIMS);
        e.ndim = nd;
        uint64_t numel = 1;
        int d = 0;
        for (cJSON *s = js->child; s; s = s->next, d++) {
            if (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble > 9.0e15 ||
                s->valuedouble != (double)(int64_t)s->valuedouble)
                return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                 p, name, d);
            e.shape[d] = (int64_t)s->valuedouble;
            if (e.shape[d] && numel > UINT64_MAX / (uint64_t)e.shape[d])
                return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': shape overflows", p, name);
            numel *= (uint64_t)e.shape[d];
        }
        if (cJSON_GetArraySize(jo) != 2 || !cJSON_IsNumber(jo->child) || !cJSON_IsNumber(jo->child->next))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", p, name);
        double b = jo->child->valuedouble, en = jo->child->next->valuedouble;
        if (b < 0 || en < b || en > (double)data_len || b != (double)(uint64_t)b || en != (double)(uint64_t)en)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the "
                             "%zu-byte data buffer", p, name, b, en, data_len);
        size_t esz = mmc_dtype_size(e.dtype);
        if (esz == 0 || numel > UINT64_MAX / esz || (uint64_t)(en - b) != numel * esz)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets "
                             "span %.0f", p, name, jd->valuestring,
                             (unsigned long long)(numel * (esz ? esz : 1)), en - b);
        e.data = data + (size_t)b;
        e.nbytes = (size_t)(en - b);
        if (mmc_st_find(st, name))
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s' appears twice", p, name);
        mmc_status rc = add_entry(st, name, e);
        if (rc) return rc;
    }
    return MMC_OK;
}

static mmc_status map_file(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return mmc_error(MMC_ERR_OOM, "out of memory");
    int fd = open(path, O_RDONLY);
    if (fd < 0) return mmc_error(MMC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
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
        return mmc_error(MMC_ERR_FORMAT, "%s: empty file", path);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return mmc_error(MMC_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    }
    return MMC_OK;
}

static mmc_status open_one(mmc_st *st, const char *path) {
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) return mmc_error(MMC_ERR_OOM, "out of memory");
    st->files = nf;
    st_file *f = &st->files[st->n_files++];
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
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) return mmc_error(MMC_ERR_FORMAT, "%s: invalid JSON", path);
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return mmc_error(MMC_ERR_FORMAT, "%s: no 'weight_map' object", path);
    }
    char *dir_copy = strdup(path);
    const char *dir = dirname(dir_copy);
    /* distinct shard names, in order of first appearance */
    for (cJSON *it = wm->child; it && rc == MMC_OK; it = it->next) {
        if (!cJSON_IsString(it)) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: weight_map['%s'] is not a string", path, it->string);
            break;
        }
        if (strchr(it->valuestring, '/') || strstr(it->valuestring, "..")) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: shard name '%s' must be a plain file name", path,
                           it->valuestring);
            break;
        }
        bool seen = false;
        for (cJSON *p = wm->child; p != it; p = p->next)
            if (strcmp(p->valuestring, it->valuestring) == 0) { seen = true; break; }
        if (seen) continue;
        char shard[4096];
        snprintf(shard, sizeof shard, "%s/%s", dir, it->valuestring);
        rc = open_one(st, shard);
    }
    /* every mapped name must be present */
    for (cJSON *it = wm->child; it && rc == MMC_OK; it = it->next)
        if (!mmc_st_find(st, it->string))
            rc = mmc_error(MMC_ERR_NOT_FOUND, "%s: tensor '%s' is listed for shard %s but not in it",
                           path, it->string, it->valuestring);
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
        rc = mmc_error(MMC_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors", path);
        if (access(p, R_OK) == 0) rc = open_one(st, p);
        else {
            snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
            if (access(p, R_OK) == 0) rc = open_index(st, p);
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

int mmc_st_count(const mmc_st *st) { return st->n; }
const mmc_st_entry *mmc_st_at(const mmc_st *st, int i) {
    return i >= 0 && i < st->n ? &st->entries[i] : NULL;
}

const mmc_st_entry *mmc_st_find(const mmc_st *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->entries[i].name, name) == 0) return &st->entries[i];
    return NULL;
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
    mmc_tensor *t = mmc_tensor_wrap(e->dtype, e->ndim, e->shape, (void *)e->data);
    if (t) snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

mmc_status mmc_st_read_into(const mmc_st *st, const char *name, mmc_tensor *dst) {
    const mmc_st_entry *e = mmc_st_find(st, name);
    if (!e) return mmc_error(MMC_ERR_NOT_FOUND, "tensor '%s' not found", name);
    int64_t numel = 1;
    for (int i = 0; i < e->ndim; i++) numel *= e->shape[i];
    if (numel != mmc_numel(dst) || !mmc_is_contiguous(dst)) {
        char a[128], b[128];
        mmc_tensor tmp = {.ndim = e->ndim};
        memcpy(tmp.shape, e->shape, sizeof tmp.shape);
        return mmc_error(MMC_ERR_SHAPE, "tensor '%s': expected shape %s, found %s", name,
                         mmc_shape_str(dst, a, sizeof a), mmc_shape_str(&tmp, b, sizeof b));
    }
    mmc_convert(dst->data, dst->dtype, e->data, e->dtype, numel);
    return MMC_OK;
}

/* ------------------------------------------------------------------ files */
mmc_status mmc_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return mmc_error(MMC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return mmc_error(MMC_ERR_IO, "%s: cannot seek", path); }
    long n = ftell(f);
    if (n < 0) { fclose(f); return mmc_error(MMC_ERR_IO, "%s: cannot tell size", path); }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) { fclose(f); return mmc_error(MMC_ERR_OOM, "%s: out of memory (%ld bytes)", path, n); }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); return mmc_error(MMC_ERR_IO, "%s: short read", path); }
    buf[n] = 0;
    *data = buf;
    if (len) *len = (size_t)n;
    return MMC_OK;
}

mmc_status mmc_write_file_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return mmc_error(MMC_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return mmc_error(MMC_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
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
    char *dcopy = strdup(path);
    if (dcopy) {
        int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
        free(dcopy);
    }
    return MMC_OK;
}
