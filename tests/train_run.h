/* train_run.h — for tests that drive `mmc train` through the library (mmc_run_config_load +
 * mmc_trainer_new + mmc_trainer_run, as tools/cmd_train.c does) and read what it logs: the run's
 * file descriptor fd (1: the contrastive trainer's stdout "step N loss X" lines; 2: the LM trainer's
 * stderr "step N/M loss X" lines) goes to the file log while it runs. */
#ifndef MMC_TEST_TRAIN_RUN_H
#define MMC_TEST_TRAIN_RUN_H

#include <stdio.h>
#include <unistd.h>

#include "mmc_config.h"
#include "mmc_trainer.h"

static inline mmc_status train_run(const char *yaml, const char *const *sets, int n_sets, int fd, const char *log) {
    mmc_run_config cfg;
    mmc_status st = mmc_run_config_load(yaml, sets, n_sets, &cfg);
    if (st) return st;
    mmc_trainer *t = NULL;
    fflush(stdout), fflush(stderr);
    const int saved = dup(fd);
    FILE *f = fopen(log, "w");
    if (!f || saved < 0) {
        if (f) fclose(f);
        if (saved >= 0) close(saved);
        mmc_run_config_free(&cfg);
        return mmc_error(MMC_ERR_IO, "cannot write %s", log);
    }
    dup2(fileno(f), fd);
    if (!(st = mmc_trainer_new(&cfg, false, &t))) st = mmc_trainer_run(t);
    fflush(stdout), fflush(stderr);
    dup2(saved, fd);
    close(saved);
    fclose(f);
    mmc_trainer_free(t);
    mmc_run_config_free(&cfg);
    return st;
}

#endif
