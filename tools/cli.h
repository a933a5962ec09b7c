/* cli.h — shared helpers of the mmc command-line tool: a tiny option parser with
 * consistent errors, and the subcommand table.
 *
 * Exit codes, the same for every subcommand: 0 done; 1 (CLI_ERROR) a runtime error — a file
 * that is missing or malformed, a model that cannot load, a failed run; 2 (CLI_USAGE) a usage
 * error — an unknown option, a missing required option or argument, a bad option value or a
 * combination of options that cannot work. Runtime errors go through cli_fail, usage errors
 * through cli_usage (or cli_value / cli_int / cli_float, which print why; return CLI_USAGE). */
#ifndef MMC_CLI_H
#define MMC_CLI_H

#include "mmc.h"
#include <stdbool.h>
#include <stdio.h>

typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
    void (*help)(FILE *f);
} cli_cmd;

enum { CLI_OK = 0, CLI_ERROR = 1, CLI_USAGE = 2 };

/* Print "mmc: <msg>" (and mmc_last_error() if st != OK) to stderr; returns CLI_ERROR. */
int cli_fail(mmc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print "mmc <cmd>: <msg> (see mmc <cmd> --help)" to stderr; returns CLI_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Option value parsing with errors naming the option. */
bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out);
bool cli_float(const char *opt, const char *val, double lo, double hi, double *out);
/* argv[*i] is an option taking a value: return it and advance, or NULL with an error
 * (argv[0] names the subcommand). */
const char *cli_value(int argc, char **argv, int *i);
bool cli_is_help(const char *a);
/* argv[*i] is "--set key.path=value" or "--set=key.path=value" (train, launch): set *kv, advance
 * and return 1; another argument: 0; no value or no '=': print why and return -1. */
int cli_set_arg(int argc, char **argv, int *i, const char **kv);

/* Subcommands (tools/cmd_*.c). */
int cmd_info(int argc, char **argv);
void help_info(FILE *f);
int cmd_generate(int argc, char **argv);
void help_generate(FILE *f);
int cmd_chat(int argc, char **argv);
void help_chat(FILE *f);
int cmd_forward(int argc, char **argv);
void help_forward(FILE *f);
int cmd_merge(int argc, char **argv);
void help_merge(FILE *f);
int cmd_synth(int argc, char **argv);
void help_synth(FILE *f);
int cmd_eval(int argc, char **argv);
void help_eval(FILE *f);
int cmd_train(int argc, char **argv);
void help_train(FILE *f);
int cmd_launch(int argc, char **argv);
void help_launch(FILE *f);
int cmd_plan(int argc, char **argv);
void help_plan(FILE *f);
int cmd_export(int argc, char **argv);
void help_export(FILE *f);
int cmd_transcribe(int argc, char **argv);
void help_transcribe(FILE *f);
int cmd_image_demo(int argc, char **argv);
void help_image_demo(FILE *f);
int cmd_train_vae(int argc, char **argv);
void help_train_vae(FILE *f);
int cmd_generate_image(int argc, char **argv);
void help_generate_image(FILE *f);
int cmd_generate_video(int argc, char **argv);
void help_generate_video(FILE *f);
int cmd_serve(int argc, char **argv);
void help_serve(FILE *f);
int cmd_template(int argc, char **argv);
void help_template(FILE *f);
int cmd_embed(int argc, char **argv);
void help_embed(FILE *f);

/* --bf16-matmul (generate, chat, forward, serve, generate-image, generate-video): switch inference
 * GEMMs on bf16 weights to the bf16-product kernel (AMX or AVX512_BF16, gemm.c); a CPU with
 * neither keeps the exact path and is told so (runner.c). */
void cli_bf16_matmul(const char *cmd);
/* --matmul-precision highest|high|medium (generate, chat, forward, serve): MMC_MATMUL_PRECISION's
 * setting (gemm.h's mmc_gemm_set_matmul_precision); 0, or a usage error (CLI_USAGE) naming the option.
 * A CPU without AMX keeps f32 and is told so. Before the model loads: it decides the packed panels. */
int cli_matmul_precision(const char *cmd, const char *v);
#define CLI_MATMUL_PRECISION_HELP \
    "  --matmul-precision P     f32 GEMMs: highest (f32, default), high (bf16x3 on AMX: each operand\n" \
    "                           split into two bf16, three bf16 products summed in f32; ~1e-6 of\n" \
    "                           sum |a||b| measured, f32 ~2e-7; 2x f32 GEMM speed), medium (one bf16\n" \
    "                           product, as --bf16-matmul); same as MMC_MATMUL_PRECISION\n"
#define CLI_BF16_MATMUL_HELP \
    "  --bf16-matmul           GEMMs on bf16 weights multiply in bf16 (activations rounded to bf16,\n" \
    "                          f32 accumulation, as PyTorch's bf16 matmul): AMX tiles where the CPU\n" \
    "                          has them, else AVX512_BF16; several times faster on AMX CPUs, results\n" \
    "                          ~1e-3 relative off the exact default; same as MMC_GEMM_BF16=dot\n"

#endif
