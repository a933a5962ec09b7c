/* gemm_grouped.h — a grouped GEMM: many independent gemm.h problems (the experts of a MoE
 * layer, each with its own row block and weight) run as one call. The problems are cut into
 * column panels and the panels handed out to the threads dynamically, each panel computed by
 * one single-threaded mmc_gemm_f32 / mmc_gemm_bf16 (gemm.c runs on the calling thread inside a
 * parallel region), so one parallel region covers every expert instead of a fork-join per
 * expert GEMM, and small row blocks (an expert few tokens picked) share the threads with the
 * large ones. The arithmetic of every C element is gemm.h's (the K blocking does not depend on
 * which panel or thread computes it), so the result is what a loop of the same calls gives. */
#ifndef MMC_CPU_GEMM_GROUPED_H
#define MMC_CPU_GEMM_GROUPED_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t M, N, K;        /* as gemm.h: C[M, N] = alpha op(A)[M, K] op(B)[K, N] + beta C */
    const float *A;
    int64_t lda;
    const void *B;          /* f32, or bf16 when b_bf16 */
    int64_t ldb;
    float *C;
    int64_t ldc;
} mmc_gemm_group;

/* Every group with the same transposes, alpha, beta and B dtype; groups with M or N 0 are
 * skipped (K 0 with beta 0 writes zeros, as gemm.h). */
void mmc_gemm_grouped(bool trans_a, bool trans_b, float alpha, float beta, bool b_bf16, const mmc_gemm_group *g,
                      int n_groups);

#endif
