/* cmd_train_vae.c — `mmc train-vae`: train a diffusers AutoencoderKL from scratch on an image folder
 * (src/train/trainer_vae.c), the first stage of a latent diffusion model trained from nothing
 * (the image-generation demo, `make run-image`). */
#include "cli.h"
#include "mmc_diffusion.h"

#include <string.h>

void help_train_vae(FILE *f) {
    mmc_vae_train_opts d;
    mmc_vae_train_defaults(&d);
    fprintf(f,
            "usage: mmc train-vae --data DIR --config VAE.json --out DIR [options]\n\n"
            "Train an AutoencoderKL (diffusers' class, the architecture of --config) from random init:\n"
            "MSE reconstruction + kl-weight x the mean KL of the latent distribution to N(0, 1), AdamW\n"
            "with warmup and cosine decay, gradient clipping at 1. The last 1/16 of the images (at most\n"
            "256) are held out for the reported reconstruction error. The latents' mean and std over\n"
            "the training images become the written config's shift_factor and 1/scaling_factor.\n"
            "Writes DIR/config.json, DIR/diffusion_pytorch_model.safetensors (diffusers'\n"
            "AutoencoderKL.from_pretrained reads the folder; put it as vae/ of a pipeline folder) and\n"
            "DIR/reconstructions.png (held-out images above their reconstructions).\n\n"
            "options:\n"
            "  --data DIR        image folder with metadata.jsonl ({\"file_name\": ...} per line; required)\n"
            "  --config FILE     AutoencoderKL config.json: block_out_channels, latent_channels, ... (required)\n"
            "  --out DIR         output folder (required)\n"
            "  --resolution R    images resized to R x R (default %d; a multiple of the downscale)\n"
            "  --steps N         optimizer steps (default %lld)\n"
            "  --batch B         images per step (default %d)\n"
            "  --lr LR           peak learning rate (default %g; cosine decay to --min-lr, default %g)\n"
            "  --min-lr LR\n"
            "  --warmup N        warmup steps (default %lld)\n"
            "  --kl-weight W     weight of the KL term (default %g)\n"
            "  --seed S          init and data order (default 0)\n"
            "  --log-every N     log every N steps (default %d)\n"
            "  -h, --help        this help\n",
            d.resolution, (long long)d.steps, d.batch, d.lr, d.min_lr, (long long)d.warmup, d.kl_weight, d.log_every);
}

int cmd_train_vae(int argc, char **argv) {
    mmc_vae_train_opts o;
    mmc_vae_train_defaults(&o);
    long long v;
    double x;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        static const char *const opts[] = {"--data", "--config", "--out", "--resolution", "--steps", "--batch", "--lr",
                                           "--min-lr", "--warmup", "--kl-weight", "--seed", "--log-every"};
        bool known = false;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) known |= !strcmp(a, opts[k]);
        if (!known) return cli_usage("train-vae", "unknown option '%s'", a);
        if (!(val = cli_value(argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--data")) o.data = val;
        else if (!strcmp(a, "--config")) o.config = val;
        else if (!strcmp(a, "--out")) o.out_dir = val;
        else if (!strcmp(a, "--resolution")) { if (!cli_int(a, val, 8, 4096, &v)) return CLI_USAGE; o.resolution = (int)v; }
        else if (!strcmp(a, "--steps")) { if (!cli_int(a, val, 1, 100000000, &v)) return CLI_USAGE; o.steps = v; }
        else if (!strcmp(a, "--batch")) { if (!cli_int(a, val, 1, 4096, &v)) return CLI_USAGE; o.batch = (int)v; }
        else if (!strcmp(a, "--warmup")) { if (!cli_int(a, val, 0, 100000000, &v)) return CLI_USAGE; o.warmup = v; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, val, 0, (long long)1 << 62, &v)) return CLI_USAGE; o.seed = (uint64_t)v; }
        else if (!strcmp(a, "--log-every")) { if (!cli_int(a, val, 0, 100000000, &v)) return CLI_USAGE; o.log_every = (int)v; }
        else if (!strcmp(a, "--lr")) { if (!cli_float(a, val, 0, 10, &x)) return CLI_USAGE; o.lr = x; }
        else if (!strcmp(a, "--min-lr")) { if (!cli_float(a, val, 0, 10, &x)) return CLI_USAGE; o.min_lr = x; }
        else { if (!cli_float(a, val, 0, 1e6, &x)) return CLI_USAGE; o.kl_weight = x; }
    }
    if (!o.data || !o.config || !o.out_dir) return cli_usage("train-vae", "--data, --config and --out are required");
    mmc_status st = mmc_vae_train(&o);
    if (st) return cli_fail(st, "train-vae failed");
    printf("wrote %s (config.json, diffusion_pytorch_model.safetensors, reconstructions.png)\n", o.out_dir);
    return 0;
}
