/* cmd_generate_image.c — `mmc generate-image`: text -> image with a diffusers FluxPipeline folder
 * (src/diffusion/flux_pipeline.c), as diffusers' FluxPipeline(...).images[0].save(path) does it:
 * the prompt through CLIP and T5, the denoising loop with a progress bar, the VAE, and a PNG per
 * image whose text chunks hold the prompt and every setting (so an image says how it was made). */
#include "cli.h"
#include "mmc_diffusion.h"
#include "mmc_image.h"
#include "mmc_io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

void help_generate_image(FILE *f) {
    fprintf(f,
            "usage: mmc generate-image --model DIR --prompt TEXT [options]\n"
            "       mmc generate-image --model FILE.safetensors --config DIR --prompt TEXT [options]\n\n"
            "Generate images with a diffusers FluxPipeline folder (model_index.json, transformer/, vae/,\n"
            "text_encoder/ (CLIP), text_encoder_2/ (T5), tokenizers, scheduler/), the way diffusers'\n"
            "FluxPipeline does: same sigmas and shift, same guidance, same VAE scaling; or with a\n"
            "StableDiffusion3Pipeline folder as diffusers' SD3 pipeline does (classifier-free guidance\n"
            "with --guidance, default 7; 256 T5 tokens); or with a StableDiffusionXLPipeline folder as\n"
            "diffusers' SDXL pipeline does (its scheduler_config.json's Euler / Euler ancestral / DPM-Solver++\n"
            "/ DDIM / PNDM scheduler, --guidance default 5, 50 steps, zero negative conditioning without\n"
            "--negative-prompt where force_zeros_for_empty_prompt); a StableDiffusionPipeline (SD 1.x / 2.x)\n"
            "folder likewise (--guidance default 7.5); a HunyuanDiTPipeline folder as diffusers' does (BERT + T5\n"
            "prompts, DDPM steps, --guidance default 5, 50 steps, sizes binned to the trained shapes).\n"
            "Text encoders are freed before the denoising\n"
            "loop. Images are PNGs whose tEXt chunks hold the prompt and every setting.\n\n"
            "options:\n"
            "  --model DIR|FILE        the pipeline folder (required); or a single-file SD 1.x / SDXL\n"
            "                          checkpoint (one .safetensors in the original LDM / SGM layout, as\n"
            "                          Civitai and the Hub ship them), converted as diffusers' from_single_file\n"
            "  --config DIR            with a single-file --model: the diffusers folder of the same model\n"
            "                          that gives the configs, tokenizers and scheduler (its weights are not\n"
            "                          read), as from_single_file(config=DIR); e.g. the model's Hub repo\n"
            "                          downloaded without its weights\n"
            "  --prompt TEXT           the prompt (required)\n"
            "  --negative-prompt TEXT  with --true-cfg > 1: a second pass per step against this prompt\n"
            "  --width W --height H    image size in pixels (default 1024 x 1024); multiples of 2 x the\n"
            "                          VAE factor (16 for released Flux models), else an error names the\n"
            "                          nearest valid size; SDXL / SD folders default to the UNet's\n"
            "                          sample_size x the VAE factor (1024 SDXL, 512 SD 1.5)\n"
            "  --steps N               denoising steps (default 28; 4 for schnell-style models)\n"
            "  --guidance G            distilled guidance of guidance-embedding checkpoints (default 3.5;\n"
            "                          ignored by models without one)\n"
            "  --true-cfg G            true classifier-free guidance scale (default 1: off)\n"
            "  --seed S                seed of the initial noise (default 0)\n"
            "  --batch N               images per prompt (default 1); files OUT, OUT-1, OUT-2, ...\n"
            "  --max-sequence-length L T5 tokens (default 512, as FluxPipeline)\n"
            "  --lora DIR[:SCALE]      a diffusers LoRA (pytorch_lora_weights.safetensors, as diffusers'\n"
            "                          save_lora_weights and `mmc train` write it) applied unmerged, at\n"
            "                          SCALE (default 1, as set_adapters' weight); SDXL / SD: also a kohya /\n"
            "                          A1111 file (lora_unet_* / lora_te1_* / lora_te2_* keys, diffusers or SGM\n"
            "                          block names, per-module alpha / rank), detected from its keys, as\n"
            "                          load_lora_weights converts it (text-encoder and 1x1-conv adapters\n"
            "                          merged at load); HunyuanDiT: PEFT's adapter directory on the\n"
            "                          transformer (adapter_config.json, as `mmc train` writes it)\n"
            "  --init-image F          img2img (FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline,\n"
            "                          StableDiffusionXLImg2ImgPipeline, StableDiffusionImg2ImgPipeline):\n"
            "                          start from this image, resized to the output size with Pillow's\n"
            "                          lanczos, VAE-encoded; required by an\n"
            "                          SDXL refiner folder (no text_encoder, requires_aesthetics_score)\n"
            "  --strength S            img2img: how much noise to add, 0..1 (default 0.6 Flux and SD3, 0.3\n"
            "                          SDXL, 0.8 SD, as the pipelines); the first steps - int(steps * S)\n"
            "                          steps (Flux, SD3: int(steps - steps * S)) are skipped\n"
            "  --aesthetic-score A     the SDXL refiner's aesthetic_score (default 6)\n"
            "  --negative-aesthetic-score A  its negative_aesthetic_score (default 2.5)\n"
            "  --latents F             initial noise from a safetensors file (tensor \"latents\", packed\n"
            "                          [B, S, 4C] as FluxPipeline takes latents=, or [B, C, h, w]): for\n"
            "                          bit-for-bit comparisons with diffusers, whose RNG differs; with\n"
            "                          --init-image (Flux, SD3) the noise mixed into the image's latents\n"
            "  --scheduler DIR         SDXL / SD: use the scheduler_config.json in DIR instead of the folder's\n"
            "                          (Euler, Euler ancestral, DPM-Solver++ 2M / SDE, DDIM, PNDM), as\n"
            "                          pipe.scheduler = Cls.from_config(...) does\n"
            CLI_BF16_MATMUL_HELP
            "  --guidance-rescale R    HunyuanDiT: rescale_noise_cfg's guidance_rescale, 0..1 (default 0)\n"
            "  --no-resolution-binning HunyuanDiT: keep --width / --height (floored to multiples of 16) instead\n"
            "                          of mapping them to the closest trained shape (use_resolution_binning)\n"
            "  --tiled-decode          decode the VAE in tiles (diffusers' enable_tiling): large images\n"
            "                          in bounded memory\n"
            "  --out F.png             output file (default image.png)\n"
            "  --json                  print one JSON object (files, timings, peak memory) instead of\n"
            "                          progress\n"
            "  -h, --help              this help\n");
}

typedef struct { bool tty, quiet; double total; } progress_state;

static void on_step(void *u, int step, int n, double secs) {
    progress_state *p = u;
    p->total += secs;
    if (p->quiet) return;
    const int width = 30, done = step * width / n;
    if (p->tty) {
        fprintf(stderr, "\rdenoising [");
        for (int i = 0; i < width; i++) fputc(i < done ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d  %.2f s/step", step, n, p->total / step);
        if (step == n) fputc('\n', stderr);
    } else {
        fprintf(stderr, "step %d/%d  %.2f s\n", step, n, secs);
    }
}

/* --latents F: the tensor "latents" (or the file's only tensor), as stored, into ctx. */
static mmc_status read_latents(mmc_ctx *ctx, const char *path, mmc_tensor **out) {
    mmc_st *st = NULL;
    mmc_status s = mmc_st_open(path, &st);
    if (s) return s;
    const mmc_st_entry *e = mmc_st_find(st, "latents");
    if (!e && mmc_st_count(st) == 1) e = mmc_st_at(st, 0);
    if (!e) { mmc_st_close(st); return mmc_error(MMC_ERR_FORMAT, "%s: no tensor \"latents\"", path); }
    mmc_tensor *t = mmc_new(ctx, MMC_F32, e->ndim, e->shape);
    s = mmc_st_read_into(st, e->name, t);
    mmc_st_close(st);
    if (!s) *out = t;
    return s;
}

/* The starting latents `lat` [B, C, h, w] of SD3 / SDXL / HunyuanDiT: `--latents F` (its shape must be
 * lat's), else N(0, 1) noise from mmc's Philox stream seeded with `seed`. */
static mmc_status initial_latents(mmc_ctx *ctx, const char *path, long long seed, mmc_tensor *lat) {
    if (!path) {
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)seed);
        mmc_rng_normal(&r, lat->data, mmc_numel(lat), 0.0f, 1.0f);
        return MMC_OK;
    }
    mmc_tensor *t = NULL;
    mmc_status s = read_latents(ctx, path, &t);
    if (s) return s;
    if (!mmc_same_shape(t, lat))
        return mmc_error(MMC_ERR_SHAPE, "%s: latents must be [%lld, %lld, %lld, %lld] for this size and batch", path,
                         (long long)lat->shape[0], (long long)lat->shape[1], (long long)lat->shape[2],
                         (long long)lat->shape[3]);
    memcpy(lat->data, t->data, mmc_nbytes(lat));
    return MMC_OK;
}

/* Flux: the packed [B, S, 4C] latents FluxPipeline takes, or plain [B, C, h, w] ones packed here. */
static mmc_status load_latents(mmc_ctx *ctx, const char *path, int64_t B, int64_t S, int64_t Cin, int64_t h, int64_t w,
                               mmc_tensor **out) {
    mmc_tensor *t = NULL;
    mmc_status s = read_latents(ctx, path, &t);
    if (s) return s;
    const bool packed = t->ndim == 3 && t->shape[0] == B && t->shape[1] == S && t->shape[2] == Cin;
    const bool plain = t->ndim == 4 && t->shape[0] == B && t->shape[1] == Cin / 4 && t->shape[2] == h && t->shape[3] == w;
    if (!packed && !plain)
        return mmc_error(MMC_ERR_SHAPE, "%s: latents must be [%lld, %lld, %lld] (packed) or [%lld, %lld, %lld, %lld] for "
                         "this size and batch", path, (long long)B, (long long)S, (long long)Cin, (long long)B,
                         (long long)Cin / 4, (long long)h, (long long)w);
    *out = packed ? t : mmc_flux_pack_latents(ctx, t);
    return MMC_OK;
}

static void out_name(const char *out, int i, char *buf, size_t n) {
    if (i == 0) { snprintf(buf, n, "%s", out); return; }
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash)) { snprintf(buf, n, "%s-%d", out, i); return; }
    snprintf(buf, n, "%.*s-%d%s", (int)(dot - out), out, i, dot);
}

/* --lora DIR[:SCALE]: the path, and the scale (the suffix after the last ':' when it is a number; 1). */
static float cli_lora_spec(const char *spec, char *path, size_t cap) {
    snprintf(path, cap, "%s", spec);
    char *colon = strrchr(path, ':'), *end = NULL;
    if (colon && colon[1]) {
        const double v = strtod(colon + 1, &end);
        if (end && !*end) { *colon = 0; return (float)v; }
    }
    return 1.0f;
}

/* --init-image: the file, resized to H x W with Pillow's lanczos when it differs, as B copies of pixels
 * [3, H, W] in [-1, 1] (VaeImageProcessor.preprocess: resize, / 255, 2x - 1). *px is malloc'ed. */
static mmc_status init_pixels(const char *path, int64_t B, int64_t height, int64_t width, float **px) {
    *px = NULL;
    mmc_image im = {0}, rs = {0};
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    mmc_status st = mmc_image_load(path, &io, &im);
    if (st) return st;
    if (im.height != height || im.width != width) {
        st = mmc_image_resize(&im, (int)height, (int)width, MMC_RESAMPLE_LANCZOS, &rs);
        mmc_image_free(&im);
        if (st) return st;
        im = rs;
    }
    float *x = malloc((size_t)B * 3 * (size_t)height * (size_t)width * sizeof *x);
    if (!x) { mmc_image_free(&im); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    for (int64_t b = 0; b < B; b++)
        for (int c = 0; c < 3; c++)
            for (int64_t i = 0; i < height * width; i++)
                x[(b * 3 + c) * height * width + i] = (im.data[i * 3 + c] / 255.0f - 0.5f) / 0.5f;
    mmc_image_free(&im);
    *px = x;
    return MMC_OK;
}

/* What the command was asked, for the PNG text chunks and the report. */
typedef struct {
    const char *model, *prompt, *neg, *latents_path, *out, *lora, *init_image, *pipeline, *scheduler;
    const char *config;       /* --config DIR: the configs and tokenizers of a single-file --model */
    double strength, guidance, true_cfg;
    double aesthetic, negative_aesthetic;   /* the SDXL refiner's scores (< 0: the pipeline's 6 / 2.5) */
    long long width, height, steps, seed, maxlen;
    bool json;
    bool size_from_model;     /* neither --width nor --height: the UNet pipelines take the model's size */
    bool single_file;         /* --model is one .safetensors in the original LDM / SGM layout */
} gi_args;

/* images [B, 3, H, W] in [0, 1] -> PNGs (numpy_to_pil: (x * 255).round() to uint8, HWC) with the
 * settings in tEXt chunks; then the timings (and with --json one object on stdout). */
static int write_outputs(const gi_args *a, const mmc_tensor *img, double t0, double t_text, double t_denoise,
                         double t_decode) {
    const int64_t B = img->shape[0], H = a->height, W = a->width;
    uint8_t *rgb = malloc((size_t)H * (size_t)W * 3);
    if (!rgb) return cli_fail(mmc_error(MMC_ERR_OOM, "out of memory"), "cannot write the image");
    char steps[32], guidance[32], true_cfg[32], size[64], seed_s[64], strength[32], idx[24], software[96], file[1024];
    snprintf(steps, sizeof steps, "%lld", a->steps);
    snprintf(guidance, sizeof guidance, "%g", a->guidance);
    snprintf(true_cfg, sizeof true_cfg, "%g", a->true_cfg);
    snprintf(size, sizeof size, "%lldx%lld", a->width, a->height);
    snprintf(seed_s, sizeof seed_s, "%lld%s", a->seed, a->latents_path ? " (--latents given)" : "");
    snprintf(strength, sizeof strength, "%g", a->strength);
    snprintf(software, sizeof software, "mmc generate-image (%s)", a->pipeline);
    if (a->json) printf("{\"files\": [");
    for (int64_t b = 0; b < B; b++) {
        const float *x = (const float *)img->data + b * 3 * H * W;
        for (int64_t i = 0; i < H * W; i++)
            for (int c = 0; c < 3; c++) rgb[i * 3 + c] = (uint8_t)lrintf(x[c * H * W + i] * 255.0f);
        snprintf(idx, sizeof idx, "%lld", (long long)b);
        const char *keys[] = {"prompt", "negative_prompt", "model", "steps", "guidance", "true_cfg", "size", "seed",
                              "image_index", "lora", "init_image", "strength", "software"};
        const char *vals[] = {a->prompt, a->neg ? a->neg : "", a->model, steps, guidance, true_cfg, size, seed_s, idx,
                              a->lora ? a->lora : "", a->init_image ? a->init_image : "", a->init_image ? strength : "",
                              software};
        out_name(a->out, (int)b, file, sizeof file);
        mmc_status st = mmc_image_write_png(file, rgb, (int)H, (int)W, 13, keys, vals);
        if (st) { free(rgb); return cli_fail(st, "cannot write %s", file); }
        if (a->json) { printf("%s", b ? ", " : ""); mmc_json_write_string(stdout, file); }
        else printf("wrote %s\n", file);
    }
    free(rgb);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (a->json)
        printf("], \"width\": %lld, \"height\": %lld, \"steps\": %lld, \"text_encode_s\": %.3f, \"denoise_s\": %.3f, "
               "\"s_per_step\": %.4f, \"vae_decode_s\": %.3f, \"total_s\": %.3f, \"peak_rss_mib\": %.1f}\n",
               a->width, a->height, a->steps, t_text, t_denoise, t_denoise / (double)a->steps, t_decode,
               mmc_now() - t0, (double)ru.ru_maxrss / 1024.0);
    else
        fprintf(stderr, "text %.2f s, denoise %.2f s (%.2f s/step), decode %.2f s; peak memory %.0f MiB\n", t_text,
                t_denoise, t_denoise / (double)a->steps, t_decode, (double)ru.ru_maxrss / 1024.0);
    return CLI_OK;
}

/* StableDiffusion3Pipeline: classifier-free guidance with --guidance (the negative prompt defaults to
 * "", as diffusers'), unpacked latents [B, C, H/f, W/f]. */
static int run_sd3(const gi_args *a, int B, bool tiled, progress_state *ps) {
    if (a->true_cfg > 1.0)
        return cli_usage("generate-image", "--true-cfg is wired for Flux pipelines only so far (SD3 guides with "
                         "--guidance)");
    mmc_sd3_pipeline *p = NULL;
    mmc_status st = mmc_sd3_pipeline_open(a->model, &p);
    if (st) return cli_fail(st, "cannot open the pipeline");
    if ((st = mmc_sd3_check_size(p, (int)a->height, (int)a->width))) {
        mmc_sd3_pipeline_free(p);
        return cli_fail(st, "bad size");
    }
    if (a->lora) {
        char path[4096];
        float w = cli_lora_spec(a->lora, path, sizeof path);
        if ((st = mmc_sd3_pipeline_load_lora(p, path, w))) {
            mmc_sd3_pipeline_free(p);
            return cli_fail(st, "cannot apply --lora %s", a->lora);
        }
    }
    mmc_ctx *ctx = mmc_ctx_new();
    const double t0 = mmc_now();
    const char **pr = malloc((size_t)B * 2 * sizeof *pr), **ng = pr + B;
    mmc_flux_cond cond = {0}, neg = {0};
    mmc_tensor *lat = NULL, *img = NULL;
    int rc = CLI_ERROR;
    for (int b = 0; b < B; b++) pr[b] = a->prompt, ng[b] = a->neg ? a->neg : "";
    const bool cfg = a->guidance > 1.0;
    double t_text = 0, t_denoise = 0, t_decode = 0;
    if ((st = mmc_sd3_encode_prompt(ctx, p, pr, B, (int)a->maxlen, &cond)) ||
        (cfg && (st = mmc_sd3_encode_prompt(ctx, p, ng, B, (int)a->maxlen, &neg))))
        goto done;
    t_text = mmc_now() - t0;
    int64_t shape[4] = {B, mmc_sd3_pipeline_latent_channels(p), 0, 0};
    mmc_sd3_latent_size(p, (int)a->height, (int)a->width, &shape[2], &shape[3]);
    lat = mmc_tensor_new(MMC_F32, 4, shape);
    if ((st = initial_latents(ctx, a->latents_path, a->seed, lat))) goto done;
    mmc_flux_sample_opts o = {.height = (int)a->height, .width = (int)a->width, .steps = (int)a->steps,
                              .guidance = a->guidance, .progress = on_step, .user = ps};
    if (a->init_image) {   /* img2img: the image's latents (sampled from the stream seed + 1), noised by lat */
        float *px = NULL;
        mmc_tensor *il = NULL;
        if ((st = init_pixels(a->init_image, B, a->height, a->width, &px))) goto done;
        st = mmc_sd3_encode_image(ctx, p, px, B, (int)a->height, (int)a->width, NULL, (uint64_t)a->seed + 1, &il);
        free(px);
        if (!st) st = mmc_sd3_img2img_latents(p, il, lat, (int)a->steps, a->strength, (int)a->height, (int)a->width,
                                              lat, &o.start_step);
        mmc_tensor_free(il);
        if (st) goto done;
    }
    double t1 = mmc_now();
    if ((st = mmc_sd3_sample(ctx, p, &cond, cfg ? &neg : NULL, lat, &o))) goto done;
    t_denoise = mmc_now() - t1;
    t1 = mmc_now();
    if ((st = mmc_sd3_decode(ctx, p, lat, tiled, &img))) goto done;
    t_decode = mmc_now() - t1;
    rc = write_outputs(a, img, t0, t_text, t_denoise, t_decode);
done:
    if (st) rc = cli_fail(st, "SD3 generation failed");
    mmc_tensor_free(lat);
    free(pr);
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_ctx_free(ctx);
    mmc_sd3_pipeline_free(p);
    return rc;
}

/* StableDiffusionXLPipeline (and StableDiffusionPipeline, SD 1.x / 2.x): classifier-free guidance with
 * --guidance (default 5; 7.5 for SD); without --negative-prompt the negative conditioning is zeros where
 * model_index.json sets force_zeros_for_empty_prompt (SDXL base), else the encoding of "", as diffusers
 * does. The noise of stochastic schedulers comes from mmc's stream seed + 1. */
/* HunyuanDiTPipeline: BERT + T5 prompts, classifier-free guidance with --guidance (default 5, negative
 * prompt "" unless given), DDPM steps (default 50), sizes binned to the trained shapes unless
 * --no-resolution-binning (use_resolution_binning=False). */
static int run_hunyuan(gi_args a, int B, bool binning, double rescale, progress_state *ps) {
    if (a.init_image || a.true_cfg > 1.0)
        return cli_usage("generate-image", "--init-image and --true-cfg are not wired for HunyuanDiTPipeline "
                         "folders (it guides with --guidance)");
    int h = (int)a.height, w = (int)a.width;
    if (binning) mmc_hunyuan_bin_resolution(&h, &w);
    else h = h / 16 * 16, w = w / 16 * 16;     /* the pipeline floors sizes to multiples of 16 */
    if (h < 16 || w < 16) return cli_usage("generate-image", "--width and --height must be at least 16");
    a.height = h, a.width = w;
    mmc_hunyuan_pipeline *p = NULL;
    mmc_status st = mmc_hunyuan_pipeline_open(a.model, &p);
    if (st) return cli_fail(st, "cannot open the pipeline");
    if (a.lora) {   /* PEFT's adapter on the transformer (what `mmc train` writes), or a diffusers LoRA file */
        char path[4096];
        const float wl = cli_lora_spec(a.lora, path, sizeof path);
        if ((st = mmc_hunyuan_pipeline_load_lora(p, path, wl))) {
            mmc_hunyuan_pipeline_free(p);
            return cli_fail(st, "cannot apply --lora %s", a.lora);
        }
    }
    mmc_ctx *ctx = mmc_ctx_new();
    const double t0 = mmc_now();
    const char **pr = malloc((size_t)B * 2 * sizeof *pr), **ng = pr + B;
    mmc_hunyuan_cond cond, neg;
    mmc_tensor *lat = NULL, *img = NULL;
    int rc = CLI_ERROR;
    for (int b = 0; b < B; b++) pr[b] = a.prompt, ng[b] = a.neg ? a.neg : "";
    const bool cfg = a.guidance > 1.0;
    double t_text = 0, t_denoise = 0, t_decode = 0;
    if ((st = mmc_hunyuan_encode_prompt(ctx, p, pr, B, &cond)) ||
        (cfg && (st = mmc_hunyuan_encode_prompt(ctx, p, ng, B, &neg))))
        goto done;
    t_text = mmc_now() - t0;
    int64_t shape[4] = {B, mmc_hunyuan_pipeline_latent_channels(p), h / 8, w / 8};
    lat = mmc_tensor_new(MMC_F32, 4, shape);
    if ((st = initial_latents(ctx, a.latents_path, a.seed, lat))) goto done; /* DDPM's init_noise_sigma is 1 */
    mmc_hunyuan_opts o = {.height = h, .width = w, .steps = (int)a.steps, .guidance = a.guidance,
                          .guidance_rescale = rescale, .seed = (uint64_t)a.seed + 1, .progress = on_step, .user = ps};
    double t1 = mmc_now();
    if ((st = mmc_hunyuan_sample(ctx, p, &cond, cfg ? &neg : NULL, &o, lat))) goto done;
    t_denoise = mmc_now() - t1;
    t1 = mmc_now();
    if ((st = mmc_hunyuan_decode(ctx, p, lat, &img))) goto done;
    t_decode = mmc_now() - t1;
    rc = write_outputs(&a, img, t0, t_text, t_denoise, t_decode);
done:
    if (st) rc = cli_fail(st, "HunyuanDiT generation failed");
    mmc_tensor_free(lat);
    free(pr);
    mmc_ctx_free(ctx);
    mmc_hunyuan_pipeline_free(p);
    return rc;
}

static int run_sdxl(const gi_args *ga, int B, bool tiled, progress_state *ps) {
    gi_args args = *ga, *a = &args;
    if (a->true_cfg > 1.0)
        return cli_usage("generate-image", "--true-cfg is not wired for SDXL / SD pipelines (they guide with "
                         "--guidance)");
    mmc_sdxl_pipeline *p = NULL;
    mmc_status st = a->single_file ? mmc_sdxl_pipeline_open_single_file(a->model, a->config, &p)
                                   : mmc_sdxl_pipeline_open(a->model, &p);
    if (st) return cli_fail(st, "cannot open the pipeline");
    if (a->size_from_model) a->width = a->height = mmc_sdxl_default_size(p);   /* as the pipelines default */
    if (!mmc_sdxl_has_text_encoder(p) && !a->init_image) {
        mmc_sdxl_pipeline_free(p);
        return cli_usage("generate-image", "%s is an SDXL refiner (CLIP-G only, an img2img pipeline): give it "
                         "--init-image (e.g. the base model's output)", a->model);
    }
    if (mmc_sdxl_requires_aesthetics(p))
        mmc_sdxl_set_aesthetic_scores(p, a->aesthetic >= 0 ? a->aesthetic : 6.0,
                                      a->negative_aesthetic >= 0 ? a->negative_aesthetic : 2.5);
    if ((st = mmc_sdxl_check_size(p, (int)a->height, (int)a->width))) {
        mmc_sdxl_pipeline_free(p);
        return cli_fail(st, "bad size");
    }
    if (a->lora) {
        char path[4096];
        const float w = cli_lora_spec(a->lora, path, sizeof path);
        if ((st = mmc_sdxl_pipeline_load_lora(p, path, w))) {
            mmc_sdxl_pipeline_free(p);
            return cli_fail(st, "cannot apply --lora %s", a->lora);
        }
    }
    if (a->scheduler && (st = mmc_sdxl_pipeline_set_scheduler(p, a->scheduler))) {
        mmc_sdxl_pipeline_free(p);
        return cli_fail(st, "cannot use --scheduler %s", a->scheduler);
    }
    mmc_ctx *ctx = mmc_ctx_new();
    const double t0 = mmc_now();
    const char **pr = malloc((size_t)B * 2 * sizeof *pr), **ng = pr + B;
    mmc_flux_cond cond = {0}, neg = {0};
    mmc_tensor *lat = NULL, *img = NULL;
    int rc = CLI_ERROR;
    for (int b = 0; b < B; b++) pr[b] = a->prompt, ng[b] = a->neg ? a->neg : "";
    const bool cfg = a->guidance > 1.0;
    double t_text = 0, t_denoise = 0, t_decode = 0;
    if ((st = mmc_sdxl_encode_prompt(ctx, p, pr, B, &cond))) goto done;
    if (cfg) {
        if (!a->neg && mmc_sdxl_force_zeros(p)) st = mmc_sdxl_zero_cond(&cond, &neg);
        else st = mmc_sdxl_encode_prompt(ctx, p, ng, B, &neg);
        if (st) goto done;
    }
    t_text = mmc_now() - t0;
    int64_t shape[4] = {B, mmc_sdxl_pipeline_latent_channels(p), 0, 0};
    mmc_sdxl_latent_size(p, (int)a->height, (int)a->width, &shape[2], &shape[3]);
    lat = mmc_tensor_new(MMC_F32, 4, shape);
    if ((st = initial_latents(ctx, a->latents_path, a->seed, lat))) goto done;
    mmc_flux_sample_opts o = {.height = (int)a->height, .width = (int)a->width, .steps = (int)a->steps,
                              .guidance = a->guidance, .progress = on_step, .user = ps};
    if (a->init_image) {   /* img2img: the image's latents (sampled from the stream seed + 2), noised by lat */
        float *px = NULL;
        mmc_tensor *il = NULL;
        if ((st = init_pixels(a->init_image, B, a->height, a->width, &px))) goto done;
        st = mmc_sdxl_encode_image(ctx, p, px, B, (int)a->height, (int)a->width, NULL, (uint64_t)a->seed + 2, &il);
        free(px);
        if (!st) st = mmc_sdxl_img2img_latents(p, il, lat, (int)a->steps, a->strength, lat, &o.start_step);
        mmc_tensor_free(il);
        if (st) goto done;
        o.img2img = true;
    }
    double t1 = mmc_now();
    if ((st = mmc_sdxl_sample(ctx, p, &cond, cfg ? &neg : NULL, lat, &o, (uint64_t)a->seed + 1))) goto done;
    t_denoise = mmc_now() - t1;
    t1 = mmc_now();
    if ((st = mmc_sdxl_decode(ctx, p, lat, tiled, &img))) goto done;
    t_decode = mmc_now() - t1;
    rc = write_outputs(a, img, t0, t_text, t_denoise, t_decode);
done:
    if (st) rc = cli_fail(st, "%s generation failed", a->pipeline);
    mmc_tensor_free(lat);
    free(pr);
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&neg);
    mmc_ctx_free(ctx);
    mmc_sdxl_pipeline_free(p);
    return rc;
}

int cmd_generate_image(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *neg = NULL, *latents_path = NULL, *out = "image.png", *lora = NULL;
    const char *init_image = NULL, *scheduler = NULL, *config = NULL;
    double strength = 0.6, aes = -1, neg_aes = -1;
    bool strength_given = false;
    long long width = 1024, height = 1024, steps = 28, batch = 1, seed = 0, maxlen = 512;
    double guidance = 3.5, true_cfg = 1.0;
    bool json = false, tiled = false, maxlen_given = false, guidance_given = false, steps_given = false;
    bool size_given = false, binning = true;
    double rescale = 0;   /* HunyuanDiT's guidance_rescale */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--tiled-decode")) { tiled = true; continue; }
        if (!strcmp(a, "--bf16-matmul")) { cli_bf16_matmul("generate-image"); continue; }
        if (!strcmp(a, "--no-resolution-binning")) { binning = false; continue; }
        if (a[0] != '-' || !strcmp(a, "-")) return cli_usage("generate-image", "unexpected argument '%s'", a);
        if (!(v = cli_value(argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--negative-prompt")) neg = v;
        else if (!strcmp(a, "--latents")) latents_path = v;
        else if (!strcmp(a, "--init-image")) init_image = v;
        else if (!strcmp(a, "--scheduler")) scheduler = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--strength")) { if (!cli_float(a, v, 0, 1, &strength)) return CLI_USAGE; strength_given = true; }
        else if (!strcmp(a, "--aesthetic-score")) { if (!cli_float(a, v, 0, 100, &aes)) return CLI_USAGE; }
        else if (!strcmp(a, "--negative-aesthetic-score")) { if (!cli_float(a, v, 0, 100, &neg_aes)) return CLI_USAGE; }
        else if (!strcmp(a, "--lora")) {
            if (lora) return cli_usage("generate-image", "one --lora at a time is supported (got '%s' and '%s')", lora, v);
            lora = v;
        }
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--width")) { if (!cli_int(a, v, 1, 16384, &width)) return CLI_USAGE; size_given = true; }
        else if (!strcmp(a, "--height")) { if (!cli_int(a, v, 1, 16384, &height)) return CLI_USAGE; size_given = true; }
        else if (!strcmp(a, "--steps")) { if (!cli_int(a, v, 1, 1000, &steps)) return CLI_USAGE; steps_given = true; }
        else if (!strcmp(a, "--batch")) { if (!cli_int(a, v, 1, 64, &batch)) return CLI_USAGE; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, (long long)1 << 62, &seed)) return CLI_USAGE; }
        else if (!strcmp(a, "--max-sequence-length")) { if (!cli_int(a, v, 1, 4096, &maxlen)) return CLI_USAGE; maxlen_given = true; }
        else if (!strcmp(a, "--guidance")) { if (!cli_float(a, v, 0, 100, &guidance)) return CLI_USAGE; guidance_given = true; }
        else if (!strcmp(a, "--guidance-rescale")) { if (!cli_float(a, v, 0, 1, &rescale)) return CLI_USAGE; }
        else if (!strcmp(a, "--true-cfg")) { if (!cli_float(a, v, 0, 100, &true_cfg)) return CLI_USAGE; }
        else return cli_usage("generate-image", "unknown option '%s'", a);
    }
    if (!model) return cli_usage("generate-image", "--model DIR is required");
    if (!prompt) return cli_usage("generate-image", "--prompt TEXT is required");
    if (true_cfg > 1 && !neg)
        return cli_usage("generate-image", "--true-cfg %.3g needs --negative-prompt (the pass it guides against)", true_cfg);
    progress_state ps = {.tty = isatty(2), .quiet = json};
    gi_args ga = {.model = model, .prompt = prompt, .neg = neg, .latents_path = latents_path, .out = out,
                  .lora = lora, .init_image = init_image, .pipeline = "FluxPipeline", .scheduler = scheduler,
                  .strength = strength, .aesthetic = aes, .negative_aesthetic = neg_aes,
                  .guidance = guidance, .true_cfg = true_cfg, .width = width, .height = height, .steps = steps,
                  .seed = seed, .maxlen = maxlen, .json = json};
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISREG(sb.st_mode)) {   /* a single-file SD 1.x / SDXL checkpoint */
        mmc_single_file *sf = NULL;
        mmc_status st = mmc_single_file_open(model, &sf);
        if (st) return cli_fail(st, "cannot open --model %s", model);
        const bool xl = mmc_single_file_get_kind(sf) != MMC_SF_SD1;
        mmc_single_file_free(sf);
        ga.pipeline = xl ? (init_image ? "StableDiffusionXLImg2ImgPipeline" : "StableDiffusionXLPipeline")
                         : (init_image ? "StableDiffusionImg2ImgPipeline" : "StableDiffusionPipeline");
        ga.config = config, ga.single_file = true;
        if (!guidance_given) ga.guidance = xl ? 5.0 : 7.5;
        if (!strength_given) ga.strength = xl ? 0.3 : 0.8;
        if (!steps_given) ga.steps = 50;
        ga.size_from_model = !size_given;
        return run_sdxl(&ga, (int)batch, tiled, &ps);
    }
    if (config)
        return cli_usage("generate-image", "--config DIR goes with a single-file --model (one .safetensors); %s is "
                         "a folder", model);
    {   /* which pipeline (model_index.json's _class_name): SD3 and SDXL folders take their own paths */
        mmc_diffusers_dir d;
        const bool opened = mmc_diffusers_open(model, &d) == MMC_OK;
        const bool xl = opened && (!strcmp(d.pipeline, "StableDiffusionXLPipeline") ||
                                   !strcmp(d.pipeline, "StableDiffusionXLImg2ImgPipeline"));
        const bool sd = opened && (!strcmp(d.pipeline, "StableDiffusionPipeline") ||
                                   !strcmp(d.pipeline, "StableDiffusionImg2ImgPipeline"));
        if (scheduler && !xl && !sd)
            return cli_usage("generate-image", "--scheduler is wired for StableDiffusionXLPipeline and "
                             "StableDiffusionPipeline folders only so far");
        if (opened && (!strcmp(d.pipeline, "StableDiffusion3Pipeline") ||
                       !strcmp(d.pipeline, "StableDiffusion3Img2ImgPipeline"))) {
            ga.pipeline = init_image ? "StableDiffusion3Img2ImgPipeline" : "StableDiffusion3Pipeline";
            if (!maxlen_given) ga.maxlen = 256;        /* the SD3 pipeline's default */
            if (!guidance_given) ga.guidance = 7.0;
            return run_sd3(&ga, (int)batch, tiled, &ps);
        }
        if (opened && !strcmp(d.pipeline, "HunyuanDiTPipeline")) {
            ga.pipeline = "HunyuanDiTPipeline";
            if (!guidance_given) ga.guidance = 5.0;    /* the pipeline's defaults */
            if (!steps_given) ga.steps = 50;
            return run_hunyuan(ga, (int)batch, binning, rescale, &ps);
        }
        if (xl || sd) {   /* the UNet pipelines: SDXL, SD 1.x / 2.x */
            ga.pipeline = xl ? (init_image ? "StableDiffusionXLImg2ImgPipeline" : "StableDiffusionXLPipeline")
                             : (init_image ? "StableDiffusionImg2ImgPipeline" : "StableDiffusionPipeline");
            if (!guidance_given) ga.guidance = xl ? 5.0 : 7.5;    /* the pipelines' defaults */
            if (!strength_given) ga.strength = xl ? 0.3 : 0.8;
            if (!steps_given) ga.steps = 50;
            ga.size_from_model = !size_given;
            return run_sdxl(&ga, (int)batch, tiled, &ps);
        }

    }
    mmc_flux_pipeline *p = NULL;
    mmc_status st = mmc_flux_pipeline_open(model, &p);
    if (st) return cli_fail(st, "cannot open the pipeline");
    if ((st = mmc_flux_check_size(p, (int)height, (int)width))) { mmc_flux_pipeline_free(p); return cli_fail(st, "bad size"); }
    if (lora) {
        char path[4096];
        const float w = cli_lora_spec(lora, path, sizeof path);
        if ((st = mmc_flux_pipeline_load_lora(p, path, w))) {
            mmc_flux_pipeline_free(p);
            return cli_fail(st, "cannot apply --lora %s", lora);
        }
    }
    mmc_ctx *ctx = mmc_ctx_new();
    const double t0 = mmc_now();
    const int B = (int)batch;
    const char **prompts = malloc((size_t)B * sizeof *prompts), **negs = malloc((size_t)B * sizeof *negs);
    mmc_flux_cond cond = {0}, ncond = {0};
    mmc_tensor *img = NULL;
    uint8_t *rgb = NULL;
    int rc = CLI_ERROR;
    for (int b = 0; b < B; b++) prompts[b] = prompt, negs[b] = neg;
    if ((st = mmc_flux_encode_prompt(ctx, p, prompts, B, (int)maxlen, &cond))) { cli_fail(st, "cannot encode the prompt"); goto done; }
    const bool use_neg = neg && true_cfg > 1;
    if (use_neg && (st = mmc_flux_encode_prompt(ctx, p, negs, B, (int)maxlen, &ncond))) {
        cli_fail(st, "cannot encode the negative prompt");
        goto done;
    }
    const double t_text = mmc_now() - t0;
    const mmc_flux_config *tc = mmc_flux_pipeline_transformer_cfg(p);
    const int f = mmc_flux_pipeline_vae_scale(p);
    const int64_t h = 2 * (height / (2 * f)), w = 2 * (width / (2 * f)), S = mmc_flux_image_tokens(p, (int)height, (int)width);
    mmc_tensor *lat = NULL;
    if (latents_path) {
        if ((st = load_latents(ctx, latents_path, B, S, tc->in_channels, h, w, &lat))) { cli_fail(st, "bad --latents"); goto done; }
    } else {
        /* N(0, 1) noise [B, C, h, w] from mmc's Philox stream, packed as the pipeline packs it */
        mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, tc->in_channels / 4, h, w));
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)seed);
        mmc_rng_normal(&r, z->data, mmc_numel(z), 0.0f, 1.0f);
        lat = mmc_flux_pack_latents(ctx, z);
    }
    int start_step = 0;
    if (init_image) {   /* img2img: the noise above mixes with the image's latents at the start step */
        float *px = NULL;
        if ((st = init_pixels(init_image, B, height, width, &px))) { cli_fail(st, "cannot read --init-image"); goto done; }
        mmc_tensor *il = NULL;
        st = mmc_flux_encode_image(ctx, p, px, B, (int)height, (int)width, (uint64_t)seed + 1, &il);
        free(px);
        if (st) { cli_fail(st, "cannot encode --init-image"); goto done; }
        mmc_tensor *noise = mmc_flux_unpack_latents(ctx, lat, h, w), *packed = NULL;
        if ((st = mmc_flux_img2img_latents(ctx, p, il, noise, (int)steps, strength, (int)height, (int)width, &packed,
                                           &start_step))) {
            cli_fail(st, "img2img");
            goto done;
        }
        lat = packed;
    }
    mmc_tensor *keep = mmc_tensor_new(MMC_F32, 3, lat->shape);   /* persistent across the loop's arena resets */
    memcpy(keep->data, lat->data, mmc_nbytes(lat));
    mmc_flux_sample_opts o = {.height = (int)height, .width = (int)width, .steps = (int)steps, .guidance = guidance,
                              .true_cfg = true_cfg, .start_step = start_step, .progress = on_step, .user = &ps};
    const double t1 = mmc_now();
    st = mmc_flux_sample(ctx, p, &cond, use_neg ? &ncond : NULL, keep, &o);
    const double t_denoise = mmc_now() - t1;
    if (st) { mmc_tensor_free(keep); cli_fail(st, "denoising failed"); goto done; }
    mmc_flux_pipeline_release_transformer(p);
    const double t2 = mmc_now();
    st = mmc_flux_decode(ctx, p, keep, (int)height, (int)width, tiled, &img);
    mmc_tensor_free(keep);
    const double t_decode = mmc_now() - t2;
    if (st) { cli_fail(st, "VAE decode failed"); goto done; }
    rc = write_outputs(&ga, img, t0, t_text, t_denoise, t_decode);
    if (rc) goto done;
    rc = CLI_OK;
done:
    free(rgb);
    free(prompts);
    free(negs);
    mmc_flux_cond_free(&cond);
    mmc_flux_cond_free(&ncond);
    mmc_ctx_free(ctx);
    mmc_flux_pipeline_free(p);
    return rc;
}
