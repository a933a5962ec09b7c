/* linear.c — the linear building block (mmc_nn.h): base projection plus optional LoRA
 * adapter, mirroring PEFT's lora.Linear.forward: result = base(x) + B(A(dropout(x))) * scale; for a
 * fused linear (parts), each part's adapter on its slice of the output, as PEFT on the separate linears. */
#include "mmc_nn.h"
#include "mmc_ops.h"
#include "gemm.h"
#include "linear.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* x [..., K] · packed Wᵀ + b: forward only (pre-packed weights serve inference) */
static mmc_tensor *linear_prepacked(mmc_ctx *ctx, mmc_tensor *x, const mmc_gemm_packed_b *w, mmc_tensor *b) {
    char sx[64];
    const int64_t N = mmc_gemm_packed_b_rows(w), K = mmc_gemm_packed_b_cols(w);
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim >= 1 && mmc_is_contiguous(x) && x->shape[x->ndim - 1] == K,
              "mmc_nn_linear (pre-packed [%lld, %lld] weight): x must be contiguous f32 [..., %lld], got %s %s",
              (long long)N, (long long)K, (long long)K, mmc_dtype_name(x->dtype), mmc_shape_str(x, sx, sizeof sx));
    MMC_CHECK(!mmc_grad_enabled(ctx) || (!mmc_requires_grad(x) && !mmc_requires_grad(b)),
              "mmc_nn_linear: this linear's weight was pre-packed for inference (mmc_prepack_linears) and has no "
              "backward; run it with gradients off, or load the model without pre-packing (MMC_PREPACK=0)");
    MMC_CHECK(!b || ((b->dtype == MMC_F32 || b->dtype == MMC_BF16) && b->ndim == 1 && b->shape[0] == N &&
                     mmc_is_contiguous(b)),
              "mmc_nn_linear: bias must be f32/bf16 [%lld]", (long long)N);
    int64_t shape[MMC_MAX_DIMS], M = 1;
    memcpy(shape, x->shape, sizeof shape);
    for (int d = 0; d < x->ndim - 1; d++) M *= x->shape[d];
    shape[x->ndim - 1] = N;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, x->ndim, shape);   /* [..., N] */
    mmc_cpu_linear_fwd_packed(x->data, w, b ? b->data : NULL, b && b->dtype == MMC_BF16, y->data, M);
    return y;
}

mmc_tensor *mmc_nf4_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_nf4 *q, mmc_tensor *b)
    __attribute__((weak));
mmc_tensor *mmc_q8_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_q8 *q, mmc_tensor *b)
    __attribute__((weak));

/* B(A(dropout(x))) * scale [..., N] */
static mmc_tensor *lora_delta(mmc_ctx *ctx, mmc_tensor *x, const mmc_lora *a) {
    mmc_tensor *xd = a->dropout > 0 ? mmc_nn_dropout(ctx, x, a->dropout, a->stream) : x;
    mmc_tensor *h = mmc_linear(ctx, xd, a->A, NULL);       /* [..., r] */
    h = mmc_linear(ctx, h, a->B, NULL);                     /* [..., N] */
    return mmc_scale(ctx, h, a->scale);
}

mmc_tensor *mmc_nn_linear(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l) {
    mmc_tensor *y;
    if (l->q) {
        MMC_CHECK(mmc_nf4_linear, "NF4 weights need the quantisation module (src/nn/quant.c)");
        y = mmc_nf4_linear(ctx, x, l->q, l->b);
    } else if (l->q8) {
        MMC_CHECK(mmc_q8_linear, "int8 weights need the quantisation module (src/nn/quant.c)");
        y = mmc_q8_linear(ctx, x, l->q8, l->b);
    } else if (l->pk) {
        y = linear_prepacked(ctx, x, l->pk, l->b);
    } else {
        y = mmc_linear(ctx, x, l->w, l->b);
    }
    if (l->lora) y = mmc_add(ctx, y, lora_delta(ctx, x, l->lora));
    if (!l->n_parts) return y;
    /* a fused linear's parts: each adapted part's delta on its slice of the output, zeros elsewhere */
    mmc_tensor *d[8];
    bool any = false;
    MMC_CHECK(l->n_parts <= 8, "mmc_nn_linear: %d parts (at most 8)", l->n_parts);
    for (int j = 0; j < l->n_parts; j++) any |= l->parts[j].lora != NULL;
    if (!any) return y;
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    for (int j = 0; j < l->n_parts; j++) {
        const mmc_linear_w *p = &l->parts[j];
        if (p->lora) { d[j] = lora_delta(ctx, x, p->lora); continue; }
        shape[x->ndim - 1] = p->out_features;
        d[j] = mmc_new(ctx, MMC_F32, x->ndim, shape);                         /* [..., N_j] of zeros */
        memset(d[j]->data, 0, mmc_nbytes(d[j]));
    }
    return mmc_add(ctx, y, mmc_concat(ctx, d, l->n_parts, x->ndim - 1));
}

/* ------------------------------------------------------------------ pre-packed weights */

bool mmc_prepack_enabled(void) {
    const char *v = getenv("MMC_PREPACK");
    return !(v && *v && !strcmp(v, "0"));
}

void mmc_linear_packed_free(mmc_linear_w *l) {
    mmc_gemm_packed_b_free(l->pk);
    l->pk = NULL;
}

/* The whole pages inside [p, p + bytes) of a weight mapped from a file, dropped from the resident
 * set (a later read would fault them back in from the file; nothing reads them once packed). */
void mmc_params_drop(mmc_tensor **params, char (*names)[96], int *n_params, const mmc_tensor *w) {
    if (!params || !n_params) return;
    int k = 0;
    for (int j = 0; j < *n_params; j++) {
        if (params[j] == w) continue;
        params[k] = params[j];
        if (names && k != j) memcpy(names[k], names[j], sizeof names[0]);
        k++;
    }
    *n_params = k;
}

static void release_mapped(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) / pg * pg,
                    e = ((uintptr_t)p + bytes) / pg * pg;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
#else
    (void)p, (void)bytes;
#endif
}

mmc_status mmc_prepack_linears(mmc_linear_w **mods, int n, mmc_tensor **params, char (*names)[96], int *n_params,
                               int *n_packed, int64_t *bytes_before, int64_t *bytes_after) {
    mmc_gemm_info gi;
    mmc_gemm_describe(&gi);
    for (int i = 0; i < n; i++) {
        mmc_linear_w *l = mods[i];
        mmc_tensor *w = l->w;
        if (l->pk || l->q || l->q8 || !w || w->ndim != 2 || !mmc_is_contiguous(w) ||
            (w->dtype != MMC_F32 && w->dtype != MMC_BF16) || (w->dtype == MMC_BF16 && !gi.bf16_dot))
            continue;
        bool shared = false;   /* a weight two linears hold (none of the models here; kept as it is) */
        for (int j = 0; j < n && !shared; j++) shared = j != i && mods[j]->w == w;
        if (shared) continue;
        mmc_gemm_packed_b *pb = mmc_gemm_pack_b(w->data, w->dtype == MMC_BF16, w->shape[0], w->shape[1], w->shape[1], true);
        if (!pb) return mmc_error_prefix(MMC_ERR_OOM, "pre-packing '%s'", w->name);
        if (n_packed) ++*n_packed;
        if (bytes_before) *bytes_before += (int64_t)mmc_nbytes(w);
        if (bytes_after) *bytes_after += (int64_t)mmc_gemm_packed_b_bytes(pb);
        l->pk = pb;
        l->w = NULL;
        mmc_params_drop(params, names, n_params, w);
        if (!(w->flags & MMC_OWNS_DATA)) release_mapped(w->data, mmc_nbytes(w));
        mmc_tensor_free(w);
    }
    return MMC_OK;
}
