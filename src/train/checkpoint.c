/* checkpoint.c — training checkpoints: output_dir/checkpoint-<step>/ holds the model as a
 * Hugging Face directory (config.json, model.safetensors, tokenizer and processor files)
 * plus trainer_state.json (step, schedule, RNG, data position) and optimizer.safetensors
 * (AdamW m/v and, for bf16 weights, the fp32 masters). Everything is written into
 * output_dir/.tmp-checkpoint-<step>-<pid>, fsynced, and renamed into place, so a checkpoint
 * directory either exists complete or not at all; a failed save (full disk, unwritable
 * directory) removes its temporary directory and leaves the earlier checkpoints alone.
 * This mirrors HF Trainer's checkpoint-<step> layout (trainer_state.json, optimizer state
 * next to the model) with an atomic rename on top. */
#include "trainer_internal.h"

/* paths are bounded by PATH_MAX in practice; snprintf truncation is checked by the OS calls */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb; (void)flag; (void)f;
    return remove(p);
}

mmc_status mmc_rm_rf(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return MMC_OK;
    if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return mmc_error(MMC_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return MMC_OK;
}

mmc_status mmc_mkdir_p(const char *path) {
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mmc_error(MMC_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mmc_error(MMC_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    if (access(buf, W_OK) != 0)
        return mmc_error(MMC_ERR_IO, "%s: directory is not writable: %s", buf, strerror(errno));
    return MMC_OK;
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

mmc_status mmc_copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t n = 0;
    mmc_status st = mmc_read_file(from, &data, &n);
    if (st) return st;
    st = mmc_write_file_atomic(to, data, n);
    free(data);
    return st;
}

/* step of "checkpoint-<digits>", or -1 */
static int64_t ckpt_step(const char *name) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    char *end;
    long long v = strtoll(name + 11, &end, 10);
    return *end || v < 0 ? -1 : (int64_t)v;
}

/* All complete checkpoints (with trainer_state.json), ascending by step. */
static int list_ckpts(const char *dir, int64_t **steps) {
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ckpt_step(e->d_name);
        if (s < 0) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s/trainer_state.json", dir, e->d_name);
        if (access(p, R_OK) != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *ns = realloc(*steps, (size_t)cap * sizeof *ns);
            if (!ns) break;
            *steps = ns;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t x = (*steps)[j]; (*steps)[j] = (*steps)[j - 1]; (*steps)[j - 1] = x;
        }
    return n;
}

mmc_status mmc_checkpoint_latest(const char *dir, int64_t *step, char *path, size_t cap) {
    int64_t *s;
    int n = list_ckpts(dir, &s);
    *step = 0;
    if (n == 0) { free(s); return mmc_error(MMC_ERR_NOT_FOUND, "no checkpoint in %s", dir); }
    *step = s[n - 1];
    snprintf(path, cap, "%s/checkpoint-%lld", dir, (long long)s[n - 1]);
    free(s);
    return MMC_OK;
}

static const char *const k_aux_files[] = {
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer.model",
    "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
    "video_preprocessor_config.json", "processor_config.json", "generation_config.json", NULL,
};

/* Every parameter under its HF name (t->names), in dtype dt (F32 / BF16); frozen_only: only
 * those that are not trained. */
static mmc_status save_weights(mmc_trainer *t, const char *path, mmc_dtype dt, bool frozen_only) {
    mmc_stw *w = mmc_stw_new();
    void **tmp = calloc((size_t)t->n_params + 1, sizeof *tmp);
    mmc_status st = MMC_OK;
    if (!w || !tmp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 0; i < t->n_params; i++) {
        const mmc_tensor *p = t->params[i];
        if (frozen_only && (p->flags & MMC_REQUIRES_GRAD)) continue;
        if (p->dtype == dt) {
            if ((st = mmc_stw_add(w, t->names[i], p))) goto done;
            continue;
        }
        /* bf16 runs keep 1-D norms / biases f32 in memory: they are written in dt too */
        int64_t n = mmc_numel(p);
        tmp[i] = malloc((size_t)n * mmc_dtype_size(dt) + 64);
        if (!tmp[i]) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        mmc_convert(tmp[i], dt, p->data, p->dtype, n);
        if ((st = mmc_stw_add_raw(w, t->names[i], dt, p->ndim, p->shape, tmp[i]))) goto done;
    }
    if ((st = mmc_stw_set_metadata(w, "format", "pt"))) goto done;
    st = mmc_stw_write(w, path);
done:
    if (tmp) for (int i = 0; i < t->n_params; i++) free(tmp[i]);
    free(tmp);
    mmc_stw_free(w);
    return st;
}

/* preprocessor_config.json with the image processor the run trained with (min/max_pixels
 * included), in the layout transformers' Qwen2VLImageProcessor reads, so that `mmc eval`,
 * `mmc generate --image` and transformers preprocess images as training did. */
static mmc_status write_preprocessor(mmc_trainer *t, const char *path) {
    const mmc_qwen2vl_proc *p = &t->dopts.proc;
    char js[2048];
    int n = snprintf(js, sizeof js,
                     "{\n  \"image_processor_type\": \"Qwen2VLImageProcessor\",\n  \"processor_class\": \"%s\",\n"
                     "  \"do_resize\": %s,\n  \"do_rescale\": %s,\n  \"do_normalize\": %s,\n  \"do_convert_rgb\": true,\n"
                     "  \"resample\": %d,\n  \"rescale_factor\": %.17g,\n"
                     "  \"image_mean\": [%.9g, %.9g, %.9g],\n  \"image_std\": [%.9g, %.9g, %.9g],\n"
                     "  \"min_pixels\": %lld,\n  \"max_pixels\": %lld,\n"
                     "  \"size\": {\"shortest_edge\": %lld, \"longest_edge\": %lld},\n"
                     "  \"patch_size\": %d,\n  \"merge_size\": %d,\n  \"temporal_patch_size\": %d\n}\n",
                     t->vl && t->vl->arch == MMC_VL_QWEN2_5 ? "Qwen2_5_VLProcessor" : "Qwen2VLProcessor",
                     p->do_resize ? "true" : "false", p->do_rescale ? "true" : "false",
                     p->do_normalize ? "true" : "false", p->resample == MMC_RESAMPLE_BILINEAR ? 2 : 3,
                     p->rescale_factor, p->image_mean[0], p->image_mean[1], p->image_mean[2], p->image_std[0],
                     p->image_std[1], p->image_std[2], (long long)p->min_pixels, (long long)p->max_pixels,
                     (long long)p->min_pixels, (long long)p->max_pixels, p->patch_size, p->merge_size,
                     p->temporal_patch_size);
    return mmc_write_file_atomic(path, js, (size_t)n);
}

/* processor_config.json (copied from the model) with an "image_processor" object: transformers
 * and mmc_qwen2vl_proc_load_dir read that object before preprocessor_config.json, so it gets
 * the trained image area (size and the legacy min/max_pixels) too; the rest came from it. */
static mmc_status sync_processor_config(mmc_trainer *t, const char *path) {
    const mmc_qwen2vl_proc *p = &t->dopts.proc;
    char *out = NULL;
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    cJSON *root = (cJSON *)j;
    cJSON *ip = cJSON_GetObjectItemCaseSensitive(root, "image_processor");
    if (!cJSON_IsObject(ip)) goto done;   /* (the reader rejected a malformed one at start) */
    cJSON *size = cJSON_CreateObject();
    if (!size || !cJSON_AddNumberToObject(size, "shortest_edge", (double)p->min_pixels) ||
        !cJSON_AddNumberToObject(size, "longest_edge", (double)p->max_pixels)) {
        cJSON_Delete(size);
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto done;
    }
    if (cJSON_HasObjectItem(ip, "size")) cJSON_ReplaceItemInObjectCaseSensitive(ip, "size", size);
    else cJSON_AddItemToObject(ip, "size", size);
    if (cJSON_HasObjectItem(ip, "min_pixels"))
        cJSON_ReplaceItemInObjectCaseSensitive(ip, "min_pixels", cJSON_CreateNumber((double)p->min_pixels));
    if (cJSON_HasObjectItem(ip, "max_pixels"))
        cJSON_ReplaceItemInObjectCaseSensitive(ip, "max_pixels", cJSON_CreateNumber((double)p->max_pixels));
    out = cJSON_Print(root);
    st = out ? mmc_write_file_atomic(path, out, strlen(out)) : mmc_error(MMC_ERR_OOM, "out of memory");
done:
    cJSON_free(out);
    mmc_json_free(j);
    return st;
}

static mmc_status write_state(mmc_trainer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    mmc_stw *w = mmc_stw_new();
    if (!w) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    /* ZeRO >= 1: the moments are in the ranks' shard files (optimizer.rank<R>-of-<W>) */
    const bool sharded = mmc_trainer_state_sharded(t);
    for (int i = 0; i < t->n_opt && !st; i++) {
        const mmc_tensor *p = t->opt[i];
        char name[256];
        snprintf(name, sizeof name, "exp_avg.%s", t->opt_names[i]);
        if (!sharded) st = mmc_stw_add_raw(w, name, MMC_F32, p->ndim, p->shape, t->adamw.m[i]);
        snprintf(name, sizeof name, "exp_avg_sq.%s", t->opt_names[i]);
        if (!st && !sharded) st = mmc_stw_add_raw(w, name, MMC_F32, p->ndim, p->shape, t->adamw.v[i]);
        if (!st && t->opt[i] != t->opt_model[i] && p->data) {   /* (ZeRO-3: the masters are the shards) */
            snprintf(name, sizeof name, "master.%s", t->opt_names[i]);
            st = mmc_stw_add(w, name, p);
        }
    }
    /* LoRA adapters, exactly (the PEFT files hold them too, but resume reads these) */
    for (int i = 0; t->lora && i < t->lora->n_params && !st; i++) {
        char name[256];
        snprintf(name, sizeof name, "lora.%s", t->lora_names[i]);
        st = mmc_stw_add(w, name, t->lora->params[i]);
    }
    /* bf16 runs write the HF model in bf16: keep the exact f32 values of the parameters that
     * stay f32 in memory (norms, biases), trainable or not, so a resume is bit-identical
     * (ZeRO-3: sharded ones are not here — their values are in the shards, or in model.path
     * for a LoRA run's base) */
    if (t->cfg->model.dtype == MMC_RUN_BF16)
        for (int i = 0; i < t->n_params && !st; i++)
            if (t->params[i]->dtype == MMC_F32 && t->params[i]->data) {
                char name[256];
                snprintf(name, sizeof name, "master.%s", t->names[i]);
                st = mmc_stw_add(w, name, t->params[i]);
            }
    if (!st) st = mmc_stw_write(w, path);
    mmc_stw_free(w);
    if (!st && sharded) st = mmc_dp_write_manifest(t->dp, t->opt_names, t->opt, dir);
    if (st) return st;
    char js[1536];
    mmc_loader_state ls = {0};
    if (t->src.kind == SRC_LOADER) ls = mmc_loader_state_get(t->src.loader);
    int n = snprintf(js, sizeof js,
                     "{\n  \"global_step\": %lld,\n  \"adamw_step\": %lld,\n  \"rng_seed\": \"%" PRIu64 "\",\n"
                     "  \"rng_offset\": \"%" PRIu64 "\",\n  \"data_position\": %lld,\n  \"data_source\": \"%s\",\n"
                     "  \"loader_epoch\": %lld,\n  \"loader_position\": %lld,\n  \"loader_batch_in_window\": %lld,\n"
                     "  \"loader_skipped\": %lld,\n"
                     "  \"lr\": %.17g,\n  \"schedule\": %d,\n  \"warmup_steps\": %lld,\n  \"total_steps\": %lld\n}\n",
                     (long long)t->step, (long long)(sharded ? mmc_dp_adamw_step(t->dp) : t->adamw.step), t->rng.seed, t->rng.offset,
                     (long long)t->src.position,
                     t->src.kind == SRC_FIXED ? "fixed" : t->src.kind == SRC_LOADER ? "dataset" : "synthetic",
                     (long long)ls.epoch, (long long)ls.position, (long long)ls.batch_in_window, (long long)ls.skipped,
                     mmc_schedule_lr(&t->sched, t->step > 0 ? t->step - 1 : 0), (int)t->sched.kind,
                     (long long)t->sched.warmup_steps, (long long)t->sched.total_steps);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    return mmc_write_file_atomic(path, js, (size_t)n);
}

static void prune(mmc_trainer *t) {
    int64_t keep = t->cfg->training.keep_last;
    if (keep <= 0) return;
    int64_t *s;
    int n = list_ckpts(t->cfg->training.output_dir, &s);
    for (int i = 0; i + keep < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/checkpoint-%lld", t->cfg->training.output_dir, (long long)s[i]);
        mmc_rm_rf(p);
    }
    free(s);
}

void mmc_checkpoint_tmp_dir(const mmc_trainer *t, int64_t token, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/.tmp-checkpoint-%lld-%lld", t->cfg->training.output_dir, (long long)t->step,
             (long long)token);
}

mmc_status mmc_checkpoint_begin(mmc_trainer *t, int64_t token) {
    char tmp[4096];
    mmc_status st = mmc_mkdir_p(t->cfg->training.output_dir);
    if (st) return mmc_error_prefix(st, "saving checkpoint-%lld", (long long)t->step);
    mmc_checkpoint_tmp_dir(t, token, tmp, sizeof tmp);
    mmc_rm_rf(tmp);
    if (mkdir(tmp, 0755) != 0)
        return mmc_error(MMC_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return MMC_OK;
}

mmc_status mmc_trainer_save(mmc_trainer *t) { return mmc_checkpoint_finish(t, -1); }

mmc_status mmc_checkpoint_finish(mmc_trainer *t, int64_t token) {
    const char *out = t->cfg->training.output_dir;
    char tmp[4096], final[4096], old[4096], path[4096];
    mmc_status st;
    if (token < 0) {   /* one process: make the temporary directory here */
        token = getpid();
        if ((st = mmc_checkpoint_begin(t, token))) return st;
    }
    mmc_checkpoint_tmp_dir(t, token, tmp, sizeof tmp);
    snprintf(final, sizeof final, "%s/checkpoint-%lld", out, (long long)t->step);
    if (mmc_trainer_diffusion(t)) {
        /* diffusers' layouts: the LoRA file load_lora_weights reads, or the transformer folder */
        if ((st = mmc_trainer_flux_save(t, tmp))) goto fail;
    } else if (t->lora) {
        /* PEFT's checkpoint layout: the adapters only (the base is model.path; `mmc merge`
         * folds them into it, and mmc eval/generate/forward load it as base + adapter). The
         * base is recorded as an absolute path, as PEFT records the path it was given, so
         * the checkpoint finds its base from any working directory. */
        char base_abs[PATH_MAX];
        const char *base = t->cfg->model.path;
        if (base && realpath(base, base_abs)) base = base_abs;
        if ((st = mmc_lora_save(t->lora, tmp, base))) goto fail;
    } else if (mmc_trainer_params_in_shards(t)) {
        /* ZeRO-3: the trained parameters are in the ranks' shards; the rest whole here
         * (`mmc export` consolidates both into model.safetensors) */
        snprintf(path, sizeof path, "%s/model.frozen.safetensors", tmp);
        if ((st = save_weights(t, path, MMC_F32, true))) goto fail;
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if ((st = mmc_write_file_atomic(path, t->config_text, t->config_len))) goto fail;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        if ((st = save_weights(t, path, t->cfg->model.dtype == MMC_RUN_BF16 ? MMC_BF16 : MMC_F32, false))) goto fail;
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if ((st = mmc_write_file_atomic(path, t->config_text, t->config_len))) goto fail;
    }
    if (t->src_dir[0])
        for (int i = 0; k_aux_files[i]; i++) {
            char from[4096];
            snprintf(from, sizeof from, "%s/%s", t->src_dir, k_aux_files[i]);
            if (access(from, R_OK) != 0) continue;
            snprintf(path, sizeof path, "%s/%s", tmp, k_aux_files[i]);
            if ((st = mmc_copy_file(from, path))) goto fail;
        }
    if (t->src.kind == SRC_LOADER && !t->llava && !t->internvl) {   /* (LLaVA's / InternVL's processor files are copied as they are) */
        snprintf(path, sizeof path, "%s/preprocessor_config.json", tmp);
        /* (Qwen2.5-Omni's processor_config.json holds its three processors; a preprocessor_config.json
         * of the image processor alone would be read as the audio feature extractor's) */
        if (!t->omni && (st = write_preprocessor(t, path))) goto fail;
        snprintf(path, sizeof path, "%s/processor_config.json", tmp);
        if (access(path, F_OK) == 0 && (st = sync_processor_config(t, path))) goto fail;
    }
    if ((st = write_state(t, tmp))) goto fail;
    if (t->ema) {   /* the EMA of the trained weights, under their names (LoRA: the adapter's) */
        mmc_stw *w = mmc_stw_new();
        if (!w) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
        for (int i = 0; i < t->n_opt && !st; i++)
            st = mmc_stw_add_raw(w, t->opt_names[i], MMC_F32, t->opt[i]->ndim, t->opt[i]->shape, t->ema[i]);
        if (!st) st = mmc_stw_set_metadata(w, "format", "pt");
        snprintf(path, sizeof path, "%s/ema.safetensors", tmp);
        if (!st) st = mmc_stw_write(w, path);
        mmc_stw_free(w);
        if (st) goto fail;
    }
    if (t->n_hist > 0) {
        snprintf(path, sizeof path, "%s/loss.png", tmp);
        mmc_status pst = mmc_plot_loss_lr(path, t->h_step, t->h_loss, t->h_lr, t->n_hist);
        if (pst && pst != MMC_ERR_UNSUPPORTED) { st = pst; goto fail; }
        char top[4096];
        snprintf(top, sizeof top, "%s/loss.png", out);
        if (!pst) mmc_copy_file(path, top);
    }
    fsync_path(tmp);
    old[0] = 0;
    if (access(final, F_OK) == 0) {   /* re-saving a step (e.g. the end of a resumed run) */
        snprintf(old, sizeof old, "%s/.old-checkpoint-%lld-%d", out, (long long)t->step, (int)getpid());
        if (rename(final, old) != 0) {
            st = mmc_error(MMC_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
            goto fail;
        }
    }
    if (rename(tmp, final) != 0) {
        st = mmc_error(MMC_ERR_IO, "%s: cannot rename into place: %s", final, strerror(errno));
        if (old[0]) rename(old, final);
        goto fail;
    }
    fsync_path(out);
    if (old[0]) mmc_rm_rf(old);
    prune(t);
    return MMC_OK;
fail:
    mmc_rm_rf(tmp);
    return mmc_error_prefix(st, "saving checkpoint-%lld in %s (earlier checkpoints are intact)",
                            (long long)t->step, out);
}

mmc_status mmc_trainer_restore(mmc_trainer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    int64_t step = 0, astep = 0, pos = 0;
    const char *seed = "0", *off = "0";
    if ((st = mmc_json_int(j, "global_step", 0, &step)) || (st = mmc_json_int(j, "adamw_step", 0, &astep)) ||
        (st = mmc_json_int(j, "data_position", 0, &pos)) || (st = mmc_json_str(j, "rng_seed", "0", &seed)) ||
        (st = mmc_json_str(j, "rng_offset", "0", &off))) {
        mmc_json_free(j);
        return mmc_error_prefix(st, "%s", path);
    }
    t->step = step;
    t->adamw.step = astep;
    t->src.position = pos;
    if (t->src.kind == SRC_LOADER) {
        mmc_loader_state ls = {0};
        if ((st = mmc_json_int(j, "loader_epoch", 0, &ls.epoch)) ||
            (st = mmc_json_int(j, "loader_position", 0, &ls.position)) ||
            (st = mmc_json_int(j, "loader_batch_in_window", 0, &ls.batch_in_window)) ||
            (st = mmc_json_int(j, "loader_skipped", 0, &ls.skipped)) ||
            (st = mmc_loader_restore(t->src.loader, &ls))) {
            mmc_json_free(j);
            return mmc_error_prefix(st, "%s: data loader state", path);
        }
    }
    t->rng.seed = strtoull(seed, NULL, 10);
    t->rng.offset = strtoull(off, NULL, 10);
    mmc_json_free(j);
    /* ZeRO checkpoints: the moments come from every rank's shard, whatever the number of ranks
     * or the stage that wrote them (re-cut by mmc_dp_scatter_state afterwards) */
    const bool sharded = mmc_dp_checkpoint_sharded(dir);
    if (sharded && (st = mmc_dp_read_sharded_state(dir, t->opt_names, t->opt, t->n_opt, t->adamw.m, t->adamw.v)))
        return mmc_error_prefix(st, "--resume");
    /* (a ZeRO-3 LoRA checkpoint shards only the adapters, which optimizer.safetensors holds whole) */
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const bool params_sharded = sharded && mmc_dp_checkpoint_params_sharded(dir) && access(path, F_OK) != 0;
    if (params_sharded) {
        /* ZeRO-3: the trained parameters from the shards (any layout), the rest as saved */
        if (t->lora) return mmc_error(MMC_ERR_INVALID, "--resume: %s holds sharded full-model parameters (ZeRO-3 "
                                      "without LoRA) but this run trains LoRA adapters", dir);
        if ((st = mmc_dp_read_sharded_params(dir, t->opt_names, t->opt, t->n_opt))) return mmc_error_prefix(st, "--resume");
        snprintf(path, sizeof path, "%s/model.frozen.safetensors", dir);
        mmc_st *fz = NULL;
        if ((st = mmc_st_open(path, &fz))) return mmc_error_prefix(st, "--resume");
        for (int i = 0; i < t->n_params && !st; i++)
            if (!(t->params[i]->flags & MMC_REQUIRES_GRAD) && mmc_st_find(fz, t->names[i]))
                st = mmc_st_read_into(fz, t->names[i], t->params[i]);
        mmc_st_close(fz);
        if (st) return mmc_error_prefix(st, "--resume");
    }
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    mmc_st *o = NULL;
    if ((st = mmc_st_open(path, &o))) return st;
    for (int i = 0; i < t->n_opt && !st; i++) {
        mmc_tensor *p = t->opt[i];
        char name[256];
        mmc_tensor *mv = mmc_tensor_wrap(MMC_F32, p->ndim, p->shape, t->adamw.m[i]);
        snprintf(name, sizeof name, "exp_avg.%s", t->opt_names[i]);
        if (!sharded) st = mmc_st_read_into(o, name, mv);
        mv->data = t->adamw.v[i];
        snprintf(name, sizeof name, "exp_avg_sq.%s", t->opt_names[i]);
        if (!st && !sharded) st = mmc_st_read_into(o, name, mv);
        mmc_tensor_free(mv);
        if (!st && p != t->opt_model[i]) {   /* a ZeRO-3 checkpoint's masters came from its shards */
            snprintf(name, sizeof name, "master.%s", t->opt_names[i]);
            if (!params_sharded) st = mmc_st_read_into(o, name, p);
            if (!st) mmc_convert(t->opt_model[i]->data, MMC_BF16, p->data, MMC_F32, mmc_numel(p));
        }
    }
    for (int i = 0; t->lora && i < t->lora->n_params && !st; i++) {
        char name[256];
        snprintf(name, sizeof name, "lora.%s", t->lora_names[i]);
        st = mmc_st_read_into(o, name, t->lora->params[i]);
    }
    for (int i = 0; i < t->n_params && !st; i++) {
        char name[256];
        snprintf(name, sizeof name, "master.%s", t->names[i]);
        if (t->params[i]->dtype == MMC_F32 && mmc_st_find(o, name)) st = mmc_st_read_into(o, name, t->params[i]);
    }
    mmc_st_close(o);
    if (st) return mmc_error_prefix(st, "%s (was the run config changed since the checkpoint? freeze/dtype "
                                    "must stay the same)", path);
    if (t->ema) {
        snprintf(path, sizeof path, "%s/ema.safetensors", dir);
        mmc_st *e = NULL;
        if ((st = mmc_st_open(path, &e)))
            return mmc_error_prefix(st, "--resume: training.ema_decay is set but the checkpoint has no EMA weights");
        for (int i = 0; i < t->n_opt && !st; i++) {
            mmc_tensor *w = mmc_tensor_wrap(MMC_F32, t->opt[i]->ndim, t->opt[i]->shape, t->ema[i]);
            st = mmc_st_read_into(e, t->opt_names[i], w);
            mmc_tensor_free(w);
        }
        mmc_st_close(e);
        if (st) return mmc_error_prefix(st, "%s", path);
    }
    return MMC_OK;
}
