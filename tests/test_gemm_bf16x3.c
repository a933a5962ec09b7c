/* test_gemm_bf16x3.c — MMC_MATMUL_PRECISION (mmc_gemm_set_matmul_precision): f32 x f32 GEMMs on
 * AMX at "high" (amx_bf16x3: operands split into bf16 hi + lo, hi·hi + hi·lo + lo·hi summed in f32)
 * and "medium" (amx_bf16x1: one bf16 product), against the f64 triple-loop oracle mmc_gemm_ref.
 *
 * Bound (gemm.c's analysis; u = 2^-8, bf16's unit roundoff): per element
 *   |got - ref| <= ((3 + 3u) u^2 + 1e-5 sqrt(3K)) * bound + 1e-30,
 *   bound = |alpha| sum_k |a_mk| |b_kn| + |beta| |c_mn|
 * — the three dropped split terms, plus the f32 summation allowance test_gemm grants the f32 kernels
 * (for 3K terms). The error measured (max over elements of |got - ref| / bound) is printed and must be
 * below 2^-16 (a fifth of the worst case), and at least 16 times below medium's (one bf16 product).
 *
 * Parts: `high` (odd shapes around the 32x32 tile and the 32-k step, the four transposes, alpha/beta
 * with beta = 0 over NaN, leading dimensions wider than the matrix with their padding untouched, K
 * over several KC blocks, 1 vs 2 threads bit-identical, inf operands), `medium`, `packed` (a weight
 * pre-packed under high gives the unpacked GEMM's bits, M <= 4 too), `blocks` (tiny cache blocks:
 * every shape across many K, row and column blocks; asked for by name only, the blocking is read at
 * the first GEMM) and `model` (the tiny Qwen2-VL fixture in high mode: vision tower and logits within
 * 1e-4 of transformers' f32 and of mmc's f32, the f32 tests' own tolerance — measured 9e-6 / 2.4e-5,
 * f32 itself 1.4e-6 / 2.7e-6 — and greedy tokens identical). An inf operand gives inf or NaN (inf·0
 * in a cross term), f32 inf: high is for finite data. A CPU (or OS) without AMX skips every part
 * (exit 77). */
#include "backend/cpu/gemm.h"
#include "test_util.h"
#include "mmc_vl.h"

#include <omp.h>

static uint64_t g_seed = 777;
static float frand(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

#define U2 (1.0 / 65536.0) /* u^2 = 2^-16 */

typedef struct { double worst; } err_stat; /* max |got - ref| / bound over the cases run */

/* One case: fast (under the precision in effect) vs the f64 oracle; returns max err / bound. */
static double run_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, float alpha, float beta,
                       float scale) {
    const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    const int64_t lda = acols + pad, ldb = bcols + pad, ldc = N + pad;
    float *A = malloc(sizeof(float) * (size_t)(arows * lda)), *Aa = malloc(sizeof(float) * (size_t)(arows * lda));
    float *B = malloc(sizeof(float) * (size_t)(brows * ldb)), *Ba = malloc(sizeof(float) * (size_t)(brows * ldb));
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc)), *C = malloc(sizeof(float) * (size_t)(M * ldc));
    float *R = malloc(sizeof(float) * (size_t)(M * ldc)), *Bd = malloc(sizeof(float) * (size_t)(M * ldc));
    for (int64_t i = 0; i < arows * lda; i++) Aa[i] = fabsf(A[i] = scale * frand());
    for (int64_t i = 0; i < brows * ldb; i++) Ba[i] = fabsf(B[i] = frand());
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = frand();
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldc; n++) {
            const float v = n < N ? (beta == 0.0f ? NAN : C0[m * ldc + n]) : 777.0f;
            C[m * ldc + n] = R[m * ldc + n] = v;
        }
    mmc_gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    mmc_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
    mmc_gemm_ref(ta, tb, M, N, K, fabsf(alpha), Aa, lda, Ba, ldb, 0.0f, Bd, ldc);
    const double tol = (3.0 + 3.0 / 256) * U2 + 1e-5 * sqrt(3.0 * (double)K);
    double worst = 0;
    int bad = 0, pads = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldc; n++) {
            const int64_t i = m * ldc + n;
            if (n >= N) { pads += C[i] != 777.0f; continue; }
            const double bound = Bd[i] + (beta != 0.0f ? fabs(beta * C0[i]) : 0.0);
            const double d = fabs((double)C[i] - (double)R[i]);
            if (!(d <= tol * bound + 1e-30)) bad++;
            else if (bound > 0 && d / bound > worst) worst = d / bound;
        }
    CHECKF(bad == 0 && pads == 0, "%s ta=%d tb=%d M=%lld N=%lld K=%lld pad=%lld alpha=%g beta=%g: %d elements past "
           "the bound, %d padding elements written", mmc_gemm_matmul_precision(), ta, tb, (long long)M, (long long)N,
           (long long)K, (long long)pad, alpha, beta, bad, pads);
    free(A); free(Aa); free(B); free(Ba); free(C0); free(C); free(R); free(Bd);
    return worst;
}

static const struct { int64_t M, N, K; } g_shapes[] = {
    {5, 1, 1},    {17, 33, 1},   {33, 17, 65},  {65, 127, 33}, {127, 129, 17}, {129, 65, 129},
    {32, 32, 32}, {31, 33, 31},  {64, 64, 257}, {15, 33, 300}, {350, 70, 300}, {6, 16, 513},
    {70, 200, 19}, {30, 70, 1100}, {9, 2100, 40}, {40, 40, 2049},
};
static const float g_ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, 0.75f}, {1.0f, 1.0f}};

/* 1 and 2 threads give the same bits (blocking and tile order do not depend on the team). */
static void determinism(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    const int64_t asz = M * K, bsz = K * N;
    float *A = malloc(sizeof(float) * (size_t)asz), *B = malloc(sizeof(float) * (size_t)bsz);
    float *C1 = malloc(sizeof(float) * (size_t)(M * N)), *C2 = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < asz; i++) A[i] = frand();
    for (int64_t i = 0; i < bsz; i++) B[i] = frand();
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    mmc_gemm_f32(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C1, N);
    omp_set_num_threads(2);
    mmc_gemm_f32(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C2, N);
    omp_set_num_threads(prev);
    CHECKF(memcmp(C1, C2, sizeof(float) * (size_t)(M * N)) == 0, "%s ta=%d tb=%d %lldx%lldx%lld: 1 and 2 threads differ",
           mmc_gemm_matmul_precision(), ta, tb, (long long)M, (long long)N, (long long)K);
    free(A); free(B); free(C1); free(C2);
}

static double suite(void) {
    double worst = 0;
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            const float *ab = g_ab[(s + t) % 4];
            double w = run_case(t & 1, t >> 1, g_shapes[s].M, g_shapes[s].N, g_shapes[s].K, (s % 3) * 3, ab[0], ab[1],
                                1.0f);
            if (w > worst) worst = w;
        }
    for (int t = 0; t < 4; t++) {
        determinism(t & 1, t >> 1, 100, 70, 1100); /* several K blocks: sliced */
        determinism(t & 1, t >> 1, 70, 300, 200);  /* one B block: shared */
    }
    return worst;
}

/* The error on a transformer-like shape, as a ratio to the bound: printed for the README. */
static double shape_error(bool tb, int64_t M, int64_t N, int64_t K) {
    return run_case(false, tb, M, N, K, 0, 1.0f, 0.0f, 0.05f);
}

static bool want_amx(const char *part) {
    if (mmc_gemm_set_kernel("avx512") != 0 || mmc_gemm_set_matmul_precision("high") != 0) {
        test_skip("test_gemm_bf16x3", "%s: this CPU (or the OS) offers no AMX", part);
        mmc_gemm_set_matmul_precision("highest");
        return false;
    }
    return true;
}

static void part_high(bool blocks) {
    mmc_gemm_info gi;
    mmc_gemm_describe(&gi);
    CHECKF(!strcmp(gi.matmul_precision, "high") && !strcmp(gi.f32_matmul.kernel, "amx_bf16x3") &&
               !strcmp(gi.f32.kernel, "avx512") && gi.f32_matmul.kc % 32 == 0,
           "high: precision %s, f32 GEMMs on %s (kc %lld), exact kernel %s", gi.matmul_precision, gi.f32_matmul.kernel,
           (long long)gi.f32_matmul.kc, gi.f32.kernel);
    const double w = suite();
    const double e1 = shape_error(true, 64, 896, 896), e2 = shape_error(false, 32, 896, 4864);
    printf("test_gemm_bf16x3: high%s: max |err| / sum|a||b| %.3g over the suite; x·Wᵀ 64x896x896 %.3g, "
           "dy·W 32x896x4864 %.3g (worst case %.3g)\n", blocks ? " (tiny blocks)" : "", w, e1, e2, 3.0 * U2);
    /* the suite's worst is a single product (K = 1: nothing to average); summed over K, independent
     * rounding errors mostly cancel */
    CHECKF(w < 3 * U2 && e1 < U2 / 16 && e2 < U2 / 16, "high: measured error %.3g / %.3g / %.3g not below 3 2^-16 / "
           "2^-20", w, e1, e2);
    /* an inf operand gives a non-finite result (inf·0 in a cross term can make it NaN where f32 gives
     * inf: high is meant for finite data); the other rows are untouched */
    float A[64 * 32], B[32 * 32], C[64 * 32];
    for (int i = 0; i < 64 * 32; i++) A[i] = 1.0f;
    for (int i = 0; i < 32 * 32; i++) B[i] = 0.5f;
    A[0] = INFINITY;
    mmc_gemm_f32(false, false, 64, 32, 32, 1.0f, A, 32, B, 32, 0.0f, C, 32);
    CHECKF(!isfinite(C[0]) && C[32] == 16.0f, "high: inf row gives %g, finite row %g (want inf or NaN, 16)", C[0],
           C[32]);
}

static void part_medium(void) {
    CHECK(mmc_gemm_set_matmul_precision("medium") == 0);
    mmc_gemm_info gi;
    mmc_gemm_describe(&gi);
    CHECKF(!strcmp(gi.f32_matmul.kernel, "amx_bf16x1") && gi.bf16_dot, "medium: f32 GEMMs on %s, bf16 weights %s",
           gi.f32_matmul.kernel, gi.bf16_dot ? "bf16 products" : "exact");
    const double m1 = shape_error(true, 128, 896, 896);
    mmc_gemm_set_bf16_kernel("f32");
    CHECK(mmc_gemm_set_matmul_precision("high") == 0);
    const double h1 = shape_error(true, 128, 896, 896);
    CHECK(mmc_gemm_set_matmul_precision("highest") == 0);
    const double f1 = shape_error(true, 128, 896, 896);
    printf("test_gemm_bf16x3: x·Wᵀ 128x896x896, max |err| / sum|a||b|: highest (f32) %.3g, high (bf16x3) %.3g, "
           "medium (bf16) %.3g\n", f1, h1, m1);
    CHECKF(h1 * 16 < m1 && m1 < 1.0 / 64, "high's error %.3g not 16x below medium's %.3g", h1, m1);
    mmc_gemm_describe(&gi);
    CHECKF(!strcmp(gi.f32_matmul.kernel, gi.f32.kernel), "highest: f32 GEMMs on %s", gi.f32_matmul.kernel);
    CHECK(mmc_gemm_set_matmul_precision("fast") == -1 && !strcmp(mmc_gemm_matmul_precision(), "highest"));
    CHECK(mmc_gemm_set_matmul_precision(NULL) == -1);
}

/* A weight packed under high (bf16x3 panels): x·Wᵀ equals the unpacked GEMM's bits, any M. */
static void part_packed(void) {
    const int64_t N = 100, K = 1100, Ms[] = {1, 3, 5, 33, 70};
    float *W = malloc(sizeof(float) * (size_t)(N * K)), *X = malloc(sizeof(float) * (size_t)(70 * K));
    float *C1 = malloc(sizeof(float) * (size_t)(70 * N)), *C2 = malloc(sizeof(float) * (size_t)(70 * N));
    for (int64_t i = 0; i < N * K; i++) W[i] = frand();
    for (int64_t i = 0; i < 70 * K; i++) X[i] = frand();
    mmc_gemm_packed_b *pb = mmc_gemm_pack_b(W, false, N, K, K, true);
    CHECKF(pb && !strcmp(mmc_gemm_packed_b_kernel(pb), "amx_bf16x3"), "packed under high: kernel %s",
           pb ? mmc_gemm_packed_b_kernel(pb) : "(none)");
    for (int i = 0; pb && i < 5; i++) {
        const int64_t M = Ms[i];
        mmc_gemm_xwt_packed(M, 1.0f, X, K, pb, 0.0f, C1, N);
        if (M > 4) {
            mmc_gemm_f32(false, true, M, N, K, 1.0f, X, K, W, K, 0.0f, C2, N);
            CHECKF(!memcmp(C1, C2, sizeof(float) * (size_t)(M * N)), "packed x·Wᵀ M=%lld differs from the unpacked",
                   (long long)M);
        }
        double worst = 0;
        float *R = malloc(sizeof(float) * (size_t)(M * N));
        mmc_gemm_ref(false, true, M, N, K, 1.0f, X, K, W, K, 0.0f, R, N);
        for (int64_t j = 0; j < M * N; j++) {
            const double d = fabs((double)C1[j] - R[j]);
            if (d > worst) worst = d;
        }
        free(R);
        /* sum |a||b| ~ K/4 for uniform [-1, 1) operands */
        CHECKF(worst < (3 * U2 + 1e-5 * sqrt(3.0 * K)) * K / 4.0, "packed M=%lld: max |err| %.3g", (long long)M, worst);
    }
    mmc_gemm_packed_b_free(pb);
    free(W); free(X); free(C1); free(C2);
}

/* ---- model: the tiny Qwen2-VL (tests/fixtures/qwen2_vl, transformers' f32 outputs) in high mode */
static mmc_st *ref;
static mmc_tensor *fx(const char *k, mmc_dtype dt) { return fixture_tensor(ref, k, dt); }
static mmc_tensor *cat_rows(mmc_tensor *a, mmc_tensor *b) {
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(a->shape[0] + b->shape[0], a->shape[1]));
    memcpy(t->data, a->data, mmc_nbytes(a));
    memcpy((char *)t->data + mmc_nbytes(a), b->data, mmc_nbytes(b));
    mmc_tensor_free(a);
    mmc_tensor_free(b);
    return t;
}
/* two images of different sizes: vision output, logits (persistent copies) */
static void two_images(mmc_qwen2_vl *m, mmc_tensor **vis, mmc_tensor **logits) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    int64_t g[6] = {1, 4, 6, 1, 6, 4};
    mmc_tensor *px = cat_rows(fx("pixels.g146", MMC_F32), fx("pixels.g164", MMC_F32));
    mmc_tensor *out = NULL, *hid = NULL, *h = NULL;
    *vis = *logits = NULL;
    CHECK_OK(mmc_vision_forward(ctx, m->visual, px, g, 2, &out, &hid));
    if (out) {
        *vis = mmc_tensor_new(MMC_F32, out->ndim, out->shape);
        memcpy((*vis)->data, out->data, mmc_nbytes(out));
    }
    mmc_tensor *ids = fx("two_images.ids", MMC_I64);
    mmc_vl_media media = {0};
    media.pixel_values = px;
    media.image_grid_thw = g;
    media.n_images = 2;
    int64_t delta = 0;
    CHECK_OK(mmc_qwen2_vl_forward(ctx, m, ids, &media, NULL, &delta, &h));
    if (h) {
        mmc_tensor *lg = mmc_qwen2_vl_logits(ctx, m, h);
        *logits = mmc_tensor_new(MMC_F32, lg->ndim, lg->shape);
        memcpy((*logits)->data, lg->data, mmc_nbytes(lg));
    }
    mmc_tensor_free(ids);
    mmc_tensor_free(px);
    mmc_ctx_free(ctx);
}

static int greedy_same(mmc_qwen2_vl *m, int *n_out) {
    mmc_tensor *ids = fx("image.ids", MMC_I32), *want = fx("q2.image.greedy", MMC_I64);
    int64_t g[3] = {1, 4, 6};
    mmc_vl_media media = {0};
    media.pixel_values = fx("pixels.g146", MMC_F32);
    media.image_grid_thw = g;
    media.n_images = 1;
    mmc_gen_opts o = {.max_new_tokens = 32};
    mmc_sampler_defaults(&o.sampler);
    int32_t out[32];
    int n = 0, same = 0;
    mmc_qwen2_vl_request req = {m, &media, 0};
    mmc_decoder dec = mmc_qwen2_vl_decoder(&req);
    CHECK_OK(mmc_generate(&dec, ids->data, ids->shape[1], &o, out, &n));
    for (int k = 0; k < n && k < 32; k++) same += out[k] == ((int64_t *)want->data)[k];
    mmc_tensor_free(media.pixel_values);
    mmc_tensor_free(ids);
    mmc_tensor_free(want);
    *n_out = n;
    return same;
}

static void part_model(void) {
    ref = fixture_open("qwen2_vl/ref.safetensors");
    if (!ref) return;
    mmc_qwen2_vl *m = NULL;
    mmc_status st = mmc_qwen2_vl_load("tests/fixtures/qwen2_vl/q2_v5", false, &m);
    CHECKF(st == MMC_OK, "load q2_v5: %s", mmc_last_error());
    if (m) {
        mmc_tensor *want_v = fx("q2.vision.two", MMC_F32), *want_l = fx("q2.two_images.logits", MMC_F32);
        mmc_tensor *v32, *l32, *vh, *lh;
        CHECK(mmc_gemm_set_matmul_precision("highest") == 0);
        two_images(m, &v32, &l32);
        CHECK(mmc_gemm_set_matmul_precision("high") == 0);
        two_images(m, &vh, &lh);
        int n = 0;
        const int same = greedy_same(m, &n);
        if (v32 && l32 && vh && lh) {
            printf("test_gemm_bf16x3: Qwen2-VL tiny, two images: max |diff| vs transformers f32: vision %.3g (f32 %.3g), "
                   "logits %.3g (f32 %.3g); vs mmc f32: vision %.3g, logits %.3g; greedy %d of %d tokens identical\n",
                   max_abs_diff(vh, want_v), max_abs_diff(v32, want_v), max_abs_diff(lh, want_l),
                   max_abs_diff(l32, want_l), max_abs_diff(vh, v32), max_abs_diff(lh, l32), same, n);
            CHECK_CLOSE(vh, want_v, 1e-4, 0, "high: vision tower vs transformers f32 (1e-4)");
            CHECK_CLOSE(lh, want_l, 1e-4, 0, "high: logits vs transformers f32 (1e-4)");
            CHECK_CLOSE(lh, l32, 1e-4, 0, "high: logits vs mmc f32 (1e-4)");
            CHECKF(max_abs_diff(lh, l32) > 0, "high mode left the logits bit-identical: the mode did not reach the model");
        } else {
            CHECK(false);
        }
        CHECKF(n == 32 && same == 32, "high: greedy %d of %d tokens identical to transformers", same, n);
        mmc_tensor_free(v32); mmc_tensor_free(l32); mmc_tensor_free(vh); mmc_tensor_free(lh);
        mmc_tensor_free(want_v); mmc_tensor_free(want_l);
        mmc_qwen2_vl_free(m);
    }
    mmc_gemm_set_matmul_precision("highest");
    mmc_st_close(ref);
}

int main(int argc, char **argv) {
    if (test_part(argc, argv, "high") && want_amx("high")) part_high(false);
    if (test_part(argc, argv, "medium") && want_amx("medium")) part_medium();
    if (test_part(argc, argv, "packed") && want_amx("packed")) part_packed();
    if (argc > 1 && test_part(argc, argv, "blocks")) {
        setenv("MMC_GEMM_BLOCKING", "40,64,64", 1); /* read at the first GEMM: MC 64, KC 64, NC 64 for AMX */
        if (want_amx("blocks")) {
            mmc_gemm_info gi;
            mmc_gemm_describe(&gi);
            CHECKF(gi.f32_matmul.kc == 64 && gi.f32_matmul.nc == 64, "blocks: kc %lld nc %lld",
                   (long long)gi.f32_matmul.kc, (long long)gi.f32_matmul.nc);
            part_high(true);
        }
    }
    if (test_part(argc, argv, "model") && want_amx("model")) part_model();
    mmc_gemm_set_matmul_precision("highest");
    return test_done("test_gemm_bf16x3");
}
