/* diffusers_dir.c — reading a diffusers pipeline directory as DiffusionPipeline.from_pretrained
 * lays it out (diffusers/pipelines/pipeline_utils.py, pipeline_loading_utils.py):
 * model_index.json holds "_class_name" (the pipeline), "_diffusers_version", pipeline
 * settings (plain values, e.g. requires_safety_checker) and one ["library", "ClassName"]
 * pair per component ([null, null] for an optional one left out); each present component is
 * a folder of its name with its config (config.json; scheduler_config.json for schedulers;
 * tokenizer_config.json / tokenizer.json for tokenizers; preprocessor_config.json for image
 * processors) and, for models, safetensors: diffusers' diffusion_pytorch_model.safetensors
 * or transformers' model.safetensors, each possibly sharded behind a .index.json.
 *
 * The checks are those the pipelines' __init__ signatures imply (a table per pipeline class,
 * below): every component the pipeline takes must be listed and present unless optional;
 * nothing else may be listed; each class must be one mmc knows, of the kind its slot takes,
 * from the library that defines it; folders, configs and weights must exist, and a config's
 * own class (_class_name / architectures) must agree with model_index.json. Every error names
 * the component, and the file where there is one. */
#include "mmc_diffusion.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ what mmc knows */
typedef struct {
    const char *library, *name;
    mmc_dcomp_kind kind;
    bool implemented;
} class_info;

static const class_info CLASSES[] = {
    {"diffusers", "AutoencoderKL", MMC_DCOMP_VAE, true},
    {"diffusers", "AutoencoderTiny", MMC_DCOMP_VAE, false},
    {"diffusers", "FluxTransformer2DModel", MMC_DCOMP_TRANSFORMER, true},
    {"diffusers", "SD3Transformer2DModel", MMC_DCOMP_TRANSFORMER, true},
    {"diffusers", "WanTransformer3DModel", MMC_DCOMP_TRANSFORMER, true},
    {"diffusers", "AutoencoderKLWan", MMC_DCOMP_VAE, true},
    {"diffusers", "UniPCMultistepScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "UNet2DConditionModel", MMC_DCOMP_UNET, true},
    {"diffusers", "FlowMatchEulerDiscreteScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "EulerDiscreteScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "EulerAncestralDiscreteScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "DDIMScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "PNDMScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "LMSDiscreteScheduler", MMC_DCOMP_SCHEDULER, false},
    {"diffusers", "DPMSolverMultistepScheduler", MMC_DCOMP_SCHEDULER, true},
    {"diffusers", "HunyuanDiT2DModel", MMC_DCOMP_TRANSFORMER, true},
    {"diffusers", "DDPMScheduler", MMC_DCOMP_SCHEDULER, true},   /* sampled by the HunyuanDiT pipeline */
    {"transformers", "BertModel", MMC_DCOMP_TEXT_ENCODER, true},
    {"transformers", "BertTokenizer", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "BertTokenizerFast", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "CLIPTextModel", MMC_DCOMP_TEXT_ENCODER, true},
    {"transformers", "CLIPTextModelWithProjection", MMC_DCOMP_TEXT_ENCODER, true},
    {"transformers", "T5EncoderModel", MMC_DCOMP_TEXT_ENCODER, true},
    {"transformers", "UMT5EncoderModel", MMC_DCOMP_TEXT_ENCODER, true},
    {"transformers", "CLIPTokenizer", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "CLIPTokenizerFast", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "T5Tokenizer", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "T5TokenizerFast", MMC_DCOMP_TOKENIZER, true},
    {"transformers", "CLIPVisionModelWithProjection", MMC_DCOMP_IMAGE_ENCODER, false},
    {"transformers", "CLIPVisionModel", MMC_DCOMP_IMAGE_ENCODER, true},   /* Wan2.1 I2V's image_encoder */
    {"transformers", "CLIPImageProcessor", MMC_DCOMP_FEATURE_EXTRACTOR, true},
    {"transformers", "CLIPFeatureExtractor", MMC_DCOMP_FEATURE_EXTRACTOR, false},
    {"stable_diffusion", "StableDiffusionSafetyChecker", MMC_DCOMP_SAFETY_CHECKER, false},
};

typedef struct {
    const char *name;
    mmc_dcomp_kind kind;
    bool optional;
} slot;

typedef struct {
    const char *names[4];   /* pipeline classes sharing these slots */
    slot slots[12];
} pipeline_info;

#define OPT_IMAGE {"image_encoder", MMC_DCOMP_IMAGE_ENCODER, true}, \
                  {"feature_extractor", MMC_DCOMP_FEATURE_EXTRACTOR, true}
static const pipeline_info PIPELINES[] = {
    {{"FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline"},
     {{"scheduler", MMC_DCOMP_SCHEDULER, false}, {"vae", MMC_DCOMP_VAE, false},
      {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false}, {"tokenizer", MMC_DCOMP_TOKENIZER, false},
      {"text_encoder_2", MMC_DCOMP_TEXT_ENCODER, false}, {"tokenizer_2", MMC_DCOMP_TOKENIZER, false},
      {"transformer", MMC_DCOMP_TRANSFORMER, false}, OPT_IMAGE}},
    /* SD3: text_encoder_3 / tokenizer_3 may be dropped (from_pretrained(text_encoder_3=None)) */
    {{"StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline"},
     {{"transformer", MMC_DCOMP_TRANSFORMER, false}, {"scheduler", MMC_DCOMP_SCHEDULER, false},
      {"vae", MMC_DCOMP_VAE, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false},
      {"tokenizer", MMC_DCOMP_TOKENIZER, false}, {"text_encoder_2", MMC_DCOMP_TEXT_ENCODER, false},
      {"tokenizer_2", MMC_DCOMP_TOKENIZER, false}, {"text_encoder_3", MMC_DCOMP_TEXT_ENCODER, true},
      {"tokenizer_3", MMC_DCOMP_TOKENIZER, true}, OPT_IMAGE}},
    {{"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"},
     {{"vae", MMC_DCOMP_VAE, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false},
      {"tokenizer", MMC_DCOMP_TOKENIZER, false}, {"unet", MMC_DCOMP_UNET, false},
      {"scheduler", MMC_DCOMP_SCHEDULER, false}, {"safety_checker", MMC_DCOMP_SAFETY_CHECKER, true}, OPT_IMAGE}},
    /* SDXL: the refiner (StableDiffusionXLImg2ImgPipeline) ships without text_encoder / tokenizer */
    {{"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"},
     {{"vae", MMC_DCOMP_VAE, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, true},
      {"text_encoder_2", MMC_DCOMP_TEXT_ENCODER, false}, {"tokenizer", MMC_DCOMP_TOKENIZER, true},
      {"tokenizer_2", MMC_DCOMP_TOKENIZER, false}, {"unet", MMC_DCOMP_UNET, false},
      {"scheduler", MMC_DCOMP_SCHEDULER, false}, OPT_IMAGE}},
    /* Wan2.1 text-to-video; transformer_2 is Wan2.2's low-noise expert (null in Wan2.1 folders) */
    {{"WanPipeline"},
     {{"tokenizer", MMC_DCOMP_TOKENIZER, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false},
      {"vae", MMC_DCOMP_VAE, false}, {"transformer", MMC_DCOMP_TRANSFORMER, false},
      {"scheduler", MMC_DCOMP_SCHEDULER, false}, {"transformer_2", MMC_DCOMP_TRANSFORMER, true}}},
    /* Wan2.1 image-to-video: the CLIP vision tower and its processor (null in Wan2.2's I2V folders) */
    {{"WanImageToVideoPipeline"},
     {{"tokenizer", MMC_DCOMP_TOKENIZER, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false},
      {"vae", MMC_DCOMP_VAE, false}, {"transformer", MMC_DCOMP_TRANSFORMER, false},
      {"scheduler", MMC_DCOMP_SCHEDULER, false}, {"image_processor", MMC_DCOMP_FEATURE_EXTRACTOR, true},
      {"image_encoder", MMC_DCOMP_IMAGE_ENCODER, true}, {"transformer_2", MMC_DCOMP_TRANSFORMER, true}}},
    /* HunyuanDiT: BERT + T5 (MT5) text encoders */
    {{"HunyuanDiTPipeline"},
     {{"vae", MMC_DCOMP_VAE, false}, {"text_encoder", MMC_DCOMP_TEXT_ENCODER, false},
      {"tokenizer", MMC_DCOMP_TOKENIZER, false}, {"transformer", MMC_DCOMP_TRANSFORMER, false},
      {"scheduler", MMC_DCOMP_SCHEDULER, false}, {"safety_checker", MMC_DCOMP_SAFETY_CHECKER, true},
      {"feature_extractor", MMC_DCOMP_FEATURE_EXTRACTOR, true}, {"text_encoder_2", MMC_DCOMP_TEXT_ENCODER, false},
      {"tokenizer_2", MMC_DCOMP_TOKENIZER, false}}},
};

const char *mmc_dcomp_kind_name(mmc_dcomp_kind k) {
    static const char *const n[] = {"vae", "transformer", "unet", "text_encoder", "tokenizer", "scheduler",
                                    "image_encoder", "feature_extractor", "safety_checker"};
    return k >= 0 && k < MMC_DCOMP_KIND_COUNT ? n[k] : "?";
}

static const pipeline_info *find_pipeline(const char *name) {
    for (size_t p = 0; p < sizeof PIPELINES / sizeof *PIPELINES; p++)
        for (int i = 0; i < 4 && PIPELINES[p].names[i]; i++)
            if (!strcmp(PIPELINES[p].names[i], name)) return &PIPELINES[p];
    return NULL;
}

static const slot *find_slot(const pipeline_info *p, const char *name) {
    for (int i = 0; i < 12 && p->slots[i].name; i++)
        if (!strcmp(p->slots[i].name, name)) return &p->slots[i];
    return NULL;
}

static void slot_list(const pipeline_info *p, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < 12 && p->slots[i].name; i++) {
        size_t u = strlen(buf);
        snprintf(buf + u, n - u, "%s%s%s", i ? ", " : "", p->slots[i].name, p->slots[i].optional ? " (optional)" : "");
    }
}

/* ------------------------------------------------------------------ files */
static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void mmc_diffusers_path(const mmc_diffusers_dir *d, const char *component, const char *file, char *buf, size_t n) {
    if (*file) snprintf(buf, n, "%s/%s/%s", d->dir, component, file);
    else snprintf(buf, n, "%s/%s", d->dir, component);      /* the component's folder */
}

mmc_status mmc_diffusion_check_size(int height, int width, int multiple, const char *why) {
    const int m = multiple;
    if (height >= m && width >= m && height % m == 0 && width % m == 0) return MMC_OK;
    const int nh = height < m ? m : (height + m / 2) / m * m, nw = width < m ? m : (width + m / 2) / m * m;
    return mmc_error(MMC_ERR_INVALID, "image size %dx%d (width x height): both must be positive multiples of %d for "
                     "this pipeline (%s); the nearest valid size is %dx%d", width, height, m, why, nw, nh);
}

const mmc_diffusers_component *mmc_diffusers_find(const mmc_diffusers_dir *d, const char *name) {
    for (int i = 0; i < d->n; i++)
        if (!strcmp(d->comp[i].name, name)) return &d->comp[i];
    return NULL;
}

/* The component's own config agrees with model_index.json: diffusers writes _class_name,
 * transformers writes architectures (models) or tokenizer_class (tokenizers). */
static mmc_status check_config(const mmc_diffusers_dir *d, const mmc_diffusers_component *c) {
    static const char *const config_json[3] = {"config.json"};
    static const char *const by_kind[MMC_DCOMP_KIND_COUNT][3] = {
        [MMC_DCOMP_SCHEDULER] = {"scheduler_config.json"},
        [MMC_DCOMP_TOKENIZER] = {"tokenizer_config.json", "tokenizer.json", "vocab.json"},
        [MMC_DCOMP_FEATURE_EXTRACTOR] = {"preprocessor_config.json"},
    };
    const char *const *names = by_kind[c->kind][0] ? by_kind[c->kind] : config_json;
    char path[1024] = "";
    const char *found = NULL;
    for (int i = 0; i < 3 && names[i] && !found; i++) {
        mmc_diffusers_path(d, c->name, names[i], path, sizeof path);
        if (is_file(path)) found = names[i];
    }
    if (!found)
        return mmc_error(MMC_ERR_NOT_FOUND, "%s/%s: component '%s' (%s) has no %s", d->dir, c->name, c->name,
                         c->class_name, names[0]);
    if (c->kind == MMC_DCOMP_TOKENIZER && strcmp(found, "tokenizer_config.json") != 0) return MMC_OK;
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    const char *cls = NULL;
    if (!strcmp(c->library, "diffusers")) st = mmc_json_str(j, "_class_name", NULL, &cls);
    else if (c->kind == MMC_DCOMP_TOKENIZER) st = mmc_json_str(j, "tokenizer_class", NULL, &cls);
    else if (c->kind != MMC_DCOMP_FEATURE_EXTRACTOR) st = mmc_json_str(j, "architectures.0", NULL, &cls);
    if (!st && cls && strcmp(cls, c->class_name) != 0) {
        /* transformers writes the slow/fast tokenizer pair interchangeably */
        size_t n = strlen(c->class_name), m = strlen(cls);
        bool fast_pair = c->kind == MMC_DCOMP_TOKENIZER &&
                         ((m == n + 4 && !strncmp(cls, c->class_name, n) && !strcmp(cls + n, "Fast")) ||
                          (n == m + 4 && !strncmp(c->class_name, cls, m) && !strcmp(c->class_name + m, "Fast")));
        if (!fast_pair)
            st = mmc_error(MMC_ERR_FORMAT, "%s: component '%s' is a %s by model_index.json but its %s says %s",
                           path, c->name, c->class_name, found, cls);
    }
    mmc_json_free(j);
    return st;
}

/* Weights: count the parameters per dtype (the mapping is opened, read, closed). */
static mmc_status scan_weights(const mmc_diffusers_dir *d, mmc_diffusers_component *c) {
    static const char *const files[] = {
        "diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json",
        "model.safetensors", "model.safetensors.index.json"};
    for (int i = 0; i < 4 && !c->weights[0]; i++) {
        char p[sizeof c->weights];
        mmc_diffusers_path(d, c->name, files[i], p, sizeof p);
        if (is_file(p)) snprintf(c->weights, sizeof c->weights, "%s", p);
    }
    if (!c->weights[0])
        return mmc_error(MMC_ERR_NOT_FOUND, "%s/%s: component '%s' (%s) has no weights: expected "
                         "diffusion_pytorch_model.safetensors or model.safetensors (or their .index.json)",
                         d->dir, c->name, c->name, c->class_name);
    mmc_st *st = NULL;
    mmc_status rc = mmc_st_open(c->weights, &st);
    if (rc) return mmc_error_prefix(rc, "component '%s': ", c->name);
    for (int i = 0; i < mmc_st_count(st); i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        int64_t n = 1;
        for (int k = 0; k < e->ndim; k++) n *= e->shape[k];
        c->n_params += n;
        int k = 0;
        while (k < c->n_dtypes && c->dtypes[k] != e->dtype) k++;
        if (k == c->n_dtypes && k < MMC_DIFFUSERS_MAX_DTYPES) c->dtypes[c->n_dtypes++] = e->dtype;
        if (k < MMC_DIFFUSERS_MAX_DTYPES) c->dtype_params[k] += n;
    }
    mmc_st_close(st);
    return MMC_OK;
}

static bool has_weights(mmc_dcomp_kind k) {
    return k == MMC_DCOMP_VAE || k == MMC_DCOMP_TRANSFORMER || k == MMC_DCOMP_UNET || k == MMC_DCOMP_TEXT_ENCODER ||
           k == MMC_DCOMP_IMAGE_ENCODER || k == MMC_DCOMP_SAFETY_CHECKER;
}

/* ------------------------------------------------------------------ model_index.json */
static mmc_status read_entry(const char *path, const pipeline_info *pi, const char *pipeline, const cJSON *it,
                             mmc_diffusers_component *c) {
    const char *key = it->string;
    char slots[512];
    const slot *s = find_slot(pi, key);
    if (!s) {
        slot_list(pi, slots, sizeof slots);
        return mmc_error(MMC_ERR_FORMAT, "%s: component '%s' is not one %s takes (its components: %s)", path, key,
                         pipeline, slots);
    }
    snprintf(c->name, sizeof c->name, "%s", key);
    c->kind = s->kind;
    const cJSON *lib = cJSON_GetArrayItem(it, 0), *cls = cJSON_GetArrayItem(it, 1);
    if (cJSON_GetArraySize(it) != 2 || !(cJSON_IsString(lib) || cJSON_IsNull(lib)) ||
        !(cJSON_IsString(cls) || cJSON_IsNull(cls)) || cJSON_IsNull(lib) != cJSON_IsNull(cls))
        return mmc_error(MMC_ERR_FORMAT, "%s: component '%s' must be [\"library\", \"ClassName\"] or [null, null]",
                         path, key);
    if (cJSON_IsNull(lib)) {
        if (!s->optional)
            return mmc_error(MMC_ERR_NOT_FOUND, "%s: component '%s' is null, but %s needs it", path, key, pipeline);
        return MMC_OK;
    }
    c->present = true;
    snprintf(c->library, sizeof c->library, "%s", lib->valuestring);
    snprintf(c->class_name, sizeof c->class_name, "%s", cls->valuestring);
    const class_info *ci = NULL;
    for (size_t i = 0; i < sizeof CLASSES / sizeof *CLASSES && !ci; i++)
        if (!strcmp(CLASSES[i].name, c->class_name)) ci = &CLASSES[i];
    if (!ci)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: component '%s' has class %s.%s, which mmc does not know", path, key,
                         c->library, c->class_name);
    if (ci->kind != s->kind)
        return mmc_error(MMC_ERR_FORMAT, "%s: component '%s' must be a %s, but %s is a %s", path, key,
                         mmc_dcomp_kind_name(s->kind), c->class_name, mmc_dcomp_kind_name(ci->kind));
    if (strcmp(ci->library, c->library) != 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: component '%s': %s comes from library '%s', not '%s'", path, key,
                         c->class_name, ci->library, c->library);
    c->mmc_implements = ci->implemented;
    return MMC_OK;
}

mmc_status mmc_diffusers_open(const char *dir, mmc_diffusers_dir *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "%s", dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if (!is_file(path))
        return mmc_error(MMC_ERR_NOT_FOUND, "%s: no model_index.json: not a diffusers pipeline directory", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    const cJSON *root = (const cJSON *)j;
    const char *pipeline = NULL, *ver = NULL;
    if (!mmc_json_is_object(j)) { st = mmc_error(MMC_ERR_FORMAT, "%s: not a JSON object", path); goto done; }
    if ((st = mmc_json_str(j, "_class_name", NULL, &pipeline)) || (st = mmc_json_str(j, "_diffusers_version", "", &ver)))
        goto done;
    if (!pipeline) { st = mmc_error(MMC_ERR_FORMAT, "%s: '_class_name' (the pipeline class) is missing", path); goto done; }
    snprintf(d->pipeline, sizeof d->pipeline, "%s", pipeline);
    snprintf(d->diffusers_version, sizeof d->diffusers_version, "%s", ver);
    const pipeline_info *pi = find_pipeline(pipeline);
    if (!pi) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: pipeline class %s is not one mmc knows (FluxPipeline, "
                       "StableDiffusion3Pipeline, StableDiffusionPipeline, StableDiffusionXLPipeline and their "
                       "img2img forms, WanPipeline, WanImageToVideoPipeline, HunyuanDiTPipeline)", path, pipeline);
        goto done;
    }
    /* components: the [library, class] arrays; keys starting with '_' and plain values are settings */
    for (const cJSON *it = root->child; it; it = it->next) {
        if (it->string[0] == '_' || !cJSON_IsArray(it)) continue;
        if (d->n == MMC_DIFFUSERS_MAX_COMPONENTS) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: more than %d components", path, MMC_DIFFUSERS_MAX_COMPONENTS);
            goto done;
        }
        if ((st = read_entry(path, pi, pipeline, it, &d->comp[d->n]))) goto done;
        d->n++;
    }
    for (int i = 0; i < 12 && pi->slots[i].name; i++)
        if (!pi->slots[i].optional && !mmc_diffusers_find(d, pi->slots[i].name)) {
            st = mmc_error(MMC_ERR_NOT_FOUND, "%s: %s needs component '%s' (a %s), which model_index.json does not "
                           "list", path, pipeline, pi->slots[i].name, mmc_dcomp_kind_name(pi->slots[i].kind));
            goto done;
        }
    for (int i = 0; i < d->n; i++) {
        mmc_diffusers_component *c = &d->comp[i];
        if (!c->present) continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", dir, c->name);
        if (!is_dir(sub)) {
            st = mmc_error(MMC_ERR_NOT_FOUND, "%s: component '%s' (%s) is listed in model_index.json but the folder "
                           "is missing", sub, c->name, c->class_name);
            goto done;
        }
        if ((st = check_config(d, c))) goto done;
        if (has_weights(c->kind) && (st = scan_weights(d, c))) goto done;
    }
done:
    mmc_json_free(j);
    return st;
}

/* ------------------------------------------------------------------ summary */
static void human(int64_t n, char *buf, size_t cap) {
    if (n >= 1000000000) snprintf(buf, cap, "%.2fB", n / 1e9);
    else if (n >= 1000000) snprintf(buf, cap, "%.2fM", n / 1e6);
    else if (n >= 1000) snprintf(buf, cap, "%.1fK", n / 1e3);
    else snprintf(buf, cap, "%lld", (long long)n);
}

void mmc_diffusers_print(const mmc_diffusers_dir *d, FILE *f) {
    fprintf(f, "%s (diffusers %s) at %s\n", d->pipeline, d->diffusers_version[0] ? d->diffusers_version : "?", d->dir);
    fprintf(f, "  %-18s %-48s %-14s %8s  %-14s %s\n", "component", "class", "kind", "params", "dtypes", "mmc");
    int64_t total = 0;
    for (int i = 0; i < d->n; i++) {
        const mmc_diffusers_component *c = &d->comp[i];
        if (!c->present) {
            fprintf(f, "  %-18s %s\n", c->name, "(none)");
            continue;
        }
        char cls[160], np[32] = "-", dt[64] = "-";
        snprintf(cls, sizeof cls, "%s.%s", c->library, c->class_name);
        if (c->weights[0]) human(c->n_params, np, sizeof np);
        for (int k = 0; k < c->n_dtypes; k++) {
            size_t u = k ? strlen(dt) : 0;
            snprintf(dt + u, sizeof dt - u, "%s%s", k ? "+" : "", mmc_dtype_name(c->dtypes[k]));
        }
        total += c->n_params;
        fprintf(f, "  %-18s %-48s %-14s %8s  %-14s %s\n", c->name, cls, mmc_dcomp_kind_name(c->kind), np, dt,
                c->mmc_implements ? "yes" : "not yet");
    }
    char t[32];
    human(total, t, sizeof t);
    fprintf(f, "  total parameters: %s\n", t);
}
