/* cmd_synth.c — `mmc synth`: write the built-in demo's synthetic shapes dataset (images +
 * LLaMA-Factory-style JSONL with a question `type`), see include/mmc_synth.h. */
#include "cli.h"
#include "mmc_synth.h"

#include <string.h>

void help_synth(FILE *f) {
    fprintf(f,
            "usage: mmc synth --out DIR [options]\n\n"
            "Write a deterministic synthetic multimodal dataset: images with one to three coloured\n"
            "shapes and questions about colour, shape, count and left/right (answers balanced\n"
            "within each type). Files: DIR/train.jsonl, DIR/val.jsonl, DIR/train_<type>.jsonl (one\n"
            "per question type), DIR/train_curriculum.jsonl (colour questions first, then colour +\n"
            "shape, then everything; train it with data.shuffle: false) and DIR/images/*.png.\n"
            "Each line is "
            "{\"messages\": [user \"<image>question\", assistant answer], \"images\": [path relative\n"
            "to DIR], \"type\": \"colour\"|\"shape\"|\"count\"|\"leftright\"}.\n\n"
            "options:\n"
            "  --out DIR      output directory (created if missing; required)\n"
            "  --train N      training samples (default 4000)\n"
            "  --val M        validation samples (default 400)\n"
            "  --size S       image side in pixels, 28..1024 (default 56: 4x4 patches of 14 px)\n"
            "  --seed S       seed (default 0); the same seed gives the same files\n"
            "  --epochs E     passes over the mixed part in train_curriculum.jsonl (default 1;\n"
            "                 each later pass in its own seeded order)\n"
            "  --blank        background-only images (the control: answers cannot use the image)\n"
            "  -h, --help     this help\n");
}

int cmd_synth(int argc, char **argv) {
    mmc_synth_opts o = {.n_train = 4000, .n_val = 400, .size = 56, .seed = 0};
    long long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (strcmp(a, "--blank") == 0) { o.blank = true; continue; }
        if (strcmp(a, "--out") == 0 || strcmp(a, "--train") == 0 || strcmp(a, "--val") == 0 ||
            strcmp(a, "--size") == 0 || strcmp(a, "--seed") == 0 || strcmp(a, "--epochs") == 0) {
            if (!(val = cli_value(argc, argv, &i))) return CLI_USAGE;
        } else return cli_usage("synth", "unknown option '%s'", a);
        if (strcmp(a, "--out") == 0) o.out_dir = val;
        else if (strcmp(a, "--train") == 0) { if (!cli_int(a, val, 0, 100000000, &v)) return CLI_USAGE; o.n_train = v; }
        else if (strcmp(a, "--val") == 0) { if (!cli_int(a, val, 0, 100000000, &v)) return CLI_USAGE; o.n_val = v; }
        else if (strcmp(a, "--size") == 0) { if (!cli_int(a, val, 28, 1024, &v)) return CLI_USAGE; o.size = (int)v; }
        else if (strcmp(a, "--epochs") == 0) { if (!cli_int(a, val, 1, 1000, &v)) return CLI_USAGE; o.curriculum_epochs = (int)v; }
        else { if (!cli_int(a, val, 0, (long long)1 << 62, &v)) return CLI_USAGE; o.seed = (uint64_t)v; }
    }
    if (!o.out_dir) return cli_usage("synth", "--out DIR is required");
    double t0 = mmc_now();
    mmc_status st = mmc_synth_write_dataset(&o);
    if (st != MMC_OK) return cli_fail(st, "synth failed");
    printf("wrote %lld train + %lld val samples (%dx%d%s, seed %llu) to %s in %.1f s\n",
           (long long)o.n_train, (long long)o.n_val, o.size, o.size, o.blank ? ", blank" : "",
           (unsigned long long)o.seed, o.out_dir, mmc_now() - t0);
    return 0;
}
