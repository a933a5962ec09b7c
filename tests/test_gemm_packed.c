/* test_gemm_packed.c — pre-packed weights (gemm.h: mmc_gemm_pack_b / mmc_gemm_xwt_packed) against
 * the unpacked GEMM they replace, y = x · Wᵀ (mmc_gemm_f32 / mmc_gemm_bf16_infer (false, true)):
 *   M > 4  the same bits (the packed panels are the unpacked path's, summed in the same order),
 *          for every alpha / beta, with a row stride wider than the matrix for A, W and C (C's
 *          padding must stay untouched), beta = 0 over a NaN-filled C;
 *   M <= 4 (decode) the decode-rows path on the packed panels (gemm.c's packed_mv; the unpacked
 *          GEMM takes the matvec): the same bits as the unpacked GEMM's first rows of a taller A
 *          (alpha 1, beta 0 or 1, where a row's result does not depend on its place in a register
 *          tile) on the f32 and vdpbf16ps panels; on AMX panels (vdpbf16ps there, not tiles) and for
 *          any alpha / beta within the oracle's tolerance (|got - ref| <= 1e-5 sqrt(K) sum |a||b| +
 *          |beta c|, as test_gemm; A rounded to bf16 for the bf16-product kernels);
 *   1 vs 2 threads the same bits.
 * Shapes are odd around the register tiles (MR 14 / 32 / 6 / 4, NR 32 / 16) and the cache blocks
 * (K past KC = 1024, N past NC; part "blocks" reruns all with tiny blocks MC=28 KC=40 NC=64, AMX
 * KC rounded to 64, so every shape spans many ragged K and N blocks).
 * Parts: f32 (each f32 kernel the CPU runs: avx512 with and without the B prefetch, avx2,
 * generic), bf16 (bf16 weights on the exact path: f32 panels widened from bf16), bf16dot
 * (vdpbf16ps), amx (AMX tiles: bf16 pair panels), blocks; a kernel the CPU lacks is skipped. */
#include "test_util.h"
#include "gemm.h"

#include <omp.h>

static uint64_t g_seed = 777;
static float frand(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

typedef struct { int64_t M, N, K; } shape;
static const shape g_shapes[] = {
    {5, 1, 1},      {17, 33, 1},    {33, 17, 65},   {65, 127, 33},  {127, 129, 17}, {129, 65, 129},
    {15, 33, 300},  {350, 70, 300}, {6, 16, 513},   {70, 200, 19},  {30, 70, 1100}, {9, 2100, 40},
    {45, 97, 2051}, {31, 33, 1025},
    /* decode sizes: the packed path at M <= 4 */
    {1, 1, 1},      {1, 130, 300},  {2, 33, 65},    {3, 65, 1},     {4, 129, 127},  {1, 70, 1100},
    /* several work units (8 panels of 32 columns), ragged passes and K blocks */
    {1, 700, 2100}, {2, 300, 1030}, {3, 1000, 64},  {4, 290, 2051},
};
static const float g_ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, 0.75f}, {1.0f, 1.0f}};

static const char *g_what = "";

/* The unpacked y = alpha x·Wᵀ + beta y for the dtype under test. */
static void unpacked(bool bf16, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *W, const uint16_t *Wh, int64_t ldw, float beta, float *C, int64_t ldc) {
    if (bf16) mmc_gemm_bf16_infer(false, true, M, N, K, alpha, A, lda, Wh, ldw, beta, C, ldc);
    else mmc_gemm_f32(false, true, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
}

/* One case. round_a: the kernel rounds A to bf16 (the oracle sees it rounded). */
static void run_case(int64_t M, int64_t N, int64_t K, int64_t pad, float alpha, float beta, bool bf16, bool round_a) {
    const int64_t Mt = M <= 4 ? M + 20 : M; /* decode sizes: the unpacked GEMM on a taller A */
    const int64_t lda = K + pad, ldw = K + 2 * pad, ldc = N + pad;
    float *A = malloc(sizeof(float) * (size_t)(Mt * lda)), *Aa = malloc(sizeof(float) * (size_t)(Mt * lda));
    float *W = malloc(sizeof(float) * (size_t)(N * ldw)), *Wa = malloc(sizeof(float) * (size_t)(N * ldw));
    uint16_t *Wh = malloc(sizeof(uint16_t) * (size_t)(N * ldw));
    float *C0 = malloc(sizeof(float) * (size_t)(Mt * ldc)), *C1 = malloc(sizeof(float) * (size_t)(Mt * ldc));
    float *C2 = malloc(sizeof(float) * (size_t)(M * ldc)), *R = malloc(sizeof(float) * (size_t)(M * ldc));
    float *Bd = malloc(sizeof(float) * (size_t)(M * ldc));
    for (int64_t i = 0; i < Mt * lda; i++) {
        A[i] = frand();
        Aa[i] = fabsf(round_a ? mmc_bf16_to_f32(mmc_f32_to_bf16(A[i])) : A[i]);
    }
    for (int64_t i = 0; i < N * ldw; i++) {
        Wh[i] = mmc_f32_to_bf16(frand());
        W[i] = bf16 ? mmc_bf16_to_f32(Wh[i]) : frand();
        Wa[i] = fabsf(W[i]);
    }
    for (int64_t i = 0; i < Mt * ldc; i++) C0[i] = frand();
    for (int64_t m = 0; m < Mt; m++)
        for (int64_t n = 0; n < ldc; n++) {
            const float v = n >= N ? 777.0f : beta == 0.0f ? NAN : C0[m * ldc + n];
            C1[m * ldc + n] = v;
            if (m < M) C2[m * ldc + n] = R[m * ldc + n] = v;
        }
    mmc_gemm_packed_b *pb = mmc_gemm_pack_b(bf16 ? (const void *)Wh : (const void *)W, bf16, N, K, ldw, true);
    CHECKF(pb && mmc_gemm_packed_b_rows(pb) == N && mmc_gemm_packed_b_cols(pb) == K, "pack_b: %s", mmc_last_error());
    if (!pb) return;
    mmc_gemm_xwt_packed(M, alpha, A, lda, pb, beta, C2, ldc);
    bool same_bits = M > 4 || (alpha == 1.0f && (beta == 0.0f || beta == 1.0f) &&
                                strcmp(mmc_gemm_packed_b_kernel(pb), "amx_bf16") != 0);
    if (same_bits) {
        unpacked(bf16, Mt, N, K, alpha, A, lda, W, Wh, ldw, beta, C1, ldc);
        int64_t first = -1;
        for (int64_t i = 0; i < M * ldc && first < 0; i++)
            if (memcmp(&C1[i], &C2[i], sizeof(float)) != 0) first = i;
        CHECKF(first < 0, "%s: packed vs unpacked bits differ at C[%lld,%lld] (%.9g vs %.9g): kernel %s M=%lld N=%lld "
               "K=%lld pad=%lld alpha=%g beta=%g", g_what, first < 0 ? 0LL : (long long)(first / ldc),
               first < 0 ? 0LL : (long long)(first % ldc), first < 0 ? 0.0 : (double)C2[first],
               first < 0 ? 0.0 : (double)C1[first], mmc_gemm_packed_b_kernel(pb), (long long)M, (long long)N,
               (long long)K, (long long)pad, alpha, beta);
    }
    /* the oracle (double accumulation) on what the kernel multiplies */
    float *Ar = malloc(sizeof(float) * (size_t)(M * lda));
    for (int64_t i = 0; i < M * lda; i++) Ar[i] = round_a ? mmc_bf16_to_f32(mmc_f32_to_bf16(A[i])) : A[i];
    mmc_gemm_ref(false, true, M, N, K, alpha, Ar, lda, W, ldw, beta, R, ldc);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldc; n++) Bd[m * ldc + n] = n < N ? fabsf(C0[m * ldc + n]) : 0.0f;
    mmc_gemm_ref(false, true, M, N, K, fabsf(alpha), Aa, lda, Wa, ldw, fabsf(beta), Bd, ldc);
    int bad = 0;
    for (int64_t m = 0; m < M && bad < 3; m++)
        for (int64_t n = 0; n < ldc && bad < 3; n++) {
            const float got = C2[m * ldc + n];
            if (n >= N) {
                if (got != 777.0f) bad++, fprintf(stderr, "  padding C[%lld,%lld] written\n", (long long)m, (long long)n);
                continue;
            }
            const double tol = 1e-5 * sqrt((double)K) * Bd[m * ldc + n] + 1e-30, d = fabs((double)got - R[m * ldc + n]);
            if (!(d <= tol)) {
                bad++;
                fprintf(stderr, "  C[%lld,%lld] = %.9g, ref %.9g, |diff| %.3g > tol %.3g\n", (long long)m, (long long)n,
                        got, R[m * ldc + n], d, tol);
            }
        }
    CHECKF(bad == 0, "%s: packed vs oracle: kernel %s M=%lld N=%lld K=%lld pad=%lld alpha=%g beta=%g", g_what,
           mmc_gemm_packed_b_kernel(pb), (long long)M, (long long)N, (long long)K, (long long)pad, alpha, beta);
    mmc_gemm_packed_b_free(pb);
    free(A); free(Aa); free(W); free(Wa); free(Wh); free(C0); free(C1); free(C2); free(R); free(Bd); free(Ar);
}

/* The packed GEMM with 1 and with 2 threads: the same bits. */
static void run_threads(int64_t M, int64_t N, int64_t K, bool bf16) {
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *W = malloc(sizeof(float) * (size_t)(N * K));
    uint16_t *Wh = malloc(sizeof(uint16_t) * (size_t)(N * K));
    float *C[2] = {malloc(sizeof(float) * (size_t)(M * N)), malloc(sizeof(float) * (size_t)(M * N))};
    for (int64_t i = 0; i < M * K; i++) A[i] = frand();
    for (int64_t i = 0; i < N * K; i++) W[i] = frand(), Wh[i] = mmc_f32_to_bf16(W[i]);
    for (int64_t i = 0; i < M * N; i++) C[0][i] = C[1][i] = frand();
    mmc_gemm_packed_b *pb = mmc_gemm_pack_b(bf16 ? (const void *)Wh : (const void *)W, bf16, N, K, K, true);
    CHECKF(pb, "pack_b: %s", mmc_last_error());
    const int prev = omp_get_max_threads();
    for (int t = 0; t < 2 && pb; t++) {
        omp_set_num_threads(t + 1);
        mmc_gemm_xwt_packed(M, 0.75f, A, K, pb, 0.5f, C[t], N);
    }
    omp_set_num_threads(prev);
    CHECKF(memcmp(C[0], C[1], sizeof(float) * (size_t)(M * N)) == 0, "%s: packed, 1 vs 2 threads differ M=%lld N=%lld K=%lld",
           g_what, (long long)M, (long long)N, (long long)K);
    mmc_gemm_packed_b_free(pb);
    free(A); free(W); free(Wh); free(C[0]); free(C[1]);
}

static void suite(bool bf16, bool round_a) {
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++) {
        const shape *sh = &g_shapes[s];
        for (int v = 0; v < 4; v++) {
            if (v >= 2 && (s + (size_t)v) % 2) continue; /* half the sweep on each shape: time */
            const int64_t pad = (s + (size_t)v) % 3 == 0 ? 0 : 3 + (int64_t)s;
            run_case(sh->M, sh->N, sh->K, pad, g_ab[v][0], g_ab[v][1], bf16, round_a);
        }
    }
    run_threads(300, 200, 333, bf16);
    run_threads(100, 70, 1100, bf16);  /* 2 K blocks: threads slice M */
    run_threads(40, 2100, 50, bf16);   /* wide: threads slice N */
    run_threads(3, 700, 257, bf16);    /* decode */
    run_threads(1, 1300, 1100, bf16);  /* decode: 6 work units over 2 threads, 2 K blocks */
}

/* f32 kernels (and bf16 weights on the exact path, widened into f32 panels). */
static void f32_kernels(bool bf16) {
    const char *native = mmc_gemm_kernel_name();
    const char *ks[] = {"avx512", "avx2", "generic"};
    for (int i = 0; i < 3; i++) {
        if (mmc_gemm_set_kernel(ks[i]) != 0) continue;
        g_what = ks[i];
        suite(bf16, false);
    }
    mmc_gemm_set_kernel(native);
}

static bool dot_kernel(const char *name) {
    if (mmc_gemm_set_kernel("avx512") != 0 || mmc_gemm_set_bf16_kernel(name) != 0) return false;
    g_what = name;
    suite(true, true);
    /* a packed weight keeps the kernel it was packed for, whatever is switched on later */
    g_seed ^= 1;
    const int64_t M = 40, N = 70, K = 300;
    float *A = malloc(sizeof(float) * M * K), *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    uint16_t *Wh = malloc(sizeof(uint16_t) * N * K);
    for (int64_t i = 0; i < M * K; i++) A[i] = frand();
    for (int64_t i = 0; i < N * K; i++) Wh[i] = mmc_f32_to_bf16(frand());
    mmc_gemm_packed_b *pb = mmc_gemm_pack_b(Wh, true, N, K, K, true);
    CHECKF(pb && !strcmp(mmc_gemm_packed_b_kernel(pb), name), "packed for %s, not %s", mmc_gemm_packed_b_kernel(pb), name);
    mmc_gemm_bf16_infer(false, true, M, N, K, 1.0f, A, K, Wh, K, 0.0f, C1, N);
    mmc_gemm_set_bf16_kernel("f32");
    if (pb) mmc_gemm_xwt_packed(M, 1.0f, A, K, pb, 0.0f, C2, N);
    CHECKF(pb && memcmp(C1, C2, sizeof(float) * M * N) == 0, "%s: packed weight ran another kernel after the switch", name);
    mmc_gemm_packed_b_free(pb);
    free(A); free(C1); free(C2); free(Wh);
    return true;
}

int main(int argc, char **argv) {
    const bool blocks = argc >= 2 && !strcmp(argv[1], "blocks");
    if (blocks) setenv("MMC_GEMM_BLOCKING", "28,40,64", 1); /* read at the first GEMM */
    const char *native = mmc_gemm_kernel_name();
    printf("test_gemm_packed: native kernel %s\n", native);
    /* bad sizes are an error, not a crash */
    CHECKF(!mmc_gemm_pack_b(NULL, false, 4, 4, 4, true) && strstr(mmc_last_error(), "bad weight"),
           "pack_b(NULL): %s", mmc_last_error());
    if (test_part(argc, argv, "f32")) f32_kernels(false);
    if (test_part(argc, argv, "bf16")) f32_kernels(true);
    const char *dots[][2] = {{"bf16dot", "avx512_bf16"}, {"amx", "amx_bf16"}};
    for (int d = 0; d < 2; d++)
        if (test_part(argc, argv, dots[d][0]) && !dot_kernel(dots[d][1]))
            test_skip("test_gemm_packed", "%s: this CPU (or the OS) lacks %s", dots[d][0], dots[d][1]);
    mmc_gemm_set_bf16_kernel("f32");
    mmc_gemm_set_kernel(native);
    if (blocks && test_part(argc, argv, "blocks")) {
        mmc_gemm_info gi;
        mmc_gemm_describe(&gi);
        CHECKF(gi.f32.kc == 40, "blocking KC=%lld, want 40", (long long)gi.f32.kc);
        f32_kernels(false);
        f32_kernels(true);
        dot_kernel("avx512_bf16");
        dot_kernel("amx_bf16");
        mmc_gemm_set_bf16_kernel("f32");
        mmc_gemm_set_kernel(native);
    }
    return test_done("test_gemm_packed");
}
