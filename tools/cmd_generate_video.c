/* cmd_generate_video.c — `mmc generate-video`: text (and, with a WanImageToVideoPipeline folder, a first
 * frame, and a last one for a first-last-frame transformer) -> video (src/diffusion/wan_pipeline.c), as diffusers' WanPipeline / WanImageToVideoPipeline
 * (...).frames[0] then export_to_video
 * does it (frames to uint8 by truncation, as export_to_video's astype): the prompt through UMT5, the denoising loop with a progress bar, the causal VAE decoded
 * chunk by chunk with its own progress bar, and the frames written by mmc_video_write as MP4
 * (H.264), GIF, lossless MKV or a folder of PNG frames, by the output's extension, with the prompt
 * and settings in the container's metadata. */
#include "cli.h"
#include "mmc_diffusion.h"
#include "mmc_io.h"
#include "mmc_video.h"
#include "mmc_wan_t2v.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

void help_generate_video(FILE *f) {
    fprintf(f,
            "usage: mmc generate-video --model DIR --prompt TEXT [--image F [--last-image F2]] [options]\n\n"
            "Generate a video with a diffusers WanPipeline folder (Wan2.1 text-to-video: model_index.json,\n"
            "transformer/ (WanTransformer3DModel), vae/ (AutoencoderKLWan), text_encoder/ (UMT5),\n"
            "tokenizer/, scheduler/ (UniPCMultistepScheduler)), the way diffusers' WanPipeline does: same\n"
            "prompt cleaning and zero-padded UMT5 states, same sigmas (flow_shift from the scheduler's\n"
            "config), same classifier-free guidance, same latent normalisation. The text encoder is freed\n"
            "before the denoising loop, the transformer before the VAE, which decodes one latent frame at a\n"
            "time (memory does not grow with the clip).\n"
            "With a WanImageToVideoPipeline folder (Wan2.1 I2V: also image_encoder/ (CLIPVisionModel) and\n"
            "image_processor/ (CLIPImageProcessor)) --image gives the first frame, as diffusers' pipeline\n"
            "takes it: CLIP image states condition every block, the image resized to the frame size (Pillow's\n"
            "lanczos) is VAE-encoded with the other frames zero and joined to the latents with a first-frame\n"
            "mask. A first-last-frame transformer (Wan2.1 FLF2V: pos_embed_seq_len in its config) also takes\n"
            "--last-image, as the pipeline's last_image: both frames' CLIP states, the last frame placed at the\n"
            "end of the encoded clip and in the mask.\n\n"
            "options:\n"
            "  --model DIR             the pipeline folder (required)\n"
            "  --prompt TEXT           the prompt (required)\n"
            "  --negative-prompt TEXT  what to guide away from (default \"\", as diffusers)\n"
            "  --image F               the first frame (JPEG / PNG / WebP ...; required by, and only taken by,\n"
            "                          an image-to-video folder)\n"
            "  --last-image F2         the last frame (required by, and only taken by, a first-last-frame folder)\n"
            "  --frames N              frames of the clip (default 81); must be 4k + 1 (the VAE compresses\n"
            "                          time 4x after the first frame), else an error names the nearest count\n"
            "  --fps F                 frames per second written into the file (default 16, Wan2.1's)\n"
            "  --width W --height H    frame size in pixels (default 832 x 480); multiples of 16 (VAE factor\n"
            "                          8 x patch 2), else an error names the nearest valid size\n"
            "  --steps N               denoising steps (default 50)\n"
            "  --guidance G            classifier-free guidance scale (default 5; 1 or less: one pass per step,\n"
            "                          no negative prompt)\n"
            "  --seed S                seed of the initial noise (default 0; mmc's generator, not torch's)\n"
            "  --max-sequence-length L UMT5 tokens (default 512, as WanPipeline)\n"
            "  --lora DIR[:SCALE]      a diffusers LoRA on the transformer (pytorch_lora_weights.safetensors),\n"
            "                          applied unmerged at SCALE (default 1)\n"
            "  --latents F             initial noise from a safetensors file (tensor \"latents\",\n"
            "                          [1, C, (frames-1)/4+1, H/8, W/8] as WanPipeline takes latents=): for\n"
            "                          bit-for-bit comparisons with diffusers, whose RNG differs\n"
            "  --out F                 output (default video.mp4): .mp4/.mov/.m4v (H.264, yuv420p: even sizes),\n"
            "                          .gif, .mkv (lossless FFV1), or a folder of PNG frames (a path ending in\n"
            "                          '/', or an existing directory; frame_00000.png ... and settings.json).\n"
            "                          --output is the same option\n"
            CLI_BF16_MATMUL_HELP
            "  --json                  print one JSON object (file, timings, peak memory) instead of progress\n"
            "  -h, --help              this help\n");
}

typedef struct { bool tty, quiet; double total; const char *what; } progress_state;

static void bar(progress_state *p, int done, int n, const char *unit, double per) {
    if (p->quiet) return;
    const int width = 30, k = n > 0 ? done * width / n : width;
    if (p->tty) {
        fprintf(stderr, "\r%s [", p->what);
        for (int i = 0; i < width; i++) fputc(i < k ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d", done, n);
        if (per > 0) fprintf(stderr, "  %.2f s/%s", per, unit);
        if (done == n) fputc('\n', stderr);
    } else {
        fprintf(stderr, "%s %d/%d\n", p->what, done, n);
    }
}

static void on_step(void *u, int step, int n, double secs) {
    progress_state *p = u;
    p->total += secs;
    bar(p, step, n, "step", p->total / step);
}

static void on_chunk(void *u, int done, int n) { bar(u, done, n, "", 0); }

static float lora_spec(const char *spec, char *path, size_t cap) {
    snprintf(path, cap, "%s", spec);
    char *colon = strrchr(path, ':'), *end = NULL;
    if (colon && colon[1]) {
        const double v = strtod(colon + 1, &end);
        if (end && !*end) { *colon = 0; return (float)v; }
    }
    return 1.0f;
}

/* --latents F: tensor "latents" (or the only one), exactly the shape the clip needs */
static mmc_status read_latents(const char *path, const int64_t *shape, mmc_tensor *lat) {
    mmc_st *st = NULL;
    mmc_status s = mmc_st_open(path, &st);
    if (s) return s;
    const mmc_st_entry *e = mmc_st_find(st, "latents");
    if (!e && mmc_st_count(st) == 1) e = mmc_st_at(st, 0);
    if (!e) s = mmc_error(MMC_ERR_FORMAT, "%s: no tensor \"latents\"", path);
    else {
        bool same = e->ndim == 5;
        for (int d = 0; same && d < 5; d++) same = e->shape[d] == shape[d];
        if (!same)
            s = mmc_error(MMC_ERR_SHAPE, "%s: latents must be [%lld, %lld, %lld, %lld, %lld] for these frames and size",
                          path, (long long)shape[0], (long long)shape[1], (long long)shape[2], (long long)shape[3],
                          (long long)shape[4]);
        else s = mmc_st_read_into(st, e->name, lat);
    }
    mmc_st_close(st);
    return s;
}

int cmd_generate_video(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *neg = "", *latents_path = NULL, *out = "video.mp4", *lora = NULL,
               *image = NULL, *last_image = NULL;
    long long width = 832, height = 480, steps = 50, seed = 0, maxlen = 512, frames = 81;
    double guidance = 5.0, fps = 16.0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--bf16-matmul")) { cli_bf16_matmul("generate-video"); continue; }
        if (a[0] != '-' || !strcmp(a, "-")) return cli_usage("generate-video", "unexpected argument '%s'", a);
        if (!(v = cli_value(argc, argv, &i))) return CLI_USAGE;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--negative-prompt")) neg = v;
        else if (!strcmp(a, "--latents")) latents_path = v;
        else if (!strcmp(a, "--image")) image = v;
        else if (!strcmp(a, "--last-image")) last_image = v;
        else if (!strcmp(a, "--lora")) {
            if (lora) return cli_usage("generate-video", "one --lora at a time is supported (got '%s' and '%s')", lora, v);
            lora = v;
        }
        else if (!strcmp(a, "--out") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--width")) { if (!cli_int(a, v, 1, 16384, &width)) return CLI_USAGE; }
        else if (!strcmp(a, "--height")) { if (!cli_int(a, v, 1, 16384, &height)) return CLI_USAGE; }
        else if (!strcmp(a, "--frames")) { if (!cli_int(a, v, 1, 100000, &frames)) return CLI_USAGE; }
        else if (!strcmp(a, "--fps")) { if (!cli_float(a, v, 0.001, 1000, &fps)) return CLI_USAGE; }
        else if (!strcmp(a, "--steps")) { if (!cli_int(a, v, 1, 1000, &steps)) return CLI_USAGE; }
        else if (!strcmp(a, "--seed")) { if (!cli_int(a, v, 0, (long long)1 << 62, &seed)) return CLI_USAGE; }
        else if (!strcmp(a, "--max-sequence-length")) { if (!cli_int(a, v, 1, 4096, &maxlen)) return CLI_USAGE; }
        else if (!strcmp(a, "--guidance")) { if (!cli_float(a, v, 0, 100, &guidance)) return CLI_USAGE; }
        else return cli_usage("generate-video", "unknown option '%s'", a);
    }
    if (!model) return cli_usage("generate-video", "--model DIR is required");
    if (!prompt) return cli_usage("generate-video", "--prompt TEXT is required");

    mmc_wan_pipeline *p = NULL;
    mmc_status st = mmc_wan_pipeline_open(model, &p);
    if (st) return cli_fail(st, "cannot open the pipeline");
    if ((st = mmc_wan_pipeline_check_frames(p, (int)frames))) { mmc_wan_pipeline_free(p); return cli_fail(st, "bad --frames"); }
    if ((st = mmc_wan_pipeline_check_size(p, (int)height, (int)width))) { mmc_wan_pipeline_free(p); return cli_fail(st, "bad size"); }
    const bool i2v = mmc_wan_pipeline_is_i2v(p);
    if (i2v != (image != NULL)) {
        mmc_wan_pipeline_free(p);
        return cli_usage("generate-video", i2v ? "%s is an image-to-video pipeline: --image F (the first frame) is required"
                                               : "%s is a text-to-video pipeline: it takes no --image", model);
    }
    if (i2v && (st = mmc_wan_pipeline_check_last_image(p, last_image != NULL))) {
        mmc_wan_pipeline_free(p);
        return cli_usage("generate-video", "%s", mmc_last_error());
    }
    if (!i2v && last_image) {
        mmc_wan_pipeline_free(p);
        return cli_usage("generate-video", "%s is a text-to-video pipeline: it takes no --last-image", model);
    }
    if (lora) {
        char path[4096];
        const float w = lora_spec(lora, path, sizeof path);
        if ((st = mmc_wan_pipeline_load_lora(p, path, w))) {
            mmc_wan_pipeline_free(p);
            return cli_fail(st, "cannot apply --lora %s", lora);
        }
    }
    mmc_ctx *ctx = mmc_ctx_new();
    const double t0 = mmc_now();
    mmc_tensor *cond = NULL, *ncond = NULL, *lat = NULL, *video = NULL, *img_states = NULL, *img_cond = NULL;
    mmc_image first = {0}, lastf = {0};
    uint8_t *rgb = NULL;
    int rc = CLI_ERROR;
    const bool cfg = guidance > 1.0;
    const char *pr[1] = {prompt}, *ng[1] = {neg};
    if ((st = mmc_wan_encode_prompt(ctx, p, pr, 1, (int)maxlen, &cond)) ||
        (cfg && (st = mmc_wan_encode_prompt(ctx, p, ng, 1, (int)maxlen, &ncond)))) {
        cli_fail(st, "cannot encode the prompt");
        goto done;
    }
    if (i2v) {   /* encode_image, then prepare_latents' condition (the VAE encodes the first frame) */
        mmc_image_opts io;
        mmc_image_opts_default(&io);
        if ((st = mmc_image_load(image, &io, &first))) { cli_fail(st, "cannot read --image %s", image); goto done; }
        if (last_image && (st = mmc_image_load(last_image, &io, &lastf))) {
            cli_fail(st, "cannot read --last-image %s", last_image);
            goto done;
        }
        const mmc_image *lp = last_image ? &lastf : NULL;
        if ((st = mmc_wan_encode_first_last(ctx, p, &first, lp, &img_states)) ||
            (st = mmc_wan_i2v_condition(p, &first, lp, (int)frames, (int)height, (int)width, &img_cond))) {
            cli_fail(st, "cannot encode --image %s%s%s", image, last_image ? " / --last-image " : "",
                     last_image ? last_image : "");
            goto done;
        }
    }
    const double t_text = mmc_now() - t0;
    int64_t ls[4], shape[5];
    mmc_wan_latent_shape(p, (int)frames, (int)height, (int)width, ls);
    shape[0] = 1;
    memcpy(shape + 1, ls, sizeof ls);
    lat = mmc_tensor_new(MMC_F32, 5, shape);
    if (!lat) { cli_fail(mmc_error(MMC_ERR_OOM, "out of memory"), "latents"); goto done; }
    if (latents_path) {
        if ((st = read_latents(latents_path, shape, lat))) { cli_fail(st, "bad --latents"); goto done; }
    } else {   /* N(0, 1) from mmc's Philox stream */
        mmc_rng r;
        mmc_rng_init(&r, (uint64_t)seed);
        mmc_rng_normal(&r, lat->data, mmc_numel(lat), 0.0f, 1.0f);
    }
    progress_state ps = {.tty = isatty(2), .quiet = json, .what = "denoising"};
    mmc_wan_sample_opts o = {.height = (int)height, .width = (int)width, .frames = (int)frames, .steps = (int)steps,
                             .guidance = guidance, .progress = on_step, .user = &ps, .condition = img_cond,
                             .image_embeds = img_states};
    double t1 = mmc_now();
    if ((st = mmc_wan_sample(ctx, p, cond, ncond, lat, &o))) { cli_fail(st, "denoising failed"); goto done; }
    const double t_denoise = mmc_now() - t1;
    progress_state pd = {.tty = ps.tty, .quiet = json, .what = "VAE decode"};
    t1 = mmc_now();
    if ((st = mmc_wan_decode(p, lat, on_chunk, &pd, &video))) { cli_fail(st, "VAE decode failed"); goto done; }
    const double t_decode = mmc_now() - t1;

    /* [1, F, 3, H, W] in [0, 1] -> RGB bytes [F, H, W, 3] as diffusers' export_to_video gets them from
     * output_type="np" frames: (frame * 255).astype(np.uint8), truncated */
    const int64_t F = video->shape[1], H = video->shape[3], W = video->shape[4];
    rgb = malloc((size_t)(F * H * W * 3));
    if (!rgb) { cli_fail(mmc_error(MMC_ERR_OOM, "out of memory"), "frames"); goto done; }
    const float *x = video->data;
    for (int64_t f = 0; f < F; f++)
        for (int c = 0; c < 3; c++)
            for (int64_t i = 0; i < H * W; i++) rgb[(f * H * W + i) * 3 + c] = (uint8_t)(x[(f * 3 + c) * H * W + i] * 255.0f);
    char comment[8192];
    snprintf(comment, sizeof comment, "prompt: %s; negative_prompt: %s; model: %s; frames: %lld; fps: %g; size: %lldx%lld; "
             "steps: %lld; guidance: %g; seed: %lld%s; lora: %s; image: %s; last_image: %s; software: mmc generate-video (%s)", prompt,
             cfg ? neg : "", model, frames, fps, width, height, steps, guidance, seed,
             latents_path ? " (--latents given)" : "", lora ? lora : "", image ? image : "", last_image ? last_image : "",
             i2v ? "WanImageToVideoPipeline" : "WanPipeline");
    mmc_video_write_opts vo = {.format = MMC_VIDEO_OUT_AUTO, .pad_odd = true, .comment = comment, .title = prompt,
                               .quiet = json};
    if ((st = mmc_video_write(out, rgb, (int)F, (int)H, (int)W, fps, &vo))) { cli_fail(st, "cannot write %s", out); goto done; }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (json) {
        printf("{\"file\": ");
        mmc_json_write_string(stdout, out);
        printf(", \"frames\": %lld, \"fps\": %g, \"width\": %lld, \"height\": %lld, \"steps\": %lld, \"text_encode_s\": "
               "%.3f, \"denoise_s\": %.3f, \"s_per_step\": %.4f, \"vae_decode_s\": %.3f, \"total_s\": %.3f, "
               "\"peak_rss_mib\": %.1f}\n", (long long)F, fps, width, height, steps, t_text, t_denoise,
               t_denoise / (double)steps, t_decode, mmc_now() - t0, (double)ru.ru_maxrss / 1024.0);
    } else {
        printf("wrote %s\n", out);
        fprintf(stderr, "text %.2f s, denoise %.2f s (%.2f s/step), decode %.2f s; peak memory %.0f MiB\n", t_text,
                t_denoise, t_denoise / (double)steps, t_decode, (double)ru.ru_maxrss / 1024.0);
    }
    rc = CLI_OK;
done:
    free(rgb);
    mmc_image_free(&first), mmc_image_free(&lastf);
    mmc_tensor_free(img_states);
    mmc_tensor_free(img_cond);
    mmc_tensor_free(video);
    mmc_tensor_free(lat);
    mmc_tensor_free(cond);
    mmc_tensor_free(ncond);
    mmc_ctx_free(ctx);
    mmc_wan_pipeline_free(p);
    return rc;
}
