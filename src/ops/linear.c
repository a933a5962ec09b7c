/* linear.c — the dense-layer ops: mmc_linear (torch.nn.functional.linear,
 * y = x · Wᵀ + b) and mmc_embedding (torch.nn.functional.embedding).
 *
 * Weights may be f32 or bf16 (widened inside the GEMM / the row copy); their gradients are
 * always f32 (mmc_grad). Backward only computes what some input needs: a frozen W costs no
 * dW GEMM, an x that needs no grad costs no dx GEMM. */
#include "mmc_ops.h"
#include "linear.h"
#include "mmc_wgrad.h"

#include <string.h>

static int64_t rows_of(const mmc_tensor *x) {
    int64_t r = 1;
    for (int d = 0; d < x->ndim - 1; d++) r *= x->shape[d];
    return r;
}

/* ------------------------------------------------------------------ linear */
/* the weight half: dW += dyᵀ x, db += Σ dy (deferred under mmc_set_defer_weight_grads) */
static void linear_backward_weight(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    float *dw = mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;
    float *db = mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    if (dw || db) mmc_cpu_linear_bwd(x->data, w->data, w->dtype == MMC_BF16, n->out->grad->data, NULL, dw, db,
                                     n->i[0], n->i[1], n->i[2]);
}

static void linear_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    int64_t M = n->i[0], N = n->i[1], K = n->i[2];
    const bool defer = mmc_defer_weight_grads(ctx) && (mmc_requires_grad(w) || mmc_requires_grad(b));
    float *dx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *dw = !defer && mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;
    float *db = !defer && mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    if (dx || dw || db) mmc_cpu_linear_bwd(x->data, w->data, w->dtype == MMC_BF16, n->out->grad->data, dx, dw, db, M,
                                           N, K);
    if (defer) mmc_defer_weight_grad(ctx, n, linear_backward_weight);
}

mmc_tensor *mmc_linear(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    char sx[64], sw[64], sb[64];
    MMC_CHECK(x && w, "mmc_linear: x and w are required");
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim >= 1 && mmc_is_contiguous(x),
              "mmc_linear: x must be contiguous f32 [..., K], got %s %s", mmc_dtype_name(x->dtype),
              mmc_shape_str(x, sx, sizeof sx));
    MMC_CHECK((w->dtype == MMC_F32 || w->dtype == MMC_BF16) && w->ndim == 2 && mmc_is_contiguous(w) &&
                  w->shape[1] == x->shape[x->ndim - 1],
              "mmc_linear: w must be contiguous f32/bf16 [N, K] with K = x's last dim; x %s, w %s %s",
              mmc_shape_str(x, sx, sizeof sx), mmc_dtype_name(w->dtype), mmc_shape_str(w, sw, sizeof sw));
    int64_t M = rows_of(x), N = w->shape[0], K = w->shape[1];
    if (b)
        MMC_CHECK((b->dtype == MMC_F32 || b->dtype == MMC_BF16) && b->ndim == 1 && b->shape[0] == N &&
                      mmc_is_contiguous(b),
                  "mmc_linear: b must be f32/bf16 [%lld], got %s %s", (long long)N,
                  mmc_dtype_name(b->dtype), mmc_shape_str(b, sb, sizeof sb));
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = N;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, shape);   /* [..., N] */
    mmc_cpu_linear_fwd(x->data, w->data, w->dtype == MMC_BF16, b ? b->data : NULL,
                       b && b->dtype == MMC_BF16, y->data, M, N, K, !mmc_grad_enabled(ctx));
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "linear", linear_backward, y, b ? 3 : 2, in);
    if (n) {
        n->i[0] = M;
        n->i[1] = N;
        n->i[2] = K;
    }
    return y;
}

/* ------------------------------------------------------------------ embedding */
static inline int64_t id_at(const mmc_tensor *ids, int64_t i) {
    return ids->dtype == MMC_I64 ? ((const int64_t *)ids->data)[i]
                                 : (int64_t)((const int32_t *)ids->data)[i];
}

static void embedding_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *table = n->in[0], *ids = n->in[1];
    if (!mmc_requires_grad(table)) return;
    int64_t T = mmc_numel(ids), C = table->shape[1];
    float *gt = mmc_grad(ctx, table)->data;
    const float *gy = n->out->grad->data;
    const int64_t padding_idx = n->i[0];   /* -1: none */
    /* Columns are split over threads; inside a column block tokens are added in order, so
     * repeated ids accumulate identically for any thread count. */
#pragma omp parallel for schedule(static) if (T * C > 32768)
    for (int64_t c0 = 0; c0 < C; c0 += 128) {
        int64_t c1 = c0 + 128 < C ? c0 + 128 : C;
        for (int64_t t = 0; t < T; t++) {
            if (id_at(ids, t) == padding_idx) continue;   /* nn.Embedding(padding_idx): no gradient */
            float *dst = gt + id_at(ids, t) * C;
            const float *src = gy + t * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

mmc_tensor *mmc_embedding(mmc_ctx *ctx, mmc_tensor *table, mmc_tensor *ids) {
    return mmc_embedding_padded(ctx, table, ids, -1);
}

mmc_tensor *mmc_embedding_padded(mmc_ctx *ctx, mmc_tensor *table, mmc_tensor *ids, int64_t padding_idx) {
    char st[64], si[64];
    MMC_CHECK(table && ids, "mmc_embedding: table and ids are required");
    MMC_CHECK((table->dtype == MMC_F32 || table->dtype == MMC_BF16) && table->ndim == 2 &&
                  mmc_is_contiguous(table),
              "mmc_embedding: table must be contiguous f32/bf16 [V, C], got %s %s",
              mmc_dtype_name(table->dtype), mmc_shape_str(table, st, sizeof st));
    MMC_CHECK((ids->dtype == MMC_I32 || ids->dtype == MMC_I64) && mmc_is_contiguous(ids) &&
                  ids->ndim < MMC_MAX_DIMS,
              "mmc_embedding: ids must be contiguous i32/i64 with < %d dims, got %s %s", MMC_MAX_DIMS,
              mmc_dtype_name(ids->dtype), mmc_shape_str(ids, si, sizeof si));
    int64_t V = table->shape[0], C = table->shape[1], T = mmc_numel(ids);
    for (int64_t t = 0; t < T; t++) {
        int64_t id = id_at(ids, t);
        MMC_CHECK(id >= 0 && id < V, "mmc_embedding: id %lld at position %lld is out of range [0, %lld)",
                  (long long)id, (long long)t, (long long)V);
    }
    int64_t shape[MMC_MAX_DIMS];
    for (int d = 0; d < ids->ndim; d++) shape[d] = ids->shape[d];
    shape[ids->ndim] = C;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, ids->ndim + 1, shape);   /* [..., C] */
    float *yd = y->data;
#pragma omp parallel for schedule(static) if (T * C > 32768)
    for (int64_t t = 0; t < T; t++) {
        int64_t id = id_at(ids, t);
        if (table->dtype == MMC_F32)
            memcpy(yd + t * C, (const float *)table->data + id * C, (size_t)C * sizeof(float));
        else
            mmc_convert(yd + t * C, MMC_F32, (const uint16_t *)table->data + id * C, MMC_BF16, C);
    }
    mmc_tensor *in[2] = {table, ids};
    mmc_node *n = mmc_tape_record(ctx, "embedding", embedding_backward, y, 2, in);
    if (n) n->i[0] = padding_idx;
    return y;
}
