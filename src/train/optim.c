/* optim.c — AdamW (torch.optim.AdamW semantics), global gradient-norm clipping
 * (torch.nn.utils.clip_grad_norm_), and warmup + constant/linear/cosine schedules
 * (transformers.get_{constant,linear,cosine}_schedule_with_warmup). */
#include "mmc_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mmc_adamw_defaults(mmc_adamw_opts *o) {
    o->lr = 1e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 0.01;
}

mmc_status mmc_adamw_init(mmc_adamw *a, const mmc_adamw_opts *o, mmc_tensor **params, int n) {
    memset(a, 0, sizeof *a);
    a->o = *o;
    a->params = calloc((size_t)n, sizeof *a->params);
    a->m = calloc((size_t)n, sizeof *a->m);
    a->v = calloc((size_t)n, sizeof *a->v);
    a->decay = calloc((size_t)n, sizeof *a->decay);
    if (!a->params || !a->m || !a->v || !a->decay) goto oom;
    for (int i = 0; i < n; i++) {
        mmc_tensor *p = params[i];
        if (!(p->flags & MMC_REQUIRES_GRAD)) continue;
        MMC_CHECK(p->dtype == MMC_F32 && mmc_is_contiguous(p), "AdamW: parameter %s must be contiguous f32",
                  p->name);
        size_t bytes = (size_t)mmc_numel(p) * sizeof(float), cap = (bytes + 63) / 64 * 64;
        a->m[a->n] = aligned_alloc(64, cap ? cap : 64);
        a->v[a->n] = aligned_alloc(64, cap ? cap : 64);
        if (!a->m[a->n] || !a->v[a->n]) { a->n++; goto oom; }
        memset(a->m[a->n], 0, bytes);
        memset(a->v[a->n], 0, bytes);
        a->decay[a->n] = p->ndim >= 2;
        a->params[a->n++] = p;
    }
    return MMC_OK;
oom:
    mmc_adamw_free(a);
    return mmc_error(MMC_ERR_OOM, "out of memory allocating AdamW state");
}

void mmc_adamw_free(mmc_adamw *a) {
    for (int i = 0; i < a->n; i++) { free(a->m[i]); free(a->v[i]); }
    free(a->params);
    free(a->m);
    free(a->v);
    free(a->decay);
    memset(a, 0, sizeof *a);
}

void mmc_adamw_step(mmc_adamw *a, double lr) {
    a->step++;
    const double b1 = a->o.beta1, b2 = a->o.beta2;
    const double bc1 = 1.0 - pow(b1, (double)a->step), bc2 = 1.0 - pow(b2, (double)a->step);
    const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float eps = (float)a->o.eps, fb1 = (float)b1, fb2 = (float)b2;
    for (int i = 0; i < a->n; i++) {
        mmc_tensor *p = a->params[i];
        if (!p->grad) continue;
        float *w = p->data, *g = p->grad->data, *m = a->m[i], *v = a->v[i];
        const float decay = a->decay[i] ? (float)(1.0 - lr * a->o.weight_decay) : 1.0f;
        int64_t n = mmc_numel(p);
        #pragma omp parallel for simd schedule(static) if (n > 32768)
        for (int64_t k = 0; k < n; k++) {
            float gk = g[k];
            w[k] *= decay;
            m[k] = fb1 * m[k] + (1.0f - fb1) * gk;
            v[k] = fb2 * v[k] + (1.0f - fb2) * gk * gk;
            w[k] -= step_size * m[k] / (sqrtf(v[k]) * inv_sqrt_bc2 + eps);
        }
    }
}

double mmc_clip_grad_norm(mmc_tensor **params, int n, double max_norm) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (!params[i]->grad) continue;
        const float *g = params[i]->grad->data;
        int64_t len = mmc_numel(params[i]);
        double s = 0;
        for (int64_t k = 0; k < len; k++) s += (double)g[k] * g[k];   /* fixed order: deterministic */
        total += s;
    }
    double norm = sqrt(total);
    if (max_norm > 0 && norm > max_norm) {
        float coef = (float)(max_norm / (norm + 1e-6));
        for (int i = 0; i < n; i++) {
            if (!params[i]->grad) continue;
            float *g = params[i]->grad->data;
            int64_t len = mmc_numel(params[i]);
            for (int64_t k = 0; k < len; k++) g[k] *= coef;
        }
    }
    return norm;
}

double mmc_schedule_lr(const mmc_schedule *s, int64_t step) {
    if (step < s->warmup_steps)
        return s->lr * (double)step / (double)(s->warmup_steps > 0 ? s->warmup_steps : 1);
    if (s->kind == MMC_SCHED_CONSTANT) return s->lr;
    int64_t span = s->total_steps - s->warmup_steps;
    double prog = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
    if (prog > 1) prog = 1;
    double f = s->kind == MMC_SCHED_LINEAR ? 1.0 - prog : 0.5 * (1.0 + cos(M_PI * prog));
    return s->min_lr + (s->lr - s->min_lr) * f;
}
