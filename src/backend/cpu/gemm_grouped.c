/* gemm_grouped.c — the grouped GEMM driver of gemm_grouped.h over gemm.c's kernels. */
#include "gemm_grouped.h"
#include "gemm.h"

#include <omp.h>
#include <stdlib.h>

typedef struct { int g; int64_t n0, n1; } panel;

/* Panels of at least 64 columns (a multiple of the 16/32-wide micro-kernels), about four per
 * thread over the whole call so the dynamic schedule can even out unequal row blocks. */
void mmc_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, bool b_bf16, const mmc_gemm_group *g,
                      int n_groups) {
    const int nth = omp_in_parallel() ? 1 : omp_get_max_threads();
    double flops = 0;
    for (int i = 0; i < n_groups; i++) flops += 2.0 * (double)g[i].M * (double)g[i].N * (double)g[i].K;
    if (nth == 1 || flops < 2e6) {   /* one thread, or too little work to share: the plain loop */
        for (int i = 0; i < n_groups; i++) {
            const mmc_gemm_group *p = &g[i];
            if (p->M <= 0 || p->N <= 0) continue;
            if (b_bf16) mmc_gemm_bf16(trans_a, trans_b, p->M, p->N, p->K, alpha, p->A, p->lda, p->B, p->ldb, beta, p->C, p->ldc);
            else mmc_gemm_f32(trans_a, trans_b, p->M, p->N, p->K, alpha, p->A, p->lda, p->B, p->ldb, beta, p->C, p->ldc);
        }
        return;
    }
    const double target = flops / (4.0 * nth);
    int cap = 0;
    for (int i = 0; i < n_groups; i++) {
        if (g[i].M <= 0 || g[i].N <= 0) continue;
        const double f = 2.0 * (double)g[i].M * (double)g[i].N * (double)(g[i].K > 0 ? g[i].K : 1);
        int64_t parts = (int64_t)(f / target + 0.5);
        if (parts < 1) parts = 1;
        if (parts > (g[i].N + 63) / 64) parts = (g[i].N + 63) / 64;
        cap += (int)parts;
    }
    panel stackp[256], *pl = cap <= 256 ? stackp : malloc(sizeof *pl * (size_t)cap);
    if (!pl) {   /* no memory for the list: the loop still gives the result */
        for (int i = 0; i < n_groups; i++)
            if (g[i].M > 0 && g[i].N > 0) mmc_gemm_grouped(trans_a, trans_b, alpha, beta, b_bf16, &g[i], 1);
        return;
    }
    int np = 0;
    for (int i = 0; i < n_groups; i++) {
        if (g[i].M <= 0 || g[i].N <= 0) continue;
        const double f = 2.0 * (double)g[i].M * (double)g[i].N * (double)(g[i].K > 0 ? g[i].K : 1);
        int64_t parts = (int64_t)(f / target + 0.5);
        if (parts < 1) parts = 1;
        if (parts > (g[i].N + 63) / 64) parts = (g[i].N + 63) / 64;
        int64_t w = (g[i].N + parts - 1) / parts;
        w = (w + 63) / 64 * 64;
        for (int64_t n0 = 0; n0 < g[i].N && np < cap; n0 += w)
            pl[np++] = (panel){i, n0, n0 + w < g[i].N ? n0 + w : g[i].N};
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
    for (int q = 0; q < np; q++) {
        const mmc_gemm_group *p = &g[pl[q].g];
        const int64_t n0 = pl[q].n0, nn = pl[q].n1 - n0;
        /* op(B) columns n0..: B [N, K] rows (trans_b) or B [K, N] columns */
        const size_t es = b_bf16 ? 2 : 4;
        const char *B = (const char *)p->B + (size_t)(trans_b ? n0 * p->ldb : n0) * es;
        if (b_bf16) mmc_gemm_bf16(trans_a, trans_b, p->M, nn, p->K, alpha, p->A, p->lda, (const uint16_t *)B, p->ldb,
                                  beta, p->C + n0, p->ldc);
        else mmc_gemm_f32(trans_a, trans_b, p->M, nn, p->K, alpha, p->A, p->lda, (const float *)B, p->ldb, beta,
                          p->C + n0, p->ldc);
    }
    if (pl != stackp) free(pl);
}
