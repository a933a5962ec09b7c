/* test_optim.c — AdamW, gradient clipping and LR schedules against torch.optim.AdamW,
 * clip_grad_norm_ and transformers' schedules (tools/ref/gen_optim.py). */
#include "test_util.h"
#include "mmc_train.h"

int main(void) {
    mmc_st *st = fixture_open("optim/adamw.safetensors");
    if (!st) return test_done("test_optim");
    mmc_tensor *w = fixture_tensor(st, "w0", MMC_F32), *b = fixture_tensor(st, "b0", MMC_F32);
    mmc_tensor *gw = fixture_tensor(st, "grads_w", MMC_F32), *gb = fixture_tensor(st, "grads_b", MMC_F32);
    mmc_tensor *lrs = fixture_tensor(st, "lrs", MMC_F64), *norms = fixture_tensor(st, "norms", MMC_F64);
    mmc_tensor *ws = fixture_tensor(st, "w_steps", MMC_F32), *bs = fixture_tensor(st, "b_steps", MMC_F32);
    w->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    b->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    w->grad = mmc_tensor_new(MMC_F32, w->ndim, w->shape);
    b->grad = mmc_tensor_new(MMC_F32, b->ndim, b->shape);
    mmc_tensor *params[2] = {w, b};
    mmc_adamw_opts o = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    mmc_adamw opt;
    CHECK_OK(mmc_adamw_init(&opt, &o, params, 2));
    mmc_schedule sch = {.kind = MMC_SCHED_COSINE, .lr = 1e-2, .min_lr = 0, .warmup_steps = 3, .total_steps = 8};
    int64_t steps = gw->shape[0], nw = mmc_numel(w), nb = mmc_numel(b);
    for (int64_t s = 0; s < steps; s++) {
        memcpy(w->grad->data, (float *)gw->data + s * nw, (size_t)nw * 4);
        memcpy(b->grad->data, (float *)gb->data + s * nb, (size_t)nb * 4);
        double lr = mmc_schedule_lr(&sch, s);
        CHECK_NEAR(lr, ((double *)lrs->data)[s], 1e-12);              /* schedule: exact */
        double norm = mmc_clip_grad_norm(params, 2, 5.0);
        CHECK_NEAR(norm, ((double *)norms->data)[s], 1e-5);            /* norm: f32 grads */
        mmc_adamw_step(&opt, lr);
        double dw = 0, db = 0;
        for (int64_t k = 0; k < nw; k++) dw = fmax(dw, fabs(((float *)w->data)[k] - ((float *)ws->data)[s * nw + k]));
        for (int64_t k = 0; k < nb; k++) db = fmax(db, fabs(((float *)b->data)[k] - ((float *)bs->data)[s * nb + k]));
        CHECKF(dw < 1e-6 && db < 1e-6, "step %lld: weights vs torch max-abs %.3g / %.3g (tol 1e-6)",
               (long long)s, dw, db);
    }
    mmc_tensor *lin = fixture_tensor(st, "linear_lrs", MMC_F64);
    mmc_schedule ls = {.kind = MMC_SCHED_LINEAR, .lr = 2.0, .warmup_steps = 2, .total_steps = 10};
    for (int64_t s = 0; s < mmc_numel(lin); s++) CHECK_NEAR(mmc_schedule_lr(&ls, s), ((double *)lin->data)[s], 1e-12);
    /* frozen parameters take no optimizer state */
    b->flags &= ~MMC_REQUIRES_GRAD;
    mmc_adamw opt2;
    CHECK_OK(mmc_adamw_init(&opt2, &o, params, 2));
    CHECK(opt2.n == 1);
    mmc_adamw_free(&opt2);
    mmc_adamw_free(&opt);
    mmc_tensor *all[] = {w, b, gw, gb, lrs, norms, ws, bs, lin};
    for (int i = 0; i < 9; i++) mmc_tensor_free(all[i]);
    mmc_st_close(st);
    return test_done("test_optim");
}
