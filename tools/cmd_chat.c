/* cmd_chat.c — `mmc chat`: a multi-turn conversation on stdin/stdout. Each turn renders the
 * whole conversation with the chat template (the same code as generate, training and
 * serving) and streams the reply. /image PATH attaches an image to the next message, /video PATH
 * a video (one per conversation: the prompt builder takes one video), /audio PATH an audio file
 * (Qwen2.5-Omni: each user turn renders its images, video, audios, then its text, as
 * Qwen2_5OmniProcessor.apply_chat_template does for content parts in that order). */
#include "cli.h"
#include "runner.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void help_chat(FILE *f) {
    fprintf(f,
            "usage: mmc chat --model DIR [options]\n\n"
            "Chat with the model in DIR. Type a message and press Enter. Commands:\n"
            "  /image PATH   attach an image to your next message (vision-language models)\n"
            "  /video PATH   attach a video file (or frame folder) to your next message; one video per\n"
            "                conversation (--video attaches one to the first message)\n"
            "  /audio PATH   attach an audio file (WAV, FLAC, MP3, OGG/Opus, M4A, a video's sound) to your\n"
            "                next message (Qwen2.5-Omni); several per message and per conversation\n"
            "  /reset        start a new conversation\n"
            "  /quit         leave (or end of input)\n\n"
            "options:\n"
            "  --model DIR              Hugging Face model directory, or a LoRA adapter directory\n"
            "  --adapter DIR            apply this PEFT LoRA adapter to the model (no merge needed)\n"
            "  --system TEXT            system prompt (default: the template's default)\n"
            "  --chat-template FILE     render with this Jinja template instead of the model's\n"
            "  --chat-template-name N   use the model's template named N (tokenizer_config.json's\n"
            "                           list of {name, template}, or additional_chat_templates/N.jinja)\n"
            "  --video FILE|DIR         a video (file, sampled at 2 fps or as the processor config\n"
            "                           says, or a folder of frames) for the first message\n"
            "  --audio FILE             an audio file for the first message (repeatable; Qwen2.5-Omni)\n"
            "  --show-prompt-ids        print each turn's prompt token ids (the whole conversation,\n"
            "                           placeholders expanded) to stderr before the reply\n"
            "  --max-image-pixels N     refuse image files with more pixels (default 178956970,\n"
            "                           PIL's decompression-bomb limit)\n"
            "  --image-backend B        pil (default): Pillow-exact resize, transformers'\n"
            "                           backend=\"pil\"; torchvision: transformers 5.x's default\n"
            "                           image processor (torch's uint8 antialiased resize)\n"
            CLI_SAMPLING_HELP
            "                           (the seed of turn n is S + n)\n"
            CLI_QUANTIZE_HELP
            "  -h, --help               this help\n", 256);
}

typedef struct {
    char *role;
    char *text;
    int n_images;      /* images placed before the text */
    int n_audios;      /* audios placed after the images / video, before the text */
} turn;

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *system = NULL, *video = NULL, *tpl = NULL, *tpl_name = NULL;
    cli_sampling sp;
    cli_sampling_init(&sp);
    long long max_image_pixels = 0;
    mmc_vlproc_resize_mode resize_mode = MMC_VLPROC_RESIZE_PIL;   /* --image-backend */
    const char *arg_audios[64];
    int n_arg_audios = 0;
    bool show_ids = false;
    int quant = 0;   /* --quantize */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return CLI_USAGE; } while (0)
        if (!strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "--adapter")) { VAL(); adapter = v; }
        else if (!strcmp(a, "--system")) { VAL(); system = v; }
        else if (!strcmp(a, "--video")) { VAL(); video = v; }
        else if (!strcmp(a, "--audio")) {
            VAL();
            if (n_arg_audios == 64) return cli_usage("chat", "at most 64 --audio files");
            arg_audios[n_arg_audios++] = v;
        }
        else if (!strcmp(a, "--show-prompt-ids")) show_ids = true;
        else if (!strcmp(a, "--chat-template")) { VAL(); tpl = v; }
        else if (!strcmp(a, "--chat-template-name")) { VAL(); tpl_name = v; }
        else if (!strcmp(a, "--max-image-pixels")) { VAL(); if (!cli_int(a, v, 1, 1LL << 40, &max_image_pixels)) return CLI_USAGE; }
        else if (!strcmp(a, "--image-backend")) { VAL(); if (cli_image_backend("chat", v, &resize_mode)) return CLI_USAGE; }
        else if (!strcmp(a, "--quantize")) { VAL(); if (cli_quantize_arg("chat", v, &quant)) return CLI_USAGE; }
        else if (!strcmp(a, "--bf16-matmul")) cli_bf16_matmul("chat");
        else if (!strcmp(a, "--matmul-precision")) { VAL(); if (cli_matmul_precision("chat", v)) return CLI_USAGE; }
        else {
            int sr = cli_sampling_arg("chat", argc, argv, &i, &sp);
            if (sr < 0) return CLI_USAGE;
            if (sr > 0) continue;
            return cli_usage("chat", "unknown option '%s'", a);
        }
#undef VAL
    }
    if (!model && !adapter) return cli_usage("chat", "--model DIR is required");
    cli_model cm;
    mmc_status st = cli_model_load(model, adapter, &cm);
    cm.max_image_pixels = max_image_pixels;
    if (st) return cli_fail(st, "chat: cannot load the model");
    if ((st = cli_model_quantize(&cm, quant))) {
        cli_model_free(&cm);
        return cli_fail(st, "chat: cannot quantise the model");
    }
    if ((st = cli_model_prepack(&cm))) {
        cli_model_free(&cm);
        return cli_fail(st, "chat: cannot pre-pack the weights");
    }
    if (cm.vl) cm.proc.resize_mode = resize_mode;
    if (cm.llava) cm.cproc.resize_mode = cm.nproc.base.resize_mode = resize_mode;
    if (cm.internvl) cm.iproc.resize_mode = resize_mode;
    if (cm.omni) cm.proc.resize_mode = resize_mode;
    if (n_arg_audios && !cm.omni) {
        fprintf(stderr, "mmc chat: --audio needs a Qwen2.5-Omni model (qwen2_5_omni_thinker or qwen2_5_omni); this "
                "one is model_type %s\n", cm.model_type);
        cli_model_free(&cm);
        return CLI_USAGE;
    }
    if ((st = cli_model_set_template(&cm, tpl, tpl_name))) {
        cli_model_free(&cm);
        return cli_fail(st, "chat: cannot use the chat template");
    }
    bool tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "mmc chat — %s%s%s (%s). /image PATH, /video PATH, /audio PATH, /reset, /quit.\n", cm.base_dir,
                     cm.adapter_dir[0] ? " + adapter " : "", cm.adapter_dir, cm.model_type);
    turn turns[256];
    int n_turns = 0;
    const char *images[64];
    char *image_store[64];
    int n_images = 0, pending_images = 0;
    char *video_store = NULL;                   /* a /video path (--video's is argv's) */
    int video_turn = video ? 0 : -1;            /* the user turn the video goes with */
    bool video_pending = false;
    cli_audio audios[64];                       /* every audio of the conversation, in turn order */
    char *audio_store[64];
    int n_audios = 0, pending_audios = 0;
    for (int i = 0; i < n_arg_audios; i++) {    /* --audio: the first message's */
        audio_store[n_audios] = strdup(arg_audios[i]);
        audios[n_audios] = (cli_audio){.path = audio_store[n_audios]};
        n_audios++, pending_audios++;
    }
    int32_t eos[MMC_GEN_MAX_EOS];
    mmc_gen_opts go0 = {0};
    /* the longest reply any turn may get (a max_length budget shrinks as the chat grows) */
    int max_new = cli_sampling_resolve(&cm, &sp, 256, 1, &go0, eos);
    int32_t *out = malloc((size_t)(max_new + 1) * sizeof *out);
    char line[65536];
    int rc = 0;
    while (1) {
        if (tty) { fprintf(stderr, ">>> "); fflush(stderr); }
        if (!fgets(line, sizeof line, stdin)) break;
        trim(line);
        if (!line[0]) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            for (int i = 0; i < n_turns; i++) { free(turns[i].role); free(turns[i].text); }
            for (int i = 0; i < n_images; i++) free(image_store[i]);
            for (int i = 0; i < n_audios; i++) free(audio_store[i]);
            n_turns = n_images = pending_images = n_audios = pending_audios = 0;
            free(video_store), video_store = NULL;
            video = NULL, video_turn = -1, video_pending = false;
            fprintf(stderr, "[conversation reset]\n");
            continue;
        }
        if (!strncmp(line, "/image ", 7)) {
            if (!cm.vl && !cm.llava && !cm.internvl && !cm.omni) { fprintf(stderr, "mmc chat: %s is text-only; /image needs a vision-language model\n", model); continue; }
            if (n_images == 64) { fprintf(stderr, "mmc chat: at most 64 images per conversation\n"); continue; }
            if (access(line + 7, R_OK) != 0) { fprintf(stderr, "mmc chat: cannot read %s\n", line + 7); continue; }
            image_store[n_images] = strdup(line + 7);
            images[n_images] = image_store[n_images];
            n_images++;
            pending_images++;
            fprintf(stderr, "[image attached: %s]\n", line + 7);
            continue;
        }
        if (!strncmp(line, "/video ", 7)) {
            if (!cm.vl && !cm.omni) { fprintf(stderr, "mmc chat: %s is text-only; /video needs a vision-language model\n", model); continue; }
            if (video) { fprintf(stderr, "mmc chat: one video per conversation (%s is attached); /reset first\n", video); continue; }
            if (access(line + 7, R_OK) != 0) { fprintf(stderr, "mmc chat: cannot read %s\n", line + 7); continue; }
            video = video_store = strdup(line + 7);
            video_pending = true;
            fprintf(stderr, "[video attached: %s]\n", line + 7);
            continue;
        }
        if (!strncmp(line, "/audio ", 7)) {
            if (!cm.omni) {
                fprintf(stderr, "mmc chat: /audio needs a Qwen2.5-Omni model (qwen2_5_omni_thinker or qwen2_5_omni); "
                        "this one is model_type %s\n", cm.model_type);
                continue;
            }
            if (n_audios == 64) { fprintf(stderr, "mmc chat: at most 64 audio files per conversation\n"); continue; }
            if (access(line + 7, R_OK) != 0) { fprintf(stderr, "mmc chat: cannot read %s\n", line + 7); continue; }
            audio_store[n_audios] = strdup(line + 7);
            audios[n_audios] = (cli_audio){.path = audio_store[n_audios]};
            n_audios++, pending_audios++;
            fprintf(stderr, "[audio attached: %s]\n", line + 7);
            continue;
        }
        if (line[0] == '/') { fprintf(stderr, "mmc chat: unknown command %s (/image PATH, /video PATH, /audio PATH, /reset, /quit)\n", line); continue; }
        if (n_turns + 2 > 256) { fprintf(stderr, "mmc chat: conversation too long; /reset\n"); continue; }
        if (video_pending) video_turn = n_turns, video_pending = false;
        turns[n_turns++] = (turn){strdup("user"), strdup(line), pending_images, pending_audios};
        pending_images = pending_audios = 0;
        /* messages: optional system, then every turn with its image parts */
        mmc_chat_message msgs[257];
        mmc_chat_part parts[256 + 64 + 64 + 1];
        int nm = 0, np = 0;
        if (system) msgs[nm++] = (mmc_chat_message){.role = "system", .content = system};
        for (int t = 0; t < n_turns; t++) {
            mmc_chat_part *p0 = &parts[np];
            for (int k = 0; k < turns[t].n_images; k++) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_IMAGE};
            if (video && t == video_turn) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_VIDEO};
            for (int k = 0; k < turns[t].n_audios; k++) parts[np++] = (mmc_chat_part){.type = MMC_CHAT_AUDIO};
            parts[np++] = (mmc_chat_part){.type = MMC_CHAT_TEXT, .text = turns[t].text};
            msgs[nm++] = (mmc_chat_message){.role = turns[t].role, .parts = p0, .n_parts = (int)(&parts[np] - p0)};
        }
        cli_prompt cp;
        if ((st = cli_prompt_build_audio(&cm, msgs, nm, images, n_images, audios, n_audios, video, &cp))) {
            cli_fail(st, "chat: cannot build the prompt");
            free(turns[--n_turns].role);
            free(turns[n_turns].text);
            /* the failed message's images and audios go with it (one of them may be the cause) */
            for (int k = 0; k < turns[n_turns].n_images; k++) free(image_store[--n_images]);
            for (int k = 0; k < turns[n_turns].n_audios; k++) free(audio_store[--n_audios]);
            if (turns[n_turns].n_images + turns[n_turns].n_audios)
                fprintf(stderr, "[the message's %d image(s) and %d audio(s) were dropped; attach them again]\n",
                        turns[n_turns].n_images, turns[n_turns].n_audios);
            if (video_turn == n_turns && video_store) video_pending = true, video_turn = -1;
            continue;
        }
        if (show_ids) {
            fprintf(stderr, "[prompt %lld tokens:", (long long)cp.n);
            for (int64_t k = 0; k < cp.n; k++) fprintf(stderr, " %d", cp.ids[k]);
            fprintf(stderr, "]\n");
        }
        cli_stream cs = {.tok = cm.tok, .ids = out, .print = true};
        mmc_gen_opts go = {.on_token = cli_stream_token, .user = &cs};
        cli_sampling_resolve(&cm, &sp, 256, cp.n, &go, eos);
        go.sampler.seed += (uint64_t)n_turns;
        int n_out = 0;
        st = cli_generate(&cm, &cp, &go, out, &n_out);
        cli_prompt_free(&cp);
        printf("\n");
        fflush(stdout);
        if (st) { cli_fail(st, "chat: generation failed"); rc = 1; break; }
        char *reply = NULL;
        if (mmc_tokenizer_decode(cm.tok, out, n_out, true, &reply) != MMC_OK) reply = strdup("");
        turns[n_turns++] = (turn){strdup("assistant"), reply, 0, 0};
    }
    for (int i = 0; i < n_turns; i++) { free(turns[i].role); free(turns[i].text); }
    for (int i = 0; i < n_images; i++) free(image_store[i]);
    for (int i = 0; i < n_audios; i++) free(audio_store[i]);
    free(video_store);
    free(out);
    cli_model_free(&cm);
    return rc;
}
