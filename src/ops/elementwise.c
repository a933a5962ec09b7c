/* elementwise.c — front ends of the elementwise ops: add / mul with numpy broadcasting,
 * scale, the activations (GELU erf and tanh forms, QuickGELU, SiLU, SwiGLU), last-dim
 * softmax and the scalar reductions sum / mean. Semantics mirror torch.add, torch.mul,
 * nn.functional.gelu(approximate='none'|'tanh'), silu, softmax(dim=-1), Tensor.sum/mean.
 *
 * Inputs that are not contiguous f32 are first made so with mmc_cast / mmc_contiguous (both
 * recorded), so gradients still reach the original tensors. Broadcasting has three paths:
 * same shape, bias-like (the smaller operand equals the trailing dims of the output:
 * out [R, C] op b [C]), and a general strided path; the backward of a broadcast operand
 * sums the gradient over the broadcast dims (in double, deterministically). */
#include "mmc_ops.h"
#include "elementwise.h"

#include <math.h>
#include <string.h>

static mmc_tensor *as_f32c(mmc_ctx *ctx, mmc_tensor *x) {
    if (x->dtype != MMC_F32) {
        MMC_CHECK(x->dtype == MMC_BF16 || x->dtype == MMC_F16 || x->dtype == MMC_F64,
                  "elementwise op: dtype %s is not a float type", mmc_dtype_name(x->dtype));
        x = mmc_cast(ctx, x, MMC_F32);
    }
    return mmc_contiguous(ctx, x);
}

static float *gradp(mmc_ctx *ctx, mmc_tensor *t) {
    return mmc_requires_grad(t) ? (float *)mmc_grad(ctx, t)->data : NULL;
}

/* ================================================================ broadcasting */
enum { BC_SAME = 0, BC_BIAS_B = 1, BC_BIAS_A = 2, BC_GENERAL = 3 };

/* The output shape of broadcasting a and b (numpy rules). */
static int broadcast_shape(const mmc_tensor *a, const mmc_tensor *b, int64_t *out) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    char ba[64], bb[64];
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        MMC_CHECK(da == db || da == 1 || db == 1, "broadcast: shapes %s and %s are incompatible",
                  mmc_shape_str(a, ba, sizeof ba), mmc_shape_str(b, bb, sizeof bb));
        out[i] = da == 1 ? db : da;
    }
    return nd;
}

/* Is t (right-aligned to the output) a bias: 1s (or absent) then exactly the output's
 * trailing dims? On success *C = numel(t). */
static bool is_bias(const mmc_tensor *t, int nd, const int64_t *out, int64_t *C) {
    int off = nd - t->ndim, i = 0;
    while (i < t->ndim && t->shape[i] == 1) i++;
    for (int j = i; j < t->ndim; j++) if (t->shape[j] != out[off + j]) return false;
    *C = mmc_numel(t);
    return true;
}

/* Element strides of t broadcast to the output (0 along broadcast dims). */
static void bcast_strides(const mmc_tensor *t, int nd, const int64_t *out, int64_t *st) {
    int off = nd - t->ndim;
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int j = i - off;
        if (j < 0 || t->shape[j] == 1) st[i] = 0;
        else { st[i] = s; s *= t->shape[j]; }
        (void)out;
    }
}

/* General broadcast, serial and in output order (deterministic); op 0 = add, 1 = mul.
 * Used only for the uncommon patterns; the hot patterns are the fast paths. */
static void general_fwd(int op, float *y, const float *a, const int64_t *sa, const float *b,
                        const int64_t *sb, int nd, const int64_t *shape) {
    int64_t idx[MMC_MAX_DIMS] = {0}, n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    int64_t oa = 0, ob = 0;
    for (int64_t k = 0; k < n; k++) {
        y[k] = op ? a[oa] * b[ob] : a[oa] + b[ob];
        for (int d = nd - 1; d >= 0; d--) {   /* odometer increment */
            idx[d]++; oa += sa[d]; ob += sb[d];
            if (idx[d] < shape[d]) break;
            oa -= sa[d] * shape[d]; ob -= sb[d] * shape[d]; idx[d] = 0;
        }
    }
}
/* gt[broadcast position] += g * (other at its position, or 1 when other == NULL), summed
 * per target element in double over a scratch buffer, in output order. */
static void general_bwd(mmc_ctx *ctx, float *gt, int64_t nt, const int64_t *st, const float *g,
                        const float *other, const int64_t *so, int nd, const int64_t *shape) {
    mmc_arena_mark mk = mmc_scratch_mark(ctx);
    double *acc = mmc_scratch_alloc(ctx, (size_t)nt * sizeof(double));
    memset(acc, 0, (size_t)nt * sizeof(double));
    int64_t idx[MMC_MAX_DIMS] = {0}, n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    int64_t ot = 0, oo = 0;
    for (int64_t k = 0; k < n; k++) {
        acc[ot] += (double)(other ? g[k] * other[oo] : g[k]);
        for (int d = nd - 1; d >= 0; d--) {
            idx[d]++; ot += st[d]; oo += so[d];
            if (idx[d] < shape[d]) break;
            ot -= st[d] * shape[d]; oo -= so[d] * shape[d]; idx[d] = 0;
        }
    }
    for (int64_t i = 0; i < nt; i++) gt[i] += (float)acc[i];
    mmc_scratch_release(ctx, mk);
}

/* node: i[0] = op (0 add, 1 mul), i[1] = path, i[2] = R, i[3] = C */
static void binary_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *a = n->in[0], *b = n->in[1], *y = n->out;
    int op = (int)n->i[0], path = (int)n->i[1];
    int64_t R = n->i[2], C = n->i[3], N = mmc_numel(y);
    const float *g = y->grad->data, *ad = a->data, *bd = b->data;
    float *ga = gradp(ctx, a), *gb = gradp(ctx, b);
    if (path == BC_SAME) {
        if (op == 0) {
            if (ga) ew_axpy_acc_f32(ga, g, 1.0f, N);
            if (gb) ew_axpy_acc_f32(gb, g, 1.0f, N);
        } else {
            if (ga) ew_mul_acc_f32(ga, g, bd, N);
            if (gb) ew_mul_acc_f32(gb, g, ad, N);
        }
    } else if (path == BC_BIAS_B || path == BC_BIAS_A) {
        /* full operand f [R, C], bias operand v [C] */
        float *gf = path == BC_BIAS_B ? ga : gb, *gv = path == BC_BIAS_B ? gb : ga;
        const float *fd = path == BC_BIAS_B ? ad : bd, *vd = path == BC_BIAS_B ? bd : ad;
        if (op == 0) {
            ew_add_bias_bwd_acc_f32(gf, gv, g, R, C);
        } else {
            if (gf) ew_mul_bias_acc_f32(gf, g, vd, R, C);
            if (gv) ew_colsum_acc_f32(gv, g, fd, R, C);
        }
    } else {
        int nd = y->ndim;
        int64_t sa[MMC_MAX_DIMS], sb[MMC_MAX_DIMS];
        bcast_strides(a, nd, y->shape, sa);
        bcast_strides(b, nd, y->shape, sb);
        if (ga) general_bwd(ctx, ga, mmc_numel(a), sa, g, op ? bd : NULL, sb, nd, y->shape);
        if (gb) general_bwd(ctx, gb, mmc_numel(b), sb, g, op ? ad : NULL, sa, nd, y->shape);
    }
}

static mmc_tensor *binary(mmc_ctx *ctx, int op, mmc_tensor *a, mmc_tensor *b) {
    a = as_f32c(ctx, a);
    b = as_f32c(ctx, b);
    int64_t shape[MMC_MAX_DIMS];
    int nd = broadcast_shape(a, b, shape);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, nd, shape);
    int64_t N = mmc_numel(y), C = 0;
    int path;
    if (mmc_numel(a) == N && mmc_numel(b) == N) path = BC_SAME;   /* equal up to leading 1s */
    else if (mmc_numel(a) == N && is_bias(b, nd, shape, &C)) path = BC_BIAS_B;
    else if (mmc_numel(b) == N && is_bias(a, nd, shape, &C)) path = BC_BIAS_A;
    else path = BC_GENERAL;
    int64_t R = C ? N / C : 0;
    float *yd = y->data;
    const float *ad = a->data, *bd = b->data;
    if (N == 0) { /* nothing to compute */ }
    else if (path == BC_SAME) (op ? ew_mul_f32 : ew_add_f32)(yd, ad, bd, N);
    else if (path == BC_BIAS_B) (op ? ew_mul_bias_f32 : ew_add_bias_f32)(yd, ad, bd, R, C);
    else if (path == BC_BIAS_A) (op ? ew_mul_bias_f32 : ew_add_bias_f32)(yd, bd, ad, R, C);
    else {
        int64_t sa[MMC_MAX_DIMS], sb[MMC_MAX_DIMS];
        bcast_strides(a, nd, shape, sa);
        bcast_strides(b, nd, shape, sb);
        general_fwd(op, yd, ad, sa, bd, sb, nd, shape);
    }
    mmc_tensor *in[2] = {a, b};
    mmc_node *n = mmc_tape_record(ctx, op ? "mul" : "add", binary_backward, y, 2, in);
    if (n) { n->i[0] = op; n->i[1] = path; n->i[2] = R; n->i[3] = C; }
    return y;
}

mmc_tensor *mmc_add(mmc_ctx *ctx, mmc_tensor *a, mmc_tensor *b) { return binary(ctx, 0, a, b); }
mmc_tensor *mmc_mul(mmc_ctx *ctx, mmc_tensor *a, mmc_tensor *b) { return binary(ctx, 1, a, b); }

/* ================================================================ scale */
static void scale_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (mmc_requires_grad(x))
        ew_axpy_acc_f32(mmc_grad(ctx, x)->data, n->out->grad->data, (float)n->f[0], mmc_numel(x));
}
mmc_tensor *mmc_scale(mmc_ctx *ctx, mmc_tensor *x, float s) {
    x = as_f32c(ctx, x);
    mmc_tensor *y = mmc_new_like(ctx, x);
    ew_scale_f32(y->data, x->data, s, mmc_numel(x));
    mmc_node *n = mmc_tape_record(ctx, "scale", scale_backward, y, 1, &x);
    if (n) n->f[0] = s;
    return y;
}

/* ================================================================ activations */
enum { ACT_GELU, ACT_GELU_TANH, ACT_QUICK_GELU, ACT_SILU };

static void act_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    float *gx = mmc_grad(ctx, x)->data;
    const float *g = n->out->grad->data, *xd = x->data;
    int64_t N = mmc_numel(x);
    switch ((int)n->i[0]) {
    case ACT_GELU: ew_gelu_bwd_acc_f32(gx, xd, g, N); break;
    case ACT_GELU_TANH: ew_gelu_tanh_bwd_acc_f32(gx, xd, g, N); break;
    case ACT_QUICK_GELU: ew_xsigmoid_bwd_acc_f32(gx, xd, g, 1.702f, N); break;
    default: ew_xsigmoid_bwd_acc_f32(gx, xd, g, 1.0f, N); break;
    }
}
static mmc_tensor *activation(mmc_ctx *ctx, mmc_tensor *x, int kind, const char *name) {
    x = as_f32c(ctx, x);
    mmc_tensor *y = mmc_new_like(ctx, x);
    int64_t N = mmc_numel(x);
    switch (kind) {
    case ACT_GELU: ew_gelu_f32(y->data, x->data, N); break;
    case ACT_GELU_TANH: ew_gelu_tanh_f32(y->data, x->data, N); break;
    case ACT_QUICK_GELU: ew_xsigmoid_f32(y->data, x->data, 1.702f, N); break;
    default: ew_xsigmoid_f32(y->data, x->data, 1.0f, N); break;
    }
    mmc_node *n = mmc_tape_record(ctx, name, act_backward, y, 1, &x);
    if (n) n->i[0] = kind;
    return y;
}
mmc_tensor *mmc_gelu(mmc_ctx *ctx, mmc_tensor *x) { return activation(ctx, x, ACT_GELU, "gelu"); }
mmc_tensor *mmc_gelu_tanh(mmc_ctx *ctx, mmc_tensor *x) { return activation(ctx, x, ACT_GELU_TANH, "gelu_tanh"); }
mmc_tensor *mmc_quick_gelu(mmc_ctx *ctx, mmc_tensor *x) { return activation(ctx, x, ACT_QUICK_GELU, "quick_gelu"); }
mmc_tensor *mmc_silu(mmc_ctx *ctx, mmc_tensor *x) { return activation(ctx, x, ACT_SILU, "silu"); }
mmc_tensor *mmc_silu_inplace(mmc_ctx *ctx, mmc_tensor *x) {
    (void)ctx;
    MMC_CHECK(x->dtype == MMC_F32 && mmc_is_contiguous(x) && !mmc_requires_grad(x),
              "mmc_silu_inplace: needs a contiguous f32 tensor no tape holds");
    ew_xsigmoid_f32(x->data, x->data, 1.0f, mmc_numel(x));   /* the same arithmetic as mmc_silu */
    return x;
}

static void swiglu_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *gate = n->in[0], *up = n->in[1];
    float *gg = gradp(ctx, gate), *gu = gradp(ctx, up);
    if (gg || gu)
        ew_swiglu_bwd_acc_f32(gg, gu, gate->data, up->data, n->out->grad->data, mmc_numel(gate));
}
mmc_tensor *mmc_swiglu(mmc_ctx *ctx, mmc_tensor *gate, mmc_tensor *up) {
    char b1[64], b2[64];
    MMC_CHECK(mmc_same_shape(gate, up), "mmc_swiglu: gate %s and up %s differ",
              mmc_shape_str(gate, b1, sizeof b1), mmc_shape_str(up, b2, sizeof b2));
    gate = as_f32c(ctx, gate);
    up = as_f32c(ctx, up);
    mmc_tensor *y = mmc_new_like(ctx, gate);
    ew_swiglu_f32(y->data, gate->data, up->data, mmc_numel(gate));
    mmc_tensor *in[2] = {gate, up};
    mmc_tape_record(ctx, "swiglu", swiglu_backward, y, 2, in);
    return y;
}

/* ================================================================ softmax */
static void softmax_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *y = n->out;
    if (!mmc_requires_grad(x)) return;
    int64_t C = n->i[0], R = C ? mmc_numel(x) / C : 0;
    ew_softmax_bwd_acc_f32(mmc_grad(ctx, x)->data, y->data, y->grad->data, R, C);
}
mmc_tensor *mmc_softmax(mmc_ctx *ctx, mmc_tensor *x) {
    MMC_CHECK(x->ndim >= 1, "mmc_softmax: needs at least one dim");
    x = as_f32c(ctx, x);
    mmc_tensor *y = mmc_new_like(ctx, x);
    int64_t C = x->shape[x->ndim - 1], R = C ? mmc_numel(x) / C : 0;
    ew_softmax_f32(y->data, x->data, R, C);
    mmc_node *n = mmc_tape_record(ctx, "softmax", softmax_backward, y, 1, &x);
    if (n) n->i[0] = C;
    return y;
}

/* ================================================================ reductions */
static void reduce_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    float g = ((float *)n->out->grad->data)[0] * (float)n->f[0];
    ew_add_scalar_acc_f32(mmc_grad(ctx, x)->data, g, mmc_numel(x));
}
static mmc_tensor *reduce(mmc_ctx *ctx, mmc_tensor *x, bool mean) {
    x = as_f32c(ctx, x);
    int64_t N = mmc_numel(x);
    double s = ew_sum_f64(x->data, N);
    if (mean) s = N ? s / (double)N : NAN;   /* torch: mean of an empty tensor is nan */
    mmc_tensor *y = mmc_scalar(ctx, (float)s);
    mmc_node *n = mmc_tape_record(ctx, mean ? "mean" : "sum", reduce_backward, y, 1, &x);
    if (n) n->f[0] = mean ? (N ? 1.0 / (double)N : NAN) : 1.0;
    return y;
}
mmc_tensor *mmc_sum(mmc_ctx *ctx, mmc_tensor *x) { return reduce(ctx, x, false); }
mmc_tensor *mmc_mean(mmc_ctx *ctx, mmc_tensor *x) { return reduce(ctx, x, true); }
