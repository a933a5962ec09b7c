/* test_diffusers_dir.c — diffusers pipeline directories (mmc_diffusers_open): the Flux
 * pipeline folder FluxPipeline.save_pretrained wrote (tests/fixtures/diffusion/pipe_flux,
 * tools/ref/gen_diffusion.py) reads with its components, classes, parameter counts and
 * dtypes (bf16 VAE, f16 transformer, f32 text encoders); its VAE and scheduler load from
 * their folders; and each broken layout — a component missing, null, extra, of an unknown
 * class or of the wrong kind, a folder / config / weights file missing, a config whose class
 * disagrees, an unknown pipeline — is an error that names the component. */
#include "test_util.h"
#include "mmc_diffusion.h"

#include <unistd.h>

#define PIPE "tests/fixtures/diffusion/pipe_flux"

static void check_read(void) {
    mmc_diffusers_dir d;
    CHECK_OK(mmc_diffusers_open(PIPE, &d));
    CHECK(!strcmp(d.pipeline, "FluxPipeline") && !strcmp(d.diffusers_version, "0.42.1"));
    CHECK(d.n == 9);
    const mmc_diffusers_component *vae = mmc_diffusers_find(&d, "vae"), *tr = mmc_diffusers_find(&d, "transformer");
    const mmc_diffusers_component *te = mmc_diffusers_find(&d, "text_encoder_2"), *sc = mmc_diffusers_find(&d, "scheduler");
    const mmc_diffusers_component *ie = mmc_diffusers_find(&d, "image_encoder"), *tk = mmc_diffusers_find(&d, "tokenizer_2");
    CHECK(vae && vae->present && vae->kind == MMC_DCOMP_VAE && vae->mmc_implements && !strcmp(vae->class_name, "AutoencoderKL"));
    CHECK(vae && vae->n_dtypes == 1 && vae->dtypes[0] == MMC_BF16);
    CHECK(tr && tr->kind == MMC_DCOMP_TRANSFORMER && tr->mmc_implements && tr->n_dtypes == 1 && tr->dtypes[0] == MMC_F16);
    CHECK(te && !strcmp(te->library, "transformers") && !strcmp(te->class_name, "T5EncoderModel") &&
          te->dtypes[0] == MMC_F32 && te->n_params > 0 && strstr(te->weights, "model.safetensors"));
    CHECK(sc && sc->kind == MMC_DCOMP_SCHEDULER && sc->mmc_implements && sc->n_params == 0 && !sc->weights[0]);
    CHECK(tk && tk->kind == MMC_DCOMP_TOKENIZER && tk->n_params == 0);
    CHECK(ie && !ie->present);
    CHECK(mmc_diffusers_find(&d, "unet") == NULL);
    /* the components load from their folders; the parameter counts agree */
    char p[1024];
    mmc_diffusers_path(&d, "vae", "", p, sizeof p);
    mmc_vae *v = NULL;
    CHECK_OK(mmc_vae_load(p, &v));
    if (v && vae) CHECK(mmc_vae_param_count(v) == vae->n_params);
    mmc_vae_free(v);
    mmc_diffusers_path(&d, "scheduler", "", p, sizeof p);
    mmc_fm_scheduler s;
    CHECK_OK(mmc_fm_load(p, &s));
    CHECK(s.cfg.use_dynamic_shifting && s.cfg.shift == 3.0);
    mmc_fm_free(&s);
    mmc_diffusers_print(&d, stdout);
}

/* ---- broken layouts, each built in a copy of the fixture */
static char g_tmp[64];

static void fresh_copy(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s/p && cp -r " PIPE " %s/p", g_tmp, g_tmp);
    CHECK(system(cmd) == 0);
}

static void run(const char *shell) {   /* a command run inside the copy */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd %s/p && %s", g_tmp, shell);
    CHECKF(system(cmd) == 0, "%s", shell);
}

/* model_index.json with `key` set to `value` (JSON text; NULL removes the key) */
static void set_component(const char *key, const char *value) {
    char path[256], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/p/model_index.json", g_tmp);
    CHECK_OK(mmc_read_file(path, &text, &len));
    FILE *f = fopen(path, "w");
    if (!f || !text) { CHECK(0); free(text); return; }
    /* rewrite the object from the start: "{", the edited key first, then the rest */
    fputs("{\n", f);
    if (value) fprintf(f, "  \"%s\": %s,\n", key, value);
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": [", key);
    char *s = strchr(text, '{') + 1, *hit = strstr(s, pat);
    if (hit) {   /* drop the old entry: up to and including its "]," */
        char *end = strstr(hit, "]"), *pe = hit;
        end++;
        while (*end == ',' || *end == ' ' || *end == '\n') end++;
        if (*end == '}') {   /* the last entry: drop the comma before it instead */
            while (pe > s && (pe[-1] == ' ' || pe[-1] == '\n')) pe--;
            if (pe > s && pe[-1] == ',') pe--;
        }
        fwrite(s, 1, (size_t)(pe - s), f);
        fputs(*end == '}' ? "\n" : "  ", f);
        s = end;
    }
    fputs(s, f);
    fclose(f);
    free(text);
}

static void expect(mmc_status want, const char *a, const char *b) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/p", g_tmp);
    mmc_diffusers_dir d;
    mmc_status st = mmc_diffusers_open(dir, &d);
    CHECKF(st == want, "status %d, expected %d (%s)", st, want, mmc_last_error());
    CHECKF(strstr(mmc_last_error(), a) && (!b || strstr(mmc_last_error(), b)), "error '%s' lacks '%s' / '%s'",
           mmc_last_error(), a, b ? b : "");
}

/* One broken layout per row: model_index.json's `key` set to `value` (NULL: removed), or, with
 * key NULL, a shell command run in the copy; then the error code and two parts of its message. */
static const struct {
    const char *key, *value;
    mmc_status code;
    const char *a, *b;
} BROKEN[] = {
    {"tokenizer_2", NULL, MMC_ERR_NOT_FOUND, "needs component 'tokenizer_2'", "FluxPipeline"},
    {"text_encoder", "[null, null]", MMC_ERR_NOT_FOUND, "component 'text_encoder' is null", NULL},
    {"unet", "[\"diffusers\", \"UNet2DConditionModel\"]", MMC_ERR_FORMAT,
     "component 'unet' is not one FluxPipeline takes", "transformer"},
    {"vae", "[\"diffusers\", \"AutoencoderKLMagic\"]", MMC_ERR_UNSUPPORTED, "component 'vae'", "AutoencoderKLMagic"},
    {"vae", "[\"diffusers\", \"FluxTransformer2DModel\"]", MMC_ERR_FORMAT, "component 'vae' must be a vae",
     "FluxTransformer2DModel is a transformer"},
    {"text_encoder", "[\"diffusers\", \"CLIPTextModel\"]", MMC_ERR_FORMAT, "component 'text_encoder'",
     "library 'transformers'"},
    {"vae", "[\"diffusers\"]", MMC_ERR_FORMAT, "component 'vae' must be", NULL},
    {NULL, "rm -r text_encoder_2", MMC_ERR_NOT_FOUND, "component 'text_encoder_2'", "folder is missing"},
    {NULL, "rm transformer/diffusion_pytorch_model.safetensors", MMC_ERR_NOT_FOUND, "component 'transformer'",
     "no weights"},
    {NULL, "rm scheduler/scheduler_config.json", MMC_ERR_NOT_FOUND, "component 'scheduler'", "scheduler_config.json"},
    {NULL, "sed -i 's/\"_class_name\": \"AutoencoderKL\"/\"_class_name\": \"AutoencoderTiny\"/' vae/config.json",
     MMC_ERR_FORMAT, "component 'vae'", "AutoencoderTiny"},
    {NULL, "sed -i 's/\"FluxPipeline\"/\"FluxKontextPipeline\"/' model_index.json", MMC_ERR_UNSUPPORTED,
     "FluxKontextPipeline", NULL},
    {NULL, "rm model_index.json", MMC_ERR_NOT_FOUND, "model_index.json", NULL},
};

static void check_errors(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/mmc_pipe_XXXXXX");
    if (!mkdtemp(g_tmp)) { CHECK(0); return; }
    for (size_t i = 0; i < sizeof BROKEN / sizeof *BROKEN; i++) {
        fresh_copy();
        if (BROKEN[i].key) set_component(BROKEN[i].key, BROKEN[i].value);
        else run(BROKEN[i].value);
        expect(BROKEN[i].code, BROKEN[i].a, BROKEN[i].b);
    }
    /* optional components may be listed as null or left out */
    fresh_copy();
    set_component("image_encoder", NULL);
    mmc_diffusers_dir d;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/p", g_tmp);
    CHECK_OK(mmc_diffusers_open(dir, &d));
    CHECK(d.n == 8);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    if (access(PIPE "/model_index.json", R_OK) != 0) {
        fprintf(stderr, "test_diffusers_dir: fixtures absent (tools/ref/gen_diffusion.py); skipping\n");
        return 77;
    }
    check_read();
    check_errors();
    return test_done("test_diffusers_dir");
}
