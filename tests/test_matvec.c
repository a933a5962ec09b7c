/* test_matvec.c — the batched decode's linears (src/backend/cpu/matvec.c: y = x · Wᵀ for up to 64 rows
 * of x, W read once) against (1) the GEMM's matvec path run per group of at most 4 rows, which a row
 * decoded alone takes: bit for bit equal, the serving engine's invariant (a row's logits do not depend
 * on the batch); and (2) a float64 product: |y - y64| <= 1e-5 · Σ|x·w| + 1e-30 per output. f32 and bf16
 * weights, beta 0 and 1 (a bias already in y), M from 1 to 64, K below, at and past the 512-wide K
 * chunk with partial 32- and 16-blocks (1000, 1100, 1536 + 8), odd N; 1 and 2 threads. Skips where
 * the GEMM's kernel is not AVX-512 (the path it repeats). */
#include "test_util.h"
#include "../src/backend/cpu/gemm.h"
#include "../src/backend/cpu/matvec.h"

#include <omp.h>
#include <stdint.h>

static uint32_t g_seed = 12345;
static float rnd(void) {
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) * (1.0f / (1 << 24)) - 0.5f;
}

int main(void) {
    if (!mmc_matvec_rows_ok()) {
        test_skip("test_matvec", "the GEMM kernel here is %s, not avx512 (matvec.c repeats the AVX-512 sums)",
                  mmc_gemm_kernel_name());
        return test_done("test_matvec");
    }
    static const int64_t Ms[] = {1, 3, 4, 5, 12, 16, 17, 64}, Ks[] = {64, 1000, 1100, 1544}, Ns[] = {37, 301};
    int64_t cases = 0, differ = 0;
    double worst = 0;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (int bf = 0; bf < 2; bf++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
                for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                        const int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                        const float beta = (float)(mi & 1);
                        float *x = malloc(sizeof(float) * (size_t)(M * K)), *w = malloc(sizeof(float) * (size_t)(N * K));
                        uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)(N * K));
                        float *y = malloc(sizeof(float) * (size_t)(M * N)), *ref = malloc(sizeof(float) * (size_t)(M * N));
                        float *bias = malloc(sizeof(float) * (size_t)(M * N));
                        for (int64_t i = 0; i < M * K; i++) x[i] = rnd();
                        for (int64_t i = 0; i < N * K; i++) {
                            wh[i] = mmc_f32_to_bf16(rnd());
                            w[i] = bf ? mmc_bf16_to_f32(wh[i]) : rnd();
                        }
                        for (int64_t i = 0; i < M * N; i++) bias[i] = rnd();
                        memcpy(y, bias, sizeof(float) * (size_t)(M * N));
                        memcpy(ref, bias, sizeof(float) * (size_t)(M * N));
                        mmc_matvec_rows(M, N, K, x, bf ? (const void *)wh : w, bf, beta, y);
                        for (int64_t g = 0; g < M; g += 4) {   /* what each row gets in a decode of at most 4 rows */
                            const int64_t m = M - g < 4 ? M - g : 4;
                            if (bf) mmc_gemm_bf16_infer(false, true, m, N, K, 1.0f, x + g * K, K, wh, K, beta, ref + g * N, N);
                            else mmc_gemm_f32(false, true, m, N, K, 1.0f, x + g * K, K, w, K, beta, ref + g * N, N);
                        }
                        differ += memcmp(y, ref, sizeof(float) * (size_t)(M * N)) != 0;
                        for (int64_t m = 0; m < M; m++)
                            for (int64_t n = 0; n < N; n++) {
                                double s = beta * (double)bias[m * N + n], a = 0;
                                for (int64_t k = 0; k < K; k++) {
                                    s += (double)x[m * K + k] * w[n * K + k];
                                    a += fabs((double)x[m * K + k] * w[n * K + k]);
                                }
                                const double e = fabs(y[m * N + n] - s) / (a + fabs(beta * bias[m * N + n]) + 1e-30);
                                if (e > worst) worst = e;
                            }
                        cases++;
                        free(x), free(w), free(wh), free(y), free(ref), free(bias);
                    }
    }
    printf("test_matvec: %lld cases (f32 / bf16, M 1..64, K 64..1544, 1 and 2 threads): %lld differ bitwise from the "
           "GEMM's matvec path per 4 rows; max error vs float64 %.3g of sum |x*w|\n",
           (long long)cases, (long long)differ, worst);
    CHECKF(differ == 0, "%lld cases differ from the per-row GEMM matvec path", (long long)differ);
    CHECKF(worst <= 1e-5, "max relative error %.3g > 1e-5", worst);
    return test_done("test_matvec");
}
