/* cmd_generate.c — `mmc generate`: load a Hugging Face model directory, render the prompt
 * with the model's chat template, and stream the completion (sampling settings from the
 * model's generation_config.json as transformers resolves them, the command line over them).
 * Text-only Qwen2 and Qwen2-VL / Qwen2.5-VL with images and a video, Qwen2.5-Omni with audio
 * (see runner.c). */
#include "cli.h"
#include "runner.h"

#include <stdlib.h>
#include <string.h>

void help_generate(FILE *f) {
    fprintf(f,
            "usage: mmc generate --model DIR --prompt TEXT [options]\n\n"
            "Generate a completion with the model in DIR (config.json, safetensors, tokenizer.json).\n"
            "The prompt is wrapped in the model's chat template as a user turn (see --raw).\n\n"
            "options:\n"
            "  --model DIR              Hugging Face model directory, or a LoRA adapter directory\n"
            "                           (a LoRA training checkpoint: its base model is loaded)\n"
            "  --adapter DIR            apply this PEFT LoRA adapter to the model (no merge needed;\n"
            "                           without --model, its base_model_name_or_path is the base)\n"
            "  --prompt TEXT            the user message (required)\n"
            "  --system TEXT            system prompt (default: the template's default)\n"
            "  --chat-template FILE     render with this Jinja template instead of the model's\n"
            "  --chat-template-name N   use the model's template named N (tokenizer_config.json's\n"
            "                           list of {name, template}, or additional_chat_templates/N.jinja)\n"
            "  --image FILE             attach an image (repeatable; vision-language models)\n"
            "  --audio FILE             attach an audio file (repeatable; Qwen2.5-Omni: WAV, FLAC, MP3, ...)\n"
            "  --audio-in-video         Qwen2.5-Omni: the --video file's audio track goes with its frames\n"
            "                           (transformers' use_audio_in_video: time-interleaved)\n"
            "  --video FILE|DIR         attach a video: a file (MP4, MKV, WebM, AVI, MOV, GIF ...)\n"
            "                           sampled at 2 fps or as the video processor config says,\n"
            "                           or a folder of frames (every frame); Qwen2-VL / 2.5-VL /\n"
            "                           Omni and LLaVA-OneVision (every frame of a file unless\n"
            "                           --video-fps / --video-frames)\n"
            "  --video-fps F, --video-frames N, --video-max-frames N, --video-pixel-budget\n"
            "                           sampling overrides; --video-pixel-budget chooses frames and\n"
            "                           size as qwen-vl-utils' fetch_video does (its smart_nframes,\n"
            "                           rounded linspace indices, total pixel budget)\n"
            "  --max-image-pixels N     refuse image files with more pixels (default 178956970,\n"
            "                           PIL's decompression-bomb limit)\n"
            "  --image-backend B        pil (default): Pillow-exact resize, transformers'\n"
            "                           backend=\"pil\"; torchvision: transformers 5.x's default\n"
            "                           image processor (torch's uint8 antialiased resize);\n"
            "                           LLaVA-NeXT / OneVision images: pil only\n"
            CLI_SAMPLING_HELP
            CLI_QUANTIZE_HELP
            "  --raw                    feed the prompt as-is, without the chat template\n"
            "  --json                   print one JSON object {text, tokens, prompt_tokens, ...}\n"
            "  -h, --help               this help\n", 128);
}

int cmd_generate(int argc, char **argv) {
    cli_prompt_args pa = {0};
    cli_sampling sp;
    cli_sampling_init(&sp);
    bool json = false;
    int quant = 0;   /* --quantize */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int pr = cli_prompt_arg("generate", argc, argv, &i, &pa);
        if (pr < 0) return CLI_USAGE;
        if (pr > 0) continue;
        int sr = cli_sampling_arg("generate", argc, argv, &i, &sp);
        if (sr < 0) return CLI_USAGE;
        if (sr > 0) continue;
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--bf16-matmul")) cli_bf16_matmul("generate");
        else if (!strcmp(a, "--matmul-precision")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_matmul_precision("generate", v)) return CLI_USAGE;
        }
        else if (!strcmp(a, "--quantize")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v || cli_quantize_arg("generate", v, &quant)) return CLI_USAGE;
        }
        else return cli_usage("generate", "unknown option '%s'", a);
    }
    if (cli_prompt_args_check("generate", &pa)) return CLI_USAGE;

    double t0 = mmc_now();
    cli_model cm;
    mmc_status st = cli_model_load(pa.model, pa.adapter, &cm);
    if (st) return cli_fail(st, "generate: cannot load the model");
    if ((st = cli_model_quantize(&cm, quant))) {
        cli_model_free(&cm);
        return cli_fail(st, "generate: cannot quantise the model");
    }
    if ((st = cli_model_prepack(&cm))) {
        cli_model_free(&cm);
        return cli_fail(st, "generate: cannot pre-pack the weights");
    }
    cli_prompt cp;
    int rc = 1;
    int32_t *out = NULL;
    cli_stream ss = {.tok = cm.tok, .print = !json};
    if ((st = cli_prompt_from_args(&cm, &pa, &cp))) {
        cli_fail(st, "generate: cannot build the prompt");
        cli_model_free(&cm);
        return CLI_ERROR;
    }
    double t_load = mmc_now() - t0;
    int32_t eos[MMC_GEN_MAX_EOS];
    mmc_gen_opts go = {.on_token = cli_stream_token, .user = &ss};
    int max_new = cli_sampling_resolve(&cm, &sp, 128, cp.n, &go, eos);
    out = malloc((size_t)(max_new + 1) * sizeof *out);
    ss.ids = malloc((size_t)(max_new + 1) * sizeof(int32_t));
    int n_out = 0;
    double t1 = mmc_now();
    st = out && ss.ids ? cli_generate(&cm, &cp, &go, out, &n_out) : mmc_error(MMC_ERR_OOM, "out of memory");
    double t_gen = mmc_now() - t1;
    char *text = NULL;
    if (st) { cli_fail(st, "generate: generation failed"); goto done; }
    if ((st = mmc_tokenizer_decode(cm.tok, out, n_out, true, &text))) {
        cli_fail(st, "generate: cannot decode the output");
        goto done;
    }
    if (json) {
        printf("{\"text\": ");
        mmc_json_write_string(stdout, text);
        printf(", \"tokens\": [");
        for (int i = 0; i < n_out; i++) printf(i ? ", %d" : "%d", out[i]);
        printf("], \"prompt_tokens\": %lld, \"new_tokens\": %d, \"load_seconds\": %.3f, "
               "\"generate_seconds\": %.3f}\n", (long long)cp.n, n_out, t_load, t_gen);
    } else {
        if (ss.printed < strlen(text)) fputs(text + ss.printed, stdout);
        printf("\n");
        fprintf(stderr, "[%lld prompt tokens, %d new tokens in %.2f s, %.1f tok/s]\n", (long long)cp.n,
                n_out, t_gen, t_gen > 0 ? n_out / t_gen : 0.0);
    }
    rc = 0;
done:
    free(text);
    free(ss.ids);
    free(out);
    cli_prompt_free(&cp);
    cli_model_free(&cm);
    return rc;
}
