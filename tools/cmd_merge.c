/* cmd_merge.c — `mmc merge --model DIR --adapter ADIR --out OUTDIR`: fold a PEFT LoRA
 * adapter into the base weights (peft's merge_and_unload: W' = W + scale · B·A) and write a
 * complete Hugging Face directory that transformers loads; all other weights (vision tower,
 * norms, embeddings) and the config/tokenizer/processor files are kept unchanged. A diffusers
 * pipeline folder (model_index.json; HunyuanDiTPipeline) goes through mmc_diffusers_merge_lora:
 * the adapter on its transformer, the whole pipeline folder written. */
#include "cli.h"
#include "mmc_diffusion.h"
#include "mmc_lora.h"

#include <string.h>
#include <unistd.h>

void help_merge(FILE *f) {
    fprintf(f, "usage: mmc merge --model DIR --adapter ADIR --out OUTDIR [--json]\n\n"
               "Merge the LoRA adapter ADIR (PEFT format: adapter_config.json +\n"
               "adapter_model.safetensors) into the model DIR and write the result to OUTDIR\n"
               "(model.safetensors + config, tokenizer and processor files). Adapted weights\n"
               "become W + (lora_alpha / r) * B A in their stored dtype; every other tensor is\n"
               "copied unchanged. OUTDIR is written atomically (built beside it, then renamed).\n"
               "A diffusers HunyuanDiTPipeline folder (model_index.json) takes the PEFT adapter\n"
               "`mmc train` writes for its transformer: OUTDIR is the whole pipeline folder with\n"
               "transformer/diffusion_pytorch_model.safetensors merged (its transformer folder\n"
               "as --model: that folder merged).\n\n"
               "options:\n"
               "  --model DIR     base model directory (default: the adapter's\n"
               "                  base_model_name_or_path)\n"
               "  --adapter ADIR  LoRA adapter directory\n"
               "  --out OUTDIR    output directory (replaced if it exists)\n"
               "  --json          print a JSON summary\n"
               "  -h, --help      this help\n");
}

int cmd_merge(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0) { if (!(model = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (strcmp(argv[i], "--adapter") == 0) { if (!(adapter = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (strcmp(argv[i], "--out") == 0) { if (!(out = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else return cli_usage("merge", "unknown argument '%s'", argv[i]);
    }
    if (!adapter || !out) return cli_usage("merge", "--adapter and --out are required");
    if (model && strcmp(model, out) == 0) return cli_usage("merge", "--out must differ from --model");
    char base[4096], adir[4096];
    mmc_status rs = mmc_lora_resolve(model, adapter, base, sizeof base, adir, sizeof adir);
    if (rs) return cli_fail(rs, "merge: no base model");
    const bool explicit_model = model != NULL;
    model = base;
    if (strcmp(model, out) == 0) return cli_usage("merge", "--out must differ from --model");
    int n = 0;
    char mi[4200], parent[4096];
    snprintf(mi, sizeof mi, "%s/model_index.json", model);
    bool diffusers = access(mi, R_OK) == 0 || mmc_diffusers_is_model_dir(model);   /* HunyuanDiT */
    /* the adapter's base is a pipeline's transformer folder (what `mmc train` records) and --model was not
     * given: merge into the whole pipeline */
    const char *sl = strrchr(model, '/');
    if (!explicit_model && diffusers && sl && !strcmp(sl + 1, "transformer")) {
        snprintf(parent, sizeof parent, "%.*s", (int)(sl - model), model);
        snprintf(mi, sizeof mi, "%s/model_index.json", parent);
        if (access(mi, R_OK) == 0) {
            snprintf(base, sizeof base, "%s", parent);
            fprintf(stderr, "mmc merge: the adapter's base is %s/transformer: writing the whole pipeline folder\n",
                    parent);
        }
    }
    if (strcmp(model, out) == 0) return cli_usage("merge", "--out must differ from --model");
    mmc_status st = diffusers ? mmc_diffusers_merge_lora(model, adapter, out, &n) : mmc_lora_merge_dir(model, adapter, out, &n);
    if (st) return cli_fail(st, "merge: cannot merge '%s' into '%s'", adapter, model);
    if (json) printf("{\"merged_weights\": %d, \"out\": \"%s\"}\n", n, out);
    else printf("merged %d adapted weight%s into %s\n", n, n == 1 ? "" : "s", out);
    return 0;
}
