/* shape.c — shape surgery: concat along any dim (torch.cat), split into views (torch.split
 * via narrow), row gather (x[idx], F.embedding-like; backward scatter-adds, as
 * index_add_) and out-of-place row scatter (dst.index_copy(0, idx, src): how image
 * embeddings replace placeholder tokens in Qwen2-VL / LLaVA).
 *
 * Backward rules are deterministic: the scatter-add of gather_rows walks idx in order,
 * parallel only over column blocks. */
#include "mmc_ops.h"
#include "elementwise.h"

#include <string.h>

#define PAR_MIN (1 << 15)

static bool is_float(mmc_dtype dt) {
    return dt == MMC_F32 || dt == MMC_BF16 || dt == MMC_F16 || dt == MMC_F64;
}

/* ================================================================ concat */
/* node: i[0] = dim; outer/inner recomputed from shapes */
static void concat_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *y = n->out;
    int dim = (int)n->i[0];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= y->shape[d];
    for (int d = dim + 1; d < y->ndim; d++) inner *= y->shape[d];
    int64_t row = y->shape[dim] * inner, off = 0;
    const float *g = y->grad->data;
    for (int k = 0; k < n->n_in; k++) {
        mmc_tensor *x = n->in[k];
        int64_t w = x->shape[dim] * inner;
        if (mmc_requires_grad(x)) {
            float *gx = mmc_grad(ctx, x)->data;
            /* gx [outer, w] += g[:, off:off+w] (rows of g have stride `row`) */
            #pragma omp parallel for schedule(static) if (outer * w >= PAR_MIN)
            for (int64_t o = 0; o < outer; o++) {
                float *d = gx + o * w;
                const float *s = g + o * row + off;
                for (int64_t j = 0; j < w; j++) d[j] += s[j];
            }
        }
        off += w;
    }
}

mmc_tensor *mmc_concat(mmc_ctx *ctx, mmc_tensor *const *xs, int n, int dim) {
    MMC_CHECK(n >= 1 && n <= MMC_NODE_MAX_IN, "mmc_concat: %d inputs (1..%d supported)", n, MMC_NODE_MAX_IN);
    const mmc_tensor *x0 = xs[0];
    if (dim < 0) dim += x0->ndim;
    char b0[64], b1[64];
    MMC_CHECK(dim >= 0 && dim < x0->ndim, "mmc_concat: dim %d out of range for %s", dim, mmc_shape_str(x0, b0, sizeof b0));
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof shape);
    shape[dim] = 0;
    mmc_tensor *in[MMC_NODE_MAX_IN];
    for (int k = 0; k < n; k++) {
        const mmc_tensor *x = xs[k];
        MMC_CHECK(x->ndim == x0->ndim && x->dtype == x0->dtype && x->dtype != MMC_NF4,
                  "mmc_concat: input %d %s %s vs input 0 %s %s", k, mmc_dtype_name(x->dtype),
                  mmc_shape_str(x, b1, sizeof b1), mmc_dtype_name(x0->dtype), mmc_shape_str(x0, b0, sizeof b0));
        for (int d = 0; d < x0->ndim; d++)
            MMC_CHECK(d == dim || x->shape[d] == x0->shape[d], "mmc_concat: input %d %s vs input 0 %s off dim %d",
                      k, mmc_shape_str(x, b1, sizeof b1), mmc_shape_str(x0, b0, sizeof b0), dim);
        shape[dim] += x->shape[dim];
        in[k] = mmc_contiguous(ctx, (mmc_tensor *)x);
    }
    mmc_tensor *y = mmc_new(ctx, x0->dtype, x0->ndim, shape);
    size_t esz = mmc_dtype_size(x0->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= shape[d];
    for (int d = dim + 1; d < x0->ndim; d++) inner *= shape[d];
    int64_t row = shape[dim] * inner, off = 0;
    for (int k = 0; k < n; k++) {
        int64_t w = in[k]->shape[dim] * inner;
        int64_t dst[2] = {row, 1}, src[2] = {w, 1}, sh[2] = {outer, w};
        ew_strided_copy((char *)y->data + off * (int64_t)esz, dst, in[k]->data, src, sh, 2, esz);
        off += w;
    }
    mmc_node *nd = is_float(x0->dtype) ? mmc_tape_record(ctx, "concat", concat_backward, y, n, in) : NULL;
    if (nd) nd->i[0] = dim;
    return y;
}

void mmc_split(mmc_ctx *ctx, mmc_tensor *x, int dim, int n, const int64_t *sizes, mmc_tensor **out) {
    if (dim < 0) dim += x->ndim;
    char buf[64];
    MMC_CHECK(dim >= 0 && dim < x->ndim, "mmc_split: dim %d out of range for %s", dim, mmc_shape_str(x, buf, sizeof buf));
    int64_t tot = 0;
    for (int k = 0; k < n; k++) tot += sizes[k];
    MMC_CHECK(tot == x->shape[dim], "mmc_split: sizes sum to %lld, dim %d of %s is %lld", (long long)tot, dim,
              mmc_shape_str(x, buf, sizeof buf), (long long)x->shape[dim]);
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
        out[k] = mmc_narrow(ctx, x, dim, start, sizes[k]);
        start += sizes[k];
    }
}

/* ================================================================ row gather / scatter */
static int64_t idx_at(const mmc_tensor *idx, int64_t m) {
    return idx->dtype == MMC_I64 ? ((const int64_t *)idx->data)[m] : ((const int32_t *)idx->data)[m];
}

static void check_rows(const char *op, const mmc_tensor *x, const mmc_tensor *idx) {
    char b0[64], b1[64];
    MMC_CHECK(x->ndim == 2, "%s: expected a 2-D [N, C] tensor, got %s", op, mmc_shape_str(x, b0, sizeof b0));
    MMC_CHECK(idx->ndim == 1 && (idx->dtype == MMC_I32 || idx->dtype == MMC_I64) && mmc_is_contiguous(idx),
              "%s: idx must be a contiguous 1-D i32/i64 tensor, got %s %s", op, mmc_dtype_name(idx->dtype),
              mmc_shape_str(idx, b1, sizeof b1));
    for (int64_t m = 0; m < idx->shape[0]; m++) {
        int64_t r = idx_at(idx, m);
        MMC_CHECK(r >= 0 && r < x->shape[0], "%s: idx[%lld] = %lld out of range for %lld rows", op,
                  (long long)m, (long long)r, (long long)x->shape[0]);
    }
}

/* gx[idx[m]] += g[m], in order of m; columns split into blocks across threads */
#define COLB 256
static void scatter_add_rows(float *gx, const float *g, const mmc_tensor *idx, int64_t M, int64_t C) {
    int64_t nb = (C + COLB - 1) / COLB;
    #pragma omp parallel for schedule(static) if (M * C >= PAR_MIN && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t c0 = b * COLB, w = C - c0 < COLB ? C - c0 : COLB;
        for (int64_t m = 0; m < M; m++) {
            float *d = gx + idx_at(idx, m) * C + c0;
            const float *s = g + m * C + c0;
            for (int64_t j = 0; j < w; j++) d[j] += s[j];
        }
    }
}

static void gather_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *idx = n->in[1];
    if (!mmc_requires_grad(x)) return;
    scatter_add_rows(mmc_grad(ctx, x)->data, n->out->grad->data, idx, idx->shape[0], x->shape[1]);
}

mmc_tensor *mmc_gather_rows(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *idx) {
    check_rows("mmc_gather_rows", x, idx);
    MMC_CHECK(x->dtype != MMC_NF4, "mmc_gather_rows: NF4 rows need dequantisation");
    x = mmc_contiguous(ctx, x);
    int64_t M = idx->shape[0], C = x->shape[1];
    size_t rb = (size_t)C * mmc_dtype_size(x->dtype);
    mmc_tensor *y = mmc_new(ctx, x->dtype, 2, MMC_SHAPE(M, C));
    #pragma omp parallel for schedule(static) if (M * C >= PAR_MIN)
    for (int64_t m = 0; m < M; m++)
        memcpy((char *)y->data + (size_t)m * rb, (const char *)x->data + (size_t)idx_at(idx, m) * rb, rb);
    mmc_tensor *in[2] = {x, idx};
    if (is_float(x->dtype)) mmc_tape_record(ctx, "gather_rows", gather_backward, y, 2, in);
    return y;
}

static void scatter_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *dst = n->in[0], *idx = n->in[1], *src = n->in[2];
    const float *g = n->out->grad->data;
    int64_t N = dst->shape[0], C = dst->shape[1], M = idx->shape[0];
    if (mmc_requires_grad(dst)) {
        float *gd = mmc_grad(ctx, dst)->data;
        mmc_arena_mark mk = mmc_scratch_mark(ctx);
        unsigned char *hit = mmc_scratch_alloc(ctx, (size_t)N + 1);
        memset(hit, 0, (size_t)N);
        for (int64_t m = 0; m < M; m++) hit[idx_at(idx, m)] = 1;
        #pragma omp parallel for schedule(static) if (N * C >= PAR_MIN)
        for (int64_t r = 0; r < N; r++)
            if (!hit[r]) for (int64_t c = 0; c < C; c++) gd[r * C + c] += g[r * C + c];
        mmc_scratch_release(ctx, mk);
    }
    if (mmc_requires_grad(src)) {
        float *gs = mmc_grad(ctx, src)->data;
        #pragma omp parallel for schedule(static) if (M * C >= PAR_MIN)
        for (int64_t m = 0; m < M; m++) {
            const float *s = g + idx_at(idx, m) * C;
            for (int64_t c = 0; c < C; c++) gs[m * C + c] += s[c];
        }
    }
}

mmc_tensor *mmc_scatter_rows(mmc_ctx *ctx, mmc_tensor *dst, mmc_tensor *idx, mmc_tensor *src) {
    check_rows("mmc_scatter_rows", dst, idx);
    char b0[64], b1[64], b2[64];
    MMC_CHECK(src->ndim == 2 && src->shape[0] == idx->shape[0] && src->shape[1] == dst->shape[1] &&
              src->dtype == dst->dtype,
              "mmc_scatter_rows: src %s %s must be [M, C] = [%lld, %lld] %s (dst %s, idx %s)",
              mmc_dtype_name(src->dtype), mmc_shape_str(src, b0, sizeof b0), (long long)idx->shape[0],
              (long long)dst->shape[1], mmc_dtype_name(dst->dtype), mmc_shape_str(dst, b1, sizeof b1),
              mmc_shape_str(idx, b2, sizeof b2));
    MMC_CHECK(dst->dtype != MMC_NF4, "mmc_scatter_rows: NF4 rows need dequantisation");
    int64_t N = dst->shape[0], C = dst->shape[1], M = idx->shape[0];
    {   /* rows must be distinct: otherwise the result would depend on write order */
        mmc_arena_mark mk = mmc_scratch_mark(ctx);
        int64_t *first = mmc_scratch_alloc(ctx, (size_t)(N + 1) * sizeof(int64_t));
        for (int64_t r = 0; r < N; r++) first[r] = -1;
        for (int64_t m = 0; m < M; m++) {
            int64_t r = idx_at(idx, m);
            MMC_CHECK(first[r] < 0, "mmc_scatter_rows: idx[%lld] and idx[%lld] both name row %lld; rows must be distinct",
                      (long long)first[r], (long long)m, (long long)r);
            first[r] = m;
        }
        mmc_scratch_release(ctx, mk);
    }
    dst = mmc_contiguous(ctx, dst);
    src = mmc_contiguous(ctx, src);
    mmc_tensor *y = mmc_new(ctx, dst->dtype, 2, dst->shape);
    size_t rb = (size_t)C * mmc_dtype_size(dst->dtype);
    memcpy(y->data, dst->data, (size_t)N * rb);
    #pragma omp parallel for schedule(static) if (M * C >= PAR_MIN)
    for (int64_t m = 0; m < M; m++)
        memcpy((char *)y->data + (size_t)idx_at(idx, m) * rb, (const char *)src->data + (size_t)m * rb, rb);
    mmc_tensor *in[3] = {dst, idx, src};
    if (is_float(dst->dtype)) mmc_tape_record(ctx, "scatter_rows", scatter_backward, y, 3, in);
    return y;
}
