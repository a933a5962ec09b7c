/* train_parity.h — what the trainer parity tests share (test_train_parity.c: Qwen2 / Qwen2-VL /
 * Qwen2.5-VL; test_llama_train_parity.c: Llama / Mistral): 20 steps of a trainer against a float64
 * reference written by tools/ref (gen_train.py, gen_llama_train.py: transformers + torch.optim.AdamW),
 * every step's loss, grad norm and lr, and the final weights. Each test states its own weight
 * tolerance and why (the loss and grad-norm bound is the same for all). */
#ifndef MMC_TEST_TRAIN_PARITY_H
#define MMC_TEST_TRAIN_PARITY_H
#include "test_util.h"
#include "mmc_trainer.h"

#define TRAIN_LOSS_RTOL 1e-5

/* ||a - b||_2 / ||b||_2 over all elements */
static double rel_l2(const mmc_tensor *a, const mmc_tensor *b) {
    double d = 0, n = 0;
    for (int64_t i = 0; i < mmc_numel(b); i++) {
        double x = mmc_get_flat(a, i), y = mmc_get_flat(b, i);
        d += (x - y) * (x - y);
        n += y * y;
    }
    return n > 0 ? sqrt(d / n) : sqrt(d);
}

/* 20 trainer steps of `t` against the reference `fx` (losses, lrs, grad_norms, final.*): every step's
 * loss and grad norm within TRAIN_LOSS_RTOL relative, the lr exactly, every fixture weight that
 * matches a trainer parameter within weight_rtol normwise and 1e-2 x peak_lr on its worst element,
 * and at least min_weights of them exist. */
static void compare_run(mmc_trainer *t, const char *fx, const char *what, double peak_lr, int min_weights,
                        double weight_rtol) {
    mmc_st *ref = fixture_open(fx);
    if (!ref) return;
    mmc_tensor *losses = fixture_tensor(ref, "losses", MMC_F64), *lrs = fixture_tensor(ref, "lrs", MMC_F64);
    mmc_tensor *norms = fixture_tensor(ref, "grad_norms", MMC_F64);
    double worst = 0, worst_norm = 0;
    for (int s = 0; s < 20; s++) {
        mmc_step_stats st;
        CHECK_OK(mmc_trainer_step(t, &st));
        double want = mmc_get_flat(losses, s), rel = fabs(st.loss - want) / fabs(want);
        worst = fmax(worst, rel);
        CHECKF(rel <= TRAIN_LOSS_RTOL, "%s step %d loss %.9f vs float64 %.9f (%.2e rel)", what, s + 1, st.loss, want, rel);
        CHECK_NEAR(st.lr, mmc_get_flat(lrs, s), 1e-12);                                  /* same formula */
        double wn = mmc_get_flat(norms, s), reln = fabs(st.grad_norm - wn) / wn;
        worst_norm = fmax(worst_norm, reln);
        CHECKF(reln <= TRAIN_LOSS_RTOL, "%s step %d grad norm %.9f vs %.9f (%.2e rel)", what, s + 1, st.grad_norm, wn, reln);
    }
    mmc_tensor **params;
    const char **names;
    int n = mmc_trainer_params(t, &params, &names), compared = 0;
    double wrel = 0, wmax = 0;
    for (int i = 0; i < n; i++) {
        char key[200];
        snprintf(key, sizeof key, "final.%s", names[i]);
        if (!mmc_st_find(ref, key)) continue;   /* the VL fixtures keep a subset */
        mmc_tensor *w = fixture_tensor(ref, key, MMC_F32);
        double r = rel_l2(params[i], w), d = max_abs_diff(params[i], w);
        wrel = fmax(wrel, r);
        wmax = fmax(wmax, d);
        compared++;
        CHECKF(r <= weight_rtol, "%s: %s differs by %.3g normwise", what, names[i], r);
        CHECKF(d <= 1e-2 * peak_lr, "%s: %s differs by %.3g on one element", what, names[i], d);
        mmc_tensor_free(w);
    }
    CHECKF(compared >= min_weights, "%s: only %d of the fixture's final weights matched a trainer name", what, compared);
    printf("%s: worst loss rel diff %.2e, grad norm %.2e; final weights normwise %.2e, max-abs %.2e "
           "over %d tensors\n", what, worst, worst_norm, wrel, wmax, compared);
    mmc_tensor_free(losses);
    mmc_tensor_free(lrs);
    mmc_tensor_free(norms);
    mmc_st_close(ref);
}

#endif
