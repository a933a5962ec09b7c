/* view.c — views and layout ops: reshape, transpose, permute, narrow (views sharing the
 * input's storage, as torch.Tensor.view / transpose / permute / narrow), contiguous (a
 * strided copy) and cast (dtype conversion, as Tensor.to(dtype)).
 *
 * A view's gradient is its own contiguous f32 buffer. Its backward adds out->grad into the
 * input's (contiguous) gradient at the positions the view covers: the node carries the
 * view's geometry re-expressed in the input gradient's contiguous strides (offset + strides),
 * and ew_strided_add_acc_f32 scatters through it. */
#include "mmc_ops.h"
#include "elementwise.h"

#include <string.h>

typedef struct {
    int ndim;
    int64_t shape[MMC_MAX_DIMS];
    int64_t stride[MMC_MAX_DIMS]; /* into the input's contiguous gradient */
    int64_t offset;
} view_geom;

static bool is_float(mmc_dtype dt) {
    return dt == MMC_F32 || dt == MMC_BF16 || dt == MMC_F16 || dt == MMC_F64;
}

static void contig_strides(int ndim, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) { st[i] = s; s *= shape[i]; }
}

static void view_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    view_geom *g = n->extra;
    float *gx = mmc_grad(ctx, x)->data;
    ew_strided_add_acc_f32(gx + g->offset, g->stride, n->out->grad->data, g->shape, g->ndim);
}

/* plain add of same-numel contiguous grads (reshape of contiguous, contiguous, cast) */
static void flat_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    ew_axpy_acc_f32(mmc_grad(ctx, x)->data, n->out->grad->data, 1.0f, mmc_numel(x));
}

/* Make y a view of x (dtype, data offset already set by the caller) and record the node. */
static mmc_tensor *record_view(mmc_ctx *ctx, const char *op, mmc_tensor *x, mmc_tensor *y,
                               const int64_t *gstride, int64_t goffset) {
    if (!is_float(x->dtype)) return y;
    mmc_node *n = mmc_tape_record(ctx, op, view_backward, y, 1, &x);
    if (n) {
        view_geom *g = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *g);
        g->ndim = y->ndim;
        memcpy(g->shape, y->shape, sizeof g->shape);
        memcpy(g->stride, gstride, sizeof g->stride);
        g->offset = goffset;
        n->extra = g;
    }
    return y;
}

mmc_tensor *mmc_contiguous(mmc_ctx *ctx, mmc_tensor *x) {
    if (mmc_is_contiguous(x)) return x;
    MMC_CHECK(x->dtype != MMC_NF4, "mmc_contiguous: NF4 tensors cannot be strided");
    mmc_tensor *y = mmc_new(ctx, x->dtype, x->ndim, x->shape);
    ew_strided_copy(y->data, y->stride, x->data, x->stride, x->shape, x->ndim, mmc_dtype_size(x->dtype));
    if (is_float(x->dtype)) mmc_tape_record(ctx, "contiguous", flat_backward, y, 1, &x);
    return y;
}

mmc_tensor *mmc_reshape(mmc_ctx *ctx, mmc_tensor *x, int ndim, const int64_t *shape) {
    MMC_CHECK(ndim >= 0 && ndim <= MMC_MAX_DIMS, "mmc_reshape: rank %d not in [0, %d]", ndim, MMC_MAX_DIMS);
    int64_t sh[MMC_MAX_DIMS], known = 1, numel = mmc_numel(x);
    int neg = -1;
    char buf[64];
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1) {
            MMC_CHECK(neg < 0, "mmc_reshape: more than one -1 in the new shape of %s", mmc_shape_str(x, buf, sizeof buf));
            neg = i;
        } else {
            MMC_CHECK(shape[i] >= 0, "mmc_reshape: bad dimension %lld", (long long)shape[i]);
            known *= shape[i];
        }
    }
    if (neg >= 0) {
        MMC_CHECK(known > 0 && numel % known == 0, "mmc_reshape: cannot infer -1 reshaping %s (%lld elements)",
                  mmc_shape_str(x, buf, sizeof buf), (long long)numel);
        sh[neg] = numel / known;
        known *= sh[neg];
    }
    MMC_CHECK(known == numel, "mmc_reshape: %s has %lld elements, the new shape %lld",
              mmc_shape_str(x, buf, sizeof buf), (long long)numel, (long long)known);
    x = mmc_contiguous(ctx, x);   /* copy (recorded) when x is not contiguous */
    mmc_tensor *y = mmc_alias(ctx, x);
    y->ndim = ndim;
    memset(y->shape, 0, sizeof y->shape);
    for (int i = 0; i < ndim; i++) y->shape[i] = sh[i];
    mmc_set_contiguous_strides(y);
    if (is_float(x->dtype)) mmc_tape_record(ctx, "reshape", flat_backward, y, 1, &x);
    return y;
}

mmc_tensor *mmc_permute(mmc_ctx *ctx, mmc_tensor *x, const int *perm) {
    int seen[MMC_MAX_DIMS] = {0};
    for (int i = 0; i < x->ndim; i++) {
        MMC_CHECK(perm[i] >= 0 && perm[i] < x->ndim && !seen[perm[i]],
                  "mmc_permute: perm[%d] = %d is not a permutation of %d dims", i, perm[i], x->ndim);
        seen[perm[i]] = 1;
    }
    int64_t cst[MMC_MAX_DIMS], gst[MMC_MAX_DIMS] = {0};
    contig_strides(x->ndim, x->shape, cst);
    mmc_tensor *y = mmc_alias(ctx, x);
    for (int i = 0; i < x->ndim; i++) {
        y->shape[i] = x->shape[perm[i]];
        y->stride[i] = x->stride[perm[i]];
        gst[i] = cst[perm[i]];
    }
    return record_view(ctx, "permute", x, y, gst, 0);
}

mmc_tensor *mmc_transpose(mmc_ctx *ctx, mmc_tensor *x, int d0, int d1) {
    if (d0 < 0) d0 += x->ndim;
    if (d1 < 0) d1 += x->ndim;
    MMC_CHECK(d0 >= 0 && d0 < x->ndim && d1 >= 0 && d1 < x->ndim,
              "mmc_transpose: dims (%d, %d) out of range for rank %d", d0, d1, x->ndim);
    int perm[MMC_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    mmc_tensor *y = mmc_permute(ctx, x, perm);
    return y;
}

mmc_tensor *mmc_narrow(mmc_ctx *ctx, mmc_tensor *x, int dim, int64_t start, int64_t len) {
    char buf[64];
    if (dim < 0) dim += x->ndim;
    MMC_CHECK(dim >= 0 && dim < x->ndim, "mmc_narrow: dim %d out of range for %s", dim, mmc_shape_str(x, buf, sizeof buf));
    MMC_CHECK(start >= 0 && len >= 0 && start + len <= x->shape[dim],
              "mmc_narrow: [%lld, %lld) out of range for dim %d of %s", (long long)start,
              (long long)(start + len), dim, mmc_shape_str(x, buf, sizeof buf));
    MMC_CHECK(x->dtype != MMC_NF4, "mmc_narrow: NF4 tensors cannot be sliced");
    int64_t cst[MMC_MAX_DIMS] = {0};
    contig_strides(x->ndim, x->shape, cst);
    mmc_tensor *y = mmc_alias(ctx, x);
    y->shape[dim] = len;
    y->data = (char *)x->data + start * x->stride[dim] * (int64_t)mmc_dtype_size(x->dtype);
    return record_view(ctx, "narrow", x, y, cst, start * cst[dim]);
}

mmc_tensor *mmc_cast(mmc_ctx *ctx, mmc_tensor *x, mmc_dtype dt) {
    MMC_CHECK(x->dtype != MMC_NF4 && dt != MMC_NF4, "mmc_cast: NF4 needs the quantisation kernels");
    if (x->dtype == dt) return x;
    x = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, dt, x->ndim, x->shape);
    mmc_convert(y->data, dt, x->data, x->dtype, mmc_numel(x));
    /* gradients are f32 buffers whatever the dtype, so the rule is a plain add */
    if (is_float(x->dtype) && is_float(dt)) mmc_tape_record(ctx, "cast", flat_backward, y, 1, &x);
    return y;
}
