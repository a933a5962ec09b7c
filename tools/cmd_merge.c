/* cmd_merge.c — `mmc merge --model DIR --adapter ADIR --out OUTDIR`: fold a PEFT LoRA
 * adapter into the base weights (peft's merge_and_unload: W' = W + scale · B·A) and write a
 * complete Hugging Face directory that transformers loads; all other weights (vision tower,
 * norms, embeddings) and the config/tokenizer/processor files are kept unchanged. */
#include "cli.h"
#include "mmc_lora.h"

#include <string.h>

void help_merge(FILE *f) {
    fprintf(f, "usage: mmc merge --model DIR --adapter ADIR --out OUTDIR [--json]\n\n"
               "Merge the LoRA adapter ADIR (PEFT format: adapter_config.json +\n"
               "adapter_model.safetensors) into the model DIR and write the result to OUTDIR\n"
               "(model.safetensors + config, tokenizer and processor files). Adapted weights\n"
               "become W + (lora_alpha / r) * B A in their stored dtype; every other tensor is\n"
               "copied unchanged. OUTDIR is written atomically (built beside it, then renamed).\n\n"
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
    model = base;
    if (strcmp(model, out) == 0) return cli_usage("merge", "--out must differ from --model");
    int n = 0;
    mmc_status st = mmc_lora_merge_dir(model, adapter, out, &n);
    if (st) return cli_fail(st, "merge: cannot merge '%s' into '%s'", adapter, model);
    if (json) printf("{\"merged_weights\": %d, \"out\": \"%s\"}\n", n, out);
    else printf("merged %d adapted weight%s into %s\n", n, n == 1 ? "" : "s", out);
    return 0;
}
