/* lora_kohya.c — LoRA files in kohya-ss / A1111 naming for Stable Diffusion 1.x and SDXL, read as diffusers 0.42's
 * load_lora_weights converts them (loaders/lora_pipeline.py StableDiffusionXLLoraLoaderMixin.lora_state_dict:
 * lora_conversion_utils._maybe_map_sgm_blocks_to_diffusers, then _convert_non_diffusers_lora_to_diffusers):
 *
 *   lora_unet_<module>.lora_down.weight [r, in]   A of the UNet module; <module> is the diffusers name with '.' -> '_'
 *   lora_unet_<module>.lora_up.weight   [out, r]  B                    (down_blocks_1_attentions_0_..._attn1_to_q), or
 *   lora_unet_<module>.alpha            scalar    scale alpha / r      the SGM one kohya writes for SDXL
 *                                                  (input_blocks_4_1_..., middle_block_1_..., output_blocks_3_1_...,
 *                                                  time_embed_0, label_emb_0_0): block numbers mapped with the UNet's
 *                                                  layers_per_block as diffusers does
 *   lora_te_ / lora_te1_<module>...               text_encoder (CLIP-L): text_model_encoder_layers_N_self_attn_q_proj ...
 *   lora_te2_<module>...                          text_encoder_2 (SDXL's OpenCLIP bigG)
 *
 * Instead of diffusers' chain of string replacements, each module of the model is spelled the way kohya spells it
 * (its diffusers name and, for the UNet, its SGM name, with '.' -> '_') and the file's names are looked up among
 * those: the same module for every name both accept, and an error naming the key for one that matches nothing.
 * (diffusers mangles add_embedding_linear_N in the diffusers spelling into one module; kohya writes SDXL's as
 * label_emb_0_N, which both read alike.) Ranks and alphas may differ per module, as diffusers' rank_pattern allows.
 * The UNet's linear adapters run unmerged (mmc_lora_set_build, PEFT's forward); those of its 1x1 convolutions (SD
 * 1.x's proj_in / proj_out, kohya's [r, in, 1, 1] / [out, r, 1, 1]) are merged into the loaded weights; the text
 * encoders are loaded for each prompt encoding and freed, so their adapters are merged as they load
 * (mmc_clip_text_merge_lora): the same function to rounding. LoHa / LoKr / DoRA keys and 3x3 convolution adapters
 * (LoCon on resnets) are errors that say so. */
#include "mmc_diffusion.h"
#include "mmc_encoders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char key[256];            /* the lora_down key (messages) */
    char module[200];         /* the kohya module name after the component prefix */
    int comp;                 /* 0 UNet, 1 text_encoder, 2 text_encoder_2 */
    mmc_tensor *A, *B;        /* f32: [r, K], [N, r] */
    float scale;              /* alpha / r x weight */
} kohya_item;

struct mmc_kohya_lora {
    char path[1024];
    kohya_item *it;
    int n;
};

static const struct { const char *prefix; int comp; } PREFIXES[] = {
    {"lora_unet_", 0}, {"lora_te1_", 1}, {"lora_te2_", 2}, {"lora_te_", 1}};

static int comp_of(const char *key, size_t *plen) {
    for (size_t i = 0; i < sizeof PREFIXES / sizeof *PREFIXES; i++)
        if (!strncmp(key, PREFIXES[i].prefix, strlen(PREFIXES[i].prefix))) {
            *plen = strlen(PREFIXES[i].prefix);
            return PREFIXES[i].comp;
        }
    return -1;
}

bool mmc_lora_file_is_kohya(const char *path) {
    size_t lp = strlen(path);
    if (lp < 12 || strcmp(path + lp - 12, ".safetensors") != 0) return false;
    mmc_st *st = NULL;
    if (mmc_st_open(path, &st) != MMC_OK) return false;
    bool k = false;
    for (int i = 0; i < mmc_st_count(st) && !k; i++) {
        const char *n = mmc_st_at(st, i)->name;
        size_t pl;
        k = comp_of(n, &pl) >= 0 || strstr(n, ".lora_down.") || strstr(n, ".lora_up.");
    }
    mmc_st_close(st);
    return k;
}

void mmc_kohya_lora_free(mmc_kohya_lora *k) {
    if (!k) return;
    for (int i = 0; i < k->n; i++) mmc_tensor_free(k->it[i].A), mmc_tensor_free(k->it[i].B);
    free(k->it);
    free(k);
}

int mmc_kohya_lora_count(const mmc_kohya_lora *k, int comp) {
    int c = 0;
    for (int i = 0; i < k->n; i++) c += k->it[i].comp == comp;
    return c;
}

/* a [r, K] / [N, r] matrix, or the same with trailing 1 x 1 (a 1x1 convolution's adapter) */
static bool matrix(const mmc_st_entry *e, int64_t *rows, int64_t *cols) {
    if (e->ndim != 2 && e->ndim != 4) return false;
    if (e->ndim == 4 && (e->shape[2] != 1 || e->shape[3] != 1)) return false;
    *rows = e->shape[0], *cols = e->shape[1];
    return true;
}

static mmc_tensor *read_matrix(const mmc_st *st, const mmc_st_entry *e, int64_t rows, int64_t cols, mmc_status *rc) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(rows, cols));
    if (!t) { *rc = mmc_error(MMC_ERR_OOM, "out of memory"); return NULL; }
    if ((*rc = mmc_st_read_into(st, e->name, t))) { mmc_tensor_free(t); return NULL; }
    return t;
}

mmc_status mmc_kohya_lora_open(const char *path, float weight, mmc_kohya_lora **out) {
    *out = NULL;
    mmc_st *st = NULL;
    mmc_status rc = mmc_st_open(path, &st);
    return rc ? rc : mmc_kohya_lora_open_st(st, path, weight, out);
}

mmc_status mmc_kohya_lora_open_st(mmc_st *st, const char *path, float weight, mmc_kohya_lora **out) {
    *out = NULL;
    mmc_status rc = MMC_OK;
    mmc_kohya_lora *k = calloc(1, sizeof *k);
    if (!k || !(k->it = calloc((size_t)mmc_st_count(st) + 1, sizeof *k->it))) {
        rc = mmc_error(MMC_ERR_OOM, "out of memory");
        goto fail;
    }
    snprintf(k->path, sizeof k->path, "%s", path);
    char other[320];
    for (int i = 0; i < mmc_st_count(st); i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        size_t pl = 0;
        const int comp = comp_of(e->name, &pl);
        const char *dot = strchr(e->name, '.');
        if (comp < 0 || !dot) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: key '%s' is not in kohya LoRA naming (lora_unet_*, lora_te_*, lora_te1_*, "
                           "lora_te2_* modules) nor a diffusers LoRA's (unet.<module>.lora_A.weight)", path, e->name);
            goto fail;
        }
        const int ml = (int)(dot - e->name);
        if (!strcmp(dot, ".lora_up.weight") || !strcmp(dot, ".alpha")) {   /* checked with their lora_down */
            snprintf(other, sizeof other, "%.*s.lora_down.weight", ml, e->name);
            if (!mmc_st_find(st, other)) {
                rc = mmc_error(MMC_ERR_FORMAT, "%s: '%s' has no '%s' (every module needs lora_down and lora_up)", path,
                               e->name, other);
                goto fail;
            }
            continue;
        }
        if (strcmp(dot, ".lora_down.weight") != 0) {
            rc = mmc_error(MMC_ERR_UNSUPPORTED, "%s: key '%s': mmc reads kohya LoRA's lora_down.weight / lora_up.weight "
                           "/ alpha (LoHa hada_*, LoKr lokr_*, DoRA dora_scale and the like are not supported)", path,
                           e->name);
            goto fail;
        }
        kohya_item *it = &k->it[k->n];
        snprintf(it->key, sizeof it->key, "%s", e->name);
        snprintf(it->module, sizeof it->module, "%.*s", ml - (int)pl, e->name + pl);
        it->comp = comp;
        snprintf(other, sizeof other, "%.*s.lora_up.weight", ml, e->name);
        const mmc_st_entry *up = mmc_st_find(st, other);
        if (!up) {
            rc = mmc_error(MMC_ERR_FORMAT, "%s: '%s' has no '%s' (the B half of the adapter)", path, e->name, other);
            goto fail;
        }
        int64_t r, K, N, r2;
        if (!matrix(e, &r, &K) || !matrix(up, &N, &r2)) {
            rc = mmc_error(MMC_ERR_SHAPE, "%s: '%s' / '%s' must be matrices [r, in] / [out, r] (or 1x1 convolutions)",
                           path, e->name, other);
            goto fail;
        }
        if (r != r2 || r < 1) {
            rc = mmc_error(MMC_ERR_SHAPE, "%s: '%s' has rank %lld but '%s' rank %lld", path, e->name, (long long)r,
                           other, (long long)r2);
            goto fail;
        }
        float alpha = (float)r;
        snprintf(other, sizeof other, "%.*s.alpha", ml, e->name);
        const mmc_st_entry *al = mmc_st_find(st, other);
        if (al) {
            mmc_tensor *a = mmc_tensor_new(MMC_F32, 1, MMC_SHAPE(1));
            int64_t n = 1;
            for (int d = 0; d < al->ndim; d++) n *= al->shape[d];
            rc = !a ? mmc_error(MMC_ERR_OOM, "out of memory")
                 : n != 1 ? mmc_error(MMC_ERR_SHAPE, "%s: '%s' must be one number", path, other)
                          : mmc_st_read_into(st, other, a);
            if (!rc) alpha = ((float *)a->data)[0];
            mmc_tensor_free(a);
            if (rc) goto fail;
        }
        it->scale = alpha / (float)r * weight;
        if (!(it->A = read_matrix(st, e, r, K, &rc)) || !(it->B = read_matrix(st, up, N, r, &rc))) goto fail;
        k->n++;
    }
    if (!k->n) { rc = mmc_error(MMC_ERR_FORMAT, "%s: no lora_down.weight tensors", path); goto fail; }
    mmc_st_close(st);
    *out = k;
    return MMC_OK;
fail:
    mmc_st_close(st);
    mmc_kohya_lora_free(k);
    return rc;
}

static void underscored(const char *dotted, char *o, size_t n) {
    snprintf(o, n, "%s", dotted);
    for (char *c = o; *c; c++)
        if (*c == '.') *c = '_';
}

/* The SGM / LDM name of a UNet linear (NULL-string when it has none): the inverse of single_file.c's mapping */
static void sgm_name(const char *name, int lpb, char *o, size_t n) {
    int b, l, used = 0;
    o[0] = 0;
    if (sscanf(name, "down_blocks.%d.attentions.%d.%n", &b, &l, &used) == 2 && used)
        snprintf(o, n, "input_blocks.%d.1.%s", 1 + b * (lpb + 1) + l, name + used);
    else if (sscanf(name, "up_blocks.%d.attentions.%d.%n", &b, &l, &used) == 2 && used)
        snprintf(o, n, "output_blocks.%d.1.%s", b * (lpb + 1) + l, name + used);
    else if (!strncmp(name, "mid_block.attentions.0.", 23)) snprintf(o, n, "middle_block.1.%s", name + 23);
    else {
        static const char *const t[][2] = {{"time_embedding.linear_1", "time_embed.0"},
                                           {"time_embedding.linear_2", "time_embed.2"},
                                           {"add_embedding.linear_1", "label_emb.0.0"},
                                           {"add_embedding.linear_2", "label_emb.0.2"}};
        for (int i = 0; i < 4; i++)
            if (!strcmp(name, t[i][0])) snprintf(o, n, "%s", t[i][1]);
    }
}

/* A 1x1 convolution of the UNet named (diffusers or SGM spelling, underscored) `module`: its weight, or NULL */
static mmc_tensor *unet_conv1x1(mmc_unet *m, const char *module) {
    mmc_tensor **params;
    const char *const *names;
    const int n = mmc_unet_param_list(m, &params, &names);
    char mod[MMC_MODULE_NAME], us[MMC_MODULE_NAME], sgm[MMC_MODULE_NAME];
    for (int i = 0; i < n; i++) {
        const size_t l = strlen(names[i]);
        if (l < 8 || strcmp(names[i] + l - 7, ".weight") != 0 || params[i]->ndim != 4 || params[i]->shape[2] != 1 ||
            params[i]->shape[3] != 1 || l - 7 >= sizeof mod)
            continue;
        snprintf(mod, sizeof mod, "%.*s", (int)(l - 7), names[i]);
        underscored(mod, us, sizeof us);
        if (!strcmp(us, module)) return params[i];
        sgm_name(mod, (int)mmc_unet_cfg(m)->layers_per_block[0], sgm, sizeof sgm);
        underscored(sgm, us, sizeof us);
        if (sgm[0] && !strcmp(us, module)) return params[i];
    }
    return NULL;
}

mmc_status mmc_kohya_lora_unet(const mmc_kohya_lora *k, const mmc_module_list *ml, mmc_unet *unet,
                               mmc_lora_set **out) {
    *out = NULL;
    const mmc_unet_config *cfg = mmc_unet_cfg(unet);
    const int n = mmc_kohya_lora_count(k, 0);
    char (*spell)[2][MMC_MODULE_NAME] = calloc((size_t)ml->n + 1, sizeof *spell);
    mmc_lora_item *items = calloc((size_t)n + 1, sizeof *items);
    mmc_status st = MMC_OK;
    if (!spell || !items) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 0; i < ml->n; i++) {
        char sgm[MMC_MODULE_NAME];
        underscored(ml->names[i], spell[i][0], sizeof spell[i][0]);
        sgm_name(ml->names[i], (int)cfg->layers_per_block[0], sgm, sizeof sgm);
        underscored(sgm, spell[i][1], sizeof spell[i][1]);
    }
    int m = 0;
    for (int j = 0; j < k->n && !st; j++) {
        const kohya_item *it = &k->it[j];
        if (it->comp != 0) continue;
        int found = -1;
        for (int i = 0; i < ml->n && found < 0; i++)
            if (!strcmp(it->module, spell[i][0]) || (spell[i][1][0] && !strcmp(it->module, spell[i][1]))) found = i;
        if (found < 0) {   /* a 1x1 convolution (SD 1.x's proj_in / proj_out): merged into its weight */
            mmc_tensor *w = unet_conv1x1(unet, it->module);
            if (w) {
                if ((st = mmc_lora_merge_tensor(w, it->A, it->B, it->scale, it->key)))
                    st = mmc_error_prefix(st, "%s: ", k->path);
                continue;
            }
            st = mmc_error(MMC_ERR_NOT_FOUND, "%s: '%s': the UNet has no linear or 1x1-convolution module '%s' (in "
                           "diffusers or SGM block names); mmc adapts the attention, feed-forward, proj_in / proj_out "
                           "and time / add embedding modules, not 3x3 convolutions (LoCon resnets)", k->path, it->key,
                           it->module);
            break;
        }
        items[m++] = (mmc_lora_item){.module = found, .A = it->A, .B = it->B, .scale = it->scale};
    }
    if (!st && (st = mmc_lora_set_build(ml, items, m, out))) st = mmc_error_prefix(st, "%s: ", k->path);
done:
    free(spell);
    free(items);
    return st;
}

mmc_status mmc_kohya_lora_merge_clip(const mmc_kohya_lora *k, int which, struct mmc_clip_text *m) {
    const int64_t L = mmc_clip_text_cfg(m)->num_hidden_layers;
    static const char *const mods[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "self_attn.out_proj", "mlp.fc1", "mlp.fc2"};
    for (int j = 0; j < k->n; j++) {
        const kohya_item *it = &k->it[j];
        if (it->comp != which) continue;
        const char *name = !strncmp(it->module, "text_model_", 11) ? it->module + 11 : it->module;
        char dotted[MMC_MODULE_NAME] = "", us[MMC_MODULE_NAME];
        for (int64_t l = 0; l < L && !dotted[0]; l++)
            for (int q = 0; q < 6 && !dotted[0]; q++) {
                char cand[MMC_MODULE_NAME];
                snprintf(cand, sizeof cand, "encoder.layers.%lld.%s", (long long)l, mods[q]);
                underscored(cand, us, sizeof us);
                if (!strcmp(us, name)) snprintf(dotted, sizeof dotted, "%s", cand);
            }
        if (!dotted[0] && !strcmp(name, "text_projection")) snprintf(dotted, sizeof dotted, "text_projection");
        if (!dotted[0])
            return mmc_error(MMC_ERR_NOT_FOUND, "%s: '%s': text_encoder%s has no linear module '%s' (%lld layers of "
                             "self_attn q/k/v/out_proj and mlp fc1/fc2)", k->path, it->key, which == 2 ? "_2" : "",
                             it->module, (long long)L);
        mmc_status st = mmc_clip_text_merge_lora(m, dotted, it->A, it->B, it->scale);
        if (st) return mmc_error_prefix(st, "%s: '%s': ", k->path, it->key);
    }
    return MMC_OK;
}
