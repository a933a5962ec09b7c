/* cmd_image_demo.c — `mmc image-demo`: the data and the pixel judge of the image-generation demo
 * (`make run-image`, scripts/demo_image.sh; include/mmc_image_demo.h). */
#include "cli.h"
#include "mmc_image_demo.h"

#include <string.h>

void help_image_demo(FILE *f) {
    fprintf(f,
            "usage: mmc image-demo data --out DIR [--train N] [--val M] [--size S] [--seed S] [--no-holdout]\n"
            "       mmc image-demo judge --val FILE --images DIR --out DIR [--grid PNG]\n\n"
            "data:  captioned `mmc synth` shapes, one object per image (\"a red circle on the left\"):\n"
            "       DIR/train/ (images + metadata.jsonl: what `mmc train` and `mmc train-vae` read),\n"
            "       DIR/train_shuffled/metadata.jsonl (the same images, captions permuted: the control),\n"
            "       DIR/val.jsonl (prompts to generate: caption, colour, shape, side, seed) and\n"
            "       DIR/val_ref/ (a reference rendering of each prompt). The 6 colour-shape-side\n"
            "       combinations with (colour + shape + side) %% 4 == 0 are held out of training and make\n"
            "       up the validation prompts (--no-holdout: all 24 in both).\n"
            "       --train N (default 4000), --val M (default 48), --size S (default 48), --seed S (0)\n"
            "judge: pixel statistics of generated images DIR/val_NNNNNN.png (one per line of --val): the\n"
            "       dominant palette colour of the foreground, its centroid's side, a shape estimate (the\n"
            "       best-overlapping template fitted to its bounding box). Writes OUT/judge.json (agreement with the captions),\n"
            "       OUT/judge.jsonl (per image), OUT/vlm_questions.jsonl + OUT/vlm/ (a colour and a\n"
            "       shape question per image at 56 px, for `mmc eval` with the understanding model)\n"
            "       and --grid PNG (prompts above images; marks: colour, side, shape; green agrees).\n");
}

int cmd_image_demo(int argc, char **argv) {
    if (argc < 2 || cli_is_help(argv[1])) {
        help_image_demo(stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const bool data = !strcmp(argv[1], "data"), judge = !strcmp(argv[1], "judge");
    if (!data && !judge) return cli_usage("image-demo", "unknown action '%s' (data or judge)", argv[1]);
    mmc_imgdemo_data_opts o = {.n_train = 4000, .n_val = 48, .size = 48, .hold_out = true};
    const char *val = NULL, *images = NULL, *out = NULL, *grid = NULL;
    long long v;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *x;
        if (data && !strcmp(a, "--no-holdout")) { o.hold_out = false; continue; }
        const bool dopt = !strcmp(a, "--train") || !strcmp(a, "--val") || !strcmp(a, "--size") || !strcmp(a, "--seed");
        const bool jopt = !strcmp(a, "--val") || !strcmp(a, "--images") || !strcmp(a, "--grid");
        if (strcmp(a, "--out") != 0 && !(data ? dopt : jopt))
            return cli_usage("image-demo", "%s: unknown option '%s'", argv[1], a);
        if (!(x = cli_value(argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--out")) out = x;
        else if (judge && !strcmp(a, "--val")) val = x;
        else if (!strcmp(a, "--images")) images = x;
        else if (!strcmp(a, "--grid")) grid = x;
        else if (!strcmp(a, "--train")) { if (!cli_int(a, x, 1, 10000000, &v)) return CLI_USAGE; o.n_train = v; }
        else if (!strcmp(a, "--val")) { if (!cli_int(a, x, 0, 10000000, &v)) return CLI_USAGE; o.n_val = v; }
        else if (!strcmp(a, "--size")) { if (!cli_int(a, x, 16, 1024, &v)) return CLI_USAGE; o.size = (int)v; }
        else { if (!cli_int(a, x, 0, (long long)1 << 62, &v)) return CLI_USAGE; o.seed = (uint64_t)v; }
    }
    if (!out) return cli_usage("image-demo", "%s: --out DIR is required", argv[1]);
    if (data) {
        o.out_dir = out;
        mmc_status st = mmc_imgdemo_write_data(&o);
        if (st) return cli_fail(st, "image-demo data failed");
        printf("wrote %lld training images (%s) and %lld held-out prompts (%dx%d, seed %llu) to %s\n", (long long)o.n_train,
               o.hold_out ? "18 of the 24 captions" : "all 24 captions", (long long)o.n_val, o.size, o.size,
               (unsigned long long)o.seed, out);
        return 0;
    }
    if (!val || !images) return cli_usage("image-demo", "judge: --val FILE and --images DIR are required");
    mmc_imgdemo_judgement j;
    mmc_status st = mmc_imgdemo_judge(val, images, out, grid, &j);
    if (st) return cli_fail(st, "image-demo judge failed");
    printf("{\"samples\":%lld,\"colour\":%.4f,\"side\":%.4f,\"shape_pixels\":%.4f}\n", (long long)j.n, j.colour, j.side,
           j.shape);
    return 0;
}
