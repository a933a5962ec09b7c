/* attention.c — mmc_attention: scaled dot-product attention with grouped-query heads and
 * full / causal (bottom-right aligned) / variable-length block-diagonal masks. Semantics
 * follow torch.nn.functional.scaled_dot_product_attention (enable_gqa=True) with an
 * explicit mask, and flash-attn's varlen interface for cu_seqlens. The kernels are in
 * src/backend/cpu/attention.c; the tape node saves the per-row logsumexp [B, Hq, T].
 */
#include "mmc.h"
#include "mmc_ops.h"
#include "attention.h"

#include <math.h>
#include <string.h>

static void fill_args(mmc_attn_args *a, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v, float scale,
                      bool causal, const int32_t *cu, int n_seqs) {
    memset(a, 0, sizeof *a);
    a->B = (int)q->shape[0];
    a->T = (int)q->shape[1];
    a->Hq = (int)q->shape[2];
    a->D = (int)q->shape[3];
    a->S = (int)k->shape[1];
    a->Hkv = (int)k->shape[2];
    a->Dv = (int)v->shape[3];
    a->q = q->data;
    a->k = k->data;
    a->v = v->data;
    for (int i = 0; i < 3; i++) {
        a->sq[i] = q->stride[i];
        a->sk[i] = k->stride[i];
        a->sv[i] = v->stride[i];
    }
    a->scale = scale;
    a->causal = causal;
    a->cu_seqlens = cu;
    a->n_seqs = n_seqs;
}

static void attention_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    bool gq = mmc_requires_grad(q), gk = mmc_requires_grad(k), gv = mmc_requires_grad(v);
    if (!gq && !gk && !gv) return;
    mmc_attn_args a;
    fill_args(&a, q, k, v, (float)n->f[0], n->i[0] != 0, n->extra, (int)n->i[1]);
    float *dq = gq ? mmc_grad(ctx, q)->data : NULL;
    float *dk = gk ? mmc_grad(ctx, k)->data : NULL;
    float *dv = gv ? mmc_grad(ctx, v)->data : NULL;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    void *scratch = mmc_scratch_alloc(ctx, mmc_attn_bwd_scratch(&a, mmc_get_num_threads(), gk, gv));
    mmc_attn_bwd_f32(&a, n->out->data, n->out->grad->data, n->saved[0]->data, dq, dk, dv, scratch);
    mmc_scratch_release(ctx, m);
}

mmc_tensor *mmc_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v,
                          const mmc_attn_opts *opts) {
    char sq[64], sk[64], sv[64];
    mmc_shape_str(q, sq, sizeof sq);
    mmc_shape_str(k, sk, sizeof sk);
    mmc_shape_str(v, sv, sizeof sv);
    MMC_CHECK(q->ndim == 4 && k->ndim == 4 && v->ndim == 4,
              "mmc_attention: q %s, k %s, v %s must be [B, T, H, D]", sq, sk, sv);
    MMC_CHECK(q->dtype == MMC_F32 && k->dtype == MMC_F32 && v->dtype == MMC_F32,
              "mmc_attention: q, k, v must be f32");
    MMC_CHECK(q->stride[3] == 1 && k->stride[3] == 1 && v->stride[3] == 1,
              "mmc_attention: the head dim of q %s, k %s, v %s must be contiguous (stride 1); "
              "call mmc_contiguous first", sq, sk, sv);
    MMC_CHECK(k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0],
              "mmc_attention: batch mismatch q %s, k %s, v %s", sq, sk, sv);
    MMC_CHECK(k->shape[3] == q->shape[3], "mmc_attention: q %s and k %s head dims differ", sq, sk);
    MMC_CHECK(v->shape[1] == k->shape[1] && v->shape[2] == k->shape[2],
              "mmc_attention: k %s and v %s must agree on [S, Hkv]", sk, sv);
    MMC_CHECK(k->shape[2] > 0 && q->shape[2] % k->shape[2] == 0,
              "mmc_attention: query heads %lld not a multiple of kv heads %lld (q %s, k %s)",
              (long long)q->shape[2], (long long)k->shape[2], sq, sk);
    mmc_attn_opts def = {0};
    if (!opts) opts = &def;
    float scale = opts->scale != 0 ? opts->scale : 1.0f / sqrtf((float)q->shape[3]);
    int32_t *cu = NULL;
    if (opts->cu_seqlens) {
        MMC_CHECK(q->shape[0] == 1 && q->shape[1] == k->shape[1],
                  "mmc_attention: cu_seqlens needs B == 1 and T == S (q %s, k %s)", sq, sk);
        MMC_CHECK(opts->n_seqs >= 1 && opts->cu_seqlens[0] == 0 &&
                      opts->cu_seqlens[opts->n_seqs] == q->shape[1],
                  "mmc_attention: cu_seqlens must run from 0 to T = %lld over %d sequences",
                  (long long)q->shape[1], opts->n_seqs);
        for (int i = 0; i < opts->n_seqs; i++)
            MMC_CHECK(opts->cu_seqlens[i + 1] >= opts->cu_seqlens[i],
                      "mmc_attention: cu_seqlens not non-decreasing at %d", i);
        /* copied: the node outlives the caller's array */
        cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(opts->n_seqs + 1));
        memcpy(cu, opts->cu_seqlens, sizeof(int32_t) * (size_t)(opts->n_seqs + 1));
    }
    mmc_attn_args a;
    fill_args(&a, q, k, v, scale, opts->causal, cu, cu ? opts->n_seqs : 0);

    mmc_tensor *out = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(q->shape[0], q->shape[1], q->shape[2], v->shape[3]));
    bool rec = mmc_grad_enabled(ctx) && (mmc_requires_grad(q) || mmc_requires_grad(k) || mmc_requires_grad(v));
    mmc_tensor *lse = rec ? mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(q->shape[0], q->shape[2], q->shape[1])) : NULL;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    void *scratch = mmc_scratch_alloc(ctx, mmc_attn_fwd_scratch(&a, mmc_get_num_threads()));
    mmc_attn_fwd_f32(&a, out->data, lse ? lse->data : NULL, scratch);
    mmc_scratch_release(ctx, m);

    mmc_tensor *ins[3] = {q, k, v};
    mmc_node *n = mmc_tape_record(ctx, "attention", attention_backward, out, 3, ins);
    if (n) {
        n->saved[0] = lse;  /* [B, Hq, T] */
        n->f[0] = scale;
        n->i[0] = opts->causal;
        n->i[1] = cu ? opts->n_seqs : 0;
        n->extra = cu;
    }
    return out;
}
