/* test_gemm.c — the packed GEMM (mmc_gemm_f32 / mmc_gemm_bf16, every micro-kernel this CPU
 * can run) against the triple-loop oracle mmc_gemm_ref(_bf16): all four trans combinations,
 * odd sizes around the register tiles and cache blocks, K=1, M=1..4 (matvec path, also with
 * N large enough for threaded units of row stretches), leading
 * dimensions wider than the matrix, alpha/beta variants, beta=0 over a NaN-filled C, and C
 * padding left untouched. Then bit-identical results with 1 and 2 threads (determinism).
 * One part (and ctest case) per kernel, `test_gemm avx512|avx2|generic|bf16dot`: a kernel this
 * CPU cannot run is skipped (exit 77 when it was the only part asked for). Parts `blocks` and
 * `blocks_shared` rerun all of it on every kernel with tiny cache blocks (MMC_GEMM_BLOCKING),
 * threads sliced or sharing B blocks (MMC_GEMM_SPLIT): many ragged blocks in every dimension.
 * bf16dot (the AVX512_BF16 vdpbf16ps kernel, opt-in, mmc_gemm_bf16_infer only: mmc_gemm_bf16
 * is checked to stay exact while it is on) rounds A to bf16 before multiplying, so
 * its oracle is mmc_gemm_ref_bf16 on A rounded to bf16 (same tolerance: the bf16 products are
 * exact in f32, only the f32 summation differs); shapes with M <= 4 take the matvec path,
 * which does not use it, and are left out. It also prints its error against the exact oracle
 * (A not rounded), the figure that decides whether it may be the default (it is not).
 *
 * Tolerance (per element): |got - ref| <= 1e-5 * sqrt(K) * bound + 1e-30, where bound =
 * |alpha| * sum_k |a_mk| |b_kn| + |beta| |c_mn| (the ref accumulates in double; our kernels
 * accumulate in f32 in a fixed order, so the error grows like sqrt(K) * eps * bound). */
#include "test_util.h"
#include "gemm.h"

#include <omp.h>

static uint64_t g_seed = 12345;
static bool g_ref_round_a = false; /* the oracle sees A rounded to bf16 (bf16dot kernel) */
static float frand(void) { /* uniform in [-1, 1) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

typedef struct { int64_t M, N, K; } shape;

/* One case: fills A, B (f32, and B rounded to bf16), C; compares fast vs ref. */
static void run_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad,
                     float alpha, float beta, bool bf16) {
    int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    int64_t lda = acols + pad, ldb = bcols + pad, ldc = N + pad;
    float *A = malloc(sizeof(float) * (size_t)(arows * lda + 1));
    float *B = malloc(sizeof(float) * (size_t)(brows * ldb + 1));
    uint16_t *Bh = malloc(sizeof(uint16_t) * (size_t)(brows * ldb + 1));
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    float *C = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    float *R = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    float *Aa = malloc(sizeof(float) * (size_t)(arows * lda + 1));
    float *Ba = malloc(sizeof(float) * (size_t)(brows * ldb + 1));
    float *Bd = malloc(sizeof(float) * (size_t)(M * ldc + 1));
    for (int64_t i = 0; i < arows * lda; i++) { A[i] = frand(); Aa[i] = fabsf(A[i]); }
    for (int64_t i = 0; i < brows * ldb; i++) {
        Bh[i] = mmc_f32_to_bf16(frand());
        B[i] = bf16 ? mmc_bf16_to_f32(Bh[i]) : frand();
        Ba[i] = fabsf(B[i]);
    }
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = frand();
    /* beta == 0: C must not be read — fill it with NaN (the padding keeps a sentinel) */
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < ldc; n++) {
            float v = n < N ? (beta == 0.0f ? NAN : C0[m * ldc + n]) : 777.0f;
            C[m * ldc + n] = R[m * ldc + n] = v;
            Bd[m * ldc + n] = fabsf(C0[m * ldc + n]);
        }
    if (bf16) {
        (g_ref_round_a ? mmc_gemm_bf16_infer : mmc_gemm_bf16)(ta, tb, M, N, K, alpha, A, lda, Bh, ldb, beta, C, ldc);
        float *Ar = malloc(sizeof(float) * (size_t)(arows * lda + 1));
        for (int64_t i = 0; i < arows * lda; i++) Ar[i] = g_ref_round_a ? mmc_bf16_to_f32(mmc_f32_to_bf16(A[i])) : A[i];
        mmc_gemm_ref_bf16(ta, tb, M, N, K, alpha, Ar, lda, Bh, ldb, beta, R, ldc);
        free(Ar);
    } else {
        mmc_gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        mmc_gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, ldc);
    }
    mmc_gemm_ref(ta, tb, M, N, K, fabsf(alpha), Aa, lda, Ba, ldb, fabsf(beta), Bd, ldc);
    int bad = 0;
    double worst = 0;
    for (int64_t m = 0; m < M && bad < 3; m++)
        for (int64_t n = 0; n < ldc && bad < 3; n++) {
            float got = C[m * ldc + n], want = R[m * ldc + n];
            if (n >= N) {
                if (got != 777.0f) { bad++; fprintf(stderr, "  padding C[%lld,%lld] written\n", (long long)m, (long long)n); }
                continue;
            }
            double tol = 1e-5 * sqrt((double)K) * Bd[m * ldc + n] + 1e-30;
            double d = fabs((double)got - want);
            if (!(d <= tol)) {
                bad++;
                fprintf(stderr, "  C[%lld,%lld] = %.9g, ref %.9g, |diff| %.3g > tol %.3g\n",
                        (long long)m, (long long)n, got, want, d, tol);
            }
            if (d / (Bd[m * ldc + n] + 1e-30) > worst) worst = d / (Bd[m * ldc + n] + 1e-30);
        }
    CHECKF(bad == 0, "%s kernel=%s ta=%d tb=%d M=%lld N=%lld K=%lld pad=%lld alpha=%g beta=%g",
           bf16 ? "bf16" : "f32", mmc_gemm_kernel_name(), ta, tb, (long long)M, (long long)N,
           (long long)K, (long long)pad, alpha, beta);
    free(A); free(B); free(Bh); free(C0); free(C); free(R); free(Aa); free(Ba); free(Bd);
}

/* Fast GEMM with 1 thread and with 2 threads must give the same bits. */
static void run_determinism(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool bf16) {
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N);
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C1 = malloc(nc * 4), *C2 = malloc(nc * 4);
    uint16_t *Bh = malloc(nb * 2);
    for (size_t i = 0; i < na; i++) A[i] = frand();
    for (size_t i = 0; i < nb; i++) { B[i] = frand(); Bh[i] = mmc_f32_to_bf16(B[i]); }
    for (size_t i = 0; i < nc; i++) C1[i] = C2[i] = frand();
    int prev = omp_get_max_threads();
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        float *C = t == 1 ? C1 : C2;
        if (bf16) (g_ref_round_a ? mmc_gemm_bf16_infer : mmc_gemm_bf16)(ta, tb, M, N, K, 0.75f, A, lda, Bh, ldb, 0.5f, C, N);
        else mmc_gemm_f32(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C, N);
    }
    omp_set_num_threads(prev);
    CHECKF(memcmp(C1, C2, nc * 4) == 0, "1 vs 2 threads differ: %s kernel=%s ta=%d tb=%d M=%lld N=%lld K=%lld",
           bf16 ? "bf16" : "f32", mmc_gemm_kernel_name(), ta, tb, (long long)M, (long long)N, (long long)K);
    free(A); free(B); free(C1); free(C2); free(Bh);
}

/* bf16dot against the exact oracle (A not rounded) on a Qwen2-like shape: prints the worst
 * |err| / bound (bound = sum_k |a||b|) and |err| / max|C|; checks the first stays under
 * 2^-8 (A's rounding is at most 2^-9 relative per element). */
static void bf16dot_error(bool tb, int64_t M, int64_t N, int64_t K) {
    int64_t lda = K, ldb = tb ? K : N;
    float *A = malloc(sizeof(float) * (size_t)(M * K)), *Aa = malloc(sizeof(float) * (size_t)(M * K));
    float *Ba = malloc(sizeof(float) * (size_t)(K * N));
    uint16_t *Bh = malloc(sizeof(uint16_t) * (size_t)(K * N));
    float *C = malloc(sizeof(float) * (size_t)(M * N)), *R = malloc(sizeof(float) * (size_t)(M * N));
    float *Bd = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) { A[i] = frand(); Aa[i] = fabsf(A[i]); }
    for (int64_t i = 0; i < K * N; i++) { Bh[i] = mmc_f32_to_bf16(0.05f * frand()); Ba[i] = fabsf(mmc_bf16_to_f32(Bh[i])); }
    mmc_gemm_bf16_infer(false, tb, M, N, K, 1.0f, A, lda, Bh, ldb, 0.0f, C, N);
    mmc_gemm_ref_bf16(false, tb, M, N, K, 1.0f, A, lda, Bh, ldb, 0.0f, R, N);
    mmc_gemm_ref(false, tb, M, N, K, 1.0f, Aa, lda, Ba, ldb, 0.0f, Bd, N);
    double worst_b = 0, worst_abs = 0, cmax = 0;
    for (int64_t i = 0; i < M * N; i++) {
        double d = fabs((double)C[i] - R[i]);
        if (d / Bd[i] > worst_b) worst_b = d / Bd[i];
        if (d > worst_abs) worst_abs = d;
        if (fabs(R[i]) > cmax) cmax = fabs(R[i]);
    }
    printf("test_gemm: bf16dot vs exact (A not rounded) tb=%d M=%lld N=%lld K=%lld: max |err|/bound %.3g, "
           "max |err| %.3g = %.3g of max|C|\n", tb, (long long)M, (long long)N, (long long)K, worst_b, worst_abs,
           worst_abs / cmax);
    CHECKF(worst_b < 1.0 / 256, "bf16dot error vs exact oracle %.3g of the bound", worst_b);
    free(A); free(Aa); free(Ba); free(Bh); free(C); free(R); free(Bd);
}

static const shape g_shapes[] = {
    {1, 1, 1},    {1, 3, 17},   {2, 33, 65},   {3, 65, 1},    {4, 129, 127}, {1, 130, 300},
    {5, 1, 1},    {17, 33, 1},  {33, 17, 65},  {65, 127, 33}, {127, 129, 17}, {129, 65, 129},
    {14, 32, 64}, {28, 64, 257}, {15, 33, 300}, {350, 70, 300}, {6, 16, 513}, {70, 200, 19},
    /* matvec path split into threaded units of row stretches with ragged ends */
    {1, 1001, 300}, {2, 2003, 129}, {4, 777, 100},
    /* K past the default KC (1024) and N past NC (2048): several B blocks, so 2 threads take
     * gemm.c's sliced path (each thread its own cell, its own packing) */
    {30, 70, 1100}, {9, 2100, 40},
};
static const float g_ab[][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, 0.75f}, {1.0f, 1.0f}};

/* Every shape × trans × (f32, bf16) on the current kernel, alpha/beta sweep, 1 vs 2 threads. */
static void kernel_suite(void) {
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            const shape *sh = &g_shapes[s];
            int v = (int)((s + t) % 4);
            int64_t pad = (s + t) % 3 == 0 ? 0 : 3 + (int64_t)s;
            run_case(t & 1, t >> 1, sh->M, sh->N, sh->K, pad, g_ab[v][0], g_ab[v][1], false);
            run_case(t & 1, t >> 1, sh->M, sh->N, sh->K, pad, g_ab[(v + 1) % 4][0], g_ab[(v + 1) % 4][1], true);
        }
    /* alpha/beta sweep on one awkward shape, both paths (M <= 4 and packed) */
    for (int v = 0; v < 4; v++) {
        run_case(false, true, 3, 45, 77, 2, g_ab[v][0], g_ab[v][1], false);
        run_case(true, false, 31, 45, 77, 2, g_ab[v][0], g_ab[v][1], true);
    }
    for (int t = 0; t < 4; t++) {
        run_determinism(t & 1, t >> 1, 300, 200, 333, false);
        run_determinism(t & 1, t >> 1, 300, 200, 333, true);
        run_determinism(t & 1, t >> 1, 2, 700, 257, false);
        run_determinism(t & 1, t >> 1, 3, 700, 257, true);
        run_determinism(t & 1, t >> 1, 20, 1000, 100, false);
        run_determinism(t & 1, t >> 1, 600, 70, 600, t == 3); /* tall: whole-N items */
        run_determinism(t & 1, t >> 1, 100, 70, 1100, t == 1);  /* 2 K blocks: sliced over M */
        run_determinism(t & 1, t >> 1, 40, 2100, 50, t == 2);   /* 2 N blocks: sliced over N */
    }
}

/* The bf16dot kernel's suite (A rounded to bf16 in the oracle; M <= 4 shapes take the matvec
 * path, which does not use it). */
static void bf16dot_suite(void) {
    g_ref_round_a = true;
    for (size_t s = 0; s < sizeof g_shapes / sizeof g_shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            const shape *sh = &g_shapes[s];
            if (sh->M <= 4) continue;
            int v = (int)((s + t) % 4);
            int64_t pad = (s + t) % 3 == 0 ? 0 : 3 + (int64_t)s;
            run_case(t & 1, t >> 1, sh->M, sh->N, sh->K, pad, g_ab[v][0], g_ab[v][1], true);
        }
    /* K across several K blocks (odd K: the last pair is half zero), odd kc tails */
    run_case(false, true, 30, 70, 2051, 1, 1.0f, 0.0f, true);
    run_case(true, false, 45, 33, 1025, 0, 0.5f, 1.0f, true);
    for (int t = 0; t < 4; t++) {
        run_determinism(t & 1, t >> 1, 300, 200, 333, true);
        run_determinism(t & 1, t >> 1, 600, 70, 1100, true);
    }
    g_ref_round_a = false;
}

/* bench_gemm's micro-kernel probe (mmc_gemm_ukr_loop) on the kernel set now: `calls` kernel calls
 * in the GEMM's order (A tiles inner) accumulate into one C tile; against a double sum over the
 * same (A tile, B panel) sequence, with the GEMM's tolerance for K = calls * kc. */
static void ukr_probe_check(void) {
    int mr, nr;
    mmc_gemm_ukr_tile(&mr, &nr);
    const int64_t kc = 37, na = 2, nb = 3, calls = 7;
    /* aligned_alloc: sizes rounded up to whole 64-byte units (C11; ASan checks it) */
    float *A = aligned_alloc(64, ((size_t)(na * kc * mr) * 4 + 63) / 64 * 64);
    float *B = aligned_alloc(64, ((size_t)(nb * kc * nr) * 4 + 63) / 64 * 64);
    float *C = aligned_alloc(64, ((size_t)(mr * nr) * 4 + 63) / 64 * 64);
    double *ref = calloc((size_t)(mr * nr), sizeof(double)), *bound = calloc((size_t)(mr * nr), sizeof(double));
    CHECKF(A && B && C && ref && bound, "out of memory");
    if (!(A && B && C && ref && bound)) goto out;
    for (int64_t i = 0; i < na * kc * mr; i++) A[i] = frand();
    for (int64_t i = 0; i < nb * kc * nr; i++) B[i] = frand();
    for (int64_t i = 0; i < mr * nr; i++) C[i] = frand(), ref[i] = C[i], bound[i] = fabs(C[i]);
    for (int64_t c = 0; c < calls; c++) {
        const float *a = A + (c % na) * kc * mr, *b = B + (c / na % nb) * kc * nr;
        for (int64_t k = 0; k < kc; k++)
            for (int i = 0; i < mr; i++)
                for (int j = 0; j < nr; j++) {
                    ref[i * nr + j] += (double)a[k * mr + i] * b[k * nr + j];
                    bound[i * nr + j] += fabs((double)a[k * mr + i] * b[k * nr + j]);
                }
    }
    mmc_gemm_ukr_loop(kc, A, na, B, nb, C, calls);
    double worst = 0;
    for (int64_t i = 0; i < mr * nr; i++) {
        const double e = fabs(C[i] - ref[i]) / (1e-5 * sqrt((double)(calls * kc)) * bound[i] + 1e-30);
        if (!(e <= worst)) worst = e;
    }
    CHECKF(worst <= 1.0, "%s: micro-kernel probe %dx%d off by %.3g of the tolerance", mmc_gemm_kernel_name(), mr, nr, worst);
out:
    free(A), free(B), free(C), free(ref), free(bound);
}

int main(int argc, char **argv) {
    const char *kernels[] = {"avx512", "avx2", "generic", "avx512"};
    /* part "blocks" / "blocks_shared" (asked for by name only: the blocking is read once, at the
     * first GEMM): tiny cache blocks MC=28 KC=40 NC=64 (bf16dot: MC=28 KC=40 NC=64 as well), so
     * every shape above spans many row, K and column blocks with ragged last blocks, on every
     * kernel; 2 threads then take the sliced path ("blocks") or the shared one ("blocks_shared",
     * MMC_GEMM_SPLIT=shared; native kernel only). Checked against the oracle and 1 vs 2 threads. */
    bool blocks = argc >= 2 && (!strcmp(argv[1], "blocks") || !strcmp(argv[1], "blocks_shared"));
    if (blocks) {
        setenv("MMC_GEMM_BLOCKING", "28,40,64", 1);
        setenv("MMC_GEMM_SPLIT", !strcmp(argv[1], "blocks") ? "slices" : "shared", 1);
    }
    /* part "avx512_bpf": the AVX-512 kernel's B-prefetching variant (Intel's default, gemm.c),
     * part "avx512" the plain one (AMD's): both checked on every machine (read at the first GEMM) */
    if (argc >= 2 && !strcmp(argv[1], "avx512_bpf")) setenv("MMC_GEMM_UKR", "bpf", 1);
    else if (argc >= 2 && !strcmp(argv[1], "avx512")) setenv("MMC_GEMM_UKR", "plain", 1);
    const char *native = mmc_gemm_kernel_name();
    printf("test_gemm: native kernel %s\n", native);
    if (blocks) {
        test_part(argc, argv, argv[1]);
        mmc_gemm_info gi;
        mmc_gemm_describe(&gi);
        CHECKF(gi.f32.kc == 40 && gi.f32.nc == 64 && gi.f32.mc == 28 && !strcmp(gi.blocking_source, "MMC_GEMM_BLOCKING") &&
                   !strcmp(gi.split, !strcmp(argv[1], "blocks") ? "slices" : "shared"),
               "blocking %lld/%lld/%lld from %s, split %s", (long long)gi.f32.mc, (long long)gi.f32.kc,
               (long long)gi.f32.nc, gi.blocking_source, gi.split);
        const bool shared = !strcmp(argv[1], "blocks_shared");
        for (int ki = 0; ki < 3; ki++) {
            /* blocks_shared: the native kernel only (the shared path is the same for all; its
             * thousands of barriers take long on a loaded machine) */
            if ((shared && strcmp(kernels[ki], native)) || mmc_gemm_set_kernel(kernels[ki]) != 0) continue;
            kernel_suite();
        }
        /* each bf16-product kernel the CPU has (vdpbf16ps, AMX) */
        const char *dots[] = {"avx512_bf16", "amx_bf16"};
        for (int d = 0; d < 2 && !shared; d++)
            if (mmc_gemm_set_kernel("avx512") == 0 && mmc_gemm_set_bf16_kernel(dots[d]) == 0) {
                bf16dot_suite();
                mmc_gemm_set_bf16_kernel("f32");
            }
        mmc_gemm_set_kernel(native);
        return test_done("test_gemm");
    }
    for (int ki = 0; ki < 4; ki++) {
        if (ki == 3 ? !test_part(argc, argv, "avx512_bpf") : !test_part(argc, argv, kernels[ki])) continue;
        if (mmc_gemm_set_kernel(kernels[ki]) != 0) {
            test_skip("test_gemm", "kernel %s: this CPU lacks its instructions", kernels[ki]);
            continue;
        }
        if (ki == 3) {
            mmc_gemm_info gi;
            mmc_gemm_describe(&gi);
            CHECKF(gi.f32_b_prefetch > 0, "MMC_GEMM_UKR=bpf: the B-prefetching kernel is not the one run");
        }
        kernel_suite();
        ukr_probe_check();
    }
    mmc_gemm_set_kernel(native);
    /* the bf16-product kernels: "bf16dot" vdpbf16ps (AVX512_BF16), "amx" AMX tiles */
    const char *dot_parts[][2] = {{"bf16dot", "avx512_bf16"}, {"amx", "amx_bf16"}};
    for (int d = 0; d < 2; d++) {
        if (!test_part(argc, argv, dot_parts[d][0])) continue;
        if (mmc_gemm_set_kernel("avx512") != 0 || mmc_gemm_set_bf16_kernel(dot_parts[d][1]) != 0) {
            test_skip("test_gemm", "%s: this CPU (or the OS) lacks %s", dot_parts[d][0], dot_parts[d][1]);
        } else {
            mmc_gemm_info gi;
            mmc_gemm_describe(&gi);
            CHECKF(gi.bf16_dot && !strcmp(gi.bf16_infer.kernel, dot_parts[d][1]) && !strcmp(gi.bf16.kernel, "avx512"),
                   "bf16 paths: infer %s, training %s", gi.bf16_infer.kernel, gi.bf16.kernel);
            /* mmc_gemm_set_bf16_dot(true) (MMC_GEMM_BF16=dot) picks AMX where the CPU has it */
            mmc_gemm_set_bf16_dot(true);
            mmc_gemm_describe(&gi);
            CHECKF(!strcmp(gi.bf16_infer.kernel, gi.amx_available ? "amx_bf16" : "avx512_bf16"),
                   "MMC_GEMM_BF16=dot picked %s (AMX %s)", gi.bf16_infer.kernel, gi.amx_available ? "yes" : "no");
            mmc_gemm_set_bf16_kernel(dot_parts[d][1]);
            bf16dot_suite();
            /* switched on, it is still only for inference: mmc_gemm_bf16 keeps the exact path */
            run_case(false, true, 350, 70, 300, 0, 1.0f, 0.0f, true);
            run_case(false, false, 65, 127, 33, 2, 0.5f, 1.0f, true);
            bf16dot_error(true, 64, 512, 896);
            bf16dot_error(false, 64, 512, 4864);
            mmc_gemm_set_bf16_kernel("f32");
        }
        mmc_gemm_set_kernel(native);
    }
    return test_done("test_gemm");
}
