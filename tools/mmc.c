/* mmc.c — the `mmc` command: one binary, one subcommand per job (info, generate, chat,
 * forward, train, eval, ...). Each subcommand has --help; errors go to stderr with what was
 * wrong and what to do, and exit 1 (runtime error) or 2 (usage error; see cli.h). */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MMC_VERSION "0.1.0"

static const cli_cmd g_cmds[] = {
    {"info", "Describe a model directory (architecture, parameters, dtypes) or, with --system, this machine",
     cmd_info, help_info},
    {"generate", "Generate a completion for a prompt (streams tokens; greedy or sampled)",
     cmd_generate, help_generate},
    {"generate-image", "Generate images from a prompt with a diffusers Flux or SD3 pipeline folder",
     cmd_generate_image, help_generate_image},
    {"generate-video", "Generate a video from a prompt (and a first frame) with a diffusers Wan pipeline folder (MP4 / GIF / PNG frames)",
     cmd_generate_video, help_generate_video},
    {"chat", "Multi-turn chat on the terminal (/image PATH, /video PATH attach media)", cmd_chat, help_chat},
    {"forward", "One forward pass; write the logits to safetensors for parity checks",
     cmd_forward, help_forward},
    {"merge", "Merge a LoRA adapter (PEFT format) into a model and write an HF directory",
     cmd_merge, help_merge},
    {"eval", "Evaluate a model on a dataset: loss, perplexity, exact/normalised-match accuracy",
     cmd_eval, help_eval},
    {"image-demo", "The image-generation demo's captioned shapes and the pixel judge of generated images", cmd_image_demo, help_image_demo},
    {"train-vae", "Train a diffusers AutoencoderKL from scratch on an image folder", cmd_train_vae, help_train_vae},
    {"synth", "Write the demo's synthetic shapes dataset (images + questions, JSONL)",
     cmd_synth, help_synth},
    {"train", "Train or fine-tune a model from one YAML run config (resumable checkpoints)",
     cmd_train, help_train},
    {"launch", "Run `mmc train` on N data-parallel processes (execs mpirun with sensible flags)",
     cmd_launch, help_launch},
    {"plan", "Rank parallel layouts (dp x tp x pp x cp, ZeRO, recompute) by modelled step time and memory", cmd_plan, help_plan},
    {"export", "Write a training checkpoint (any rank count / ZeRO stage) as a Hugging Face directory",
     cmd_export, help_export},
    {"transcribe", "Speech to text with a Whisper checkpoint (language detection, timestamps, JSON / SRT)",
     cmd_transcribe, help_transcribe},
    {"serve", "Serve a model over HTTP with OpenAI's API (chat/completions, streaming, images)", cmd_serve, help_serve},
    {"template", "Render a chat template over messages, exactly as transformers does", cmd_template, help_template},
    {"embed", "Image and text embeddings of a dual encoder (CLIP) and their similarities", cmd_embed, help_embed},
};
static const int g_ncmds = sizeof g_cmds / sizeof g_cmds[0];

/* "mmc[ cmd]: <fmt...>[: last error][ (see mmc cmd --help)]\n" in one write: under mpirun the
 * ranks' stderr is merged, and separate writes of two ranks' messages interleave on one line */
static void report(const char *cmd, mmc_status st, const char *fmt, va_list ap) {
    char buf[8192];
    int n = snprintf(buf, sizeof buf, cmd ? "mmc %s: " : "mmc: ", cmd);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (n < (int)sizeof buf && st != MMC_OK && mmc_last_error()[0])
        n += snprintf(buf + n, sizeof buf - (size_t)n, ": %s", mmc_last_error());
    if (n < (int)sizeof buf && cmd) n += snprintf(buf + n, sizeof buf - (size_t)n, " (see mmc %s --help)", cmd);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    fwrite(buf, 1, (size_t)n, stderr);
}

int cli_fail(mmc_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(NULL, st, fmt, ap);
    va_end(ap);
    return CLI_ERROR;
}

int cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(cmd, MMC_OK, fmt, ap);
    va_end(ap);
    return CLI_USAGE;
}

bool cli_is_help(const char *a) { return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0; }

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_usage(argv[0], "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_set_arg(int argc, char **argv, int *i, const char **kv) {
    const char *a = argv[*i];
    if (strcmp(a, "--set") == 0) {
        if (!(*kv = cli_value(argc, argv, i))) return -1;
    } else if (strncmp(a, "--set=", 6) == 0) {
        *kv = a + 6;
    } else return 0;
    if (!strchr(*kv, '=') || (*kv)[0] == '=') {
        cli_usage(argv[0], "--set expects key.path=value, got '%s'", *kv);
        return -1;
    }
    return 1;
}

bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(val, &end, 10);
    if (!*val || *end || v < lo || v > hi) {
        fprintf(stderr, "mmc: %s expects an integer in [%lld, %lld], got '%s'\n", opt, lo, hi, val);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *opt, const char *val, double lo, double hi, double *out) {
    char *end;
    double v = strtod(val, &end);
    if (!*val || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "mmc: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, val);
        return false;
    }
    *out = v;
    return true;
}

static void usage(FILE *f) {
    fprintf(f, "mmc %s — train, fine-tune, evaluate and serve multimodal models, in C.\n\n"
               "usage: mmc <command> [options]\n\ncommands:\n", MMC_VERSION);
    for (int i = 0; i < g_ncmds; i++) fprintf(f, "  %-14s %s\n", g_cmds[i].name, g_cmds[i].summary);
    fprintf(f, "\n`mmc <command> --help` describes a command's options.\n"
               "environment: OMP_NUM_THREADS sets the number of CPU threads (default: all cores);\n"
               "  OMP_WAIT_POLICY=active makes idle threads spin (mmc's default is passive).\n");
}

/* OpenMP threads that wait for the next parallel region spin by default (libgomp: up to 300 000
 * iterations). On a host with more runnable threads than cores (shared CI runners, a server next
 * to other jobs) the spinning thread takes the core from the one with work: a Whisper decode step
 * took 135-237 ms instead of 19 ms under load 2-14 on the 2-core dev VM. mmc therefore waits
 * passively unless the user chose a policy. libgomp reads the variable once, when it is loaded,
 * so the process re-executes itself once with it set (the variable stops a second exec). */
static void default_wait_policy(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("KMP_BLOCKTIME")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);   /* on failure: go on with the library's default */
}

int main(int argc, char **argv) {
    default_wait_policy(argv);
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("mmc %s\n", MMC_VERSION);
        return 0;
    }
    for (int i = 0; i < g_ncmds; i++) {
        if (strcmp(argv[1], g_cmds[i].name) != 0) continue;
        /* -h/--help anywhere before a "--" (launch passes what follows to mpirun) */
        for (int a = 2; a < argc && strcmp(argv[a], "--") != 0; a++)
            if (cli_is_help(argv[a])) { g_cmds[i].help(stdout); return CLI_OK; }
        return g_cmds[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "mmc: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
