/* lora_merge.c — `mmc merge` on a diffusers pipeline folder: a PEFT LoRA adapter on the pipeline's
 * transformer (what `mmc train` writes for HunyuanDiT, whose HunyuanDiTPipeline has no
 * load_lora_weights: adapter_config.json + adapter_model.safetensors with
 * "base_model.model.<module>.lora_A.weight" keys) folded into the transformer's weights as peft's
 * merge_and_unload folds it, W' = W + (lora_alpha / r) B A (rsLoRA: / sqrt(r)) computed in f32 and stored
 * in W's dtype (mmc_lora_merge_file), every other tensor copied unchanged:
 *
 *   out_dir/                       model_index.json, scheduler/, vae/, text encoders, tokenizers: copied
 *   out_dir/transformer/           config.json copied; diffusion_pytorch_model.safetensors: the merged
 *                                  weights in one file (a sharded input is written unsharded)
 *
 * so HunyuanDiTPipeline.from_pretrained(out_dir) and `mmc generate-image --model out_dir` load it with no
 * adapter. Given the transformer folder itself (a HunyuanDiT2DModel folder: config.json with _class_name),
 * out_dir is that folder merged (config.json and the merged weights), as HunyuanDiT2DModel.from_pretrained
 * loads it. The folder is built as out_dir.tmp.<pid> and renamed into place; an existing out_dir is moved
 * aside and removed only once the new one is complete. Checked against PEFT's merge_and_unload by
 * tests/test_hunyuan.c (part merge, tools/ref/gen_hunyuan_merge.py) and by generating with the merged
 * folder (tests/test_hunyuan_cli.sh). */
#include "mmc_diffusion.h"
#include "mmc_io.h"
#include "mmc_lora.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(path);
}

static void remove_tree(const char *dir) {
    struct stat sb;
    if (lstat(dir, &sb) == 0) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static bool is_weights(const char *name) {   /* what the merged file replaces in the component folder */
    size_t l = strlen(name);
    return (l > 12 && !strcmp(name + l - 12, ".safetensors")) || (l > 23 && !strcmp(name + l - 23, ".safetensors.index.json")) ||
           (l > 4 && !strcmp(name + l - 4, ".bin")) || (l > 15 && !strcmp(name + l - 15, ".bin.index.json"));
}

static mmc_status copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    mmc_status st = MMC_OK;
    if (!in || !out) st = mmc_error(MMC_ERR_IO, "cannot copy '%s' to '%s': %s", src, dst, strerror(errno));
    char buf[1 << 16];
    size_t n;
    while (!st && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) st = mmc_error(MMC_ERR_IO, "cannot write '%s': %s", dst, strerror(errno));
    if (!st && ferror(in)) st = mmc_error(MMC_ERR_IO, "cannot read '%s': %s", src, strerror(errno));
    if (in) fclose(in);
    if (out && fclose(out) != 0 && !st) st = mmc_error(MMC_ERR_IO, "cannot write '%s': %s", dst, strerror(errno));
    return st;
}

/* src copied into dst (created) recursively, hidden entries left out; in src's sub-folder `component` the
 * weight files are left out too (the merged file takes their place); skip: src is that folder. */
static mmc_status copy_tree(const char *src, const char *dst, const char *component, bool skip) {
    if (mkdir(dst, 0755) != 0) return mmc_error(MMC_ERR_IO, "cannot create '%s': %s", dst, strerror(errno));
    DIR *d = opendir(src);
    if (!d) return mmc_error(MMC_ERR_IO, "cannot list '%s': %s", src, strerror(errno));
    mmc_status st = MMC_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char s[PATH_MAX], t[PATH_MAX];
        if ((size_t)snprintf(s, sizeof s, "%s/%s", src, e->d_name) >= sizeof s ||
            (size_t)snprintf(t, sizeof t, "%s/%s", dst, e->d_name) >= sizeof t) {
            st = mmc_error(MMC_ERR_INVALID, "path too long under '%s'", src);
            break;
        }
        struct stat sb;
        if (stat(s, &sb) != 0) continue;   /* a dangling link */
        if (S_ISDIR(sb.st_mode)) st = copy_tree(s, t, NULL, component && !strcmp(e->d_name, component));
        else if (S_ISREG(sb.st_mode) && !(skip && is_weights(e->d_name))) st = copy_file(s, t);
    }
    closedir(d);
    return st;
}

/* The diffusers model class of a model folder (config.json's _class_name), "" when it is none. */
static void model_class(const char *dir, char *cls, size_t cap) {
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/config.json", dir);
    cls[0] = 0;
    mmc_json *j = NULL;
    const char *c = NULL;
    if (access(p, R_OK) == 0 && mmc_json_load(p, &j) == MMC_OK && mmc_json_str(j, "_class_name", "", &c) == MMC_OK)
        snprintf(cls, cap, "%s", c);
    mmc_json_free(j);
    mmc_clear_error();
}

bool mmc_diffusers_is_model_dir(const char *dir) {
    char cls[128];
    model_class(dir, cls, sizeof cls);
    return cls[0] != 0;
}

mmc_status mmc_diffusers_merge_lora(const char *pipe_dir, const char *adapter_dir, const char *out_dir, int *n_merged) {
    if (n_merged) *n_merged = 0;
    char mi[PATH_MAX + 32], weights[1024], cls[128];
    snprintf(mi, sizeof mi, "%s/model_index.json", pipe_dir);
    const bool pipeline = access(mi, R_OK) == 0;   /* else the transformer folder itself */
    mmc_status st;
    if (pipeline) {
        mmc_diffusers_dir d;
        if ((st = mmc_diffusers_open(pipe_dir, &d))) return st;
        if (strcmp(d.pipeline, "HunyuanDiTPipeline") != 0)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: a %s folder: mmc merge of a diffusers pipeline is wired for "
                             "HunyuanDiTPipeline (PEFT adapters on its transformer); apply this adapter with "
                             "`mmc generate-image --lora` instead", pipe_dir, d.pipeline);
        const mmc_diffusers_component *tc = mmc_diffusers_find(&d, "transformer");
        if (!tc || !tc->present || !tc->weights[0])
            return mmc_error(MMC_ERR_FORMAT, "%s: no transformer weights to merge into", pipe_dir);
        snprintf(weights, sizeof weights, "%s", tc->weights);
    } else {
        model_class(pipe_dir, cls, sizeof cls);
        if (strcmp(cls, "HunyuanDiT2DModel") != 0)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s%s%s: mmc merge of a diffusers model folder is wired for "
                             "HunyuanDiT2DModel (or its HunyuanDiTPipeline folder)", pipe_dir, cls[0] ? "a " : "no "
                             "diffusers model", cls, cls[0] ? " folder" : "");
        snprintf(weights, sizeof weights, "%s/diffusion_pytorch_model.safetensors", pipe_dir);
        if (access(weights, R_OK) != 0)
            snprintf(weights, sizeof weights, "%s/diffusion_pytorch_model.safetensors.index.json", pipe_dir);
    }
    if (!mmc_lora_is_adapter_dir(adapter_dir))
        return mmc_error(MMC_ERR_NOT_FOUND, "'%s' is not a PEFT LoRA adapter directory (no adapter_config.json): "
                         "give the folder `mmc train` wrote (checkpoint-N/)", adapter_dir);
    /* the output must not lie inside the pipeline folder (the copy would take itself along) */
    char rp[PATH_MAX], ro[PATH_MAX], parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out_dir);
    char *sl = strrchr(parent, '/');
    if (sl) *sl = 0;
    if (realpath(pipe_dir, rp) && realpath(sl ? (parent[0] ? parent : "/") : ".", ro)) {
        const size_t l = strlen(rp);
        if (!strncmp(ro, rp, l) && (ro[l] == '/' || ro[l] == 0))
            return mmc_error(MMC_ERR_INVALID, "--out %s lies inside the pipeline folder %s: write it elsewhere",
                             out_dir, pipe_dir);
    }
    char tmp[PATH_MAX], out_w[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out_dir, (long)getpid());
    remove_tree(tmp);
    int merged = 0;
    if ((st = copy_tree(pipe_dir, tmp, pipeline ? "transformer" : NULL, !pipeline))) goto fail;
    snprintf(out_w, sizeof out_w, "%s%s/diffusion_pytorch_model.safetensors", tmp, pipeline ? "/transformer" : "");
    if ((st = mmc_lora_merge_file(weights, adapter_dir, out_w, &merged))) goto fail;
    if (rename(tmp, out_dir) != 0) {   /* out_dir exists: move it aside, put the new one in place, drop the old */
        char old[PATH_MAX + 32];
        snprintf(old, sizeof old, "%s.old.%ld", out_dir, (long)getpid());
        remove_tree(old);
        if (rename(out_dir, old) != 0 || rename(tmp, out_dir) != 0) {
            st = mmc_error(MMC_ERR_IO, "cannot move '%s' to '%s': %s", tmp, out_dir, strerror(errno));
            goto fail;
        }
        remove_tree(old);
    }
    if (n_merged) *n_merged = merged;
    return MMC_OK;
fail:
    remove_tree(tmp);
    return st;
}
