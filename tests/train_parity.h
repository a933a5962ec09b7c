/* train_parity.h — the comparison shared by the training parity tests (test_train_parity.c,
 * test_llama_train_parity.c, test_moe_train_parity.c): `steps` trainer steps against a float64
 * reference fixture written by tools/ref (losses, lrs, grad_norms [steps] and "final.<HF name>" for the weights). Every step's
 * loss and grad norm within loss_rtol relative, the lr exactly (the same formula), and every
 * fixture weight matching a trainer parameter within weight_rtol normwise and 1e-2 x peak_lr on
 * one element; at least min_weights of them. Include after test_util.h. */
#ifndef MMC_TRAIN_PARITY_H
#define MMC_TRAIN_PARITY_H

#include "mmc_trainer.h"

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

static void train_parity_compare(mmc_trainer *t, const char *fx, const char *what, int steps, double loss_rtol,
                                 double weight_rtol, double peak_lr, int min_weights) {
    mmc_st *ref = fixture_open(fx);
    if (!ref) return;
    mmc_tensor *losses = fixture_tensor(ref, "losses", MMC_F64), *lrs = fixture_tensor(ref, "lrs", MMC_F64);
    mmc_tensor *norms = fixture_tensor(ref, "grad_norms", MMC_F64);
    double worst = 0, worst_norm = 0;
    for (int s = 0; s < steps; s++) {
        mmc_step_stats st;
        CHECK_OK(mmc_trainer_step(t, &st));
        double want = mmc_get_flat(losses, s), rel = fabs(st.loss - want) / fabs(want);
        worst = fmax(worst, rel);
        CHECKF(rel <= loss_rtol, "%s step %d loss %.9f vs float64 %.9f (%.2e rel)", what, s + 1, st.loss, want, rel);
        CHECK_NEAR(st.lr, mmc_get_flat(lrs, s), 1e-12);                                  /* same formula */
        double wn = mmc_get_flat(norms, s), reln = fabs(st.grad_norm - wn) / wn;
        worst_norm = fmax(worst_norm, reln);
        CHECKF(reln <= loss_rtol, "%s step %d grad norm %.9f vs %.9f (%.2e rel)", what, s + 1, st.grad_norm, wn, reln);
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
