/* test_ops_nn.c — dense, norm, loss and convolution ops (src/ops/{linear,norm,loss,conv}.c):
 * finite-difference gradient checks for every op and variant, forward + backward against
 * PyTorch fixtures (tools/ref/gen_nn.py -> tests/fixtures/nn/), bf16-weight forwards against
 * the f32 op on the rounded weights, and the edge cases (all-ignored cross-entropy, frozen
 * weights, determinism across thread counts, a 151936-wide vocabulary). */
#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------ helpers */
static mmc_tensor *param(uint64_t seed, int ndim, const int64_t *shape, float std, float mean) {
    mmc_tensor *t = randn_param(seed, ndim, shape, std);
    for (int64_t i = 0; i < mmc_numel(t); i++) ((float *)t->data)[i] += mean;
    return t;
}
static mmc_tensor *bf16_copy(const mmc_tensor *t) {   /* bf16 rounding of an f32 tensor */
    mmc_tensor *b = mmc_tensor_new(MMC_BF16, t->ndim, t->shape);
    mmc_convert(b->data, MMC_BF16, t->data, MMC_F32, mmc_numel(t));
    return b;
}
static mmc_tensor *f32_copy(const mmc_tensor *t) {
    mmc_tensor *f = mmc_tensor_new(MMC_F32, t->ndim, t->shape);
    mmc_convert(f->data, MMC_F32, t->data, t->dtype, mmc_numel(t));
    return f;
}
static mmc_tensor *ids_tensor(mmc_dtype dt, int ndim, const int64_t *shape, const int64_t *v) {
    mmc_tensor *t = mmc_tensor_new(dt, ndim, shape);
    for (int64_t i = 0; i < mmc_numel(t); i++) mmc_set_flat(t, i, (double)v[i]);
    return t;
}
static void free_all(mmc_tensor **t, int n) {
    for (int i = 0; i < n; i++) mmc_tensor_free(t[i]);
}

/* op closures for gradcheck and fixtures: in[] as documented per function */
typedef struct { float eps; int groups, stride, pad; int64_t ignore; } args;

static mmc_tensor *f_linear(mmc_ctx *c, mmc_tensor **in, void *u) { return mmc_linear(c, in[0], in[1], in[2]); }
static mmc_tensor *f_embedding(mmc_ctx *c, mmc_tensor **in, void *u) { return mmc_embedding(c, in[0], in[1]); }
static mmc_tensor *f_embedding_pad1(mmc_ctx *c, mmc_tensor **in, void *u) {
    return mmc_embedding_padded(c, in[0], in[1], 1);
}
static mmc_tensor *f_rmsnorm(mmc_ctx *c, mmc_tensor **in, void *u) {
    return mmc_rmsnorm(c, in[0], in[1], ((args *)u)->eps);
}
static mmc_tensor *f_layernorm(mmc_ctx *c, mmc_tensor **in, void *u) {
    return mmc_layernorm(c, in[0], in[1], in[2], ((args *)u)->eps);
}
static mmc_tensor *f_groupnorm(mmc_ctx *c, mmc_tensor **in, void *u) {
    args *a = u;
    return mmc_groupnorm(c, in[0], a->groups, in[1], in[2], a->eps);
}
static mmc_tensor *f_xent(mmc_ctx *c, mmc_tensor **in, void *u) {
    return mmc_cross_entropy(c, in[0], in[1], ((args *)u)->ignore);
}
static mmc_tensor *f_patch(mmc_ctx *c, mmc_tensor **in, void *u) { return mmc_patch_embed(c, in[0], in[1], in[2]); }
static mmc_tensor *f_conv2d(mmc_ctx *c, mmc_tensor **in, void *u) {
    args *a = u;
    return mmc_conv2d(c, in[0], in[1], in[2], a->stride, a->pad);
}

/* ------------------------------------------------------------------ fixtures
 * Load the named inputs (NULL name -> NULL input), run f, compare `out`, seed out.grad = r,
 * backpropagate and compare g<name> for every input whose `grad` flag is set. */
typedef struct { const char *name; mmc_dtype dt; bool grad; } fx_in;

static void fixture_case(const char *file, const fx_in *spec, int n, gc_fn f, void *user, double atol,
                         double rtol) {
    char rel[256];
    snprintf(rel, sizeof rel, "nn/%s.safetensors", file);
    mmc_st *st = fixture_open(rel);
    if (!st) return;
    mmc_tensor *in[8] = {0};
    for (int i = 0; i < n; i++) {
        if (!spec[i].name) continue;
        in[i] = fixture_tensor(st, spec[i].name, spec[i].dt);
        if (spec[i].grad) in[i]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *y = f(ctx, in, user);
    mmc_tensor *want = fixture_tensor(st, "out", MMC_F32), *r = fixture_tensor(st, "r", MMC_F32);
    char what[300];
    snprintf(what, sizeof what, "%s: out", file);
    CHECK_CLOSE(y, want, atol, rtol, what);
    if (mmc_requires_grad(y)) {
        memcpy(mmc_grad(ctx, y)->data, r->data, mmc_nbytes(r));
        mmc_set_grad_enabled(ctx, false);
        mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
        for (int i = 0; i < n; i++) {
            if (!spec[i].name || !spec[i].grad) continue;
            char gname[64];
            snprintf(gname, sizeof gname, "g%s", spec[i].name);
            mmc_tensor *gw = fixture_tensor(st, gname, MMC_F32);
            snprintf(what, sizeof what, "%s: %s", file, gname);
            CHECKF(in[i]->grad != NULL, "%s: no gradient", what);
            if (in[i]->grad) CHECK_CLOSE(in[i]->grad, gw, atol, rtol, what);
            mmc_tensor_free(gw);
        }
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(want);
    mmc_tensor_free(r);
    free_all(in, n);
    mmc_st_close(st);
}

static void test_fixtures(void) {
    /* Tolerances: everything is f32 with short reductions (K <= 96, C <= 16, V <= 4099), so
     * |diff| <= 1e-5 + 1e-5 * max|want| covers summation-order differences from torch. */
    const double A = 1e-5, R = 1e-5;
    args a = {0};
    fixture_case("linear_bias", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {"b", MMC_F32, 1}}, 3,
                 f_linear, &a, A, R);
    fixture_case("linear_nobias", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {NULL}}, 3, f_linear,
                 &a, A, R);
    /* bf16 weights: frozen (no dW), x and b get grads through the bf16 GEMM */
    fixture_case("linear_bf16", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_BF16, 0}, {"b", MMC_F32, 1}}, 3,
                 f_linear, &a, A, R);
    fixture_case("embedding", (fx_in[]){{"table", MMC_F32, 1}, {"ids", MMC_I64, 0}}, 2, f_embedding, &a,
                 0, 0);   /* exact: copies and sums of <= 4 values in token order */
    fixture_case("embedding", (fx_in[]){{"table", MMC_F32, 1}, {"ids", MMC_I32, 0}}, 2, f_embedding, &a,
                 1e-6, 0);
    fixture_case("embedding_bf16", (fx_in[]){{"table", MMC_BF16, 0}, {"ids", MMC_I64, 0}}, 2,
                 f_embedding, &a, 0, 0);
    /* padding_idx 1: that row's gradient stays exactly zero (torch's F.embedding(padding_idx=1)) */
    fixture_case("embedding_padded", (fx_in[]){{"table", MMC_F32, 1}, {"ids", MMC_I64, 0}}, 2,
                 f_embedding_pad1, &a, 0, 0);
    a.eps = 1e-6f;
    fixture_case("rmsnorm", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}}, 2, f_rmsnorm, &a, A, R);
    fixture_case("rmsnorm_noweight", (fx_in[]){{"x", MMC_F32, 1}, {NULL}}, 2, f_rmsnorm, &a, A, R);
    a.eps = 1e-5f;
    fixture_case("layernorm", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {"b", MMC_F32, 1}}, 3,
                 f_layernorm, &a, A, R);
    fixture_case("layernorm_noaffine", (fx_in[]){{"x", MMC_F32, 1}, {NULL}, {NULL}}, 3, f_layernorm, &a,
                 A, R);
    a.groups = 4;
    fixture_case("groupnorm", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {"b", MMC_F32, 1}}, 3,
                 f_groupnorm, &a, A, R);
    a.groups = 3;
    fixture_case("groupnorm_noaffine", (fx_in[]){{"x", MMC_F32, 1}, {NULL}, {NULL}}, 3, f_groupnorm, &a,
                 A, R);
    a.ignore = -100;
    fixture_case("xent_small", (fx_in[]){{"logits", MMC_F32, 1}, {"targets", MMC_I64, 0}}, 2, f_xent, &a,
                 A, R);
    fixture_case("xent_small", (fx_in[]){{"logits", MMC_F32, 1}, {"targets", MMC_I32, 0}}, 2, f_xent, &a,
                 A, R);
    /* V = 4099: the loss sums exp over 4099 logits; 2e-5 relative on the loss, grads ~1e-7 */
    fixture_case("xent_large", (fx_in[]){{"logits", MMC_F32, 1}, {"targets", MMC_I64, 0}}, 2, f_xent, &a,
                 2e-5, 2e-5);
    fixture_case("patch_embed3d", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {NULL}}, 3, f_patch,
                 &a, A, R);
    fixture_case("patch_embed2d", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {"b", MMC_F32, 1}}, 3,
                 f_patch, &a, A, R);
    a.stride = 2, a.pad = 1;
    fixture_case("conv2d_s2p1", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {"b", MMC_F32, 1}}, 3,
                 f_conv2d, &a, A, R);
    a.stride = 1, a.pad = 0;
    fixture_case("conv2d_s1p0", (fx_in[]){{"x", MMC_F32, 1}, {"w", MMC_F32, 1}, {NULL}}, 3, f_conv2d,
                 &a, A, R);
}

/* ------------------------------------------------------------------ gradchecks
 * Central differences with eps 1e-2 on f32 inputs of magnitude ~1; tolerance
 * |analytic - numeric| <= 2e-3 + 2e-2 |numeric| (f32 rounding of L / (2 eps) is ~1e-4). */
#define GC(name, f, in, n, user) gradcheck(name, f, in, n, user, 1e-2, 2e-3, 2e-2, 200)

static void test_gradchecks(void) {
    args a = {.eps = 1e-5f};
    {   /* linear, 3-D x, with and without bias */
        mmc_tensor *in[3] = {param(1, 3, MMC_SHAPE(2, 3, 7), 1, 0), param(2, 2, MMC_SHAPE(5, 7), 0.5f, 0),
                             param(3, 1, MMC_SHAPE(5), 1, 0)};
        GC("linear", f_linear, in, 3, &a);
        mmc_tensor *nb[3] = {in[0], in[1], NULL};
        GC("linear_nobias", f_linear, nb, 3, &a);
        free_all(in, 3);
    }
    {   /* embedding: table grad with repeated ids (i32 and i64) */
        mmc_tensor *tab = param(4, 2, MMC_SHAPE(9, 5), 1, 0);
        int64_t v[6] = {8, 0, 3, 3, 8, 3};
        mmc_tensor *i64 = ids_tensor(MMC_I64, 2, MMC_SHAPE(2, 3), v), *i32 = ids_tensor(MMC_I32, 1, MMC_SHAPE(6), v);
        mmc_tensor *in[2] = {tab, i64};
        GC("embedding_i64", f_embedding, in, 2, &a);
        in[1] = i32;
        GC("embedding_i32", f_embedding, in, 2, &a);
        mmc_tensor_free(tab), mmc_tensor_free(i64), mmc_tensor_free(i32);
    }
    {   /* rmsnorm with and without weight */
        mmc_tensor *in[2] = {param(5, 3, MMC_SHAPE(2, 3, 24), 1, 0.3f), param(6, 1, MMC_SHAPE(24), 0.3f, 1)};
        a.eps = 1e-6f;
        GC("rmsnorm", f_rmsnorm, in, 2, &a);
        mmc_tensor *nw[2] = {in[0], NULL};
        GC("rmsnorm_noweight", f_rmsnorm, nw, 2, &a);
        free_all(in, 2);
    }
    {   /* layernorm: w+b, w only, neither */
        mmc_tensor *in[3] = {param(7, 2, MMC_SHAPE(5, 19), 1, 0.5f), param(8, 1, MMC_SHAPE(19), 0.3f, 1),
                             param(9, 1, MMC_SHAPE(19), 0.5f, 0)};
        a.eps = 1e-5f;
        GC("layernorm", f_layernorm, in, 3, &a);
        mmc_tensor *w_only[3] = {in[0], in[1], NULL}, *none[3] = {in[0], NULL, NULL};
        GC("layernorm_w_only", f_layernorm, w_only, 3, &a);
        GC("layernorm_noaffine", f_layernorm, none, 3, &a);
        free_all(in, 3);
    }
    {   /* groupnorm: [N, C, H, W] affine, [N, C, L] without affine, [N, C] (spatial 1) */
        mmc_tensor *in[3] = {param(10, 4, MMC_SHAPE(2, 6, 3, 4), 1, 0.2f), param(11, 1, MMC_SHAPE(6), 0.3f, 1),
                             param(12, 1, MMC_SHAPE(6), 0.5f, 0)};
        a.groups = 3;
        GC("groupnorm", f_groupnorm, in, 3, &a);
        mmc_tensor *x3 = param(13, 3, MMC_SHAPE(2, 6, 5), 1, 0);
        mmc_tensor *none[3] = {x3, NULL, NULL};
        a.groups = 2;
        GC("groupnorm_noaffine", f_groupnorm, none, 3, &a);
        mmc_tensor *x2 = param(14, 2, MMC_SHAPE(3, 12), 1, 0);
        mmc_tensor *in2[3] = {x2, NULL, in[2]};
        mmc_tensor *b8 = param(15, 1, MMC_SHAPE(12), 0.5f, 0);
        in2[2] = b8;
        a.groups = 3;
        GC("groupnorm_2d_bias_only", f_groupnorm, in2, 3, &a);
        free_all(in, 3), mmc_tensor_free(x3), mmc_tensor_free(x2), mmc_tensor_free(b8);
    }
    {   /* cross-entropy with ignored rows, i64 and i32 targets */
        mmc_tensor *lg = param(16, 2, MMC_SHAPE(5, 11), 2, 0);
        int64_t t[5] = {3, -100, 10, 0, 7};
        mmc_tensor *t64 = ids_tensor(MMC_I64, 1, MMC_SHAPE(5), t), *t32 = ids_tensor(MMC_I32, 1, MMC_SHAPE(5), t);
        mmc_tensor *in[2] = {lg, t64};
        a.ignore = -100;
        GC("xent_i64", f_xent, in, 2, &a);
        in[1] = t32;
        GC("xent_i32", f_xent, in, 2, &a);
        mmc_tensor_free(lg), mmc_tensor_free(t64), mmc_tensor_free(t32);
    }
    {   /* patch embed: 5-D weight without bias, 4-D weight with bias */
        mmc_tensor *in[3] = {param(17, 2, MMC_SHAPE(4, 2 * 2 * 2 * 2), 1, 0),
                             param(18, 5, MMC_SHAPE(3, 2, 2, 2, 2), 0.3f, 0), NULL};
        GC("patch_embed3d", f_patch, in, 3, &a);
        mmc_tensor *in2[3] = {param(19, 2, MMC_SHAPE(4, 2 * 3 * 3), 1, 0), param(20, 4, MMC_SHAPE(3, 2, 3, 3), 0.3f, 0),
                              param(21, 1, MMC_SHAPE(3), 1, 0)};
        GC("patch_embed2d", f_patch, in2, 3, &a);
        free_all(in, 3), free_all(in2, 3);
    }
    {   /* conv2d: stride 2 / pad 1 with bias, stride 1 / pad 2 without, non-square kernel */
        mmc_tensor *in[3] = {param(22, 4, MMC_SHAPE(2, 3, 6, 5), 1, 0), param(23, 4, MMC_SHAPE(4, 3, 3, 3), 0.3f, 0),
                             param(24, 1, MMC_SHAPE(4), 1, 0)};
        a.stride = 2, a.pad = 1;
        GC("conv2d_s2p1", f_conv2d, in, 3, &a);
        mmc_tensor *w2 = param(25, 4, MMC_SHAPE(2, 3, 2, 3), 0.3f, 0);
        mmc_tensor *in2[3] = {in[0], w2, NULL};
        a.stride = 1, a.pad = 2;
        GC("conv2d_s1p2", f_conv2d, in2, 3, &a);
        free_all(in, 3), mmc_tensor_free(w2);
    }
}

/* ------------------------------------------------------------------ bf16 weights
 * The bf16 path must equal the f32 op run on the bf16-rounded weights (same math, the
 * weights widened exactly); only GEMM summation order may differ: 1e-5 relative. */
static void test_bf16_weights(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = param(30, 2, MMC_SHAPE(6, 24), 1, 0), *w = param(31, 2, MMC_SHAPE(10, 24), 0.3f, 0);
    mmc_tensor *b = param(32, 1, MMC_SHAPE(10), 1, 0);
    mmc_tensor *wb = bf16_copy(w), *wr = f32_copy(wb), *bb = bf16_copy(b), *br = f32_copy(bb);
    CHECK_CLOSE(mmc_linear(ctx, x, wb, bb), mmc_linear(ctx, x, wr, br), 1e-5, 1e-5, "linear bf16 w, b");
    mmc_tensor *pw = param(33, 5, MMC_SHAPE(10, 3, 2, 2, 2), 0.3f, 0);
    mmc_tensor *pwb = bf16_copy(pw), *pwr = f32_copy(pwb);
    CHECK_CLOSE(mmc_patch_embed(ctx, x, pwb, NULL), mmc_patch_embed(ctx, x, pwr, NULL), 1e-5, 1e-5,
                "patch_embed bf16 w");
    mmc_tensor *ci = param(34, 4, MMC_SHAPE(2, 3, 7, 7), 1, 0), *cw = param(35, 4, MMC_SHAPE(4, 3, 3, 3), 0.3f, 0);
    mmc_tensor *cwb = bf16_copy(cw), *cwr = f32_copy(cwb);
    CHECK_CLOSE(mmc_conv2d(ctx, ci, cwb, NULL, 2, 1), mmc_conv2d(ctx, ci, cwr, NULL, 2, 1), 1e-5, 1e-5,
                "conv2d bf16 w");
    mmc_ctx_free(ctx);
    mmc_tensor *all[] = {x, w, b, wb, wr, bb, br, pw, pwb, pwr, ci, cw, cwb, cwr};
    free_all(all, 14);
}

/* ------------------------------------------------------------------ edge cases */
static void test_xent_edges(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    /* all targets ignored: torch gives NaN (0/0); mmc documents loss 0 and zero grads */
    mmc_tensor *lg = param(40, 2, MMC_SHAPE(3, 8), 1, 0);
    int64_t t[3] = {-100, -100, -100};
    mmc_tensor *tt = ids_tensor(MMC_I64, 1, MMC_SHAPE(3), t);
    mmc_tensor *loss = mmc_cross_entropy(ctx, lg, tt, -100);
    CHECK(mmc_numel(loss) == 1 && ((float *)loss->data)[0] == 0.0f);
    mmc_backward(ctx, loss);
    CHECK(lg->grad && max_abs(lg->grad) == 0.0);
    /* a custom ignore_index (not -100): -100 would be out of range there, so use 5 */
    int64_t t2[3] = {5, 1, 5};
    mmc_tensor *tt2 = ids_tensor(MMC_I32, 1, MMC_SHAPE(3), t2);
    loss = mmc_cross_entropy(ctx, lg, tt2, 5);
    const float *x = lg->data;
    double m = -INFINITY, s = 0;
    for (int j = 0; j < 8; j++) m = fmax(m, x[8 + j]);
    for (int j = 0; j < 8; j++) s += exp(x[8 + j] - m);
    CHECK_NEAR(((float *)loss->data)[0], m + log(s) - x[8 + 1], 1e-5);   /* one counted row */
    mmc_ctx_reset(ctx);
    /* V = 151936 (Qwen2 vocabulary) against a double-precision reference: 1e-5 relative */
    int64_t N = 3, V = 151936;
    mmc_tensor *big = param(41, 2, MMC_SHAPE(N, V), 3, 0);
    ((float *)big->data)[V + 77] = 40.0f;   /* a dominant logit: tests the running-max rescale */
    int64_t tb[3] = {151935, 77, 0};
    mmc_tensor *tbt = ids_tensor(MMC_I64, 1, MMC_SHAPE(3), tb);
    loss = mmc_cross_entropy(ctx, big, tbt, -100);
    double ref = 0;
    for (int64_t i = 0; i < N; i++) {
        const float *r = (const float *)big->data + i * V;
        double mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, r[j]);
        for (int64_t j = 0; j < V; j++) se += exp((double)r[j] - mx);
        ref += mx + log(se) - r[tb[i]];
    }
    ref /= N;
    CHECK_NEAR(((float *)loss->data)[0], ref, 1e-5 * fabs(ref) + 1e-6);
    mmc_backward(ctx, loss);
    double gsum = 0;   /* each counted row of softmax - onehot sums to 0 */
    for (int64_t j = 0; j < N * V; j++) gsum += ((float *)big->grad->data)[j];
    CHECK_NEAR(gsum, 0.0, 1e-5);
    mmc_ctx_free(ctx);
    mmc_tensor *all[] = {lg, tt, tt2, big, tbt};
    free_all(all, 5);
}

static void test_frozen_and_partial_grads(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = param(50, 2, MMC_SHAPE(4, 6), 1, 0), *w = param(51, 2, MMC_SHAPE(3, 6), 1, 0);
    w->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;   /* frozen weight: no dW buffer is ever made */
    mmc_tensor *y = mmc_linear(ctx, x, w, NULL);
    memset(mmc_grad(ctx, y)->data, 0, mmc_nbytes(y));
    ((float *)y->grad->data)[0] = 1.0f;
    mmc_set_grad_enabled(ctx, false);
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    CHECK(w->grad == NULL && x->grad != NULL);
    /* dx = dy · W: with dy = e_00, row 0 of dx is row 0 of W */
    for (int k = 0; k < 6; k++) CHECK_NEAR(((float *)x->grad->data)[k], ((float *)w->data)[k], 0);
    mmc_set_grad_enabled(ctx, true);
    /* nothing requires grad -> no node */
    x->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    int len = mmc_tape_len(ctx);
    y = mmc_rmsnorm(ctx, x, NULL, 1e-6f);
    CHECK(mmc_tape_len(ctx) == len && !mmc_requires_grad(y));
    mmc_ctx_free(ctx);
    mmc_tensor_free(x), mmc_tensor_free(w);
}

/* ------------------------------------------------------------------ conv2d blocking
 * mmc_conv2d cuts the im2col buffer into blocks (grouped whole images, or row bands of one
 * image; MMC_CONV_COL_MB sets the budget), run team-parallel per block or unit-parallel
 * (>= 4 units): every blocking must give the direct convolution
 * (double sums) for y, dx, dW, db, including stride 2/3, non-square inputs and kernels,
 * no bias, frozen x / w, and be bitwise identical for 1 and 2 threads. */
typedef struct { int64_t B, Cin, H, W, Cout, kh, kw; int stride, pad; bool bias, gx, gw; } conv_case;

static void conv_direct(const conv_case *c, const float *x, const float *w, const float *b,
                        const float *dy, double *y, double *dx, double *dw, double *db, int64_t Ho,
                        int64_t Wo) {
    for (int64_t n = 0; n < c->B; n++)
        for (int64_t o = 0; o < c->Cout; o++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    int64_t yi = ((n * c->Cout + o) * Ho + oh) * Wo + ow;
                    double s = b ? b[o] : 0, g = dy[yi];
                    if (db) db[o] += g;
                    for (int64_t ci = 0; ci < c->Cin; ci++)
                        for (int64_t ki = 0; ki < c->kh; ki++)
                            for (int64_t kj = 0; kj < c->kw; kj++) {
                                int64_t ih = oh * c->stride - c->pad + ki, iw = ow * c->stride - c->pad + kj;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                int64_t xi = ((n * c->Cin + ci) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * c->Cin + ci) * c->kh + ki) * c->kw + kj;
                                s += (double)x[xi] * w[wi];
                                dx[xi] += g * w[wi];
                                dw[wi] += g * x[xi];
                            }
                    y[yi] = s;
                }
}

static double max_rel(const float *got, const double *want, int64_t n) {
    double m = 0, scale = 1e-3;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(got[i] - want[i]) / scale);
    return m;
}

static void test_conv2d_blocking(void) {
    const conv_case cases[] = {
        {3, 5, 9, 7, 6, 3, 3, 1, 1, true, true, true},      /* small images: grouped */
        {2, 2, 45, 38, 3, 3, 2, 1, 1, true, true, true},    /* 45 rows x 39: row bands */
        {2, 3, 47, 50, 4, 3, 3, 2, 1, false, true, true},   /* stride 2, non-square, no bias */
        {2, 3, 11, 13, 2, 5, 4, 3, 2, true, true, true},    /* stride 3, 5x4 kernel, pad 2 */
        {2, 4, 34, 33, 3, 3, 3, 1, 0, true, false, true},   /* x frozen: no dx */
        {3, 4, 20, 21, 5, 3, 3, 1, 1, true, true, false},   /* w frozen: no dW */
        {2, 2, 6, 7, 100, 3, 3, 1, 1, true, true, true},    /* Cout > 96: dW not transposed */
        /* >= 4 (image, band) units: the unit-parallel mode */
        {5, 3, 8, 9, 4, 3, 3, 1, 1, true, true, true},
        {4, 2, 9, 8, 100, 3, 3, 2, 1, false, true, true},   /* Cout > 96, stride 2, no bias */
        {4, 3, 10, 7, 3, 3, 3, 1, 1, true, false, true},    /* x frozen */
        {2, 2, 100, 30, 3, 3, 3, 1, 1, true, true, true},   /* 3 bands (tiny budget): even/odd dx */
    };
    const char *budgets[] = {NULL, "0.000001", "0.05"};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const conv_case *c = &cases[k];
        int64_t Ho = (c->H + 2 * c->pad - c->kh) / c->stride + 1, Wo = (c->W + 2 * c->pad - c->kw) / c->stride + 1;
        int64_t nx = c->B * c->Cin * c->H * c->W, nw = c->Cout * c->Cin * c->kh * c->kw, ny = c->B * c->Cout * Ho * Wo;
        mmc_tensor *x = param(70 + k, 4, MMC_SHAPE(c->B, c->Cin, c->H, c->W), 1, 0);
        mmc_tensor *w = param(80 + k, 4, MMC_SHAPE(c->Cout, c->Cin, c->kh, c->kw), 0.3f, 0);
        mmc_tensor *b = c->bias ? param(90 + k, 1, MMC_SHAPE(c->Cout), 1, 0) : NULL;
        if (!c->gx) x->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        if (!c->gw) w->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        float *dy = malloc((size_t)ny * sizeof(float));
        mmc_rng r;
        mmc_rng_init(&r, 100 + k);
        mmc_rng_uniform(&r, dy, ny, -1, 1);
        double *y = calloc((size_t)ny, sizeof(double)), *dx = calloc((size_t)nx, sizeof(double));
        double *dw = calloc((size_t)nw, sizeof(double)), *db = calloc((size_t)c->Cout, sizeof(double));
        conv_direct(c, x->data, w->data, b ? b->data : NULL, dy, y, dx, dw, b ? db : NULL, Ho, Wo);
        float *first[4] = {NULL};   /* results of the first run, for the bitwise comparisons */
        for (int bu = 0; bu < 3; bu++)
            for (int th = 1; th <= 2; th++) {
#ifdef _OPENMP
                omp_set_num_threads(th);
#else
                if (th == 2) continue;
#endif
                if (budgets[bu]) setenv("MMC_CONV_COL_MB", budgets[bu], 1);
                else unsetenv("MMC_CONV_COL_MB");
                mmc_ctx *ctx = mmc_ctx_new();
                mmc_tensor *out = mmc_conv2d(ctx, x, w, b, c->stride, c->pad);
                memcpy(mmc_grad(ctx, out)->data, dy, (size_t)ny * sizeof(float));
                mmc_set_grad_enabled(ctx, false);
                mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
                CHECKF(max_rel(out->data, y, ny) < 1e-5, "conv2d case %zu budget %s: y", k, budgets[bu] ? budgets[bu] : "default");
                CHECK((x->grad != NULL) == c->gx && (w->grad != NULL) == c->gw);
                if (x->grad) CHECKF(max_rel(x->grad->data, dx, nx) < 1e-5, "conv2d case %zu budget %s: dx", k, budgets[bu] ? budgets[bu] : "default");
                if (w->grad) CHECKF(max_rel(w->grad->data, dw, nw) < 1e-5, "conv2d case %zu budget %s: dW", k, budgets[bu] ? budgets[bu] : "default");
                if (b) CHECKF(max_rel(b->grad->data, db, c->Cout) < 1e-5, "conv2d case %zu budget %s: db", k, budgets[bu] ? budgets[bu] : "default");
                /* a given blocking is bitwise the same on 1 and 2 threads */
                const mmc_tensor *res[4] = {out, x->grad, w->grad, b ? b->grad : NULL};
                for (int q = 0; q < 4; q++) {
                    if (!res[q]) continue;
                    if (th == 1) {
                        free(first[q]);
                        first[q] = malloc(mmc_nbytes(res[q]));
                        memcpy(first[q], res[q]->data, mmc_nbytes(res[q]));
                    } else {
                        CHECKF(memcmp(first[q], res[q]->data, mmc_nbytes(res[q])) == 0,
                               "conv2d case %zu budget %s: output %d differs between 1 and 2 threads", k,
                               budgets[bu] ? budgets[bu] : "default", q);
                    }
                }
                mmc_ctx_free(ctx);
                mmc_tensor *ts[3] = {x, w, b};
                for (int q = 0; q < 3; q++)
                    if (ts[q]) mmc_tensor_free(ts[q]->grad), ts[q]->grad = NULL;   /* fresh grads next run */
            }
        unsetenv("MMC_CONV_COL_MB");
        for (int q = 0; q < 4; q++) free(first[q]);
        free(dy), free(y), free(dx), free(dw), free(db);
        mmc_tensor_free(x), mmc_tensor_free(w), mmc_tensor_free(b);
    }
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
}

/* dw/db and the loss must be bitwise identical for 1 and 2 threads (fixed-order reductions) */
static void test_determinism(void) {
#ifdef _OPENMP
    float *res[2][4];
    int64_t R = 300, C = 256;
    for (int pass = 0; pass < 2; pass++) {
        omp_set_num_threads(pass == 0 ? 1 : 2);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *x = param(60, 2, MMC_SHAPE(R, C), 1, 0), *w = param(61, 1, MMC_SHAPE(C), 0.2f, 1);
        mmc_tensor *b = param(62, 1, MMC_SHAPE(C), 1, 0);
        mmc_tensor *y = mmc_layernorm(ctx, mmc_rmsnorm(ctx, x, w, 1e-6f), w, b, 1e-5f);
        mmc_rng r;
        mmc_rng_init(&r, 3);
        mmc_rng_uniform(&r, mmc_grad(ctx, y)->data, R * C, -1, 1);
        mmc_set_grad_enabled(ctx, false);
        mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
        mmc_tensor *outs[4] = {w->grad, b->grad, x->grad, y};
        for (int k = 0; k < 4; k++) {
            res[pass][k] = malloc(mmc_nbytes(outs[k]));
            memcpy(res[pass][k], outs[k]->data, mmc_nbytes(outs[k]));
        }
        CHECK(memcmp(res[pass][0], res[0][0], C * 4) == 0 && memcmp(res[pass][1], res[0][1], C * 4) == 0);
        CHECK(memcmp(res[pass][2], res[0][2], R * C * 4) == 0 && memcmp(res[pass][3], res[0][3], R * C * 4) == 0);
        mmc_ctx_free(ctx);
        mmc_tensor_free(x), mmc_tensor_free(w), mmc_tensor_free(b);
    }
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 4; k++) free(res[p][k]);
    omp_set_num_threads(2);
#endif
}

/* Programmer errors abort with a message naming the bad value: run the op in a child and
 * check it died with that message on stderr. */
typedef void (*abort_fn)(void);
static void expect_abort(const char *what, abort_fn fn, const char *needle) {
    fflush(NULL);
    int fd[2];
    if (pipe(fd) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn();
        _exit(0);   /* did not abort */
    }
    close(fd[1]);
    char buf[1024] = {0};
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)k;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFSIGNALED(status) && strstr(buf, needle), "%s: status %d, stderr '%s'", what, status, buf);
}
static void bad_embedding(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *tab = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(10, 4));
    int64_t v[3] = {1, 12, 2};
    mmc_embedding(ctx, tab, ids_tensor(MMC_I64, 1, MMC_SHAPE(3), v));
}
static void bad_target(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *lg = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(2, 7));
    int64_t v[2] = {-1, 3};
    mmc_cross_entropy(ctx, lg, ids_tensor(MMC_I32, 1, MMC_SHAPE(2), v), -100);
}
static void bad_linear(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_linear(ctx, mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(2, 7)), mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(3, 6)), NULL);
}
static void test_errors(void) {
    expect_abort("embedding id out of range", bad_embedding, "id 12 at position 1 is out of range [0, 10)");
    expect_abort("cross-entropy target out of range", bad_target, "target -1 at row 0 is out of range [0, 7)");
    expect_abort("linear shape mismatch", bad_linear, "[2, 7]");
}

int main(void) {
    test_errors();
    test_fixtures();
    test_gradchecks();
    test_bf16_weights();
    test_xent_edges();
    test_frozen_and_partial_grads();
    test_determinism();
    test_conv2d_blocking();
    return test_done("test_ops_nn");
}
