/* norm.c — normalisation ops: mmc_rmsnorm (transformers' Qwen2RMSNorm), mmc_layernorm
 * (torch.nn.LayerNorm over the last dim) and mmc_groupnorm (torch.nn.GroupNorm). The
 * forward saves the per-row (per-group) mean / rstd; the backward is one fused kernel for
 * dx, dw and db (src/backend/cpu/norm.c). */
#include "mmc_ops.h"
#include "norm.h"

static int64_t rows_of(const mmc_tensor *x) {
    int64_t r = 1;
    for (int d = 0; d < x->ndim - 1; d++) r *= x->shape[d];
    return r;
}

static void check_x(const char *op, const mmc_tensor *x) {
    char s[64];
    MMC_CHECK(x && x->dtype == MMC_F32 && x->ndim >= 1 && mmc_is_contiguous(x),
              "%s: x must be contiguous f32, got %s %s", op, x ? mmc_dtype_name(x->dtype) : "NULL",
              x ? mmc_shape_str(x, s, sizeof s) : "");
}
static void check_vec(const char *op, const char *what, const mmc_tensor *v, int64_t C) {
    char s[64];
    if (!v) return;
    MMC_CHECK(v->dtype == MMC_F32 && v->ndim == 1 && v->shape[0] == C && mmc_is_contiguous(v),
              "%s: %s must be f32 [%lld], got %s %s", op, what, (long long)C, mmc_dtype_name(v->dtype),
              mmc_shape_str(v, s, sizeof s));
}
static float *grad_or_null(mmc_ctx *ctx, mmc_tensor *t) {
    return mmc_requires_grad(t) ? mmc_grad(ctx, t)->data : NULL;
}

/* ------------------------------------------------------------------ RMSNorm */
static void rmsnorm_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->n_in > 1 ? n->in[1] : NULL;
    int64_t R = n->i[0], C = n->i[1];
    float *dx = grad_or_null(ctx, x), *dw = grad_or_null(ctx, w);
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    float *part = dw ? mmc_scratch_alloc(ctx, mmc_cpu_norm_partial_floats(R, C) * sizeof(float)) : NULL;
    mmc_cpu_rmsnorm_bwd(x->data, w ? w->data : NULL, n->saved[0]->data, n->out->grad->data, dx, dw,
                        part, R, C);
    mmc_scratch_release(ctx, m);
}

mmc_tensor *mmc_rmsnorm(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, float eps) {
    check_x("mmc_rmsnorm", x);
    int64_t C = x->shape[x->ndim - 1], R = rows_of(x);
    check_vec("mmc_rmsnorm", "w", w, C);
    mmc_tensor *y = mmc_new_like(ctx, x);                        /* [..., C] */
    mmc_tensor *rstd = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(R));   /* [R] */
    mmc_cpu_rmsnorm_fwd(x->data, w ? w->data : NULL, y->data, rstd->data, R, C, eps);
    mmc_tensor *in[2] = {x, w};
    mmc_node *n = mmc_tape_record(ctx, "rmsnorm", rmsnorm_backward, y, w ? 2 : 1, in);
    if (n) {
        n->saved[0] = rstd;
        n->i[0] = R;
        n->i[1] = C;
    }
    return y;
}

/* ------------------------------------------------------------------ LayerNorm */
static void layernorm_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];   /* w, b may be NULL */
    int64_t R = n->i[0], C = n->i[1];
    float *dx = grad_or_null(ctx, x), *dw = grad_or_null(ctx, w), *db = grad_or_null(ctx, b);
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    float *part = (dw || db) ? mmc_scratch_alloc(ctx, mmc_cpu_norm_partial_floats(R, C) * sizeof(float))
                             : NULL;
    mmc_cpu_layernorm_bwd(x->data, w ? w->data : NULL, n->saved[0]->data, n->saved[1]->data,
                          n->out->grad->data, dx, dw, db, part, R, C);
    mmc_scratch_release(ctx, m);
}

mmc_tensor *mmc_layernorm(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b, float eps) {
    check_x("mmc_layernorm", x);
    int64_t C = x->shape[x->ndim - 1], R = rows_of(x);
    check_vec("mmc_layernorm", "w", w, C);
    check_vec("mmc_layernorm", "b", b, C);
    mmc_tensor *y = mmc_new_like(ctx, x);                        /* [..., C] */
    mmc_tensor *mean = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(R));   /* [R] */
    mmc_tensor *rstd = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(R));   /* [R] */
    mmc_cpu_layernorm_fwd(x->data, w ? w->data : NULL, b ? b->data : NULL, y->data, mean->data,
                          rstd->data, R, C, eps);
    /* always 3 inputs (NULLs allowed) so the backward knows which is which */
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "layernorm", layernorm_backward, y, 3, in);
    if (n) {
        n->saved[0] = mean;
        n->saved[1] = rstd;
        n->i[0] = R;
        n->i[1] = C;
    }
    return y;
}

/* ------------------------------------------------------------------ GroupNorm */
static void groupnorm_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    int64_t N = n->i[0], C = n->i[1], S = n->i[2], G = n->i[3];
    float *dx = grad_or_null(ctx, x), *dw = grad_or_null(ctx, w), *db = grad_or_null(ctx, b);
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    float *part = mmc_scratch_alloc(ctx, (size_t)(2 * N * C) * sizeof(float));
    mmc_cpu_groupnorm_bwd(x->data, w ? w->data : NULL, n->saved[0]->data, n->saved[1]->data,
                          n->out->grad->data, dx, dw, db, part, N, C, S, G);
    mmc_scratch_release(ctx, m);
}

void mmc_groupnorm_affine(const mmc_tensor *x, int groups, const mmc_tensor *w, const mmc_tensor *b, float eps,
                          float *a, float *sh) {
    char s[64];
    MMC_CHECK(x && x->dtype == MMC_F32 && mmc_is_contiguous(x) && x->ndim >= 2 && groups > 0 && x->shape[1] % groups == 0,
              "mmc_groupnorm_affine: x must be contiguous f32 [N, C, *spatial] with C divisible by groups=%d, got %s",
              groups, x ? mmc_shape_str(x, s, sizeof s) : "NULL");
    int64_t N = x->shape[0], C = x->shape[1], S = 1;
    for (int d = 2; d < x->ndim; d++) S *= x->shape[d];
    check_vec("mmc_groupnorm_affine", "w", w, C);
    check_vec("mmc_groupnorm_affine", "b", b, C);
    mmc_cpu_groupnorm_affine(x->data, w ? w->data : NULL, b ? b->data : NULL, a, sh, N, C, S, groups, eps);
}

mmc_tensor *mmc_groupnorm(mmc_ctx *ctx, mmc_tensor *x, int groups, mmc_tensor *w, mmc_tensor *b,
                          float eps) {
    char s[64];
    check_x("mmc_groupnorm", x);
    MMC_CHECK(x->ndim >= 2 && groups > 0 && x->shape[1] % groups == 0,
              "mmc_groupnorm: x must be [N, C, *spatial] with C divisible by groups=%d, got %s", groups,
              mmc_shape_str(x, s, sizeof s));
    int64_t N = x->shape[0], C = x->shape[1], S = 1, G = groups;
    for (int d = 2; d < x->ndim; d++) S *= x->shape[d];
    check_vec("mmc_groupnorm", "w", w, C);
    check_vec("mmc_groupnorm", "b", b, C);
    mmc_tensor *y = mmc_new_like(ctx, x);                            /* [N, C, *spatial] */
    mmc_tensor *mean = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N, G));   /* [N, G] */
    mmc_tensor *rstd = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N, G));   /* [N, G] */
    mmc_cpu_groupnorm_fwd(x->data, w ? w->data : NULL, b ? b->data : NULL, y->data, mean->data,
                          rstd->data, N, C, S, G, eps);
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "groupnorm", groupnorm_backward, y, 3, in);
    if (n) {
        n->saved[0] = mean;
        n->saved[1] = rstd;
        n->i[0] = N;
        n->i[1] = C;
        n->i[2] = S;
        n->i[3] = G;
    }
    return y;
}
