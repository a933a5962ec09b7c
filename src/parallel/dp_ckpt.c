/* dp_ckpt.c — sharded checkpoints for ZeRO >= 1 (mmc_dp.h): every rank writes the AdamW
 * moments of its own shard (optimizer.rank<R>-of-<W>.safetensors) in parallel — with ZeRO-3
 * its shard of the trainable parameters too, which then exist nowhere else — and rank 0 a
 * manifest (optimizer_manifest.json) with the layout — world size, ZeRO stage, the buckets
 * (ZeRO-3: one per unit) and where each parameter sits in them, its shape and unit — so that
 * a later run with any number of ranks or ZeRO stage can reassemble full per-parameter
 * tensors and re-cut them (resharding), as DeepSpeed's universal checkpoints /
 * torch.distributed.checkpoint do, and `mmc export` can consolidate the model (zero_to_fp32).
 *
 * Shard file of rank r: for each bucket b and each parameter p intersecting r's range
 * [r*S_b, (r+1)*S_b) of the bucket, the tensors exp_avg.<name> and exp_avg_sq.<name> (and
 * ZeRO-3: param.<name>), 1-D, the elements [lo, hi) of p (lo/hi follow from the manifest). A
 * parameter lives in one bucket, so a name appears at most once per file. */
#include "mmc_dp.h"
#include "mmc_io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* d's internals are private to dp.c: this file reads them through mmc_dp_get_layout(). */
void mmc_dp_shard_path(char *buf, size_t cap, const char *dir, int rank, int world) {
    snprintf(buf, cap, "%s/optimizer.rank%d-of-%d.safetensors", dir, rank, world);
}

mmc_status mmc_dp_write_shard(const mmc_dp *d, const char *const *names, const char *dir) {
    mmc_dp_layout L;
    mmc_dp_get_layout(d, &L);
    char path[4096];
    mmc_dp_shard_path(path, sizeof path, dir, L.rank, L.world);
    mmc_stw *w = mmc_stw_new();
    if (!w) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    char name[320];
    for (int j = 0; j < L.n_slices && !st; j++) {
        int64_t shape[1] = {L.slice_numel[j]};
        snprintf(name, sizeof name, "exp_avg.%s", names[L.slice_param[j]]);
        st = mmc_stw_add_raw(w, name, MMC_F32, 1, shape, L.m[j]);
        snprintf(name, sizeof name, "exp_avg_sq.%s", names[L.slice_param[j]]);
        if (!st) st = mmc_stw_add_raw(w, name, MMC_F32, 1, shape, L.v[j]);
        snprintf(name, sizeof name, "param.%s", names[L.slice_param[j]]);
        if (!st && L.p[j]) st = mmc_stw_add_raw(w, name, MMC_F32, 1, shape, L.p[j]);
    }
    char meta[64];
    snprintf(meta, sizeof meta, "%d", L.rank);
    if (!st) st = mmc_stw_set_metadata(w, "rank", meta);
    snprintf(meta, sizeof meta, "%d", L.world);
    if (!st) st = mmc_stw_set_metadata(w, "world_size", meta);
    if (!st) st = mmc_stw_write(w, path);   /* atomic: temporary file, fsync, rename */
    mmc_stw_free(w);
    int rank = L.rank;
    mmc_dp_layout_free(&L);
    return st ? mmc_error_prefix(st, "rank %d: optimizer shard", rank) : MMC_OK;
}

mmc_status mmc_dp_write_manifest(const mmc_dp *d, const char *const *names, mmc_tensor *const *tensors,
                                 const char *dir) {
    mmc_dp_layout L;
    mmc_dp_get_layout(d, &L);
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray(), *buckets = cJSON_CreateArray(),
          *params = cJSON_CreateArray();
    mmc_status st = MMC_OK;
    char *text = NULL;
    if (!root || !files || !buckets || !params) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    cJSON_AddStringToObject(root, "format", "mmc-zero-optimizer-v1");
    cJSON_AddNumberToObject(root, "world_size", L.world);
    cJSON_AddNumberToObject(root, "zero", L.zero);
    cJSON_AddBoolToObject(root, "params_sharded", L.zero == 3);
    for (int r = 0; r < L.world; r++) {
        char p[4096];
        mmc_dp_shard_path(p, sizeof p, ".", r, L.world);
        cJSON_AddItemToArray(files, cJSON_CreateString(p + 2));
    }
    for (int b = 0; b < L.nb; b++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "numel", (double)L.bucket_len[b]);
        cJSON_AddNumberToObject(o, "shard", (double)L.bucket_shard[b]);
        cJSON_AddItemToArray(buckets, o);
    }
    for (int p = 0; p < L.n; p++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", names[p]);
        cJSON_AddNumberToObject(o, "bucket", L.param_bucket[p]);
        cJSON_AddNumberToObject(o, "offset", (double)L.param_off[p]);
        cJSON_AddNumberToObject(o, "numel", (double)L.param_numel[p]);
        cJSON_AddNumberToObject(o, "unit", L.param_unit[p]);
        cJSON *sh = cJSON_CreateArray();
        for (int k = 0; k < tensors[p]->ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)tensors[p]->shape[k]));
        cJSON_AddItemToObject(o, "shape", sh);
        cJSON_AddItemToArray(params, o);
    }
    cJSON_AddItemToObject(root, "files", files);
    cJSON_AddItemToObject(root, "buckets", buckets);
    cJSON_AddItemToObject(root, "params", params);
    files = buckets = params = NULL;
    if (!(text = cJSON_Print(root))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    st = mmc_write_file_atomic(path, text, strlen(text));
done:
    free(text);
    cJSON_Delete(root);
    cJSON_Delete(files);
    cJSON_Delete(buckets);
    cJSON_Delete(params);
    mmc_dp_layout_free(&L);
    return st;
}

bool mmc_dp_checkpoint_sharded(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    return access(path, F_OK) == 0;
}

static int64_t jint(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

mmc_status mmc_dp_check_shards(const char *dir, int *world, int *zero) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    int64_t w = jint(root, "world_size"), z = jint(root, "zero");
    if (w < 1 || !cJSON_IsArray(files) || cJSON_GetArraySize(files) != w) {
        cJSON_Delete(root);
        return mmc_error(MMC_ERR_FORMAT, "%s: world_size and files do not agree", path);
    }
    for (int r = 0; r < w; r++) {
        const cJSON *f = cJSON_GetArrayItem(files, r);
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, cJSON_IsString(f) ? f->valuestring : "?");
        if (access(p, R_OK) != 0) {
            st = mmc_error(MMC_ERR_NOT_FOUND, "%s is incomplete: the optimizer shard of rank %d, %s, is missing "
                           "(the manifest lists %lld shards written by a %lld-rank ZeRO-%lld run); use an earlier "
                           "checkpoint or restore the file", dir, r, cJSON_IsString(f) ? f->valuestring : "?",
                           (long long)w, (long long)w, (long long)z);
            cJSON_Delete(root);
            return st;
        }
    }
    if (world) *world = (int)w;
    if (zero) *zero = (int)z;
    cJSON_Delete(root);
    return MMC_OK;
}

/* The manifest, parsed (caller frees with cJSON_Delete). */
static mmc_status load_manifest(const char *dir, cJSON **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    char *text = NULL;
    size_t len = 0;
    mmc_status st = mmc_read_file(path, &text, &len);
    if (st) return st;
    *out = cJSON_ParseWithLength(text, len);
    free(text);
    return *out ? MMC_OK : mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", path);
}

bool mmc_dp_checkpoint_params_sharded(const char *dir) {
    cJSON *root = NULL;
    if (!mmc_dp_checkpoint_sharded(dir) || load_manifest(dir, &root)) return false;
    bool yes = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "params_sharded"));
    cJSON_Delete(root);
    return yes;
}

/* Reassemble the full tensors "<kind>.<name>" of every listed parameter (want(name) >= 0 gives
 * the destination index q; dst[q] receives numel floats) from every rank's shard. */
typedef int (*want_fn)(void *user, const char *name, int64_t numel, const cJSON *entry);
static mmc_status read_kind(const char *dir, const char *kind, want_fn want, void *user, float **dst) {
    mmc_status st = mmc_dp_check_shards(dir, NULL, NULL);
    if (st) return st;
    cJSON *root = NULL;
    if ((st = load_manifest(dir, &root))) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *buckets = cJSON_GetObjectItemCaseSensitive(root, "buckets");
    const cJSON *plist = cJSON_GetObjectItemCaseSensitive(root, "params");
    const int world = jint(root, "world_size") > 0 ? (int)jint(root, "world_size") : 1;
    int np = cJSON_GetArraySize(plist);
    mmc_st **sf = calloc((size_t)world, sizeof *sf);
    if (!sf) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int r = 0; r < world && !st; r++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, cJSON_GetArrayItem(files, r)->valuestring);
        st = mmc_st_open(p, &sf[r]);
    }
    for (int k = 0; k < np && !st; k++) {
        const cJSON *e = cJSON_GetArrayItem(plist, k);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        int64_t b = jint(e, "bucket"), off = jint(e, "offset"), numel = jint(e, "numel");
        const cJSON *bo = cJSON_GetArrayItem(buckets, (int)b);
        int64_t S = bo ? jint(bo, "shard") : -1;
        if (!cJSON_IsString(nm) || b < 0 || off < 0 || numel < 0 || S <= 0) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: params[%d] is malformed", path, k);
            break;
        }
        int q = want(user, nm->valuestring, numel, e);
        if (q == -2) { st = MMC_ERR_FORMAT; break; }   /* want() set the message */
        if (q < 0) continue;
        for (int r = 0; r < world && !st; r++) {
            int64_t lo = r * S, hi = lo + S, a = off, z = off + numel;
            int64_t l = a > lo ? a : lo, h = z < hi ? z : hi;
            if (h <= l) continue;
            int64_t shape[1] = {h - l};
            char tn[320];
            snprintf(tn, sizeof tn, "%s.%s", kind, nm->valuestring);
            mmc_tensor *t = mmc_tensor_wrap(MMC_F32, 1, shape, dst[q] + (l - a));
            if (!t) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            st = mmc_st_read_into(sf[r], tn, t);
            mmc_tensor_free(t);
        }
    }
done:
    if (sf) for (int r = 0; r < world; r++) mmc_st_close(sf[r]);
    free(sf);
    cJSON_Delete(root);
    return st;
}

typedef struct {
    const char *const *names;
    mmc_tensor *const *params;
    int n;
    char *seen;
    const char *path;
} want_named;

static int want_by_name(void *user, const char *name, int64_t numel, const cJSON *e) {
    (void)e;
    want_named *w = user;
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->names[i], name) == 0) {
            if (mmc_numel(w->params[i]) != numel) {
                mmc_error(MMC_ERR_FORMAT, "%s: %s has %lld elements in the checkpoint, %lld in the model", w->path,
                          name, (long long)numel, (long long)mmc_numel(w->params[i]));
                return -2;
            }
            w->seen[i] = 1;
            return i;
        }
    return -1;   /* not trained in this run: checked below the other way round */
}

static mmc_status read_named(const char *dir, const char *kind, const char *const *names, mmc_tensor *const *params,
                             int n, float **dst) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    want_named w = {names, params, n, calloc((size_t)n + 1, 1), path};
    if (!w.seen) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = read_kind(dir, kind, want_by_name, &w, dst);
    for (int i = 0; i < n && !st; i++)
        if (!w.seen[i])
            st = mmc_error(MMC_ERR_FORMAT, "%s: no %s state for %s (was model.freeze or LoRA changed since the "
                           "checkpoint?)", path, kind, names[i]);
    free(w.seen);
    return st;
}

mmc_status mmc_dp_read_sharded_state(const char *dir, const char *const *names, mmc_tensor *const *params, int n,
                                     float **m, float **v) {
    mmc_status st = read_named(dir, "exp_avg", names, params, n, m);
    return st ? st : read_named(dir, "exp_avg_sq", names, params, n, v);
}

mmc_status mmc_dp_read_sharded_params(const char *dir, const char *const *names, mmc_tensor *const *params, int n) {
    float **dst = calloc((size_t)n + 1, sizeof *dst);
    if (!dst) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < n; i++) {
        MMC_CHECK(params[i]->dtype == MMC_F32 && params[i]->data, "dp: %s must be a full f32 tensor", names[i]);
        dst[i] = params[i]->data;
    }
    mmc_status st = read_named(dir, "param", names, params, n, dst);
    free(dst);
    return st;
}

/* consolidation: every manifest parameter, full, with its shape */
typedef struct {
    int n;
    char **names;
    int *ndim;
    int64_t (*shape)[MMC_MAX_DIMS];
    float **data;
    const char *path;
} want_all;

static int want_every(void *user, const char *name, int64_t numel, const cJSON *e) {
    want_all *w = user;
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    int nd = cJSON_GetArraySize(sh);
    int64_t prod = 1;
    if (!cJSON_IsArray(sh) || nd < 1 || nd > MMC_MAX_DIMS) {
        mmc_error(MMC_ERR_FORMAT, "%s: %s has no valid shape", w->path, name);
        return -2;
    }
    for (int k = 0; k < nd; k++) {
        const cJSON *x = cJSON_GetArrayItem(sh, k);
        w->shape[w->n][k] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -1;
        prod *= w->shape[w->n][k];
    }
    if (prod != numel) {
        mmc_error(MMC_ERR_FORMAT, "%s: %s: shape and numel (%lld) disagree", w->path, name, (long long)numel);
        return -2;
    }
    w->ndim[w->n] = nd;
    w->names[w->n] = strdup(name);
    w->data[w->n] = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
    if (!w->names[w->n] || !w->data[w->n]) { mmc_error(MMC_ERR_OOM, "out of memory"); return -2; }
    return w->n++;
}

mmc_status mmc_dp_consolidate(const char *dir, const char *out_path, int *n_tensors) {
    cJSON *root = NULL;
    mmc_status st = load_manifest(dir, &root);
    if (st) return st;
    int np = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "params"));
    cJSON_Delete(root);
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    want_all w = {0, calloc((size_t)np + 1, sizeof(char *)), calloc((size_t)np + 1, sizeof(int)),
                  calloc((size_t)np + 1, sizeof *w.shape), calloc((size_t)np + 1, sizeof(float *)), path};
    mmc_st *frozen = NULL;
    mmc_stw *wr = mmc_stw_new();
    if (!w.names || !w.ndim || !w.shape || !w.data || !wr) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if ((st = read_kind(dir, "param", want_every, &w, w.data))) goto done;
    /* the parameters that were not trained (not sharded) are whole in model.frozen.safetensors */
    snprintf(path, sizeof path, "%s/model.frozen.safetensors", dir);
    if (access(path, R_OK) == 0) {
        if ((st = mmc_st_open(path, &frozen))) goto done;
        for (int i = 0; i < mmc_st_count(frozen) && !st; i++) {
            const mmc_st_entry *e = mmc_st_at(frozen, i);
            st = mmc_stw_add_raw(wr, e->name, e->dtype, e->ndim, e->shape, e->data);
        }
    }
    for (int i = 0; i < w.n && !st; i++) st = mmc_stw_add_raw(wr, w.names[i], MMC_F32, w.ndim[i], w.shape[i], w.data[i]);
    if (!st) st = mmc_stw_set_metadata(wr, "format", "pt");
    if (!st) st = mmc_stw_write(wr, out_path);
    if (n_tensors) *n_tensors = w.n + (frozen ? mmc_st_count(frozen) : 0);
done:
    mmc_stw_free(wr);
    mmc_st_close(frozen);
    for (int i = 0; i < w.n; i++) { free(w.names[i]); free(w.data[i]); }
    free(w.names);
    free(w.ndim);
    free(w.shape);
    free(w.data);
    return st;
}
