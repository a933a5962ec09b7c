/* lora.c — LoRA adapters (mmc_lora.h), mirroring PEFT's LoraModel: target selection by
 * module name, kaiming-uniform A and zero B, frozen base, and PEFT's on-disk format
 * (adapter_config.json + adapter_model.safetensors keyed
 * "base_model.model.<module>.lora_{A,B}.weight"). */
#include "mmc_lora.h"
#include "mmc_io.h"
#include "../backend/cpu/gemm.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KEY_PREFIX "base_model.model."

/* ------------------------------------------------------------------ module lists */
mmc_status mmc_module_list_add(mmc_module_list *ml, mmc_linear_w *l, const char *name) {
    if (ml->n == ml->cap) {
        int cap = ml->cap ? 2 * ml->cap : 64;
        mmc_linear_w **m = realloc(ml->mods, sizeof *m * (size_t)cap);
        if (!m) return mmc_error(MMC_ERR_OOM, "out of memory listing modules");
        ml->mods = m;
        char (*nm)[MMC_MODULE_NAME] = realloc(ml->names, sizeof *nm * (size_t)cap);
        if (!nm) return mmc_error(MMC_ERR_OOM, "out of memory listing modules");
        ml->names = nm;
        ml->cap = cap;
    }
    ml->mods[ml->n] = l;
    snprintf(ml->names[ml->n], MMC_MODULE_NAME, "%s", name);
    ml->n++;
    return MMC_OK;
}

void mmc_module_list_free(mmc_module_list *ml) {
    free(ml->mods);
    free(ml->names);
    memset(ml, 0, sizeof *ml);
}

/* ------------------------------------------------------------------ matching */
bool mmc_lora_target_match(const char *t, const char *name) {
    if (strncmp(t, "re:", 3) == 0) {
        char pat[1024];
        snprintf(pat, sizeof pat, "^(%s)$", t + 3);
        regex_t re;
        if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB)) return false;
        bool ok = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        return ok;
    }
    if (strpbrk(t, "*?[")) return fnmatch(t, name, 0) == 0;
    size_t lt = strlen(t), ln = strlen(name);
    if (ln == lt) return strcmp(t, name) == 0;
    return ln > lt && name[ln - lt - 1] == '.' && strcmp(name + ln - lt, t) == 0;
}

void mmc_lora_canonical_name(const char *name, char *out, size_t cap) {
    static const struct { const char *from, *to; } map[] = {
        {"model.language_model.", "lm."}, {"language_model.model.", "lm."},
        {"model.visual.", "visual."},     {"visual.", "visual."},
        /* LLaVA: the live transformers 5 model's names vs its checkpoints' (4.4x / 5.x saves); its vision
         * tower is model.vision_tower.encoder.* live in 5.x, (model.)vision_tower.vision_model.encoder.* in 4.x */
        {"model.multi_modal_projector.", "multi_modal_projector."},
        {"model.vision_tower.vision_model.", "vision_tower."}, {"vision_tower.vision_model.", "vision_tower."},
        {"model.vision_tower.", "vision_tower."},
        {"model.audio_tower.", "audio_tower."},   /* Qwen2.5-Omni's thinker: live vs its checkpoint */
        {"model.", "lm."},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        size_t n = strlen(map[i].from);
        if (strncmp(name, map[i].from, n) == 0) {
            snprintf(out, cap, "%s%s", map[i].to, name + n);
            return;
        }
    }
    snprintf(out, cap, "%s", name);
}

float mmc_lora_scale(int r, float alpha, bool use_rslora) {
    return use_rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
}

/* ------------------------------------------------------------------ attach */
static mmc_lora_set *set_new(int n) {
    mmc_lora_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->mods = calloc((size_t)(n ? n : 1), sizeof *s->mods);
    s->names = calloc((size_t)(n ? n : 1), sizeof *s->names);
    s->adapters = calloc((size_t)(n ? n : 1), sizeof *s->adapters);
    s->params = calloc((size_t)(2 * n + 1), sizeof *s->params);
    if (!s->mods || !s->names || !s->adapters || !s->params) { mmc_lora_free(s); return NULL; }
    return s;
}

/* Create adapter i on module l (A, B zeroed), freeze the base. */
static mmc_status add_adapter(mmc_lora_set *s, mmc_linear_w *l, const char *name, int stream,
                              bool trainable) {
    if (l->lora) return mmc_error(MMC_ERR_INVALID, "LoRA: module '%s' already has an adapter", name);
    int i = s->n;
    mmc_tensor *A = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(s->r, l->in_features));          /* [r, K] */
    mmc_tensor *B = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(l->out_features, s->r));         /* [N, r] */
    if (!A || !B) { mmc_tensor_free(A); mmc_tensor_free(B); return mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); }
    A->flags |= MMC_PARAM | (trainable ? MMC_REQUIRES_GRAD : 0);
    B->flags |= MMC_PARAM | (trainable ? MMC_REQUIRES_GRAD : 0);
    snprintf(A->name, sizeof A->name, "%s.lora_A", name);
    snprintf(B->name, sizeof B->name, "%s.lora_B", name);
    s->adapters[i] = (mmc_lora){.A = A, .B = B, .scale = mmc_lora_scale(s->r, s->alpha, s->use_rslora),
                                .dropout = s->dropout, .stream = (uint64_t)stream};
    s->mods[i] = l;
    snprintf(s->names[i], MMC_MODULE_NAME, "%s", name);
    s->params[s->n_params++] = A;
    s->params[s->n_params++] = B;
    if (l->w) l->w->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    if (l->b) l->b->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    l->lora = &s->adapters[i];
    s->n++;
    return MMC_OK;
}

static mmc_status copy_targets(mmc_lora_set *s, const char *const *t, int n) {
    s->targets = calloc((size_t)(n ? n : 1), sizeof *s->targets);
    if (!s->targets) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
    for (int i = 0; i < n; i++) {
        s->targets[i] = strdup(t[i]);
        if (!s->targets[i]) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
        s->n_targets++;
    }
    return MMC_OK;
}

/* A loaded adapter's targets: the names of the modules it adapts. */
static mmc_status targets_from_modules(mmc_lora_set *s) {
    const char **t = malloc(sizeof *t * (size_t)(s->n ? s->n : 1));
    if (!t) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
    for (int i = 0; i < s->n; i++) t[i] = s->names[i];
    mmc_status st = copy_targets(s, t, s->n);
    free(t);
    return st;
}

mmc_status mmc_lora_attach(const mmc_module_list *ml, const mmc_lora_config *cfg, mmc_lora_set **out) {
    *out = NULL;
    if (cfg->r <= 0) return mmc_error(MMC_ERR_INVALID, "LoRA: r = %d must be positive", cfg->r);
    if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f))
        return mmc_error(MMC_ERR_INVALID, "LoRA: dropout = %g must be in [0, 1)", (double)cfg->dropout);
    if (cfg->n_targets <= 0) return mmc_error(MMC_ERR_INVALID, "LoRA: no target modules given");
    for (int t = 0; t < cfg->n_targets; t++) {
        if (strncmp(cfg->targets[t], "re:", 3) == 0) {
            regex_t re;
            char pat[1024];
            snprintf(pat, sizeof pat, "^(%s)$", cfg->targets[t] + 3);
            if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB))
                return mmc_error(MMC_ERR_INVALID, "LoRA: target '%s' is not a valid regular expression",
                                 cfg->targets[t]);
            regfree(&re);
        }
    }
    mmc_lora_set *s = set_new(ml->n);
    if (!s) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
    s->r = cfg->r;
    s->alpha = cfg->alpha;
    s->dropout = cfg->dropout;
    s->use_rslora = cfg->use_rslora;
    mmc_status st = copy_targets(s, cfg->targets, cfg->n_targets);
    if (st) goto fail;
    mmc_rng rng;
    mmc_rng_init(&rng, cfg->seed);
    for (int i = 0; i < ml->n; i++) {
        bool hit = false;
        for (int t = 0; t < cfg->n_targets && !hit; t++) hit = mmc_lora_target_match(cfg->targets[t], ml->names[i]);
        if (!hit) continue;
        if ((st = add_adapter(s, ml->mods[i], ml->names[i], i, true))) goto fail;
        /* kaiming_uniform_(A, a=sqrt(5)): bound = sqrt(6 / ((1 + a^2) fan_in)) = 1/sqrt(fan_in) */
        mmc_tensor *A = s->adapters[s->n - 1].A;
        float bound = 1.0f / sqrtf((float)A->shape[1]);
        mmc_rng_uniform(&rng, A->data, mmc_numel(A), -bound, bound);
    }
    if (s->n == 0) {
        char ex[512] = "";
        for (int i = 0; i < ml->n && i < 4; i++) {
            size_t u = strlen(ex);
            snprintf(ex + u, sizeof ex - u, "%s'%s'", i ? ", " : "", ml->names[i]);
        }
        st = mmc_error(MMC_ERR_INVALID, "LoRA: no module matches the targets (%s%s); modules look like %s",
                       cfg->targets[0], cfg->n_targets > 1 ? ", ..." : "", ex);
        goto fail;
    }
    *out = s;
    return MMC_OK;
fail:
    mmc_lora_free(s);
    return st;
}

void mmc_lora_free(mmc_lora_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        if (s->mods[i] && s->mods[i]->lora == &s->adapters[i]) s->mods[i]->lora = NULL;
    for (int i = 0; i < s->n_params; i++) mmc_tensor_free(s->params[i]);
    for (int i = 0; i < s->n_targets; i++) free(s->targets[i]);
    free(s->targets);
    free(s->mods);
    free(s->names);
    free(s->adapters);
    free(s->params);
    free(s);
}

void mmc_lora_keep(mmc_lora_set *s, const bool *keep) {
    int j = 0;
    for (int i = 0; i < s->n; i++) {
        if (!keep[i]) {   /* its module may be gone (a pipeline stage's trimmed layer): only detach */
            if (s->mods[i] && s->mods[i]->lora == &s->adapters[i]) s->mods[i]->lora = NULL;
            mmc_tensor_free(s->params[2 * i]);
            mmc_tensor_free(s->params[2 * i + 1]);
            continue;
        }
        if (j != i) {
            s->mods[j] = s->mods[i];
            memcpy(s->names[j], s->names[i], sizeof s->names[0]);
            s->adapters[j] = s->adapters[i];
            s->params[2 * j] = s->params[2 * i], s->params[2 * j + 1] = s->params[2 * i + 1];
        }
        j++;
    }
    s->n = j, s->n_params = 2 * j;
    for (int i = 0; i < s->n; i++)   /* the adapters moved: re-point their modules */
        if (s->mods[i]) s->mods[i]->lora = &s->adapters[i];
}

/* ------------------------------------------------------------------ save */
/* PEFT's string form of target_modules: a regex fully matched against module names. */
static void append_regex(char *buf, size_t cap, const char *t) {
    size_t u = strlen(buf);
    if (strncmp(t, "re:", 3) == 0) { snprintf(buf + u, cap - u, "(%s)", t + 3); return; }
    if (!strpbrk(t, "*?[")) { snprintf(buf + u, cap - u, "(.*\\.)?%s", t); return; }
    char *p = buf + u, *end = buf + cap - 4;
    for (const char *c = t; *c && p < end; c++) {
        if (*c == '*') { *p++ = '.'; *p++ = '*'; }
        else if (*c == '?') *p++ = '.';
        else if (*c == '.') { *p++ = '\\'; *p++ = '.'; }
        else *p++ = *c;
    }
    *p = 0;
}

static mmc_status make_dir(const char *dir) {
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) {
        struct stat sb;
        if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return MMC_OK;
    }
    return mmc_error(MMC_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
}

mmc_status mmc_lora_save(const mmc_lora_set *s, const char *dir, const char *base_model) {
    return mmc_lora_save_task(s, dir, base_model, "CAUSAL_LM");
}

mmc_status mmc_lora_save_task(const mmc_lora_set *s, const char *dir, const char *base_model, const char *task_type) {
    mmc_status st = make_dir(dir);
    if (st) return st;
    bool plain = true;
    for (int i = 0; i < s->n_targets; i++) plain &= !strpbrk(s->targets[i], "*?[") && strncmp(s->targets[i], "re:", 3);
    cJSON *j = cJSON_CreateObject();
    char *text = NULL, *rx = NULL;
    mmc_stw *w = NULL;
    if (!j) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
    cJSON_AddItemToObject(j, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "auto_mapping");
    if (base_model) cJSON_AddStringToObject(j, "base_model_name_or_path", base_model);
    else cJSON_AddNullToObject(j, "base_model_name_or_path");
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddFalseToObject(j, "fan_in_fan_out");
    cJSON_AddTrueToObject(j, "inference_mode");
    cJSON_AddTrueToObject(j, "init_lora_weights");
    cJSON_AddNullToObject(j, "layers_pattern");
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddItemToObject(j, "loftq_config", cJSON_CreateObject());
    if (s->alpha == floorf(s->alpha)) cJSON_AddNumberToObject(j, "lora_alpha", (double)(int64_t)s->alpha);
    else cJSON_AddNumberToObject(j, "lora_alpha", s->alpha);
    cJSON_AddBoolToObject(j, "lora_bias", false);
    cJSON_AddNumberToObject(j, "lora_dropout", (double)s->dropout);
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddNumberToObject(j, "r", s->r);
    cJSON_AddItemToObject(j, "rank_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "revision");
    if (plain) {
        cJSON *arr = cJSON_AddArrayToObject(j, "target_modules");
        for (int i = 0; i < s->n_targets; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(s->targets[i]));
    } else {
        size_t cap = 256;
        for (int i = 0; i < s->n_targets; i++) cap += 2 * strlen(s->targets[i]) + 16;
        rx = calloc(1, cap);
        if (!rx) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
        for (int i = 0; i < s->n_targets; i++) {
            if (i) strcat(rx, "|");
            append_regex(rx, cap, s->targets[i]);
        }
        cJSON_AddStringToObject(j, "target_modules", rx);
    }
    if (task_type) cJSON_AddStringToObject(j, "task_type", task_type);
    else cJSON_AddNullToObject(j, "task_type");   /* a plain PeftModel (any torch module, e.g. a diffusers transformer) */
    cJSON_AddBoolToObject(j, "use_dora", false);
    cJSON_AddBoolToObject(j, "use_rslora", s->use_rslora);
    text = cJSON_Print(j);
    if (!text) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    char path[1024];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if ((st = mmc_write_file_atomic(path, text, strlen(text)))) goto done;
    w = mmc_stw_new();
    if (!w) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    for (int i = 0; i < s->n && !st; i++) {
        char key[256];
        snprintf(key, sizeof key, KEY_PREFIX "%s.lora_A.weight", s->names[i]);
        st = mmc_stw_add(w, key, s->adapters[i].A);
        snprintf(key, sizeof key, KEY_PREFIX "%s.lora_B.weight", s->names[i]);
        if (!st) st = mmc_stw_add(w, key, s->adapters[i].B);
    }
    if (!st) st = mmc_stw_set_metadata(w, "format", "pt");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (!st) st = mmc_stw_write(w, path);
done:
    mmc_stw_free(w);
    cJSON_Delete(j);
    free(text);
    free(rx);
    return st;
}

/* ------------------------------------------------------------------ load */
mmc_status mmc_lora_read_config(const char *dir, int *r, float *alpha, float *dropout, bool *use_rslora) {
    char path[1024];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    const char *pt = NULL, *bias = NULL;
    int64_t rr = 0;
    double a = 0, d = 0;
    bool rs = false, dora = false, fifo = false;
    if ((st = mmc_json_str(j, "peft_type", "LORA", &pt)) || (st = mmc_json_int(j, "r", 8, &rr)) ||
        (st = mmc_json_num(j, "lora_alpha", 8, &a)) || (st = mmc_json_num(j, "lora_dropout", 0, &d)) ||
        (st = mmc_json_bool(j, "use_rslora", false, &rs)) || (st = mmc_json_bool(j, "use_dora", false, &dora)) ||
        (st = mmc_json_bool(j, "fan_in_fan_out", false, &fifo)) || (st = mmc_json_str(j, "bias", "none", &bias)))
        goto done;
    if (strcmp(pt, "LORA") != 0) { st = mmc_error(MMC_ERR_UNSUPPORTED, "peft_type '%s' (only LORA)", pt); goto done; }
    if (rr <= 0) { st = mmc_error(MMC_ERR_FORMAT, "'r' = %lld must be positive", (long long)rr); goto done; }
    if (dora) { st = mmc_error(MMC_ERR_UNSUPPORTED, "use_dora: DoRA adapters are not supported"); goto done; }
    if (fifo) { st = mmc_error(MMC_ERR_UNSUPPORTED, "fan_in_fan_out adapters are not supported"); goto done; }
    if (strcmp(bias, "none") != 0) { st = mmc_error(MMC_ERR_UNSUPPORTED, "bias '%s' (only 'none')", bias); goto done; }
    static const char *const patt[] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; i < 2; i++) {
        const cJSON *p = (const cJSON *)mmc_json_get(j, patt[i]);
        if (p && cJSON_IsObject(p) && p->child) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "non-empty %s is not supported", patt[i]);
            goto done;
        }
    }
    *r = (int)rr;
    *alpha = (float)a;
    *dropout = (float)d;
    *use_rslora = rs;
done:
    mmc_json_free(j);
    return st ? mmc_error_prefix(st, "%s", path) : MMC_OK;
}

/* ------------------------------------------------------------------ resolve base + adapter */
static bool has_file(const char *dir, const char *name) {
    char p[8800];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool mmc_lora_is_adapter_dir(const char *dir) { return dir && has_file(dir, "adapter_config.json"); }

/* base_model_name_or_path of adapter dir, resolved to a directory with a config.json. */
static mmc_status adapter_base(const char *dir, char *out, size_t cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    const cJSON *b = (const cJSON *)mmc_json_get(j, "base_model_name_or_path");
    if (!cJSON_IsString(b) || !b->valuestring[0]) {
        mmc_json_free(j);
        return mmc_error(MMC_ERR_NOT_FOUND, "%s names no base model (base_model_name_or_path is %s): give the base "
                         "model with --model BASE --adapter %s", path, cJSON_IsString(b) ? "empty" : "missing or null",
                         dir);
    }
    char cand[2][4200];
    int n = 0;
    snprintf(cand[n++], sizeof cand[0], "%s", b->valuestring);
    if (b->valuestring[0] != '/') snprintf(cand[n++], sizeof cand[0], "%s/%s", dir, b->valuestring);
    for (int i = 0; i < n; i++)
        if (has_file(cand[i], "config.json")) {
            if (strlen(cand[i]) >= cap) break;
            snprintf(out, cap, "%s", cand[i]);
            mmc_json_free(j);
            return MMC_OK;
        }
    st = mmc_error(MMC_ERR_NOT_FOUND, "%s: base model '%s' not found (no config.json in '%s'%s%s%s): give the base "
                   "model with --model BASE --adapter %s", path, b->valuestring, cand[0], n > 1 ? " nor '" : "",
                   n > 1 ? cand[1] : "", n > 1 ? "'" : "", dir);
    mmc_json_free(j);
    return st;
}

mmc_status mmc_lora_resolve(const char *model, const char *adapter, char *base, size_t base_cap, char *adir,
                            size_t adir_cap) {
    base[0] = adir[0] = '\0';
    if (!model && !adapter) return mmc_error(MMC_ERR_INVALID, "no model directory given");
    if (adapter && model && mmc_lora_is_adapter_dir(model))
        return mmc_error(MMC_ERR_INVALID, "'%s' is a LoRA adapter, not a base model: give the base with --model "
                         "(or leave --model out to use the adapter's base_model_name_or_path)", model);
    if (adapter && !mmc_lora_is_adapter_dir(adapter))
        return mmc_error(MMC_ERR_NOT_FOUND, "'%s' is not a LoRA adapter directory (no adapter_config.json)", adapter);
    const char *ad = adapter ? adapter : mmc_lora_is_adapter_dir(model) ? model : NULL;
    if (!ad) {
        if (strlen(model) >= base_cap) return mmc_error(MMC_ERR_INVALID, "model path too long: %s", model);
        snprintf(base, base_cap, "%s", model);
        return MMC_OK;
    }
    if (strlen(ad) >= adir_cap) return mmc_error(MMC_ERR_INVALID, "adapter path too long: %s", ad);
    snprintf(adir, adir_cap, "%s", ad);
    if (adapter && model) {
        if (strlen(model) >= base_cap) return mmc_error(MMC_ERR_INVALID, "model path too long: %s", model);
        snprintf(base, base_cap, "%s", model);
        return MMC_OK;
    }
    return adapter_base(ad, base, base_cap);
}

static int find_module(const mmc_module_list *ml, const char *name) {
    for (int i = 0; i < ml->n; i++) if (strcmp(ml->names[i], name) == 0) return i;
    char want[256], have[256];
    mmc_lora_canonical_name(name, want, sizeof want);
    for (int i = 0; i < ml->n; i++) {
        mmc_lora_canonical_name(ml->names[i], have, sizeof have);
        if (strcmp(want, have) == 0) return i;
    }
    return -1;
}

mmc_status mmc_lora_load(const char *dir, const mmc_module_list *ml, bool trainable, mmc_lora_set **out) {
    *out = NULL;
    int r;
    float alpha, dropout;
    bool rs;
    mmc_status st = mmc_lora_read_config(dir, &r, &alpha, &dropout, &rs);
    if (st) return st;
    char path[1024];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    mmc_st *w = NULL;
    if ((st = mmc_st_open(path, &w))) return st;
    mmc_lora_set *s = set_new(ml->n);
    char *errs = calloc(1, 4096);
    int bad = 0;
    if (!s || !errs) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    s->r = r;
    s->alpha = alpha;
    s->dropout = dropout;
    s->use_rslora = rs;
    /* targets: the adapted module names themselves */
    for (int e = 0; e < mmc_st_count(w); e++) {
        const mmc_st_entry *en = mmc_st_at(w, e);
        const char *k = en->name;
        size_t lk = strlen(k), lsuf = strlen(".lora_A.weight");
        if (lk <= lsuf || strcmp(k + lk - lsuf, ".lora_A.weight") != 0) continue;
        char mod[256];
        const char *m0 = strncmp(k, KEY_PREFIX, strlen(KEY_PREFIX)) == 0 ? k + strlen(KEY_PREFIX) : k;
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(m0) - lsuf), m0);
        int i = find_module(ml, mod);
        if (i < 0) {
            size_t u = strlen(errs);
            snprintf(errs + u, 4096 - u, "\n  adapter module '%s' is not a linear of this model", mod);
            bad++;
            continue;
        }
        char kb[300];
        snprintf(kb, sizeof kb, "%.*slora_B.weight", (int)(lk - strlen("lora_A.weight")), k);
        if ((st = add_adapter(s, ml->mods[i], ml->names[i], i, trainable))) goto done;
        mmc_lora *a = &s->adapters[s->n - 1];
        if ((st = mmc_st_read_into(w, k, a->A)) || (st = mmc_st_read_into(w, kb, a->B))) {
            st = mmc_error_prefix(st, "%s", path);
            goto done;
        }
    }
    if (bad) {
        st = mmc_error(MMC_ERR_NOT_FOUND, "%s: %d adapter module%s not found:%s", path, bad, bad > 1 ? "s" : "", errs);
        goto done;
    }
    if (s->n == 0) { st = mmc_error(MMC_ERR_FORMAT, "%s: no lora_A/lora_B weights", path); goto done; }
    st = targets_from_modules(s);
done:
    free(errs);
    mmc_st_close(w);
    if (st) { mmc_lora_free(s); return st; }
    *out = s;
    return MMC_OK;
}

/* ------------------------------------------------------------------ merge */
mmc_status mmc_lora_merge_tensor(mmc_tensor *W, const mmc_tensor *A, const mmc_tensor *B, float scale, const char *what) {
    const int64_t N = W->ndim ? W->shape[0] : 0, K = N ? mmc_numel(W) / N : 0;
    if (W->ndim < 2 || A->ndim != 2 || B->ndim != 2 || A->shape[1] != K || B->shape[0] != N || B->shape[1] != A->shape[0])
        return mmc_error(MMC_ERR_SHAPE, "LoRA: '%s' is [%lld, %lld]; the adapter's A is [%lld, %lld], B [%lld, %lld]",
                         what, (long long)N, (long long)K, (long long)A->shape[0],
                         (long long)(A->ndim > 1 ? A->shape[1] : 0), (long long)B->shape[0],
                         (long long)(B->ndim > 1 ? B->shape[1] : 0));
    if (W->dtype != MMC_F32 || !(W->flags & MMC_OWNS_DATA) || !mmc_is_contiguous(W)) {   /* an f32 copy of its own */
        float *d = malloc((size_t)(N * K) * sizeof *d);
        if (!d) return mmc_error(MMC_ERR_OOM, "out of memory");
        mmc_convert(d, MMC_F32, W->data, W->dtype, N * K);
        if (W->flags & MMC_OWNS_DATA) free(W->data);
        W->data = d;
        W->dtype = MMC_F32;
        W->flags |= MMC_OWNS_DATA;
    }
    mmc_lora_merge_into(W->data, A->data, B->data, N, K, A->shape[0], scale);
    return MMC_OK;
}

mmc_status mmc_lora_set_build(const mmc_module_list *ml, const mmc_lora_item *items, int n, mmc_lora_set **out) {
    *out = NULL;
    mmc_lora_set *s = set_new(n);
    if (!s) return mmc_error(MMC_ERR_OOM, "LoRA: out of memory");
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        const mmc_lora_item *it = &items[i];
        MMC_ASSERT(it->module >= 0 && it->module < ml->n);
        mmc_linear_w *l = ml->mods[it->module];
        if (it->A->ndim != 2 || it->B->ndim != 2 || it->A->shape[0] != it->B->shape[1] ||
            it->A->shape[1] != l->in_features || it->B->shape[0] != l->out_features) {
            st = mmc_error(MMC_ERR_SHAPE, "LoRA: module '%s' is [%lld, %lld]; the adapter's A is [%lld, %lld], B [%lld, "
                           "%lld]", ml->names[it->module], (long long)l->out_features, (long long)l->in_features,
                           (long long)it->A->shape[0], (long long)(it->A->ndim > 1 ? it->A->shape[1] : 0),
                           (long long)it->B->shape[0], (long long)(it->B->ndim > 1 ? it->B->shape[1] : 0));
            break;
        }
        s->r = (int)it->A->shape[0];                       /* this adapter's rank (they may differ) */
        if ((st = add_adapter(s, l, ml->names[it->module], it->module, false))) break;
        mmc_lora *a = &s->adapters[s->n - 1];
        memcpy(a->A->data, it->A->data, mmc_nbytes(a->A));
        memcpy(a->B->data, it->B->data, mmc_nbytes(a->B));
        a->scale = it->scale;
    }
    if (!st && n > 0) s->r = (int)items[0].A->shape[0], s->alpha = items[0].scale * (float)s->r;
    if (!st) st = targets_from_modules(s);
    if (st) { mmc_lora_free(s); return st; }
    *out = s;
    return MMC_OK;
}

void mmc_lora_merge_into(float *W, const float *A, const float *B, int64_t N, int64_t K, int64_t r,
                         float scale) {
    /* W [N, K] += scale · B [N, r] · A [r, K] */
    mmc_gemm_f32(false, false, N, K, r, scale, B, r, A, K, 1.0f, W, K);
}

/* ------------------------------------------------------------------ merge a directory */
#include <dirent.h>
#include <unistd.h>

static bool is_weight_file(const char *n) {
    size_t l = strlen(n);
    return (l > 12 && strcmp(n + l - 12, ".safetensors") == 0) || strcmp(n, "model.safetensors.index.json") == 0;
}

static void remove_tree1(const char *dir) {   /* a flat directory (what we write) */
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[2048];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

mmc_status mmc_lora_merge_file(const char *weights, const char *adapter_dir, const char *out_file, int *n_merged) {
    if (n_merged) *n_merged = 0;
    int r;
    float alpha, dropout;
    bool rs;
    mmc_status st = mmc_lora_read_config(adapter_dir, &r, &alpha, &dropout, &rs);
    if (st) return st;
    float scale = mmc_lora_scale(r, alpha, rs);
    mmc_st *base = NULL, *ad = NULL;
    mmc_stw *w = NULL;
    void **bufs = NULL;
    int nbufs = 0, merged = 0;
    char apath[1024];
    if ((st = mmc_st_open(weights, &base))) goto done;
    snprintf(apath, sizeof apath, "%s/adapter_model.safetensors", adapter_dir);
    if ((st = mmc_st_open(apath, &ad))) goto done;
    int nb = mmc_st_count(base);
    bufs = calloc((size_t)nb, sizeof *bufs);
    char *used = calloc((size_t)mmc_st_count(ad) + 1, 1);
    w = mmc_stw_new();
    if (!bufs || !used || !w) { free(used); st = mmc_error(MMC_ERR_OOM, "merge: out of memory"); goto done; }
    /* map each adapter module to a base weight */
    for (int i = 0; i < nb && !st; i++) {
        const mmc_st_entry *e = mmc_st_at(base, i);
        size_t ln = strlen(e->name);
        const mmc_st_entry *ea = NULL, *eb = NULL;
        int ia = -1;
        if (ln > 7 && strcmp(e->name + ln - 7, ".weight") == 0 && e->ndim == 2) {
            char mod[256], cm[256];
            snprintf(mod, sizeof mod, "%.*s", (int)(ln - 7), e->name);
            mmc_lora_canonical_name(mod, cm, sizeof cm);
            for (int k = 0; k < mmc_st_count(ad) && !ea; k++) {
                const mmc_st_entry *x = mmc_st_at(ad, k);
                const char *kn = x->name;
                size_t lk = strlen(kn), ls = strlen(".lora_A.weight");
                if (lk <= ls || strcmp(kn + lk - ls, ".lora_A.weight")) continue;
                const char *m0 = strncmp(kn, KEY_PREFIX, strlen(KEY_PREFIX)) == 0 ? kn + strlen(KEY_PREFIX) : kn;
                char am[256], ca[256];
                snprintf(am, sizeof am, "%.*s", (int)(strlen(m0) - ls), m0);
                mmc_lora_canonical_name(am, ca, sizeof ca);
                if (strcmp(am, mod) && strcmp(ca, cm)) continue;
                char kb[300];
                snprintf(kb, sizeof kb, "%.*slora_B.weight", (int)(lk - strlen("lora_A.weight")), kn);
                ea = x;
                ia = k;
                eb = mmc_st_find(ad, kb);
            }
        }
        if (!ea) {
            st = mmc_stw_add_raw(w, e->name, e->dtype, e->ndim, e->shape, e->data);
            continue;
        }
        int64_t N = e->shape[0], K = e->shape[1];
        if (!eb || ea->ndim != 2 || eb->ndim != 2 || ea->shape[1] != K || eb->shape[0] != N ||
            ea->shape[0] != eb->shape[1]) {
            st = mmc_error(MMC_ERR_SHAPE, "merge: adapter for '%s' [%lld, %lld] has a missing lora_B or mismatched "
                           "shapes", e->name, (long long)N, (long long)K);
            break;
        }
        if (e->dtype != MMC_F32 && e->dtype != MMC_BF16 && e->dtype != MMC_F16) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "merge: weight '%s' has dtype %s", e->name, mmc_dtype_name(e->dtype));
            break;
        }
        int64_t rr = ea->shape[0];
        float *W = malloc(sizeof(float) * (size_t)(N * K));
        float *A = malloc(sizeof(float) * (size_t)(rr * K));
        float *B = malloc(sizeof(float) * (size_t)(N * rr));
        if (!W || !A || !B) { free(W); free(A); free(B); st = mmc_error(MMC_ERR_OOM, "merge: out of memory"); break; }
        mmc_convert(W, MMC_F32, e->data, e->dtype, N * K);
        mmc_convert(A, MMC_F32, ea->data, ea->dtype, rr * K);
        mmc_convert(B, MMC_F32, eb->data, eb->dtype, N * rr);
        mmc_lora_merge_into(W, A, B, N, K, rr, scale);
        free(A);
        free(B);
        if (e->dtype != MMC_F32) {
            void *nw = malloc(mmc_dtype_size(e->dtype) * (size_t)(N * K));
            if (!nw) { free(W); st = mmc_error(MMC_ERR_OOM, "merge: out of memory"); break; }
            mmc_convert(nw, e->dtype, W, MMC_F32, N * K);
            free(W);
            W = nw;
        }
        bufs[nbufs++] = W;
        used[ia] = 1;
        merged++;
        st = mmc_stw_add_raw(w, e->name, e->dtype, 2, e->shape, W);
    }
    if (!st) {
        char miss[2048] = "";
        int nm = 0;
        for (int k = 0; k < mmc_st_count(ad); k++) {
            const char *kn = mmc_st_at(ad, k)->name;
            if (used[k] || !strstr(kn, ".lora_A.")) continue;
            size_t u = strlen(miss);
            snprintf(miss + u, sizeof miss - u, "\n  %s", kn);
            nm++;
        }
        if (nm) st = mmc_error(MMC_ERR_NOT_FOUND, "merge: %d adapter module%s match no 2-D weight of %s:%s", nm,
                               nm > 1 ? "s" : "", weights, miss);
    }
    free(used);
    if (st) goto done;
    if ((st = mmc_stw_set_metadata(w, "format", "pt"))) goto done;
    if ((st = mmc_stw_write(w, out_file))) goto done;
    if (n_merged) *n_merged = merged;
done:
    for (int i = 0; i < nbufs; i++) free(bufs[i]);
    free(bufs);
    mmc_stw_free(w);
    mmc_st_close(ad);
    mmc_st_close(base);
    return st;
}

mmc_status mmc_lora_merge_dir(const char *model_dir, const char *adapter_dir, const char *out_dir,
                              int *n_merged) {
    if (n_merged) *n_merged = 0;
    char tmp[1024], path[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out_dir, (long)getpid());
    bool made_tmp = false;
    int merged = 0;
    mmc_status st;
    remove_tree1(tmp);
    if (mkdir(tmp, 0755) != 0) { st = mmc_error(MMC_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno)); goto done; }
    made_tmp = true;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    if ((st = mmc_lora_merge_file(model_dir, adapter_dir, path, &merged))) goto done;
    /* copy config / tokenizer / processor files */
    DIR *d = opendir(model_dir);
    if (!d) { st = mmc_error(MMC_ERR_IO, "cannot list '%s': %s", model_dir, strerror(errno)); goto done; }
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.' || is_weight_file(e->d_name)) continue;
        char src[1200];
        snprintf(src, sizeof src, "%s/%s", model_dir, e->d_name);
        struct stat sb;
        if (stat(src, &sb) || !S_ISREG(sb.st_mode)) continue;
        char *data = NULL;
        size_t len = 0;
        if ((st = mmc_read_file(src, &data, &len))) break;
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        st = mmc_write_file_atomic(path, data, len);
        free(data);
    }
    closedir(d);
    if (st) goto done;
    if (rename(tmp, out_dir) != 0) {
        /* out_dir exists: move it aside, put the new one in place, then drop the old one */
        char old[1100];
        snprintf(old, sizeof old, "%s.old.%ld", out_dir, (long)getpid());
        if (rename(out_dir, old) != 0 || rename(tmp, out_dir) != 0) {
            st = mmc_error(MMC_ERR_IO, "cannot move '%s' to '%s': %s", tmp, out_dir, strerror(errno));
            goto done;
        }
        remove_tree1(old);
    }
    made_tmp = false;
    if (n_merged) *n_merged = merged;
done:
    if (made_tmp) remove_tree1(tmp);
    return st;
}

/* ------------------------------------------------------------------ diffusers' LoRA files
 * What diffusers' save_lora_weights writes and load_lora_weights reads for a pipeline
 * component: one pytorch_lora_weights.safetensors with "<component>.<module>.lora_A.weight" /
 * ".lora_B.weight" keys and, since diffusers 0.34, the LoraConfig as JSON in the
 * "lora_adapter_metadata" entry of __metadata__, its keys prefixed "<component>." (sorted, indent
 * 2, as json.dumps writes them). Without that entry the scale is 1 (alpha = r, diffusers'
 * convention for adapters that carry no alphas). */
#define DIFFUSERS_LORA_FILE "pytorch_lora_weights.safetensors"

mmc_status mmc_lora_save_diffusers(const mmc_lora_set *s, const char *dir, const char *component) {
    mmc_status st = make_dir(dir);
    if (st) return st;
    cJSON *j = cJSON_CreateObject();
    char *text = NULL;
    mmc_stw *w = mmc_stw_new();
    if (!j || !w) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    char key[320];
    /* cJSON keeps insertion order: add them sorted, as json.dumps(sort_keys=True) does */
    snprintf(key, sizeof key, "%s.bias", component);
    cJSON_AddStringToObject(j, key, "none");
    snprintf(key, sizeof key, "%s.lora_alpha", component);
    if (s->alpha == floorf(s->alpha)) cJSON_AddNumberToObject(j, key, (double)(int64_t)s->alpha);
    else cJSON_AddNumberToObject(j, key, s->alpha);
    snprintf(key, sizeof key, "%s.lora_dropout", component);
    cJSON_AddNumberToObject(j, key, (double)s->dropout);
    snprintf(key, sizeof key, "%s.r", component);
    cJSON_AddNumberToObject(j, key, s->r);
    snprintf(key, sizeof key, "%s.target_modules", component);
    cJSON *arr = cJSON_AddArrayToObject(j, key);    /* the adapted modules by full name */
    for (int i = 0; i < s->n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(s->names[i]));
    snprintf(key, sizeof key, "%s.use_dora", component);
    cJSON_AddFalseToObject(j, key);
    snprintf(key, sizeof key, "%s.use_rslora", component);
    cJSON_AddBoolToObject(j, key, s->use_rslora);
    if (!(text = cJSON_Print(j))) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    for (int i = 0; i < s->n && !st; i++) {
        snprintf(key, sizeof key, "%s.%s.lora_A.weight", component, s->names[i]);
        st = mmc_stw_add(w, key, s->adapters[i].A);
        snprintf(key, sizeof key, "%s.%s.lora_B.weight", component, s->names[i]);
        if (!st) st = mmc_stw_add(w, key, s->adapters[i].B);
    }
    if (!st) st = mmc_stw_set_metadata(w, "format", "pt");
    if (!st) st = mmc_stw_set_metadata(w, "lora_adapter_metadata", text);
    char path[1024];
    snprintf(path, sizeof path, "%s/" DIFFUSERS_LORA_FILE, dir);
    if (!st) st = mmc_stw_write(w, path);
done:
    mmc_stw_free(w);
    cJSON_Delete(j);
    free(text);
    return st;
}

mmc_status mmc_lora_load_diffusers(const char *path, const char *component, const mmc_module_list *ml, float weight,
                                   bool trainable, mmc_lora_set **out) {
    *out = NULL;
    char file[1024];
    size_t lp = strlen(path);
    if (lp > 12 && !strcmp(path + lp - 12, ".safetensors")) snprintf(file, sizeof file, "%s", path);
    else snprintf(file, sizeof file, "%s/" DIFFUSERS_LORA_FILE, path);
    mmc_st *w = NULL;
    mmc_status st = mmc_st_open(file, &w);
    if (st) return st;
    char pre[96], *errs = calloc(1, 4096);
    snprintf(pre, sizeof pre, "%s.", component);
    const size_t lpre = strlen(pre), lsuf = strlen(".lora_A.weight");
    mmc_lora_set *s = set_new(ml->n);
    cJSON *meta = NULL;
    int bad = 0;
    if (!s || !errs) { st = mmc_error(MMC_ERR_OOM, "LoRA: out of memory"); goto done; }
    /* the rank from the first adapter, alpha and rsLoRA from the metadata when there is one */
    s->r = 0;
    for (int e = 0; e < mmc_st_count(w) && !s->r; e++) {
        const mmc_st_entry *en = mmc_st_at(w, e);
        size_t lk = strlen(en->name);
        if (lk > lsuf && !strcmp(en->name + lk - lsuf, ".lora_A.weight") && en->ndim == 2) s->r = (int)en->shape[0];
    }
    if (!s->r) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: no <module>.lora_A.weight tensors: not a diffusers / PEFT LoRA file%s%s%s",
                       file, mmc_st_count(w) ? " (first key '" : "", mmc_st_count(w) ? mmc_st_at(w, 0)->name : "",
                       mmc_st_count(w) ? "'; kohya files are read by the SDXL / SD pipelines' --lora)" : "");
        goto done;
    }
    s->alpha = (float)s->r;
    const char *mtext = mmc_st_metadata(w, "lora_adapter_metadata");
    if (mtext) {
        meta = cJSON_Parse(mtext);
        if (!meta) { st = mmc_error(MMC_ERR_FORMAT, "%s: lora_adapter_metadata is not JSON", file); goto done; }
        char key[160];
        snprintf(key, sizeof key, "%slora_alpha", pre);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(meta, key);
        if (cJSON_IsNumber(a)) s->alpha = (float)a->valuedouble;
        snprintf(key, sizeof key, "%suse_rslora", pre);
        s->use_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, key));
        static const char *const per_module[] = {"rank_pattern", "alpha_pattern"};
        for (int k = 0; k < 2; k++) {
            snprintf(key, sizeof key, "%s%s", pre, per_module[k]);
            const cJSON *pm = cJSON_GetObjectItemCaseSensitive(meta, key);
            if (cJSON_IsObject(pm) && pm->child) {
                st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: per-module ranks or alphas (%s) are not supported", file, key);
                goto done;
            }
        }
        snprintf(key, sizeof key, "%suse_dora", pre);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, key))) {
            st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: DoRA adapters (use_dora) are not supported", file);
            goto done;
        }
    }
    for (int e = 0; e < mmc_st_count(w); e++) {
        const mmc_st_entry *en = mmc_st_at(w, e);
        const char *k = en->name;
        size_t lk = strlen(k);
        if (lk <= lsuf || strcmp(k + lk - lsuf, ".lora_A.weight") != 0) continue;
        if (strncmp(k, pre, lpre) != 0) continue;          /* another component's adapter (text encoder) */
        char mod[256], kb[320];
        snprintf(mod, sizeof mod, "%.*s", (int)(lk - lpre - lsuf), k + lpre);
        snprintf(kb, sizeof kb, "%.*s.lora_B.weight", (int)(lk - lsuf), k);
        int i = find_module(ml, mod);
        const mmc_st_entry *eb = mmc_st_find(w, kb);
        size_t u = strlen(errs);
        if (i < 0) {
            snprintf(errs + u, 4096 - u, "\n  adapter module '%s' is not a linear of this %s", mod, component);
            bad++;
            continue;
        }
        if (en->ndim != 2 || en->shape[0] != s->r || !eb || eb->ndim != 2 || eb->shape[1] != s->r) {
            snprintf(errs + u, 4096 - u, "\n  '%s': rank differs from %d or lora_B is missing (one rank per file "
                     "is supported)", mod, s->r);
            bad++;
            continue;
        }
        if (en->shape[1] != ml->mods[i]->in_features || eb->shape[0] != ml->mods[i]->out_features) {
            snprintf(errs + u, 4096 - u, "\n  '%s': adapter for a [%lld, %lld] weight, the module is [%lld, %lld]", mod,
                     (long long)eb->shape[0], (long long)en->shape[1], (long long)ml->mods[i]->out_features,
                     (long long)ml->mods[i]->in_features);
            bad++;
            continue;
        }
        if ((st = add_adapter(s, ml->mods[i], ml->names[i], i, trainable))) goto done;
        mmc_lora *a = &s->adapters[s->n - 1];
        if ((st = mmc_st_read_into(w, k, a->A)) || (st = mmc_st_read_into(w, kb, a->B))) {
            st = mmc_error_prefix(st, "%s", file);
            goto done;
        }
        a->scale *= weight;                                 /* set_adapters(weights=...) */
    }
    if (bad) {
        st = mmc_error(MMC_ERR_NOT_FOUND, "%s: %d problem%s:%s", file, bad, bad > 1 ? "s" : "", errs);
        goto done;
    }
    if (s->n == 0) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: no '%s*.lora_A.weight' tensors (an adapter for another component?)", file,
                       pre);
        goto done;
    }
    st = targets_from_modules(s);
done:
    cJSON_Delete(meta);
    free(errs);
    mmc_st_close(w);
    if (st) { mmc_lora_free(s); return st; }
    *out = s;
    return MMC_OK;
}
