/* mmc.c — the `mmc` command: one binary, one subcommand per job (info, generate, chat,
 * forward, train, eval, ...). Each subcommand has --help; errors go to stderr with what was
 * wrong and what to do, and a non-zero exit code. */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MMC_VERSION "0.1.0"

static const cli_cmd g_cmds[] = {
    {"info", "Describe a model directory: architecture, parameters by component, dtypes",
     cmd_info, help_info},
    {"generate", "Generate a completion for a prompt (streams tokens; greedy or sampled)",
     cmd_generate, help_generate},
    {"chat", "Multi-turn chat on the terminal (/image PATH attaches an image)", cmd_chat, help_chat},
    {"forward", "One forward pass; write the logits to safetensors for parity checks",
     cmd_forward, help_forward},
    {"merge", "Merge a LoRA adapter (PEFT format) into a model and write an HF directory",
     cmd_merge, help_merge},
    {"eval", "Evaluate a model on a dataset: loss, perplexity, exact/normalised-match accuracy",
     cmd_eval, help_eval},
    {"synth", "Write the demo's synthetic shapes dataset (images + questions, JSONL)",
     cmd_synth, help_synth},
    {"train", "Train or fine-tune a model from one YAML run config (resumable checkpoints)",
     cmd_train, help_train},
    {"launch", "Run `mmc train` on N data-parallel processes (execs mpirun with sensible flags)",
     cmd_launch, help_launch},
    {"export", "Write a training checkpoint (any rank count / ZeRO stage) as a Hugging Face directory",
     cmd_export, help_export},
    {"template", "Render a chat template over messages, exactly as transformers does", cmd_template, help_template},
};
static const int g_ncmds = sizeof g_cmds / sizeof g_cmds[0];

int cli_fail(mmc_status st, const char *fmt, ...) {
    /* one write for the whole line: under mpirun the ranks' stderr is merged, and separate
     * writes of two ranks' messages interleave on one line */
    char buf[8192];
    va_list ap;
    int n = snprintf(buf, sizeof buf, "mmc: ");
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof buf && st != MMC_OK && mmc_last_error()[0])
        n += snprintf(buf + n, sizeof buf - (size_t)n, ": %s", mmc_last_error());
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    fwrite(buf, 1, (size_t)n, stderr);
    return 1;
}

bool cli_is_help(const char *a) { return strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0; }

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "mmc %s: option %s needs a value\n", argv[0], argv[*i]);
        return NULL;
    }
    return argv[++*i];
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
    for (int i = 0; i < g_ncmds; i++) fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].summary);
    fprintf(f, "\n`mmc <command> --help` describes a command's options.\n"
               "environment: OMP_NUM_THREADS sets the number of CPU threads (default: all cores).\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("mmc %s\n", MMC_VERSION);
        return 0;
    }
    for (int i = 0; i < g_ncmds; i++) {
        if (strcmp(argv[1], g_cmds[i].name) != 0) continue;
        for (int a = 2; a < argc; a++)
            if (cli_is_help(argv[a])) { g_cmds[i].help(stdout); return 0; }
        return g_cmds[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "mmc: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
