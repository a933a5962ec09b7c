/* moe_experts.c — the routed experts of a MoE block as one autograd op over all experts: the
 * rows of x are grouped by expert (counts[e] rows for expert e, in expert order) and expert e's
 * SwiGLU MLP, down_e(silu(gate_e x) * up_e x) (transformers' Qwen2MoeMLP, no biases), runs on
 * its row block. Each projection is one grouped GEMM over every expert's row block
 * (src/backend/cpu/gemm_grouped.h; gate and up together), the SwiGLU one pass over all rows,
 * and backward the same grouped GEMMs for dx and each weight's gradient — instead of a loop of
 * per-expert linear, swiglu and row-copy ops (Megatron-LM's GroupedMLP does this with
 * grouped_gemm on GPUs). The arithmetic is the loop's: the same GEMMs and elementwise kernels,
 * only scheduled together. */
#include "mmc_nn.h"
#include "mmc_ops.h"
#include "gemm_grouped.h"
#include "elementwise.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n, C, I;
    int64_t *off;                 /* [n + 1] first row of each expert */
    mmc_tensor **gate, **up, **down;
    bool bf16;
} moe_ex;

static void fill(mmc_gemm_group *g, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const void *B,
                 int64_t ldb, float *C, int64_t ldc) {
    *g = (mmc_gemm_group){M, N, K, A, lda, B, ldb, C, ldc};
}

static void experts_backward(mmc_ctx *ctx, mmc_node *n) {
    const moe_ex *e = n->extra;
    mmc_tensor *x = n->in[0];
    const int64_t E = e->n, C = e->C, I = e->I, M = x->shape[0];
    const float *X = x->data, *G = n->saved[0]->data, *U = n->saved[1]->data, *A = n->saved[2]->data;
    const float *dY = n->out->grad->data;
    mmc_gemm_group *gr = calloc((size_t)(2 * E + 1), sizeof *gr);
    float *dA = malloc(sizeof(float) * (size_t)(M * I + 1)), *dG = calloc((size_t)(2 * M * I + 1), sizeof(float));
    MMC_CHECK(gr && dA && dG, "moe experts backward: out of memory");
    float *dU = dG + M * I;
    /* dA_e = dY_e W_down_e   [M_e, I] */
    for (int64_t k = 0; k < E; k++)
        fill(&gr[k], e->off[k + 1] - e->off[k], I, C, dY + e->off[k] * C, C, e->down[k]->data, I, dA + e->off[k] * I, I);
    mmc_gemm_grouped(false, false, 1.0f, 0.0f, e->bf16, gr, (int)E);
    /* dW_down_e += dY_eᵀ A_e   [C, I] */
    int ng = 0;
    for (int64_t k = 0; k < E; k++)
        if (mmc_requires_grad(e->down[k]) && e->off[k + 1] > e->off[k])
            fill(&gr[ng++], C, I, e->off[k + 1] - e->off[k], dY + e->off[k] * C, C, A + e->off[k] * I, I,
                 mmc_grad(ctx, e->down[k])->data, I);
    mmc_gemm_grouped(true, false, 1.0f, 1.0f, false, gr, ng);
    ew_swiglu_bwd_acc_f32(dG, dU, G, U, dA, M * I);
    /* dx_e += dG_e W_gate_e + dU_e W_up_e   [M_e, C] (two calls: both add into dx) */
    if (mmc_requires_grad(x)) {
        float *dX = mmc_grad(ctx, x)->data;
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t k = 0; k < E; k++)
                fill(&gr[k], e->off[k + 1] - e->off[k], C, I, (pass ? dU : dG) + e->off[k] * I, I,
                     (pass ? e->up : e->gate)[k]->data, C, dX + e->off[k] * C, C);
            mmc_gemm_grouped(false, false, 1.0f, 1.0f, e->bf16, gr, (int)E);
        }
    }
    /* dW_gate_e += dG_eᵀ x_e, dW_up_e += dU_eᵀ x_e   [I, C] (one call) */
    ng = 0;
    for (int64_t k = 0; k < E; k++)
        for (int pass = 0; pass < 2; pass++) {
            mmc_tensor *w = (pass ? e->up : e->gate)[k];
            if (mmc_requires_grad(w) && e->off[k + 1] > e->off[k])
                fill(&gr[ng++], I, C, e->off[k + 1] - e->off[k], (pass ? dU : dG) + e->off[k] * I, I, X + e->off[k] * C,
                     C, mmc_grad(ctx, w)->data, C);
        }
    mmc_gemm_grouped(true, false, 1.0f, 1.0f, false, gr, ng);
    free(gr);
    free(dA);
    free(dG);
}

bool mmc_moe_experts_grouped_ok(const mmc_linear_w *gate, const mmc_linear_w *up, const mmc_linear_w *down, int64_t n) {
    if (n < 1 || !gate[0].w) return false;
    const mmc_dtype dt = gate[0].w->dtype;
    if (dt != MMC_F32 && dt != MMC_BF16) return false;
    for (int64_t k = 0; k < n; k++) {
        const mmc_linear_w *l[3] = {&gate[k], &up[k], &down[k]};
        for (int j = 0; j < 3; j++)
            if (!l[j]->w || l[j]->b || l[j]->lora || l[j]->q || l[j]->q8 || l[j]->w->dtype != dt ||
                !mmc_is_contiguous(l[j]->w))
                return false;
    }
    return true;
}

mmc_tensor *mmc_moe_experts_swiglu(mmc_ctx *ctx, mmc_tensor *x, const int64_t *counts, int64_t n,
                                   const mmc_linear_w *gate, const mmc_linear_w *up, const mmc_linear_w *down) {
    MMC_CHECK(mmc_moe_experts_grouped_ok(gate, up, down, n), "mmc_moe_experts_swiglu: plain f32/bf16 weights only");
    x = mmc_contiguous(ctx, x);
    const int64_t M = x->shape[0], C = x->shape[1], I = gate[0].w->shape[0];
    mmc_arena *ar = mmc_ctx_arena(ctx);
    moe_ex *e = mmc_arena_alloc(ar, sizeof *e);
    e->n = n, e->C = C, e->I = I, e->bf16 = gate[0].w->dtype == MMC_BF16;
    e->off = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)(n + 1));
    e->gate = mmc_arena_alloc(ar, sizeof(mmc_tensor *) * (size_t)(3 * n));
    e->up = e->gate + n, e->down = e->gate + 2 * n;
    e->off[0] = 0;
    bool wgrad = false;
    for (int64_t k = 0; k < n; k++) {
        MMC_CHECK(gate[k].w->shape[0] == I && gate[k].w->shape[1] == C && up[k].w->shape[0] == I &&
                  up[k].w->shape[1] == C && down[k].w->shape[0] == C && down[k].w->shape[1] == I,
                  "mmc_moe_experts_swiglu: expert %lld's weights do not match x [%lld, %lld] and I %lld",
                  (long long)k, (long long)M, (long long)C, (long long)I);
        e->off[k + 1] = e->off[k] + counts[k];
        e->gate[k] = gate[k].w, e->up[k] = up[k].w, e->down[k] = down[k].w;
        wgrad |= mmc_requires_grad(gate[k].w) || mmc_requires_grad(up[k].w) || mmc_requires_grad(down[k].w);
    }
    MMC_CHECK(e->off[n] == M, "mmc_moe_experts_swiglu: counts add up to %lld rows, x has %lld", (long long)e->off[n],
              (long long)M);
    mmc_tensor *G = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, I)), *U = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, I));
    mmc_tensor *A = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, I)), *Y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, C));
    mmc_gemm_group *gr = malloc(sizeof *gr * (size_t)(2 * n + 1));
    MMC_CHECK(gr, "mmc_moe_experts_swiglu: out of memory");
    const float *X = x->data;
    /* G_e = x_e W_gate_eᵀ, U_e = x_e W_up_eᵀ   [M_e, I]: one grouped call */
    for (int64_t k = 0; k < n; k++) {
        const int64_t m = counts[k], o = e->off[k];
        fill(&gr[2 * k], m, I, C, X + o * C, C, gate[k].w->data, C, (float *)G->data + o * I, I);
        fill(&gr[2 * k + 1], m, I, C, X + o * C, C, up[k].w->data, C, (float *)U->data + o * I, I);
    }
    mmc_gemm_grouped(false, true, 1.0f, 0.0f, e->bf16, gr, (int)(2 * n));
    ew_swiglu_f32(A->data, G->data, U->data, M * I);
    /* Y_e = A_e W_down_eᵀ   [M_e, C] */
    for (int64_t k = 0; k < n; k++)
        fill(&gr[k], counts[k], C, I, (const float *)A->data + e->off[k] * I, I, down[k].w->data, I,
             (float *)Y->data + e->off[k] * C, C);
    mmc_gemm_grouped(false, true, 1.0f, 0.0f, e->bf16, gr, (int)n);
    free(gr);
    if (!mmc_grad_enabled(ctx) || (!mmc_requires_grad(x) && !wgrad)) return Y;
    /* the weights are reached through extra (any number of experts); the token input makes the
     * node record when only they need a gradient */
    mmc_tensor *tok = mmc_scalar(ctx, 0.0f);
    if (wgrad) tok->flags |= MMC_REQUIRES_GRAD;
    mmc_tensor *in[2] = {x, tok};
    mmc_node *nd = mmc_tape_record(ctx, "moe_experts_swiglu", experts_backward, Y, 2, in);
    if (nd) {
        nd->extra = e;
        nd->saved[0] = G, nd->saved[1] = U, nd->saved[2] = A;
    }
    return Y;
}
