/* tensor.c — tensor metadata helpers, persistent tensors, and activation tensors
 * allocated in a context's arena. */
#include "mmc.h"
#include "ctx_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double mmc_load_f64_(const void *p, mmc_dtype dt, int64_t i);
void mmc_store_f64_(void *p, mmc_dtype dt, int64_t i, double v);

int64_t mmc_numel(const mmc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t mmc_nbytes(const mmc_tensor *t) {
    if (t->dtype == MMC_NF4) return (size_t)(mmc_numel(t) + 1) / 2;
    return (size_t)mmc_numel(t) * mmc_dtype_size(t->dtype);
}

void mmc_set_contiguous_strides(mmc_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) { t->stride[i] = s; s *= t->shape[i]; }
}

bool mmc_is_contiguous(const mmc_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool mmc_same_shape(const mmc_tensor *a, const mmc_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *mmc_shape_str(const mmc_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

static void init_meta(mmc_tensor *t, mmc_dtype dt, int ndim, const int64_t *shape) {
    MMC_CHECK(ndim >= 0 && ndim <= MMC_MAX_DIMS, "tensor rank %d not in [0, %d]", ndim, MMC_MAX_DIMS);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        MMC_CHECK(shape[i] >= 0, "negative dimension %lld", (long long)shape[i]);
        t->shape[i] = shape[i];
    }
    mmc_set_contiguous_strides(t);
}

mmc_tensor *mmc_tensor_new(mmc_dtype dt, int ndim, const int64_t *shape) {
    mmc_tensor *t = malloc(sizeof *t);
    if (!t) { mmc_error(MMC_ERR_OOM, "out of memory allocating a tensor"); return NULL; }
    init_meta(t, dt, ndim, shape);
    size_t nb = mmc_nbytes(t), cap = (nb + 63) / 64 * 64;
    t->data = aligned_alloc(64, cap ? cap : 64);
    if (!t->data) {
        free(t);
        mmc_error(MMC_ERR_OOM, "out of memory allocating %zu bytes for a tensor", nb);
        return NULL;
    }
    memset(t->data, 0, cap ? cap : 64);
    t->flags = MMC_OWNS_DATA;
    return t;
}

mmc_tensor *mmc_tensor_wrap(mmc_dtype dt, int ndim, const int64_t *shape, void *data) {
    mmc_tensor *t = malloc(sizeof *t);
    if (!t) { mmc_error(MMC_ERR_OOM, "out of memory allocating a tensor"); return NULL; }
    init_meta(t, dt, ndim, shape);
    t->data = data;
    return t;
}

void mmc_tensor_free(mmc_tensor *t) {
    if (!t) return;
    MMC_CHECK(!(t->flags & MMC_IN_ARENA), "mmc_tensor_free on an arena tensor");
    if (t->grad && !(t->grad->flags & MMC_IN_ARENA)) mmc_tensor_free(t->grad);
    if (t->flags & MMC_OWNS_DATA) free(t->data);
    free(t);
}

static int64_t flat_offset(const mmc_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t idx = i % t->shape[d];
        i /= t->shape[d];
        off += idx * t->stride[d];
    }
    return off;
}

double mmc_get_flat(const mmc_tensor *t, int64_t i) {
    return mmc_load_f64_(t->data, t->dtype, flat_offset(t, i));
}
void mmc_set_flat(mmc_tensor *t, int64_t i, double v) {
    mmc_store_f64_(t->data, t->dtype, flat_offset(t, i), v);
}

/* ---- activation tensors */
mmc_tensor *mmc_new(mmc_ctx *ctx, mmc_dtype dt, int ndim, const int64_t *shape) {
    mmc_tensor *t = mmc_arena_alloc(ctx->act, sizeof *t);
    init_meta(t, dt, ndim, shape);
    t->data = mmc_arena_alloc(ctx->act, mmc_nbytes(t));
    t->flags = MMC_IN_ARENA;
    return t;
}

mmc_tensor *mmc_zeros(mmc_ctx *ctx, mmc_dtype dt, int ndim, const int64_t *shape) {
    mmc_tensor *t = mmc_new(ctx, dt, ndim, shape);
    memset(t->data, 0, mmc_nbytes(t));
    return t;
}

mmc_tensor *mmc_new_like(mmc_ctx *ctx, const mmc_tensor *t) {
    return mmc_new(ctx, t->dtype, t->ndim, t->shape);
}

mmc_tensor *mmc_scalar(mmc_ctx *ctx, float v) {
    mmc_tensor *t = mmc_new(ctx, MMC_F32, 0, NULL);
    *(float *)t->data = v;
    return t;
}

mmc_tensor *mmc_alias(mmc_ctx *ctx, const mmc_tensor *t) {
    mmc_tensor *a = mmc_arena_alloc(ctx->act, sizeof *a);
    *a = *t;
    a->grad = NULL;
    a->flags = MMC_IN_ARENA;
    return a;
}
