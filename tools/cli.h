/* cli.h — shared helpers of the mmc command-line tool: a tiny option parser with
 * consistent errors, and the subcommand table. */
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

/* Print "mmc: <msg>" (and mmc_last_error() if st != OK) to stderr; returns exit code 1. */
int cli_fail(mmc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Option value parsing with errors naming the option. */
bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out);
bool cli_float(const char *opt, const char *val, double lo, double hi, double *out);
/* argv[*i] is an option taking a value: return it and advance, or NULL with an error. */
const char *cli_value(int argc, char **argv, int *i);
bool cli_is_help(const char *a);

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
int cmd_export(int argc, char **argv);
void help_export(FILE *f);
int cmd_template(int argc, char **argv);
void help_template(FILE *f);

#endif
