/* test_ops_elementwise.c — views & layout, elementwise ops, reductions and shape surgery
 * (src/ops/view.c, elementwise.c, shape.c):
 *   - finite-difference gradchecks for every op and broadcasting pattern
 *     (eps 1e-3 on f32 inputs, loss summed in double);
 *   - forward + backward against PyTorch fixtures from tools/ref/gen_elementwise.py;
 *   - views share storage; transpose -> contiguous -> reshape chains; kernel accuracy of the
 *     SIMD erf/exp paths against double precision; determinism across thread counts;
 *   - programmer errors in scatter/gather indices abort with a message (checked in a child). */
#include "test_util.h"
#include "elementwise.h"

#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ fixtures */
typedef mmc_tensor *(*fx_fn)(mmc_ctx *ctx, mmc_tensor **in);

/* Load inputs `names` (floats as f32 params requiring grad; "idx" as i64), run fn, compare
 * out with `out`, backprop r and compare each float input's grad with grad_<name>. */
static void fixture_case(const char *file, const char *const *names, int n, fx_fn fn,
                         double atol, double rtol, mmc_dtype out_dt) {
    char rel[256];
    snprintf(rel, sizeof rel, "elementwise/%s.safetensors", file);
    mmc_st *st = fixture_open(rel);
    if (!st) return;
    mmc_tensor *in[8];
    for (int i = 0; i < n; i++) {
        bool is_idx = strcmp(names[i], "idx") == 0;
        in[i] = fixture_tensor(st, names[i], is_idx ? MMC_I64 : MMC_F32);
        if (!is_idx) in[i]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    }
    mmc_tensor *want = fixture_tensor(st, "out", out_dt), *r = fixture_tensor(st, "r", MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *y = fn(ctx, in);
    char what[128];
    snprintf(what, sizeof what, "%s forward", file);
    CHECKF(mmc_same_shape(y, want), "%s: output shape", file);
    CHECK_CLOSE(y, want, atol, rtol, what);
    CHECK(mmc_requires_grad(y));
    memcpy(mmc_grad(ctx, y)->data, r->data, mmc_nbytes(r));
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], "idx") == 0) continue;
        char gname[40];
        snprintf(gname, sizeof gname, "grad_%s", names[i]);
        mmc_tensor *gw = fixture_tensor(st, gname, MMC_F32);
        snprintf(what, sizeof what, "%s %s", file, gname);
        CHECKF(in[i]->grad != NULL, "%s: no gradient", what);
        if (in[i]->grad) CHECK_CLOSE(in[i]->grad, gw, atol, rtol, what);
        mmc_tensor_free(gw);
    }
    mmc_ctx_free(ctx);
    for (int i = 0; i < n; i++) mmc_tensor_free(in[i]);
    mmc_tensor_free(want);
    mmc_tensor_free(r);
    mmc_st_close(st);
}

static mmc_tensor *f_add(mmc_ctx *c, mmc_tensor **in) { return mmc_add(c, in[0], in[1]); }
static mmc_tensor *f_mul(mmc_ctx *c, mmc_tensor **in) { return mmc_mul(c, in[0], in[1]); }
static mmc_tensor *f_scale(mmc_ctx *c, mmc_tensor **in) { return mmc_scale(c, in[0], 0.37f); }
static mmc_tensor *f_gelu(mmc_ctx *c, mmc_tensor **in) { return mmc_gelu(c, in[0]); }
static mmc_tensor *f_gelu_tanh(mmc_ctx *c, mmc_tensor **in) { return mmc_gelu_tanh(c, in[0]); }
static mmc_tensor *f_quick_gelu(mmc_ctx *c, mmc_tensor **in) { return mmc_quick_gelu(c, in[0]); }
static mmc_tensor *f_silu(mmc_ctx *c, mmc_tensor **in) { return mmc_silu(c, in[0]); }
static mmc_tensor *f_swiglu(mmc_ctx *c, mmc_tensor **in) { return mmc_swiglu(c, in[0], in[1]); }
static mmc_tensor *f_softmax(mmc_ctx *c, mmc_tensor **in) { return mmc_softmax(c, in[0]); }
static mmc_tensor *f_sum(mmc_ctx *c, mmc_tensor **in) { return mmc_sum(c, in[0]); }
static mmc_tensor *f_mean(mmc_ctx *c, mmc_tensor **in) { return mmc_mean(c, in[0]); }
static mmc_tensor *f_chain(mmc_ctx *c, mmc_tensor **in) {
    mmc_tensor *t = mmc_transpose(c, in[0], 0, 2);
    return mmc_reshape(c, mmc_contiguous(c, t), 2, MMC_SHAPE(4, -1));
}
static mmc_tensor *f_permute_narrow(mmc_ctx *c, mmc_tensor **in) {
    return mmc_narrow(c, mmc_permute(c, in[0], (const int[]){2, 0, 1}), 1, 1, 2);
}
static mmc_tensor *f_cast_bf16(mmc_ctx *c, mmc_tensor **in) { return mmc_cast(c, in[0], MMC_BF16); }
static mmc_tensor *f_concat1(mmc_ctx *c, mmc_tensor **in) { return mmc_concat(c, in, 3, 1); }
static mmc_tensor *f_concat2(mmc_ctx *c, mmc_tensor **in) { return mmc_concat(c, in, 2, -1); }
static mmc_tensor *f_gather(mmc_ctx *c, mmc_tensor **in) { return mmc_gather_rows(c, in[0], in[1]); }
static mmc_tensor *f_scatter(mmc_ctx *c, mmc_tensor **in) { return mmc_scatter_rows(c, in[0], in[1], in[2]); }

static void test_fixtures(void) {
    static const char *const AB[] = {"a", "b"}, *const X[] = {"x"}, *const GU[] = {"gate", "up"};
    static const char *const ABC[] = {"a", "b", "c"}, *const XI[] = {"x", "idx"};
    static const char *const DIS[] = {"dst", "idx", "src"};
    /* exact-arithmetic ops (add/mul/scale/views/copies): f32 rounding only -> 1e-6 */
    const char *adds[] = {"add_same", "add_bias", "add_bias_left", "add_scalar", "add_bcast"};
    for (int i = 0; i < 5; i++) fixture_case(adds[i], AB, 2, f_add, 1e-6, 1e-6, MMC_F32);
    const char *muls[] = {"mul_same", "mul_bias", "mul_bcast"};
    for (int i = 0; i < 3; i++) fixture_case(muls[i], AB, 2, f_mul, 1e-6, 1e-6, MMC_F32);
    fixture_case("scale", X, 1, f_scale, 1e-6, 1e-6, MMC_F32);
    /* transcendental activations: our SIMD exp/erf vs torch's (both ~1 ulp) -> 1e-6 rel of max */
    fixture_case("gelu", X, 1, f_gelu, 1e-6, 1e-6, MMC_F32);
    fixture_case("gelu_tanh", X, 1, f_gelu_tanh, 1e-6, 1e-6, MMC_F32);
    fixture_case("quick_gelu", X, 1, f_quick_gelu, 1e-6, 1e-6, MMC_F32);
    fixture_case("silu", X, 1, f_silu, 1e-6, 1e-6, MMC_F32);
    fixture_case("swiglu", GU, 2, f_swiglu, 1e-6, 1e-6, MMC_F32);
    fixture_case("softmax", X, 1, f_softmax, 1e-6, 1e-6, MMC_F32);
    /* reductions: we sum in double, torch in f32 -> 1e-6 relative */
    fixture_case("sum", X, 1, f_sum, 1e-6, 1e-6, MMC_F32);
    fixture_case("mean", X, 1, f_mean, 1e-6, 1e-6, MMC_F32);
    /* views and copies: exact */
    fixture_case("chain", X, 1, f_chain, 0, 0, MMC_F32);
    fixture_case("permute_narrow", X, 1, f_permute_narrow, 0, 0, MMC_F32);
    /* forward: RNE like torch, exact (checked below); backward: torch rounds the bf16 grad
     * to bf16 before casting it back, we keep f32 -> bf16 relative precision 2^-8 */
    fixture_case("cast_bf16", X, 1, f_cast_bf16, 0, 1.0 / 256, MMC_BF16);
    fixture_case("concat1", ABC, 3, f_concat1, 0, 0, MMC_F32);
    fixture_case("concat2", AB, 2, f_concat2, 0, 0, MMC_F32);
    fixture_case("gather_rows", XI, 2, f_gather, 1e-7, 0, MMC_F32);   /* repeated rows add */
    fixture_case("scatter_rows", DIS, 3, f_scatter, 0, 0, MMC_F32);
}

/* ------------------------------------------------------------------ gradchecks */
typedef struct { int op; int64_t i[4]; } gc_user;
static mmc_tensor *gc_ops(mmc_ctx *c, mmc_tensor **in, void *u) {
    gc_user *g = u;
    switch (g->op) {
    case 0: return mmc_add(c, in[0], in[1]);
    case 1: return mmc_mul(c, in[0], in[1]);
    case 2: return mmc_scale(c, in[0], -1.7f);
    case 3: return mmc_gelu(c, in[0]);
    case 4: return mmc_gelu_tanh(c, in[0]);
    case 5: return mmc_quick_gelu(c, in[0]);
    case 6: return mmc_silu(c, in[0]);
    case 7: return mmc_swiglu(c, in[0], in[1]);
    case 8: return mmc_softmax(c, in[0]);
    case 9: return mmc_sum(c, in[0]);
    case 10: return mmc_mean(c, in[0]);
    case 11: return mmc_transpose(c, in[0], (int)g->i[0], (int)g->i[1]);
    case 12: return mmc_permute(c, in[0], (const int[]){1, 2, 0});
    case 13: return mmc_narrow(c, in[0], (int)g->i[0], g->i[1], g->i[2]);
    case 14: /* transpose -> contiguous -> reshape -> mul (a chain through several views) */
        return mmc_mul(c, mmc_reshape(c, mmc_contiguous(c, mmc_transpose(c, in[0], 0, 1)), 2, MMC_SHAPE(-1, 6)), in[1]);
    case 15: /* reshape of a non-contiguous view copies; then gelu of a narrowed transpose */
        return mmc_gelu(c, mmc_narrow(c, mmc_reshape(c, mmc_transpose(c, in[0], 1, 2), 2, MMC_SHAPE(6, 4)), 1, 1, 2));
    case 16: return mmc_concat(c, in, 2, (int)g->i[0]);
    case 17: { mmc_tensor *p[3]; mmc_split(c, in[0], 2, 3, (const int64_t[]){1, 2, 1}, p);
               /* combine the parts with different weights so each split's grad is distinct */
               return mmc_add(c, mmc_sum(c, mmc_mul(c, p[0], p[0])), mmc_add(c, mmc_sum(c, mmc_scale(c, p[1], 3.0f)), mmc_sum(c, mmc_silu(c, p[2])))); }
    case 18: return mmc_gather_rows(c, in[0], in[1]);
    case 19: return mmc_scatter_rows(c, in[0], in[1], in[2]);
    case 20: /* cast round trip f32 -> f16 -> f32 passes gradients */
        return mmc_mul(c, mmc_cast(c, mmc_cast(c, in[0], MMC_F16), MMC_F32), in[0]);
    default: return NULL;
    }
}

static mmc_tensor *P(uint64_t seed, int nd, const int64_t *sh) { return randn_param(seed, nd, sh, 1.0f); }

static void gc(const char *name, int op, mmc_tensor **in, int n, double atol, double rtol) {
    gc_user u = {.op = op};
    gradcheck(name, gc_ops, in, n, &u, 1e-3, atol, rtol, 200);
}

static void free_all(mmc_tensor **t, int n) { for (int i = 0; i < n; i++) mmc_tensor_free(t[i]); }

static void test_gradchecks(void) {
    /* eps 1e-3 on f32 inputs: the central difference carries ~1e-4 absolute noise from f32
     * outputs, so atol 2e-3 + rtol 1e-2 (analytic vs numeric). */
    const double AT = 2e-3, RT = 1e-2;
    struct { const char *name; int op; int na; int64_t sa[4]; int nb; int64_t sb[4]; } bin[] = {
        {"add same", 0, 2, {3, 5}, 2, {3, 5}},
        {"add bias", 0, 3, {2, 3, 4}, 1, {4}},
        {"add bias 2d", 0, 3, {2, 3, 4}, 2, {3, 4}},
        {"add bias left", 0, 1, {4}, 2, {3, 4}},
        {"add scalar", 0, 2, {3, 4}, 0, {0}},
        {"add outer", 0, 2, {3, 1}, 2, {1, 4}},
        {"add middle", 0, 3, {2, 3, 4}, 2, {3, 1}},
        {"mul same", 1, 2, {3, 5}, 2, {3, 5}},
        {"mul bias", 1, 3, {2, 3, 4}, 1, {4}},
        {"mul bias left", 1, 2, {1, 4}, 3, {2, 3, 4}},
        {"mul scalar", 1, 1, {1}, 2, {3, 4}},
        {"mul outer", 1, 2, {3, 1}, 3, {2, 1, 4}},
        {"mul middle", 1, 3, {2, 1, 4}, 2, {3, 1}},
    };
    for (size_t k = 0; k < sizeof bin / sizeof bin[0]; k++) {
        mmc_tensor *in[2] = {P(10 + k, bin[k].na, bin[k].sa), P(50 + k, bin[k].nb, bin[k].sb)};
        gc(bin[k].name, bin[k].op, in, 2, AT, RT);
        free_all(in, 2);
    }
    const char *un[] = {"scale", "gelu", "gelu_tanh", "quick_gelu", "silu", NULL, "softmax", "sum", "mean"};
    for (int op = 2; op <= 10; op++) {
        if (op == 7) continue;
        mmc_tensor *x = randn_param(100 + op, 2, MMC_SHAPE(4, 9), 2.0f);
        gc(un[op - 2], op, &x, 1, AT, RT);
        mmc_tensor_free(x);
    }
    { mmc_tensor *in[2] = {randn_param(200, 2, MMC_SHAPE(3, 7), 2.0f), P(201, 2, MMC_SHAPE(3, 7))};
      gc("swiglu", 7, in, 2, AT, RT); free_all(in, 2); }
    /* views: exact linear maps, so the central difference is exact up to f32 rounding */
    { mmc_tensor *x = P(300, 3, MMC_SHAPE(2, 3, 4));
      gc_user u = {.op = 11, .i = {0, 2}};
      gradcheck("transpose", gc_ops, &x, 1, &u, 1e-3, AT, RT, 200);
      gc("permute", 12, &x, 1, AT, RT);
      gc_user v = {.op = 13, .i = {2, 1, 2}};
      gradcheck("narrow", gc_ops, &x, 1, &v, 1e-3, AT, RT, 200);
      gc_user w = {.op = 13, .i = {1, 2, 1}};
      gradcheck("narrow mid", gc_ops, &x, 1, &w, 1e-3, AT, RT, 200);
      mmc_tensor *in[2] = {x, P(301, 2, MMC_SHAPE(4, 6))};
      gc("transpose->contiguous->reshape->mul", 14, in, 2, AT, RT);
      gc("reshape(non-contig)->narrow->gelu", 15, &x, 1, AT, RT);
      gc("split", 17, &x, 1, AT, RT);
      gc("cast f16 round trip", 20, &x, 1, 5e-2, 5e-2);  /* f16 rounding of one factor: loose */
      mmc_tensor_free(in[1]);
      mmc_tensor *y = P(302, 3, MMC_SHAPE(2, 3, 2));
      mmc_tensor *cc[2] = {x, y};
      gc_user cu = {.op = 16, .i = {2}};
      gradcheck("concat last", gc_ops, cc, 2, &cu, 1e-3, AT, RT, 200);
      mmc_tensor_free(x); mmc_tensor_free(y); }
    { mmc_tensor *a = P(310, 2, MMC_SHAPE(2, 5)), *b = P(311, 2, MMC_SHAPE(3, 5));
      mmc_tensor *cc[2] = {a, b};
      gc_user cu = {.op = 16, .i = {0}};
      gradcheck("concat first", gc_ops, cc, 2, &cu, 1e-3, AT, RT, 200);
      free_all(cc, 2); }
    { mmc_tensor *x = P(320, 2, MMC_SHAPE(5, 6)), *idx = mmc_tensor_new(MMC_I32, 1, MMC_SHAPE(7));
      int32_t id[7] = {4, 0, 4, 2, 2, 4, 1};
      memcpy(idx->data, id, sizeof id);
      mmc_tensor *in[2] = {x, idx};
      gc("gather_rows (repeats)", 18, in, 2, AT, RT);
      mmc_tensor *src = P(321, 2, MMC_SHAPE(3, 6)), *sidx = mmc_tensor_new(MMC_I64, 1, MMC_SHAPE(3));
      int64_t sd[3] = {3, 0, 4};
      memcpy(sidx->data, sd, sizeof sd);
      mmc_tensor *sin[3] = {x, sidx, src};
      gc("scatter_rows", 19, sin, 3, AT, RT);
      mmc_tensor_free(x); mmc_tensor_free(idx); mmc_tensor_free(src); mmc_tensor_free(sidx); }
}

/* ------------------------------------------------------------------ views */
static void test_views(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(2, 3, 4));
    for (int i = 0; i < 24; i++) mmc_set_flat(x, i, i);
    mmc_tensor *t = mmc_transpose(ctx, x, 0, 2);   /* [4, 3, 2] */
    CHECK(t->data == x->data && t->shape[0] == 4 && t->shape[2] == 2);
    CHECK(t->stride[0] == 1 && t->stride[1] == 4 && t->stride[2] == 12);
    CHECK(!mmc_is_contiguous(t));
    CHECK(mmc_get_flat(t, 1) == 12);                /* t[0,0,1] = x[1,0,0] */
    mmc_set_flat(t, 1, -5);                         /* writes through to x */
    CHECK(mmc_get_flat(x, 12) == -5);
    mmc_tensor *nr = mmc_narrow(ctx, x, 1, 1, 2);   /* [2, 2, 4] */
    CHECK((float *)nr->data == (float *)x->data + 4 && nr->stride[0] == 12 && nr->stride[1] == 4);
    mmc_tensor *r1 = mmc_reshape(ctx, x, 2, MMC_SHAPE(-1, 8));   /* contiguous: a view */
    CHECK(r1->data == x->data && r1->shape[0] == 3 && r1->shape[1] == 8);
    mmc_tensor *r2 = mmc_reshape(ctx, t, 2, MMC_SHAPE(4, 6));    /* non-contiguous: a copy */
    CHECK(r2->data != x->data && mmc_is_contiguous(r2));
    for (int i = 0; i < 24; i++) CHECK(mmc_get_flat(r2, i) == mmc_get_flat(t, i));
    CHECK(mmc_contiguous(ctx, x) == x);
    mmc_tensor *c = mmc_contiguous(ctx, t);
    for (int i = 0; i < 24; i++) CHECK(mmc_get_flat(c, i) == mmc_get_flat(t, i));
    mmc_tensor *p = mmc_permute(ctx, x, (const int[]){1, 2, 0});  /* [3, 4, 2] */
    CHECK(p->data == x->data && p->stride[0] == 4 && p->stride[1] == 1 && p->stride[2] == 12);
    mmc_tensor *parts[2];
    mmc_split(ctx, x, 2, 2, (const int64_t[]){1, 3}, parts);
    CHECK(parts[0]->data == x->data && parts[1]->shape[2] == 3 && (float *)parts[1]->data == (float *)x->data + 1);
    /* bf16 views share storage too (element size 2) */
    mmc_tensor *h = mmc_cast(ctx, x, MMC_BF16);
    mmc_tensor *hn = mmc_narrow(ctx, h, 2, 1, 2);
    CHECK((uint16_t *)hn->data == (uint16_t *)h->data + 1);
    CHECK(mmc_get_flat(hn, 0) == 1);
    /* concat of a non-contiguous view and gather of bf16 rows work by layout alone */
    mmc_tensor *cc = mmc_concat(ctx, (mmc_tensor *[]){t, t}, 2, 0);   /* [8, 3, 2] */
    for (int i = 0; i < 24; i++) CHECK(mmc_get_flat(cc, 24 + i) == mmc_get_flat(t, i));
    mmc_ctx_free(ctx);

    /* bf16 cast is bit-exact against torch (the fixture check above is loose for its grad) */
    mmc_st *st = fixture_open("elementwise/cast_bf16.safetensors");
    if (st) {
        mmc_tensor *fx = fixture_tensor(st, "x", MMC_F32), *fo = fixture_tensor(st, "out", MMC_BF16);
        ctx = mmc_ctx_new();
        mmc_tensor *o = mmc_cast(ctx, fx, MMC_BF16);
        CHECK(o->dtype == MMC_BF16 && memcmp(o->data, fo->data, mmc_nbytes(fo)) == 0);
        mmc_ctx_free(ctx);
        mmc_tensor_free(fx); mmc_tensor_free(fo);
        mmc_st_close(st);
    }

    /* gradients through view -> op chains land at the right positions of the base */
    ctx = mmc_ctx_new();
    mmc_tensor *w = P(400, 2, MMC_SHAPE(3, 4));
    mmc_tensor *wt = mmc_transpose(ctx, w, 0, 1);                  /* [4, 3] */
    mmc_tensor *s = mmc_sum(ctx, mmc_scale(ctx, mmc_narrow(ctx, wt, 0, 1, 2), 2.0f));  /* w[:, 1:3] */
    mmc_backward(ctx, s);
    for (int i = 0; i < 12; i++) {
        int col = i % 4;
        CHECK(((float *)w->grad->data)[i] == ((col == 1 || col == 2) ? 2.0f : 0.0f));
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(w);
}

/* ------------------------------------------------------------------ kernels */
static void test_kernel_accuracy(void) {
    /* dense sweep vs double precision: gelu/silu/softmax-exp within ~1e-6 relative */
    enum { N = 40001 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = -20.0f + 40.0f * (float)i / (N - 1);
    ew_gelu_f32(y, x, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
        worst = fmax(worst, fabs(y[i] - ref) / fmax(1.0, fabs(ref)));
    }
    CHECKF(worst < 4e-7, "gelu max rel err %.3g", worst);   /* f32 output: ulp-level */
    ew_xsigmoid_f32(y, x, 1.0f, N);
    worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = x[i] / (1.0 + exp(-(double)x[i]));
        worst = fmax(worst, fabs(y[i] - ref) / fmax(1e-30, fabs(ref)));
    }
    CHECKF(worst < 1e-6, "silu max rel err %.3g", worst);
    /* gelu backward against the double-precision derivative */
    for (int i = 0; i < N; i++) { g[i] = 0; y[i] = 1; }
    ew_gelu_bwd_acc_f32(g, x, y, N);
    worst = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i], ref = 0.5 * (1 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2 * M_PI);
        worst = fmax(worst, fabs(g[i] - ref) / fmax(1.0, fabs(ref)));
    }
    CHECKF(worst < 1e-6, "gelu' max err %.3g", worst);
    /* NaN and inf propagate like libm */
    float sp[4] = {NAN, INFINITY, -INFINITY, 100.0f}, so[4];
    ew_gelu_f32(so, sp, 4);
    /* gelu(-inf) = -inf * 0 = nan as in torch; torch also gives nan for gelu(+inf), we
     * give the limit +inf */
    CHECK(isnan(so[0]) && so[1] == INFINITY && isnan(so[2]) && so[3] == 100.0f);
    ew_xsigmoid_f32(so, sp, 1.0f, 4);   /* torch silu: nan, inf, nan, 100 */
    CHECK(isnan(so[0]) && so[1] == INFINITY && isnan(so[2]) && so[3] == 100.0f);
    free(x); free(y); free(g);
}

static void test_determinism(void) {
    /* big enough for the parallel paths; results must not depend on the thread count */
    int64_t R = 300, C = 257, n = R * C;
    mmc_tensor *a = randn_param(500, 2, MMC_SHAPE(R, C), 1.0f), *b = randn_param(501, 1, MMC_SHAPE(C), 1.0f);
    float *res[2][3];
    int nt0 = mmc_get_num_threads();
    for (int t = 0; t < 2; t++) {
        mmc_set_num_threads(t ? 2 : 1);
        mmc_zero_grad((mmc_tensor *[]){a, b}, 2);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *y = mmc_softmax(ctx, mmc_mul(ctx, a, b));
        mmc_tensor *s = mmc_mean(ctx, mmc_mul(ctx, y, a));
        mmc_backward(ctx, s);
        res[t][0] = malloc(sizeof(float)); res[t][0][0] = *(float *)s->data;
        res[t][1] = malloc(n * sizeof(float)); memcpy(res[t][1], a->grad->data, n * sizeof(float));
        res[t][2] = malloc(C * sizeof(float)); memcpy(res[t][2], b->grad->data, C * sizeof(float));
        mmc_ctx_free(ctx);
    }
    mmc_set_num_threads(nt0);
    CHECK(memcmp(res[0][0], res[1][0], sizeof(float)) == 0);
    CHECK(memcmp(res[0][1], res[1][1], n * sizeof(float)) == 0);
    CHECK(memcmp(res[0][2], res[1][2], C * sizeof(float)) == 0);
    /* large sum in double: exact for integers */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 1, MMC_SHAPE(1000003));
    for (int64_t i = 0; i < 1000003; i++) ((float *)x->data)[i] = (float)(i % 7);
    double want = 0;
    for (int64_t i = 0; i < 1000003; i++) want += (double)(i % 7);
    CHECK_NEAR(*(float *)mmc_sum(ctx, x)->data, (float)want, 0);
    mmc_ctx_free(ctx);
    /* large bias add + colsum vs naive */
    ctx = mmc_ctx_new();
    mmc_zero_grad((mmc_tensor *[]){a, b}, 2);
    mmc_tensor *y = mmc_add(ctx, a, b);
    double md = 0;
    for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(((float *)y->data)[i] - (((float *)a->data)[i] + ((float *)b->data)[i % C])));
    CHECK(md == 0);
    mmc_backward(ctx, mmc_sum(ctx, y));
    for (int64_t c = 0; c < C; c++) CHECK(((float *)b->grad->data)[c] == (float)R);
    mmc_ctx_free(ctx);
    for (int t = 0; t < 2; t++) for (int k = 0; k < 3; k++) free(res[t][k]);
    mmc_tensor_free(a); mmc_tensor_free(b);

    /* one-pass bias-add backward (row chunks of partial sums) vs naive double column sums,
     * bitwise the same with 1 and 2 threads; also with gf == NULL (frozen full operand) */
    float *g = malloc(n * sizeof(float)), *gf[2], *gb[2];
    for (int64_t i = 0; i < n; i++) g[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (int t = 0; t < 2; t++) {
        mmc_set_num_threads(t ? 2 : 1);
        gf[t] = malloc(n * sizeof(float));
        gb[t] = malloc(C * sizeof(float));
        for (int64_t i = 0; i < n; i++) gf[t][i] = 0.25f;
        for (int64_t c = 0; c < C; c++) gb[t][c] = 1.0f;
        ew_add_bias_bwd_acc_f32(gf[t], gb[t], g, R, C);
    }
    mmc_set_num_threads(nt0);
    CHECK(memcmp(gf[0], gf[1], n * sizeof(float)) == 0 && memcmp(gb[0], gb[1], C * sizeof(float)) == 0);
    double mf = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) mf = fmax(mf, fabs(gf[0][i] - (0.25f + g[i])));
    for (int64_t c = 0; c < C; c++) {
        double want = 1.0;
        for (int64_t r = 0; r < R; r++) want += g[r * C + c];
        mb = fmax(mb, fabs(gb[0][c] - want) / fmax(1.0, fabs(want)));
    }
    CHECK(mf == 0);
    CHECK(mb <= 1e-7); /* f32 rounding of a double sum */
    for (int64_t c = 0; c < C; c++) gb[1][c] = 1.0f;
    ew_add_bias_bwd_acc_f32(NULL, gb[1], g, R, C);
    CHECK(memcmp(gb[0], gb[1], C * sizeof(float)) == 0);
    for (int t = 0; t < 2; t++) { free(gf[t]); free(gb[t]); }
    free(g);
}

/* ------------------------------------------------------------------ misuse aborts */
static int dies(void (*fn)(void)) {
    fflush(stdout); fflush(stderr);
    pid_t p = fork();
    if (p == 0) { freopen("/dev/null", "w", stderr); fn(); _exit(0); }
    int st = 0;
    waitpid(p, &st, 0);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
static void scatter_dup(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *d = mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(4, 3)), *s = mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(2, 3));
    mmc_tensor *i = mmc_zeros(ctx, MMC_I32, 1, MMC_SHAPE(2));
    ((int32_t *)i->data)[0] = 1; ((int32_t *)i->data)[1] = 1;
    mmc_scatter_rows(ctx, d, i, s);
}
static void gather_oob(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *d = mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(4, 3)), *i = mmc_zeros(ctx, MMC_I64, 1, MMC_SHAPE(2));
    ((int64_t *)i->data)[1] = 4;
    mmc_gather_rows(ctx, d, i);
}
static void bad_broadcast(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_add(ctx, mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(4, 3)), mmc_zeros(ctx, MMC_F32, 1, MMC_SHAPE(4)));
}
static void test_misuse(void) {
    CHECK(dies(scatter_dup));
    CHECK(dies(gather_oob));
    CHECK(dies(bad_broadcast));
}

int main(void) {
    test_views();
    test_fixtures();
    test_gradchecks();
    test_kernel_accuracy();
    test_determinism();
    test_misuse();
    return test_done("test_ops_elementwise");
}
