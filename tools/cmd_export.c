/* cmd_export.c — `mmc export CKPT --out DIR`: turn a training checkpoint (single-process or
 * data-parallel, any ZeRO stage) into a plain Hugging Face directory. Up to ZeRO-2 the model
 * weights are whole in the checkpoint (only the optimizer state is sharded); a ZeRO-3
 * checkpoint keeps the trained parameters in the ranks' shards, and export consolidates them
 * with the untrained ones (model.frozen.safetensors) into model.safetensors, as DeepSpeed's
 * zero_to_fp32 does. Export validates the checkpoint — complete (every shard its manifest
 * lists, trainer_state.json), weights readable, config.json parseable — and copies the model,
 * config, tokenizer and processor files, leaving the optimizer and trainer state behind. A
 * LoRA checkpoint exports as its PEFT adapter directory (fold it into the base with `mmc
 * merge`). Written beside DIR, then renamed into place. */
#include "cli.h"
#include "mmc_dp.h"
#include "mmc_io.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void help_export(FILE *f) {
    fprintf(f,
            "usage: mmc export CKPT --out DIR [--json]\n\n"
            "Write the model of training checkpoint CKPT (training.output_dir/checkpoint-<step>, from\n"
            "any number of ranks and ZeRO stage; ZeRO-3 shards are consolidated) as a Hugging Face\n"
            "directory DIR: model.safetensors,\n"
            "config.json, tokenizer and processor files (a LoRA checkpoint: the PEFT adapter files).\n"
            "The checkpoint is checked first: an incomplete one (e.g. a missing optimizer shard) is\n"
            "refused with the name of the missing file. DIR must not exist or be empty.\n\n"
            "options:\n"
            "  --out DIR   output directory\n"
            "  --json      print a JSON summary\n"
            "  -h, --help  this help\n");
}

/* files that belong to training, not to the model */
static bool training_only(const char *n) {
    return strncmp(n, "optimizer", 9) == 0 || strcmp(n, "trainer_state.json") == 0 || strcmp(n, "loss.png") == 0 ||
           strcmp(n, "model.frozen.safetensors") == 0 || n[0] == '.';
}

static void rm_dir_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0) { if (!(out = cli_value(argc, argv, &i))) return CLI_USAGE; }
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage("export", "unknown option '%s'", argv[i]);
        else if (ckpt) return cli_usage("export", "one checkpoint expected, got '%s' and '%s'", ckpt, argv[i]);
        else ckpt = argv[i];
    }
    if (!ckpt || !out) return cli_usage("export", "%s", !ckpt ? "missing CKPT" : "missing --out DIR");
    char p[4400], q[4400];
    /* 1. the checkpoint is complete */
    snprintf(p, sizeof p, "%s/trainer_state.json", ckpt);
    if (access(p, R_OK) != 0)
        return cli_fail(MMC_OK, "export: %s is not a complete checkpoint (no trainer_state.json: %s)", ckpt,
                        strerror(errno));
    int world = 1, zero = 0;
    mmc_status st;
    if (mmc_dp_checkpoint_sharded(ckpt) && (st = mmc_dp_check_shards(ckpt, &world, &zero)))
        return cli_fail(st, "export: refusing the checkpoint");
    /* 2. the weights and config are readable */
    bool lora = false, consolidate = false;
    int n_tensors = 0;
    snprintf(p, sizeof p, "%s/model.safetensors", ckpt);
    if (access(p, R_OK) != 0) {
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", ckpt);
        /* (ZeRO-3 with LoRA shards the adapters too, but rank 0 wrote them whole) */
        consolidate = access(p, R_OK) != 0 && mmc_dp_checkpoint_params_sharded(ckpt);
        lora = !consolidate;
    }
    if (!consolidate) {
        mmc_st *w = NULL;
        if ((st = mmc_st_open(p, &w))) return cli_fail(st, "export: %s: no readable model weights", ckpt);
        n_tensors = mmc_st_count(w);
        mmc_st_close(w);
    }
    mmc_json *j = NULL;
    snprintf(p, sizeof p, "%s/%s", ckpt, lora ? "adapter_config.json" : "config.json");
    if ((st = mmc_json_load(p, &j))) return cli_fail(st, "export");
    mmc_json_free(j);
    /* 3. copy the model files into a temporary directory, then rename it into place */
    DIR *od = opendir(out);
    if (od) {
        struct dirent *e;
        int n = 0;
        while ((e = readdir(od))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
        closedir(od);
        if (n) return cli_fail(MMC_OK, "export: --out %s exists and is not empty", out);
        rmdir(out);
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", out, (int)getpid());
    rm_dir_flat(tmp);
    if (mkdir(tmp, 0755) != 0) return cli_fail(MMC_OK, "export: %s: cannot create: %s", tmp, strerror(errno));
    DIR *d = opendir(ckpt);
    if (!d) { rm_dir_flat(tmp); return cli_fail(MMC_OK, "export: %s: %s", ckpt, strerror(errno)); }
    struct dirent *e;
    int files = 0;
    st = MMC_OK;
    while (!st && (e = readdir(d))) {
        if (training_only(e->d_name)) continue;
        snprintf(p, sizeof p, "%s/%s", ckpt, e->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char *data = NULL;
        size_t len = 0;
        snprintf(q, sizeof q, "%s/%s", tmp, e->d_name);
        if (!(st = mmc_read_file(p, &data, &len))) st = mmc_write_file_atomic(q, data, len);
        free(data);
        files++;
    }
    closedir(d);
    if (st) { rm_dir_flat(tmp); return cli_fail(st, "export: copying %s", ckpt); }
    if (consolidate) {   /* ZeRO-3: the model from the shards */
        snprintf(q, sizeof q, "%s/model.safetensors", tmp);
        if ((st = mmc_dp_consolidate(ckpt, q, &n_tensors))) {
            rm_dir_flat(tmp);
            return cli_fail(st, "export: consolidating the ZeRO-3 shards of %s", ckpt);
        }
        files++;
    }
    if (rename(tmp, out) != 0) {
        int err = errno;
        rm_dir_flat(tmp);
        return cli_fail(MMC_OK, "export: cannot rename %s to %s: %s", tmp, out, strerror(err));
    }
    if (json)
        printf("{\"out\": \"%s\", \"files\": %d, \"tensors\": %d, \"lora\": %s, \"world_size\": %d, \"zero\": %d}\n",
               out, files, n_tensors, lora ? "true" : "false", world, zero);
    else
        printf("exported %s (%d tensors%s; written by %d rank%s, ZeRO-%d) to %s\n", ckpt, n_tensors,
               lora ? ", LoRA adapter" : "", world, world == 1 ? "" : "s", zero, out);
    return 0;
}
