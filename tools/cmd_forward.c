/* cmd_forward.c — `mmc forward`: one full forward pass over a prompt (chat template,
 * images, video), writing the logits to a safetensors file for parity checks against
 * transformers: "logits" [T, V], "last_logits" [V], "input_ids" [T]. */
#include "cli.h"
#include "runner.h"
#include "mmc_io.h"

#include <stdlib.h>
#include <string.h>

void help_forward(FILE *f) {
    fprintf(f,
            "usage: mmc forward --model DIR --prompt TEXT --out FILE.safetensors [options]\n\n"
            "Run one forward pass over the prompt (as a user turn of the chat template, with a\n"
            "generation prompt) and write the logits: logits [T, V], last_logits [V], input_ids [T].\n\n"
            "options:\n"
            "  --model DIR       Hugging Face model directory, or a LoRA adapter directory (its\n"
            "                    base model is loaded and the adapter applied)\n"
            "  --adapter DIR     apply this PEFT LoRA adapter to the model (no merge needed)\n"
            "  --prompt TEXT     the user message (required)\n"
            "  --out FILE        output .safetensors file, written atomically (required)\n"
            "  --system TEXT     system prompt (default: the template's default)\n"
            "  --chat-template FILE, --chat-template-name N   the template to render with (see\n"
            "                    mmc generate --help)\n"
            "  --image FILE      attach an image (repeatable; vision-language models)\n"
            "  --audio FILE      attach an audio file (repeatable; Qwen2.5-Omni)\n"
            "  --audio-in-video  Qwen2.5-Omni: the --video file's audio track goes with its frames\n"
            "  --video FILE|DIR  attach a video file (sampled at 2 fps or as the video processor\n"
            "                    config says) or a folder of frames; --video-fps F,\n"
            "                    --video-frames N, --video-max-frames N, --video-pixel-budget\n"
            "                    (--video-pixel-budget: frames and size as qwen-vl-utils)\n"
            "  --max-image-pixels N  refuse image files with more pixels (default 178956970,\n"
            "                    PIL's decompression-bomb limit)\n"
            "  --image-backend B  pil (default): Pillow-exact resize, transformers' backend=\"pil\";\n"
            "                    torchvision: transformers 5.x's default image processor\n"
            "  --raw             feed the prompt as-is, without the chat template\n"
            "  --quantize int8|nf4  weight-only quantised decoder linears, as generate's (compare\n"
            "                    the logits with an f32 run to see the drift)\n"
            "  --bf16-matmul     bf16 weight GEMMs multiply in bf16 (AMX / AVX512_BF16), as\n"
            "                    generate's (compare the logits with a default run)\n"
            "  --matmul-precision highest|high|medium  f32 GEMMs in f32 (default), bf16x3 or bf16\n"
            "                    on AMX, as generate's\n"            "  --json            print {tokens, vocab, argmax_last, out} as JSON\n"
            "  -h, --help        this help\n");
}

int cmd_forward(int argc, char **argv) {
    cli_prompt_args pa = {0};
    const char *out = NULL;
    bool json = false;
    int quant = 0;   /* --quantize */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return CLI_USAGE; } while (0)
        int pr = cli_prompt_arg("forward", argc, argv, &i, &pa);
        if (pr < 0) return CLI_USAGE;
        if (pr > 0) continue;
        if (!strcmp(a, "--out")) { VAL(); out = v; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--quantize")) { VAL(); if (cli_quantize_arg("forward", v, &quant)) return CLI_USAGE; }
        else if (!strcmp(a, "--bf16-matmul")) cli_bf16_matmul("forward");
        else if (!strcmp(a, "--matmul-precision")) { VAL(); if (cli_matmul_precision("forward", v)) return CLI_USAGE; }
        else return cli_usage("forward", "unknown option '%s'", a);
#undef VAL
    }
    if (cli_prompt_args_check("forward", &pa)) return CLI_USAGE;
    if (!out) return cli_usage("forward", "--out FILE is required");
    cli_model cm;
    mmc_status st = cli_model_load(pa.model, pa.adapter, &cm);
    if (st) return cli_fail(st, "forward: cannot load the model");
    if ((st = cli_model_quantize(&cm, quant))) {
        cli_model_free(&cm);
        return cli_fail(st, "forward: cannot quantise the model");
    }
    if ((st = cli_model_prepack(&cm))) {
        cli_model_free(&cm);
        return cli_fail(st, "forward: cannot pre-pack the weights");
    }
    cli_prompt cp;
    if ((st = cli_prompt_from_args(&cm, &pa, &cp))) {
        cli_model_free(&cm);
        return cli_fail(st, "forward: cannot build the prompt");
    }
    int rc = 1;
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, cp.n));
    memcpy(ids->data, cp.ids, (size_t)cp.n * sizeof(int32_t));
    mmc_tensor *hidden = NULL, *logits = NULL;
    if (cm.llava) {
        if ((st = mmc_llava_forward_media(ctx, cm.llava, ids, cp.llava_pixels, (const int64_t (*)[2])cp.llava_sizes,
                                           cp.llava_n_images, cp.llava_video, NULL, &hidden))) {
            cli_fail(st, "forward: forward pass failed");
            goto done;
        }
        logits = mmc_llava_logits(ctx, cm.llava, hidden);
    } else if (cm.internvl) {
        if ((st = mmc_internvl_forward(ctx, cm.internvl, ids, cp.internvl_pixels, NULL, &hidden))) {
            cli_fail(st, "forward: forward pass failed");
            goto done;
        }
        logits = mmc_internvl_logits(ctx, cm.internvl, hidden);
    } else if (cm.vl) {
        if ((st = mmc_qwen2_vl_forward(ctx, cm.vlm, ids, &cp.media, NULL, NULL, &hidden))) {
            cli_fail(st, "forward: forward pass failed");
            goto done;
        }
        logits = mmc_qwen2_vl_logits(ctx, cm.vlm, hidden);
    } else if (cm.omni) {
        if ((st = mmc_omni_forward(ctx, cm.omni, cp.ids, cp.n, &cp.omni, NULL, NULL, &hidden))) {
            cli_fail(st, "forward: forward pass failed");
            goto done;
        }
        logits = mmc_qwen2_logits(ctx, cm.omni->lm, hidden);
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(cp.n));
        for (int64_t t = 0; t < cp.n; t++) ((int64_t *)pos->data)[t] = t;
        mmc_tensor *cos, *sin;
        mmc_qwen2_rope_table(ctx, &cm.lm->cfg, pos, &cos, &sin);
        mmc_attn_opts ao = {.causal = true};
        hidden = mmc_qwen2_forward(ctx, cm.lm, mmc_qwen2_embed(ctx, cm.lm, ids), cos, sin, &ao, NULL);
        logits = mmc_qwen2_logits(ctx, cm.lm, hidden);
    }
    int64_t V = cm.vocab_size, T = cp.n;
    const float *L = logits->data;
    mmc_stw *w = mmc_stw_new();
    st = w ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) st = mmc_stw_add_raw(w, "logits", MMC_F32, 2, MMC_SHAPE(T, V), L);
    if (!st) st = mmc_stw_add_raw(w, "last_logits", MMC_F32, 1, MMC_SHAPE(V), L + (T - 1) * V);
    if (!st) st = mmc_stw_add_raw(w, "input_ids", MMC_I32, 1, MMC_SHAPE(T), cp.ids);
    if (!st) st = mmc_stw_set_metadata(w, "model", cm.base_dir);
    if (!st && cm.adapter_dir[0]) st = mmc_stw_set_metadata(w, "adapter", cm.adapter_dir);
    if (!st) st = mmc_stw_write(w, out);
    mmc_stw_free(w);
    if (st) { cli_fail(st, "forward: cannot write %s", out); goto done; }
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++) if (L[(T - 1) * V + v] > L[(T - 1) * V + best]) best = v;
    if (json) printf("{\"tokens\": %lld, \"vocab\": %lld, \"argmax_last\": %lld, \"out\": \"%s\"}\n",
                     (long long)T, (long long)V, (long long)best, out);
    else printf("wrote %s: logits [%lld, %lld], last-position argmax %lld\n", out, (long long)T,
                (long long)V, (long long)best);
    rc = 0;
done:
    mmc_ctx_free(ctx);
    cli_prompt_free(&cp);
    cli_model_free(&cm);
    return rc;
}
