/* run_dir.h — reading what an `mmc train` run left in its output folder, for the multi-rank
 * comparers (tp_worker's compare mode, test_pp_schedule's): the losses of metrics.jsonl in order,
 * and the path of the newest checkpoint-N. */
#ifndef MMC_TEST_RUN_DIR_H
#define MMC_TEST_RUN_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* up to cap "loss" values of dir/metrics.jsonl; -1 when the file cannot be opened */
static int read_losses(const char *dir, double *l, int cap) {
    char path[2048], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *p = strstr(line, "\"loss\": ");
        if (p) l[n++] = atof(p + 8);
    }
    fclose(f);
    return n;
}

/* dir/checkpoint-N with the largest N (checkpoint--1 when there is none) */
static void last_ckpt(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    long best = -1;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "checkpoint-", 11) && atol(e->d_name + 11) > best) best = atol(e->d_name + 11);
    if (d) closedir(d);
    snprintf(out, cap, "%s/checkpoint-%ld", dir, best);
}

#endif
