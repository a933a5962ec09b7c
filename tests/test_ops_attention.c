/* test_ops_attention.c — mmc_attention: finite-difference gradchecks on small shapes; the
 * tiled kernels vs a naive reference (materialised softmax in double) at shapes spanning
 * several tiles, forward and backward, for every mask kind, GQA, D != Dv, head_dim 64 / 80 /
 * 128, odd lengths, strided q/k/v views and the decode path, under the tiling derived from
 * this machine's caches and under forced small and odd tilings (so every remainder path of
 * the micro-kernels runs); thread-count determinism; the vectorised exp2's error bound; the
 * tiling model on a table of caches; and PyTorch fixtures (tools/ref/gen_attention.py,
 * F.scaled_dot_product_attention). */
#include "test_util.h"
#include "attention.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    bool causal;
    const int32_t *cu;
    int n_seqs;
} cfg;

static mmc_tensor *attn_fn(mmc_ctx *ctx, mmc_tensor **in, void *user) {
    cfg *c = user;
    mmc_attn_opts o = {.causal = c->causal, .cu_seqlens = c->cu, .n_seqs = c->n_seqs};
    return mmc_attention(ctx, in[0], in[1], in[2], &o);
}

/* element (b, t, h, d) of a 4-d tensor with arbitrary strides */
static inline double at4(const mmc_tensor *x, int b, int t, int h, int d) {
    return ((const float *)x->data)[b * x->stride[0] + t * x->stride[1] + h * x->stride[2] + d * x->stride[3]];
}

/* Naive attention in double. Outputs contiguous double arrays: o [B,T,Hq,Dv]; with dout
 * (contiguous f32 [B,T,Hq,Dv]) also dq, dk, dv (same shapes as q, k, v, contiguous). */
static void naive(const mmc_tensor *q, const mmc_tensor *k, const mmc_tensor *v, const cfg *c,
                  const float *dout, double *o, double *dq, double *dk, double *dv) {
    int B = q->shape[0], T = q->shape[1], Hq = q->shape[2], D = q->shape[3];
    int S = k->shape[1], Hkv = k->shape[2], Dv = v->shape[3], G = Hq / Hkv;
    double scale = 1.0 / sqrt((double)D);
    double *p = malloc(sizeof(double) * S), *dp = malloc(sizeof(double) * S);
    if (dq) memset(dq, 0, sizeof(double) * B * T * Hq * D);
    if (dk) memset(dk, 0, sizeof(double) * B * S * Hkv * D);
    if (dv) memset(dv, 0, sizeof(double) * B * S * Hkv * Dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) {
                int hk = h / G, lo = 0, hi = S;
                if (c->cu) {
                    for (int i = 0; i < c->n_seqs; i++)
                        if (t >= c->cu[i] && t < c->cu[i + 1]) { lo = c->cu[i]; hi = c->cu[i + 1]; }
                    if (c->causal) hi = t + 1;
                } else if (c->causal) {
                    hi = t + S - T + 1;
                    if (hi > S) hi = S;
                    if (hi < 0) hi = 0;
                }
                double mx = -INFINITY, sum = 0;
                for (int s = lo; s < hi; s++) {
                    double a = 0;
                    for (int d = 0; d < D; d++) a += at4(q, b, t, h, d) * at4(k, b, s, hk, d);
                    p[s] = a * scale;
                    if (p[s] > mx) mx = p[s];
                }
                for (int s = lo; s < hi; s++) sum += (p[s] = exp(p[s] - mx));
                double *orow = o + (((int64_t)b * T + t) * Hq + h) * Dv;
                for (int e = 0; e < Dv; e++) {
                    double a = 0;
                    for (int s = lo; s < hi; s++) a += p[s] / sum * at4(v, b, s, hk, e);
                    orow[e] = hi > lo ? a : 0;
                }
                if (!dout || hi <= lo) continue;
                const float *g = dout + (((int64_t)b * T + t) * Hq + h) * Dv;
                double di = 0;
                for (int s = lo; s < hi; s++) {
                    p[s] /= sum;
                    double a = 0;
                    for (int e = 0; e < Dv; e++) a += g[e] * at4(v, b, s, hk, e);
                    dp[s] = a;
                    di += a * p[s];
                }
                for (int s = lo; s < hi; s++) {
                    double ds = p[s] * (dp[s] - di) * scale;
                    for (int e = 0; e < Dv; e++) dv[(((int64_t)b * S + s) * Hkv + hk) * Dv + e] += p[s] * g[e];
                    for (int d = 0; d < D; d++) {
                        dq[(((int64_t)b * T + t) * Hq + h) * D + d] += ds * at4(k, b, s, hk, d);
                        dk[(((int64_t)b * S + s) * Hkv + hk) * D + d] += ds * at4(q, b, t, h, d);
                    }
                }
            }
    free(p);
    free(dp);
}

static double maxdiff(const float *a, const double *b, int64_t n, double *maxref) {
    double m = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= m)) m = d;   /* NaN -> NaN */
        r = fmax(r, fabs(b[i]));
    }
    if (maxref) *maxref = r;
    return m;
}

/* Fill a tensor (any strides) with N(0, 1) from seed. */
static void fill_randn(mmc_tensor *x, uint64_t seed) {
    int64_t n = mmc_numel(x);
    float *tmp = malloc(sizeof(float) * n);
    mmc_rng r;
    mmc_rng_init(&r, seed);
    mmc_rng_normal(&r, tmp, n, 0, 1);
    for (int64_t i = 0; i < n; i++) mmc_set_flat(x, i, tmp[i]);
    free(tmp);
}

/* Tiled vs naive, forward and backward. fused: q, k, v are views into one [B, T, Hq+2Hkv, D]
 * buffer (as slices of a fused qkv projection; needs T == S, D == Dv). */
static void check_vs_naive(const char *what, int B, int T, int S, int Hq, int Hkv, int D, int Dv,
                           cfg c, bool fused) {
    mmc_tensor *q, *k, *v, *buf = NULL;
    if (fused) {
        int H3 = Hq + 2 * Hkv;
        buf = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, T, H3, D));
        q = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(B, T, Hq, D), buf->data);
        k = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(B, S, Hkv, D), (float *)buf->data + Hq * D);
        v = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(B, S, Hkv, Dv), (float *)buf->data + (Hq + Hkv) * D);
        for (mmc_tensor **t = (mmc_tensor *[]){q, k, v, NULL}; *t; t++) {
            (*t)->stride[0] = (int64_t)T * H3 * D;
            (*t)->stride[1] = (int64_t)H3 * D;
        }
    } else {
        q = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, T, Hq, D));
        k = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, S, Hkv, D));
        v = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(B, S, Hkv, Dv));
    }
    fill_randn(q, 11);
    fill_randn(k, 12);
    fill_randn(v, 13);
    q->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    k->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    v->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    int64_t no = (int64_t)B * T * Hq * Dv, nq = (int64_t)B * T * Hq * D, nk = (int64_t)B * S * Hkv * D,
            nv = (int64_t)B * S * Hkv * Dv;
    float *r = malloc(sizeof(float) * no);
    mmc_rng rng;
    mmc_rng_init(&rng, 77);
    mmc_rng_uniform(&rng, r, no, -1, 1);
    double *o = malloc(sizeof(double) * no), *dq = malloc(sizeof(double) * nq),
           *dk = malloc(sizeof(double) * nk), *dv = malloc(sizeof(double) * nv);
    naive(q, k, v, &c, r, o, dq, dk, dv);

    float *res[2][4];
    for (int pass = 0; pass < 2; pass++) {   /* 2 threads, then 1: results must be identical */
        mmc_set_num_threads(pass == 0 ? 2 : 1);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_tensor *y = attn_fn(ctx, (mmc_tensor *[]){q, k, v}, &c);
        memcpy(mmc_grad(ctx, y)->data, r, sizeof(float) * no);
        mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
        res[pass][0] = malloc(sizeof(float) * no);
        memcpy(res[pass][0], y->data, sizeof(float) * no);
        mmc_tensor *g[3] = {q->grad, k->grad, v->grad};
        int64_t ns[3] = {nq, nk, nv};
        for (int i = 0; i < 3; i++) {
            res[pass][i + 1] = malloc(sizeof(float) * ns[i]);
            memcpy(res[pass][i + 1], g[i]->data, sizeof(float) * ns[i]);
            memset(g[i]->data, 0, sizeof(float) * ns[i]);
        }
        mmc_ctx_free(ctx);
    }
    mmc_set_num_threads(2);
    /* f32 tiles vs double: outputs are O(1); errors ~1e-6 relative. atol 2e-5 + 1e-4 * max|ref| */
    double ref, d;
    const char *names[4] = {"out", "dq", "dk", "dv"};
    double *refs[4] = {o, dq, dk, dv};
    int64_t ns[4] = {no, nq, nk, nv};
    for (int i = 0; i < 4; i++) {
        d = maxdiff(res[0][i], refs[i], ns[i], &ref);
        CHECKF(d <= 2e-5 + 1e-4 * ref, "%s %s: max|diff| %.3g (max|ref| %.3g)", what, names[i], d, ref);
        CHECKF(memcmp(res[0][i], res[1][i], sizeof(float) * ns[i]) == 0,
               "%s %s: 1 and 2 threads differ", what, names[i]);
        free(res[0][i]);
        free(res[1][i]);
    }
    free(r); free(o); free(dq); free(dk); free(dv);
    mmc_tensor_free(q);
    mmc_tensor_free(k);
    mmc_tensor_free(v);
    if (buf) mmc_tensor_free(buf);
}

static void vs_naive_set(void) {
    check_vs_naive("full T=S=200 D=64", 1, 200, 200, 2, 2, 64, 64, (cfg){0}, false);
    check_vs_naive("causal T=S=200 D=64 gqa", 2, 200, 200, 4, 2, 64, 64, (cfg){.causal = true}, false);
    check_vs_naive("causal T=70 S=200", 1, 70, 200, 2, 1, 32, 32, (cfg){.causal = true}, false);
    check_vs_naive("causal T=150 S=100 (empty rows)", 1, 150, 100, 2, 2, 16, 16, (cfg){.causal = true}, false);
    check_vs_naive("full D=48 Dv=80", 1, 130, 90, 3, 1, 48, 80, (cfg){0}, false);
    check_vs_naive("decode T=1", 2, 1, 150, 4, 2, 64, 64, (cfg){.causal = true}, false);
    check_vs_naive("fused qkv views causal", 1, 100, 100, 4, 2, 32, 32, (cfg){.causal = true}, true);
    static const int32_t cu[4] = {0, 70, 75, 230};
    check_vs_naive("varlen 3 seqs", 1, 230, 230, 2, 1, 64, 64, (cfg){.cu = cu, .n_seqs = 3}, false);
    check_vs_naive("varlen 3 seqs causal", 1, 230, 230, 4, 2, 40, 40,
                   (cfg){.causal = true, .cu = cu, .n_seqs = 3}, true);
    /* the head dims of the models (Qwen2 64, Qwen2-VL vision 80, Llama / Flux 128), odd T */
    check_vs_naive("full D=80 odd T=131", 1, 131, 131, 3, 3, 80, 80, (cfg){0}, false);
    check_vs_naive("causal D=80 gqa T=97", 1, 97, 97, 4, 2, 80, 80, (cfg){.causal = true}, false);
    check_vs_naive("full D=128 T=77 S=45", 1, 77, 45, 2, 1, 128, 128, (cfg){0}, false);
    check_vs_naive("causal D=128 gqa T=S=99", 1, 99, 99, 4, 1, 128, 128, (cfg){.causal = true}, false);
    check_vs_naive("causal D=64 gqa T=S=131", 1, 131, 131, 6, 2, 64, 64, (cfg){.causal = true}, true);
    static const int32_t cu2[5] = {0, 1, 64, 65, 161};
    check_vs_naive("varlen causal D=80 (1-token seqs)", 1, 161, 161, 2, 2, 80, 80,
                   (cfg){.causal = true, .cu = cu2, .n_seqs = 4}, false);
}

static void test_vs_naive(void) {
    /* under this machine's tiling: shapes past one forward query tile (up to 512 rows) */
    check_vs_naive("full D=80 T=S=600", 1, 600, 600, 2, 2, 80, 80, (cfg){0}, false);
    check_vs_naive("causal D=64 gqa T=S=560", 1, 560, 560, 2, 1, 64, 64, (cfg){.causal = true}, false);
    vs_naive_set();
    /* forced tilings: small tiles (many tiles, every remainder), then odd sizes */
    static const mmc_attn_tiling forced[2] = {{32, 16, 16, 32}, {48, 80, 40, 24}};
    for (int i = 0; i < 2; i++) {
        mmc_attn_force_tiles(&forced[i]);
        vs_naive_set();
    }
    mmc_attn_force_tiles(NULL);
}

/* The vectorised exp2 (attention.c): <= 2e-7 relative on [-126, 0] (bound stated there:
 * 1.6e-7 measured), exactly 0 below -126 and at -inf. */
static void test_exp2(void) {
    const int64_t n = 126 * 65536 + 1;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) x[i] = -(float)i / 65536.0f;
    mmc_attn_exp2_f32(x, y, n);
    double worst = 0, at = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = exp2((double)x[i]), e = fabs(y[i] - r) / r;
        if (!(e <= worst)) { worst = e; at = x[i]; }
    }
    CHECKF(worst <= 2e-7, "exp2: max relative error %.3g at x = %g (bound 2e-7)", worst, at);
    float lo[4] = {-126.5f, -150.0f, -1e30f, -INFINITY}, ylo[4];
    mmc_attn_exp2_f32(lo, ylo, 4);
    for (int i = 0; i < 4; i++) CHECKF(ylo[i] == 0.0f, "exp2(%g) = %g, want 0", lo[i], ylo[i]);
    free(x);
    free(y);
}

/* The tiling model on a table of caches: Zen 5 (48 KiB L1d, 1 MiB L2), Emerald Rapids
 * (48 KiB, 2 MiB), a small core (32 KiB, 256 KiB), unknown caches (0: the small core). Each
 * tiling must satisfy the model's constraints; the Zen 5 head_dim 80 row is the one measured
 * there. */
static void test_tiles(void) {
    static const struct { int64_t l1, l2; int D; mmc_attn_tiling want; } tab[] = {
        {48 << 10, 1 << 20, 80, {512, 64, 64, 256}},
        {48 << 10, 1 << 20, 64, {512, 64, 64, 256}},
        {48 << 10, 1 << 20, 128, {384, 48, 64, 256}},
        {48 << 10, 2 << 20, 80, {512, 64, 64, 256}},
        {32 << 10, 256 << 10, 64, {128, 64, 64, 64}},
        {32 << 10, 256 << 10, 128, {64, 32, 64, 64}},
        {0, 0, 64, {128, 64, 64, 64}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        mmc_attn_tiling t = mmc_attn_tiles(tab[i].D, tab[i].D, tab[i].l1, tab[i].l2);
        CHECKF(t.fwd_br == tab[i].want.fwd_br && t.fwd_bc == tab[i].want.fwd_bc &&
                   t.bwd_br == tab[i].want.bwd_br && t.bwd_bc == tab[i].want.bwd_bc,
               "tiles L1d %lld L2 %lld D %d: got %d,%d,%d,%d want %d,%d,%d,%d", (long long)tab[i].l1,
               (long long)tab[i].l2, tab[i].D, t.fwd_br, t.fwd_bc, t.bwd_br, t.bwd_bc, tab[i].want.fwd_br,
               tab[i].want.fwd_bc, tab[i].want.bwd_br, tab[i].want.bwd_bc);
        int64_t l1 = tab[i].l1 ? tab[i].l1 : 32 << 10, l2 = tab[i].l2 ? tab[i].l2 : 256 << 10, D = tab[i].D;
        CHECKF(4 * t.fwd_bc * D <= l1 / 2 || t.fwd_bc == 16, "tiles %zu: K tile exceeds half of L1d", i);
        CHECKF(4 * t.fwd_br * (t.fwd_bc + 2 * D) <= l2 / 2 || t.fwd_br == 64, "tiles %zu: forward set > L2/2", i);
        CHECKF(t.fwd_br % 16 == 0 && t.fwd_bc % 16 == 0 && t.bwd_bc % 16 == 0, "tiles %zu: not multiples of 16", i);
    }
}

static void gc(const char *name, int B, int T, int S, int Hq, int Hkv, int D, int Dv, cfg c) {
    mmc_tensor *in[3] = {randn_param(1, 4, MMC_SHAPE(B, T, Hq, D), 1.0f),
                         randn_param(2, 4, MMC_SHAPE(B, S, Hkv, D), 1.0f),
                         randn_param(3, 4, MMC_SHAPE(B, S, Hkv, Dv), 1.0f)};
    /* f32 forward, central differences eps 1e-2: truncation ~eps^2, rounding ~1e-7/eps */
    gradcheck(name, attn_fn, in, 3, &c, 1e-2, 2e-3, 2e-2, 200);
    for (int i = 0; i < 3; i++) mmc_tensor_free(in[i]);
}

static void test_gradcheck(void) {
    gc("full", 2, 5, 5, 2, 2, 8, 8, (cfg){0});
    gc("causal", 1, 6, 6, 2, 1, 8, 8, (cfg){.causal = true});
    gc("causal T<S", 1, 3, 7, 2, 2, 8, 8, (cfg){.causal = true});
    gc("gqa D!=Dv", 1, 5, 6, 4, 2, 8, 12, (cfg){0});
    static const int32_t cu[4] = {0, 3, 4, 9};
    gc("varlen", 1, 9, 9, 2, 1, 8, 8, (cfg){.cu = cu, .n_seqs = 3});
    gc("varlen causal", 1, 9, 9, 2, 2, 8, 8, (cfg){.causal = true, .cu = cu, .n_seqs = 3});
}

/* PyTorch fixtures: inputs q, k, v, r (upstream grad), outputs out, dq, dk, dv. */
static void fixture_case(const char *file, cfg c) {
    char path[256];
    snprintf(path, sizeof path, "attention/%s.safetensors", file);
    mmc_st *st = fixture_open(path);
    if (!st) return;
    mmc_tensor *q = fixture_tensor(st, "q", MMC_F32), *k = fixture_tensor(st, "k", MMC_F32),
               *v = fixture_tensor(st, "v", MMC_F32), *r = fixture_tensor(st, "r", MMC_F32);
    mmc_tensor *want[4] = {fixture_tensor(st, "out", MMC_F32), fixture_tensor(st, "dq", MMC_F32),
                           fixture_tensor(st, "dk", MMC_F32), fixture_tensor(st, "dv", MMC_F32)};
    q->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    k->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    v->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *y = attn_fn(ctx, (mmc_tensor *[]){q, k, v}, &c);
    memcpy(mmc_grad(ctx, y)->data, r->data, mmc_nbytes(r));
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    mmc_tensor *got[4] = {y, q->grad, k->grad, v->grad};
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s %s", file, names[i]);
        CHECK_CLOSE(got[i], want[i], 1e-5, 1e-4, what);   /* f32 both sides, different order */
        mmc_tensor_free(want[i]);
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(q); mmc_tensor_free(k); mmc_tensor_free(v); mmc_tensor_free(r);
    mmc_st_close(st);
}

static void test_fixtures(void) {
    fixture_case("full", (cfg){0});
    fixture_case("causal_gqa", (cfg){.causal = true});
    fixture_case("causal_decode_chunk", (cfg){.causal = true});   /* T < S, bottom-right */
    fixture_case("dv_ne_d", (cfg){0});
    static const int32_t cu[4] = {0, 30, 50, 97};
    fixture_case("varlen", (cfg){.cu = cu, .n_seqs = 3});
    fixture_case("varlen_causal", (cfg){.causal = true, .cu = cu, .n_seqs = 3});
}

int main(void) {
    mmc_set_num_threads(2);
    test_gradcheck();
    test_exp2();
    test_tiles();
    test_vs_naive();
    test_fixtures();
    return test_done("test_ops_attention");
}
