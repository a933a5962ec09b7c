/* cmd_generate.c — `mmc generate`: load a Hugging Face model directory, render the prompt
 * with the model's chat template, and stream the completion (greedy unless a temperature
 * is given). Text-only Qwen2 and Qwen2-VL / Qwen2.5-VL with images and a video (see
 * runner.c). */
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
            "  --image FILE             attach an image (repeatable; vision-language models)\n"
            "  --video FILE|DIR         attach a video: a file (MP4, MKV, WebM, AVI, MOV, GIF ...)\n"
            "                           sampled at 2 fps or as the video processor config says,\n"
            "                           or a folder of frames (every frame)\n"
            "  --video-fps F, --video-frames N, --video-max-frames N, --video-pixel-budget\n"
            "                           sampling overrides; the budget caps total video pixels as\n"
            "                           qwen-vl-utils does\n"
            "  --max-new-tokens N       stop after N new tokens (default 128)\n"
            "  --temperature T          sample with temperature T (default: greedy)\n"
            "  --top-k K                keep the K most likely tokens (default off)\n"
            "  --top-p P                nucleus sampling mass (default 1 = off)\n"
            "  --min-p P                drop tokens below P x the top probability (default off)\n"
            "  --repetition-penalty R   HF repetition penalty (default 1 = off)\n"
            "  --seed S                 sampling seed (default 0)\n"
            "  --raw                    feed the prompt as-is, without the chat template\n"
            "  --json                   print one JSON object {text, tokens, prompt_tokens, ...}\n"
            "  -h, --help               this help\n");
}

int cmd_generate(int argc, char **argv) {
    cli_prompt_args pa = {0};
    long long max_new = 128, seed = 0, top_k = 0;
    double temp = 0, top_p = 1, min_p = 0, rep = 1;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        int pr = cli_prompt_arg("generate", argc, argv, &i, &pa);
        if (pr < 0) return 2;
        if (pr > 0) continue;
        if (!strcmp(a, "--max-new-tokens")) { VAL(); if (!cli_int(a, v, 1, 1 << 20, &max_new)) return 2; }
        else if (!strcmp(a, "--temperature")) { VAL(); if (!cli_float(a, v, 0, 100, &temp)) return 2; }
        else if (!strcmp(a, "--top-k")) { VAL(); if (!cli_int(a, v, 0, 1 << 30, &top_k)) return 2; }
        else if (!strcmp(a, "--top-p")) { VAL(); if (!cli_float(a, v, 1e-6, 1, &top_p)) return 2; }
        else if (!strcmp(a, "--min-p")) { VAL(); if (!cli_float(a, v, 0, 1, &min_p)) return 2; }
        else if (!strcmp(a, "--repetition-penalty")) { VAL(); if (!cli_float(a, v, 1e-3, 100, &rep)) return 2; }
        else if (!strcmp(a, "--seed")) { VAL(); if (!cli_int(a, v, 0, (1LL << 62), &seed)) return 2; }
        else if (!strcmp(a, "--json")) json = true;
        else return cli_fail(MMC_OK, "generate: unknown option '%s' (see mmc generate --help)", a);
#undef VAL
    }
    if (!pa.model && !pa.adapter) return cli_fail(MMC_OK, "generate: --model DIR is required (see mmc generate --help)");
    if (!pa.prompt) return cli_fail(MMC_OK, "generate: --prompt TEXT is required (see mmc generate --help)");
    if (pa.raw && (pa.n_images || pa.video))
        return cli_fail(MMC_OK, "generate: --raw cannot place images; drop --raw to use the chat template");

    double t0 = mmc_now();
    cli_model cm;
    mmc_status st = cli_model_load(pa.model, pa.adapter, &cm);
    if (st) return cli_fail(st, "generate: cannot load the model");
    cli_prompt cp;
    int rc = 1;
    int32_t *out = NULL;
    cli_stream ss = {.tok = cm.tok, .print = !json};
    if ((st = cli_prompt_from_args(&cm, &pa, &cp))) {
        cli_fail(st, "generate: cannot build the prompt");
        cli_model_free(&cm);
        return 1;
    }
    double t_load = mmc_now() - t0;
    int32_t eos[8];
    int n_eos = mmc_tokenizer_eos_ids(cm.tok, eos, 8);
    out = malloc((size_t)max_new * sizeof *out);
    ss.ids = malloc((size_t)max_new * sizeof(int32_t));
    mmc_gen_opts go = {.max_new_tokens = (int)max_new, .eos_ids = eos, .n_eos = n_eos,
                       .on_token = cli_stream_token, .user = &ss};
    mmc_sampler_defaults(&go.sampler);
    go.sampler.temperature = (float)temp;
    go.sampler.top_k = (int)top_k;
    go.sampler.top_p = (float)top_p;
    go.sampler.min_p = (float)min_p;
    go.sampler.repetition_penalty = (float)rep;
    go.sampler.seed = (uint64_t)seed;
    int n_out = 0;
    double t1 = mmc_now();
    st = cli_generate(&cm, &cp, &go, out, &n_out);
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
