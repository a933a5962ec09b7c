/* cmd_info.c — `mmc info DIR`: what a Hugging Face model directory holds: model type and
 * architecture, parameter counts by component, weight dtypes, context length, and whether
 * mmc can run it. Reads config.json and the safetensors headers only (no weights loaded). */
#include "cli.h"
#include "mmc_diffusion.h"
#include "mmc_infer.h"
#include "mmc_io.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void help_info(FILE *f) {
    fprintf(f, "usage: mmc info DIR [--json]\n\n"
               "Describe the Hugging Face model directory DIR (config.json + safetensors):\n"
               "architecture, parameter counts by component, dtypes, context length and the\n"
               "generation settings (generation_config.json). A diffusers pipeline folder\n"
               "(model_index.json) lists its components, their classes, parameters and dtypes,\n"
               "and which of them mmc implements.\n\n"
               "options:\n"
               "  --json     print one JSON object instead of a table\n"
               "  -h, --help this help\n");
}

typedef struct { const char *label; const char *match[4]; int64_t params; } component;

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] == '-') return cli_usage("info", "unknown option '%s'", argv[i]);
        else if (!dir) dir = argv[i];
        else return cli_usage("info", "more than one directory given ('%s' and '%s')", dir, argv[i]);
    }
    if (!dir) return cli_usage("info", "no model directory given (usage: mmc info DIR)");
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", dir);   /* a diffusers pipeline folder */
    if (access(path, F_OK) == 0) {
        if (json) return cli_usage("info", "--json is not available for diffusers pipeline folders yet");
        mmc_diffusers_dir d;
        mmc_status dst = mmc_diffusers_open(dir, &d);
        if (dst) return cli_fail(dst, "info: cannot read the diffusers pipeline");
        mmc_diffusers_print(&d, stdout);
        return 0;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return cli_fail(st, "info: cannot read the model config");
    mmc_st *w = NULL;
    st = mmc_st_open(dir, &w);
    if (st) { mmc_json_free(cfg); return cli_fail(st, "info: cannot open the weights"); }
    mmc_gen_config gen;
    if ((st = mmc_gen_config_read(dir, &gen))) {
        mmc_st_close(w);
        mmc_json_free(cfg);
        return cli_fail(st, "info: cannot read the generation config");
    }
    char eos[160] = "the tokenizer's";
    for (int k = 0, o = 0; k < gen.n_eos && o < (int)sizeof eos - 16; k++)
        o += snprintf(eos + o, sizeof eos - (size_t)o, k ? ", %d" : "%d", gen.eos_ids[k]);

    const char *model_type = "?", *arch = "?";
    mmc_json_str(cfg, "model_type", "?", &model_type);
    mmc_json_str(cfg, "architectures.0", "?", &arch);
    int64_t ctx_len = 0;
    if (mmc_json_int(cfg, "max_position_embeddings", 0, &ctx_len) == MMC_OK && ctx_len == 0)
        mmc_json_int(cfg, "text_config.max_position_embeddings", 0, &ctx_len);
    component comps[] = {
        {"vision tower", {"visual.blocks", "visual.patch_embed", "vision_tower", "vision_model"}, 0},
        {"merger/projector", {"visual.merger", "multi_modal_projector", "mm_projector", "mlp1"}, 0},
        {"embeddings", {"embed_tokens", NULL}, 0},
        {"language model", {"layers.", "norm.weight", NULL}, 0},
        {"lm head", {"lm_head", NULL}, 0},
        {"other", {NULL}, 0},
    };
    int ncomp = sizeof comps / sizeof comps[0];
    int64_t total = 0, by_dtype[MMC_DTYPE_COUNT] = {0};
    for (int i = 0; i < mmc_st_count(w); i++) {
        const mmc_st_entry *e = mmc_st_at(w, i);
        int64_t n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        total += n;
        by_dtype[e->dtype] += n;
        int c = ncomp - 1;
        for (int k = 0; k < ncomp - 1 && c == ncomp - 1; k++)
            for (int j = 0; j < 4 && comps[k].match[j]; j++)
                if (strstr(e->name, comps[k].match[j])) { c = k; break; }
        comps[c].params += n;
    }
    static const char *const supported[] = {"qwen2", "qwen2_vl", "qwen2_5_vl"};
    bool ok = false;
    for (size_t k = 0; k < sizeof supported / sizeof supported[0]; k++) ok |= !strcmp(model_type, supported[k]);
    if (json) {
        printf("{\"model_type\": \"%s\", \"supported\": %s, \"architecture\": \"%s\", \"parameters\": %lld, "
               "\"context_length\": %lld, \"tensors\": %d, \"components\": {",
               model_type, ok ? "true" : "false", arch, (long long)total, (long long)ctx_len, mmc_st_count(w));
        int first = 1;
        for (int k = 0; k < ncomp; k++) {
            if (!comps[k].params) continue;
            printf("%s\"%s\": %lld", first ? "" : ", ", comps[k].label, (long long)comps[k].params);
            first = 0;
        }
        printf("}, \"dtypes\": {");
        first = 1;
        for (int d = 0; d < MMC_DTYPE_COUNT; d++) {
            if (!by_dtype[d]) continue;
            printf("%s\"%s\": %lld", first ? "" : ", ", mmc_dtype_name((mmc_dtype)d), (long long)by_dtype[d]);
            first = 0;
        }
        printf("}, \"generation\": {\"file\": %s, \"do_sample\": %s, \"temperature\": %g, \"top_k\": %lld, "
               "\"top_p\": %g, \"min_p\": %g, \"repetition_penalty\": %g, \"max_new_tokens\": %lld, "
               "\"max_length\": %lld, \"eos_token_id\": [%s]}}\n",
               gen.present ? "true" : "false", gen.do_sample ? "true" : "false", gen.temperature,
               (long long)gen.top_k, gen.top_p, gen.min_p, gen.repetition_penalty, (long long)gen.max_new_tokens,
               (long long)gen.max_length, gen.n_eos ? eos : "");
    } else {
        printf("model:          %s\n", dir);
        printf("model_type:     %s (%s)%s\n", model_type, arch,
               ok ? "" : " -- not supported by mmc (supported: qwen2, qwen2_vl, qwen2_5_vl)");
        printf("context length: %lld\n", (long long)ctx_len);
        printf("tensors:        %d\n", mmc_st_count(w));
        printf("parameters:     %lld (%.2f M)\n", (long long)total, total / 1e6);
        for (int k = 0; k < ncomp; k++)
            if (comps[k].params)
                printf("  %-16s %12lld (%5.1f %%)\n", comps[k].label, (long long)comps[k].params,
                       100.0 * comps[k].params / (double)(total ? total : 1));
        printf("dtypes:        ");
        for (int d = 0; d < MMC_DTYPE_COUNT; d++)
            if (by_dtype[d]) printf(" %s=%lld", mmc_dtype_name((mmc_dtype)d), (long long)by_dtype[d]);
        printf("\n");
        /* what generate / chat use unless the command line overrides (transformers' resolution) */
        printf("generation:     %s", gen.present ? "generation_config.json" : "no generation_config.json (transformers' defaults)");
        if (gen.do_sample)
            printf(", sampling: temperature %g, top_k %lld, top_p %g, min_p %g", gen.temperature, (long long)gen.top_k,
                   gen.top_p, gen.min_p);
        else
            printf(", greedy");
        if (gen.repetition_penalty != 1) printf(", repetition_penalty %g", gen.repetition_penalty);
        if (gen.max_new_tokens >= 0) printf(", max_new_tokens %lld", (long long)gen.max_new_tokens);
        else if (gen.length_set) printf(", max_length %lld", (long long)gen.max_length);
        printf(", eos %s\n", eos);
    }
    mmc_st_close(w);
    mmc_json_free(cfg);
    return 0;
}
