/* bench_vlm7b.h — what bench_llava.c and bench_internvl.c (7B-shaped VLMs at reduced depth)
 * share beside bench_util.h:
 *
 *   vlm7b_read_bw()      the host's DRAM read bandwidth on the bench's threads (bench_util.h's
 *                        bench_read_bw: several prefetched streams per thread over 512 MiB or
 *                        2 x L3, each thread timed on its own CPU clock): what bounds decode,
 *                        which reads every decoder weight and the lm_head once per token
 *   vlm7b_train_case()   one training step as mmc_trainer_step runs it (grads zeroed, the model's
 *                        causal-LM batch loss / label tokens, backward, clip_grad_norm_(1.0),
 *                        AdamW lr 1e-5 wd 0.01), timed over MMC_BENCH_VLM7B_TRAIN_STEPS (default
 *                        3) steps after one warm-up and reported as tokens/s (median), CPU
 *                        seconds per step (median; all threads of the process) and peak memory; the vision tower frozen (no tape through it), the projector and
 *                        language model trained ("full") or LoRA r=16 alpha 32 on the language
 *                        model's q/k/v/o/gate/up/down projections only ("lora"; PEFT's regex
 *                        target, the base frozen). Run in a forked child so that the peak is the
 *                        case's own.
 *   vlm7b_train_mode()   whether MMC_BENCH_VLM7B_TRAIN (a comma-separated subset of full,lora;
 *                        "none": no training cases; unset: the bench's default) names a mode.
 *   vlm7b_train_cases()  each mode that vlm7b_train_mode() names (full, then lora) run in a forked
 *                        child by the bench's own case function; vlm7b_model_free() its parameter
 *                        lists. */
#ifndef MMC_BENCH_VLM7B_H
#define MMC_BENCH_VLM7B_H

#include "bench_util.h"
#include "mmc_data.h"
#include "mmc_lora.h"
#include "mmc_train.h"

#include <omp.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double vlm7b_read_bw(void) { return bench_read_bw(); }

static bool vlm7b_train_mode(const char *mode, const char *dflt) {
    const char *s = getenv("MMC_BENCH_VLM7B_TRAIN");
    if (!s) s = dflt;
    const size_t len = strlen(mode);
    for (const char *p = s; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        size_t k = strcspn(p, ",");
        if (k == len && !strncmp(p, mode, len)) return true;
    }
    return false;
}

/* One greedy decode step after the prefill in kv: the logits [1, 1, V] of the one-token ids (the model's
 * forward with the cache, then its lm_head); NULL on error. */
typedef mmc_tensor *(*vlm7b_step_fn)(mmc_ctx *ctx, void *model, mmc_kv_cache *kv, mmc_tensor *ids);

/* The median seconds of 32 greedy decode steps (each: reset ctx, one token through step, argmax over
 * vocab), starting from token 42 after the prefill already in kv. */
static double vlm7b_decode_s(mmc_ctx *ctx, void *model, mmc_kv_cache *kv, vlm7b_step_fn step, int64_t vocab) {
    double times[32];
    int32_t tok = 42;
    for (int s = 0; s < 32; s++) {
        double t0 = mmc_now();
        mmc_ctx_reset(ctx);
        mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, 1));   /* [1, 1] */
        ((int32_t *)ids->data)[0] = tok;
        mmc_tensor *lt = step(ctx, model, kv, ids);
        if (!lt) { fprintf(stderr, "bench: decode step: %s\n", mmc_last_error()); exit(1); }
        const float *l = lt->data;
        int32_t best = 0;
        for (int64_t v = 1; v < vocab; v++) if (l[v] > l[best]) best = (int32_t)v;
        tok = best;
        times[s] = mmc_now() - t0;
    }
    qsort(times, 32, sizeof times[0], bench_cmp_);
    return times[16];
}

/* CPU seconds of this process, all threads (robust where other processes share the cores) */
static double vlm7b_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef mmc_status (*vlm7b_loss_fn)(mmc_ctx *ctx, void *model, const mmc_batch *b, double scale, mmc_tensor **loss,
                                    int64_t *n_scored);

typedef struct {
    void *model;
    vlm7b_loss_fn loss;
    mmc_tensor **params;          /* every parameter, save_pretrained's names */
    char **names;
    int n;
    const char *tower_prefix;     /* parameters frozen in both modes ("vision_tower.") */
    mmc_module_list *linears;     /* the LoRA candidates, PEFT's module names */
} vlm7b_model;

/* Runs in the calling process (fork first): one warm-up, then the timed steps. */
static void vlm7b_train_case(vlm7b_model *vm, bool lora, const mmc_batch *b, const char *prefix, double base) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_lora_set *ls = NULL;
    if (lora) {
        static const char *const tg[] = {"re:.*language_model.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"};
        mmc_lora_config lc = {.r = 16, .alpha = 32, .dropout = 0, .targets = tg, .n_targets = 1, .seed = 1};
        if (mmc_lora_attach(vm->linears, &lc, &ls)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    }
    const size_t tl = strlen(vm->tower_prefix);
    mmc_tensor **opt = calloc((size_t)(vm->n + (ls ? ls->n_params : 0)), sizeof *opt);
    int n_opt = 0;
    int64_t n_train = 0;
    for (int i = 0; i < vm->n; i++) {
        mmc_tensor *p = vm->params[i];
        if (lora || !strncmp(vm->names[i], vm->tower_prefix, tl)) { p->flags &= ~(uint32_t)MMC_REQUIRES_GRAD; continue; }
        p->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        opt[n_opt++] = p;
    }
    for (int i = 0; ls && i < ls->n_params; i++) {
        ls->params[i]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        opt[n_opt++] = ls->params[i];
    }
    for (int i = 0; i < n_opt; i++) n_train += mmc_numel(opt[i]);
    mmc_adamw_opts ao;
    mmc_adamw_defaults(&ao);
    ao.lr = 1e-5, ao.weight_decay = 0.01;
    mmc_adamw adamw;
    if (mmc_adamw_init(&adamw, &ao, opt, n_opt)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    const double scale = 1.0 / (double)(b->n_label_tokens > 0 ? b->n_label_tokens : 1);
    int steps = getenv("MMC_BENCH_VLM7B_TRAIN_STEPS") ? atoi(getenv("MMC_BENCH_VLM7B_TRAIN_STEPS")) : 3;
    if (steps < 1) steps = 1;
    if (steps > 32) steps = 32;
    double ts[33], cs[33];
    float first = 0, last = 0;
    for (int s = 0; s <= steps; s++) {
        double t0 = mmc_now(), c0 = vlm7b_cpu_s();
        for (int i = 0; i < n_opt; i++)
            if (!opt[i]->grad) mmc_grad(ctx, opt[i]);
        mmc_zero_grad(opt, n_opt);
        mmc_set_grad_enabled(ctx, true);
        mmc_tensor *l = NULL;
        int64_t n = 0;
        if (vm->loss(ctx, vm->model, b, scale, &l, &n)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
        last = *(const float *)l->data;
        if (s == 0) first = last;
        mmc_backward(ctx, l);
        mmc_ctx_reset(ctx);
        mmc_clip_grad_norm(opt, n_opt, 1.0);
        mmc_adamw_step(&adamw, 1e-5);
        if (s > 0) ts[s - 1] = mmc_now() - t0, cs[s - 1] = vlm7b_cpu_s() - c0;
    }
    qsort(ts, (size_t)steps, sizeof ts[0], bench_cmp_);
    qsort(cs, (size_t)steps, sizeof cs[0], bench_cmp_);
    char name[192];
    const char *tag = lora ? "lora" : "full";
    snprintf(name, sizeof name, "%s_%s_tokens_per_s", prefix, tag);
    bench_report(name, (double)(b->B * b->T) / ts[steps / 2], "tokens/s", 1);
    snprintf(name, sizeof name, "%s_%s_cpu_s_per_step", prefix, tag);
    bench_report(name, cs[steps / 2], "CPU s", 0);
    snprintf(name, sizeof name, "%s_%s_peak_mem_MiB", prefix, tag);
    bench_report(name, bench_peak_rss_mib() - base, "MiB", 0);
    fprintf(stderr, "%s %s: %.2f s/step (median of %d), %.1fM trained parameters, loss %.4f -> %.4f\n", prefix, tag,
            ts[steps / 2], steps, (double)n_train / 1e6, first, last);
    mmc_adamw_free(&adamw);
    free(opt);
    mmc_lora_free(ls);
    mmc_ctx_free(ctx);
}
/* The parameter lists and LoRA candidates a vlm7b_model holds (not the model itself). */
static void vlm7b_model_free(vlm7b_model *vm) {
    mmc_module_list_free(vm->linears);
    for (int i = 0; i < vm->n; i++) free(vm->names[i]);
    free(vm->names);
    free(vm->params);
}

/* full (lora = 0) and LoRA (1) training cases, each in a forked child so that its peak is its own */
static void vlm7b_train_cases(const char *bench, const char *dflt, void (*train_case)(bool lora)) {
    for (int lora = 0; lora < 2; lora++) {
        if (!vlm7b_train_mode(lora ? "lora" : "full", dflt)) continue;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) { train_case(lora); fflush(stdout); _exit(0); }
        int status;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status))
            fprintf(stderr, "%s: training case %s failed\n", bench, lora ? "lora" : "full");
    }
}
#endif
