/* model_weights.c — see model_weights.h. */
#include "model_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

mmc_status mw_init_random(mw_set *w, uint64_t seed, mw_init kind) {
    memset(w, 0, sizeof *w);
    w->errcap = 16384;
    w->errs = calloc(1, w->errcap);
    if (!w->errs) return mmc_error(MMC_ERR_OOM, "out of memory");
    w->random = kind;
    mmc_rng_init(&w->rng, seed);
    return MMC_OK;
}

static mmc_status bind_random(mw_set *w, const char *full, const char *name, int ndim, const int64_t *shape,
                              mmc_tensor **slot) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, ndim, shape);
    if (!t) return mmc_error(MMC_ERR_OOM, "out of memory for %s", full);
    const char *base = strrchr(name, '.');
    const bool bias = base && !strcmp(base, ".bias");
    const bool norm = !bias && (strstr(name, "norm") || strstr(name, "layrnorm"));
    float *d = t->data;
    const int64_t n = mmc_numel(t);
    if (norm) {
        for (int64_t i = 0; i < n; i++) d[i] = 1.0f;
    } else if (w->random == MW_INIT_HF_NORMAL) {
        if (bias) memset(d, 0, (size_t)n * sizeof(float));
        else mmc_rng_normal(&w->rng, d, n, 0.0f, 0.02f);
    } else {   /* torch's nn.Linear: fan_in of a matrix is its columns, of a bias its layer's input */
        const int64_t fan_in = ndim >= 2 ? n / shape[0] : w->init_fan_in;
        const float b = 1.0f / sqrtf((float)(fan_in > 0 ? fan_in : 1));
        mmc_rng_uniform(&w->rng, d, n, -b, b);
    }
    if (w->trainable) t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, full);
    *slot = t;
    return MMC_OK;
}

mmc_status mw_open(const char *dir, const char *stem, mw_set *w) {
    memset(w, 0, sizeof *w);
    w->errcap = 16384;
    w->errs = calloc(1, w->errcap);
    if (!w->errs) return mmc_error(MMC_ERR_OOM, "out of memory");
    char p[1024];
    snprintf(p, sizeof p, "%s/%s.safetensors", dir, stem);
    FILE *f = fopen(p, "rb");
    if (!f) snprintf(p, sizeof p, "%s/%s.safetensors.index.json", dir, stem), f = fopen(p, "rb");
    if (!f)
        return mmc_error(MMC_ERR_NOT_FOUND, "%s: no %s.safetensors or %s.safetensors.index.json (a component "
                         "folder as save_pretrained writes it)", dir, stem, stem);
    fclose(f);
    return mmc_st_open(p, &w->st);
}

mmc_status mw_adopt(mmc_st *st, mw_set *w) {
    memset(w, 0, sizeof *w);
    w->st = st;    /* closed by mw_close, also on failure here */
    w->errcap = 16384;
    w->errs = calloc(1, w->errcap);
    return w->errs ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
}

void mw_bind(mw_set *w, const char *prefix, const char *name, mmc_tensor **slot, int ndim, const int64_t *shape) {
    char full[256], dummy[512] = "";
    snprintf(full, sizeof full, "%s%s", prefix, name);
    bool listed = w->bad < MW_MAX_LISTED;
    if (w->random) {
        if (bind_random(w, full, name, ndim, shape, slot) != MMC_OK) { w->bad++; return; }
    } else if (mmc_model_bind(w->st, full, ndim, shape, w->trainable, slot, listed ? w->errs : dummy,
                              listed ? w->errcap : sizeof dummy) != MMC_OK) {
        w->bad++;
        return;
    }
    if (w->n_params == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        mmc_tensor **p = realloc(w->params, (size_t)cap * sizeof *p);
        if (p) w->params = p;
        char (*nm)[256] = realloc(w->names, (size_t)cap * sizeof *nm);
        if (nm) w->names = nm;
        if (!p || !nm) { mmc_tensor_free(*slot); *slot = NULL; w->bad++; return; }
        w->cap = cap;
    }
    snprintf(w->names[w->n_params], sizeof w->names[0], "%s", full);
    w->params[w->n_params++] = *slot;
}

void mw_bind_wb(mw_set *w, const char *prefix, const char *name, mmc_tensor **weight, mmc_tensor **bias, int ndim,
                const int64_t *shape) {
    char nm[160];
    snprintf(nm, sizeof nm, "%s.weight", name);
    mw_bind(w, prefix, nm, weight, ndim, shape);
    snprintf(nm, sizeof nm, "%s.bias", name);
    mw_bind(w, prefix, nm, bias, 1, shape);
}

void mw_bind_linear(mw_set *w, const char *prefix, const char *name, mmc_linear_w *l, int64_t N, int64_t K, bool bias) {
    memset(l, 0, sizeof *l);
    l->out_features = N, l->in_features = K;
    char nm[160];
    snprintf(nm, sizeof nm, "%s.weight", name);
    mw_bind(w, prefix, nm, &l->w, 2, MMC_SHAPE(N, K));
    if (!bias) return;
    snprintf(nm, sizeof nm, "%s.bias", name);
    w->init_fan_in = K;
    mw_bind(w, prefix, nm, &l->b, 1, MMC_SHAPE(N));
    w->init_fan_in = 0;
}

mmc_status mw_status(const mw_set *w, const char *dir, const char *cls) {
    if (!w->bad) return MMC_OK;
    char more[64] = "";
    if (w->bad > MW_MAX_LISTED) snprintf(more, sizeof more, "\n  ... and %d more", w->bad - MW_MAX_LISTED);
    return mmc_error(MMC_ERR_FORMAT, "%s: %s weights: %d problem%s:%s%s\n  (does config.json match the checkpoint?)",
                     dir, cls, w->bad, w->bad > 1 ? "s" : "", w->errs, more);
}

mmc_status mw_check_unused(const mw_set *w, const char *dir, const char *cls) {
    if (!w->st || mmc_st_count(w->st) == w->n_params) return MMC_OK;
    for (int i = 0; i < mmc_st_count(w->st); i++) {
        const char *nm = mmc_st_at(w->st, i)->name;
        bool used = false;
        for (int k = 0; k < w->n_params && !used; k++) used = !strcmp(w->names[k], nm);
        if (!used)
            return mmc_error(MMC_ERR_FORMAT, "%s: tensor '%s' (and %d more unused) does not belong to the %s that "
                             "config.json describes", dir, nm, mmc_st_count(w->st) - w->n_params - 1, cls);
    }
    return MMC_OK;
}

void mw_close(mw_set *w) {
    for (int i = 0; i < w->n_params; i++) mmc_tensor_free(w->params[i]);
    free(w->params);
    free(w->names);
    free(w->errs);
    if (w->st) mmc_st_close(w->st);
    memset(w, 0, sizeof *w);
}

int64_t mw_count(const mw_set *w) {
    int64_t n = 0;
    for (int i = 0; i < w->n_params; i++) n += mmc_numel(w->params[i]);
    return n;
}

void mw_keep_n(mmc_ctx *ctx, mmc_arena_mark m, int n, mmc_tensor **ys) {
    for (int i = 0; i < n; i++)
        if (mmc_requires_grad(ys[i])) return;          /* the tape still needs what they came from */
    mmc_arena_mark sm = mmc_scratch_mark(ctx);
    void *tmp[8];
    mmc_tensor saved[8];
    MMC_ASSERT(n <= 8);
    for (int i = 0; i < n; i++) {
        saved[i] = *ys[i];
        tmp[i] = mmc_scratch_alloc(ctx, mmc_nbytes(ys[i]));
        if (mmc_is_contiguous(ys[i])) {
            memcpy(tmp[i], ys[i]->data, mmc_nbytes(ys[i]));
        } else {   /* a view: copy out in order through a contiguous temporary of the scratch */
            mmc_tensor *c = mmc_contiguous(ctx, ys[i]);
            memcpy(tmp[i], c->data, mmc_nbytes(c));
        }
    }
    mmc_arena_release(mmc_ctx_arena(ctx), m);
    for (int i = 0; i < n; i++) {
        ys[i] = mmc_new(ctx, saved[i].dtype, saved[i].ndim, saved[i].shape);
        memcpy(ys[i]->data, tmp[i], mmc_nbytes(ys[i]));
    }
    mmc_scratch_release(ctx, sm);
}

mmc_tensor *mw_keep(mmc_ctx *ctx, mmc_arena_mark m, mmc_tensor *y) {
    if (mmc_requires_grad(y) || !mmc_is_contiguous(y) || !(y->flags & MMC_IN_ARENA)) {
        mw_keep_n(ctx, m, 1, &y);
        return y;
    }
    /* One contiguous output: moved down in place instead of through a scratch copy (at 1024² a VAE
     * activation is 512 MiB). The arena keeps released chunks and never moves them, and the new
     * tensor's pieces land at or below the old ones: its header at the mark (or at the start of a
     * later chunk, where it may cover the first bytes of the old data: those are saved first), its
     * data after it, so memmove (overlap-safe) carries the rest. */
    enum { HEAD = 4096 };
    const mmc_tensor saved = *y;
    const size_t bytes = mmc_nbytes(y), head = bytes < HEAD ? bytes : HEAD;
    unsigned char first[HEAD];
    memcpy(first, y->data, head);
    const unsigned char *old = y->data;
    mmc_arena_release(mmc_ctx_arena(ctx), m);
    mmc_tensor *t = mmc_new(ctx, saved.dtype, saved.ndim, saved.shape);
    if (bytes > head) memmove((unsigned char *)t->data + head, old + head, bytes - head);
    memcpy(t->data, first, head);
    return t;
}
