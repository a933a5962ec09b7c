/* dp_ckpt.c — sharded optimizer checkpoints for ZeRO >= 1 (mmc_dp.h): every rank writes the
 * AdamW moments of its own shard (optimizer.rank<R>-of-<W>.safetensors) in parallel, and rank 0
 * a manifest (optimizer_manifest.json) with the layout — world size, ZeRO stage, the buckets
 * and where each parameter sits in them — so that a later run with any number of ranks or
 * ZeRO stage can reassemble full per-parameter moments and re-cut them (resharding), as
 * DeepSpeed's universal checkpoints / torch.distributed.checkpoint do.
 *
 * Shard file of rank r: for each bucket b and each parameter p intersecting r's range
 * [r*S_b, (r+1)*S_b) of the bucket, the tensors exp_avg.<name> and exp_avg_sq.<name>, 1-D, the
 * elements [lo, hi) of p (lo/hi follow from the manifest). A parameter lives in one bucket,
 * so a name appears at most once per file. */
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

mmc_status mmc_dp_write_manifest(const mmc_dp *d, const char *const *names, const char *dir) {
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

mmc_status mmc_dp_read_sharded_state(const char *dir, const char *const *names, mmc_tensor *const *params, int n,
                                     float **m, float **v) {
    mmc_status st = mmc_dp_check_shards(dir, NULL, NULL);
    if (st) return st;
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer_manifest.json", dir);
    char *text = NULL;
    size_t len = 0;
    if ((st = mmc_read_file(path, &text, &len))) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return mmc_error(MMC_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *buckets = cJSON_GetObjectItemCaseSensitive(root, "buckets");
    const cJSON *plist = cJSON_GetObjectItemCaseSensitive(root, "params");
    const int world = jint(root, "world_size") > 0 ? (int)jint(root, "world_size") : 1;
    int np = cJSON_GetArraySize(plist);
    char *seen = calloc((size_t)n + 1, 1);
    mmc_st **sf = calloc((size_t)world, sizeof *sf);
    if (!seen || !sf) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
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
        int q = -1;
        for (int i = 0; i < n; i++) if (strcmp(names[i], nm->valuestring) == 0) { q = i; break; }
        if (q < 0) continue;   /* not trained in this run: checked below the other way round */
        if (mmc_numel(params[q]) != numel) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: %s has %lld elements in the checkpoint, %lld in the model", path,
                           nm->valuestring, (long long)numel, (long long)mmc_numel(params[q]));
            break;
        }
        seen[q] = 1;
        for (int r = 0; r < world && !st; r++) {
            int64_t lo = r * S, hi = lo + S, a = off, z = off + numel;
            int64_t l = a > lo ? a : lo, h = z < hi ? z : hi;
            if (h <= l) continue;
            int64_t shape[1] = {h - l};
            for (int mv = 0; mv < 2 && !st; mv++) {
                char tn[320];
                snprintf(tn, sizeof tn, "%s.%s", mv ? "exp_avg_sq" : "exp_avg", nm->valuestring);
                mmc_tensor *dst = mmc_tensor_wrap(MMC_F32, 1, shape, (mv ? v[q] : m[q]) + (l - a));
                if (!dst) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
                st = mmc_st_read_into(sf[r], tn, dst);
                mmc_tensor_free(dst);
            }
        }
    }
    for (int i = 0; i < n && !st; i++)
        if (!seen[i])
            st = mmc_error(MMC_ERR_FORMAT, "%s: no optimizer state for %s (was model.freeze or LoRA changed since "
                           "the checkpoint?)", path, names[i]);
done:
    if (sf) for (int r = 0; r < world; r++) mmc_st_close(sf[r]);
    free(sf);
    free(seen);
    cJSON_Delete(root);
    return st;
}
