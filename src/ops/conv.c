/* conv.c — convolution ops.
 *
 * mmc_patch_embed: Qwen2-VL's PatchEmbed (a Conv3d / Conv2d whose stride equals its kernel,
 * applied to patches the processor already flattened): it is exactly a linear layer with
 * W viewed as [Cout, Cin*kt*kh*kw], so it runs the linear kernels on w's storage without
 * copying it.
 * mmc_conv2d: torch.nn.functional.conv2d (square stride / zero padding, no dilation or
 * groups) as im2col + GEMM per image; backward recomputes the columns instead of keeping
 * them (memory), dx via Wᵀ·dy and col2im, dW via dy·colᵀ. */
#include "mmc_ops.h"
#include "conv.h"
#include "gemm.h"
#include "linear.h"

#include <string.h>

static void check_bias(const char *op, const mmc_tensor *b, int64_t Cout) {
    char s[64];
    if (!b) return;
    MMC_CHECK((b->dtype == MMC_F32 || b->dtype == MMC_BF16) && b->ndim == 1 && b->shape[0] == Cout &&
                  mmc_is_contiguous(b),
              "%s: b must be f32/bf16 [%lld], got %s %s", op, (long long)Cout, mmc_dtype_name(b->dtype),
              mmc_shape_str(b, s, sizeof s));
}

/* ------------------------------------------------------------------ patch embed */
static void patch_embed_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    int64_t M = n->i[0], N = n->i[1], K = n->i[2];
    float *dx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *dw = mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;   /* w's shape, same layout */
    float *db = mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    mmc_cpu_linear_bwd(x->data, w->data, w->dtype == MMC_BF16, n->out->grad->data, dx, dw, db, M,
                       N, K);
}

mmc_tensor *mmc_patch_embed(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    char sx[64], sw[64];
    MMC_CHECK(x && w, "mmc_patch_embed: x and w are required");
    int64_t K = 1;
    for (int d = 1; d < w->ndim; d++) K *= w->shape[d];
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 2 && mmc_is_contiguous(x) &&
                  (w->dtype == MMC_F32 || w->dtype == MMC_BF16) && (w->ndim == 4 || w->ndim == 5) &&
                  mmc_is_contiguous(w) && x->shape[1] == K,
              "mmc_patch_embed: need x f32 [N, Cin*kt*kh*kw] and w f32/bf16 [Cout, Cin, (kt,) kh, kw] "
              "with matching sizes; got x %s, w %s %s",
              mmc_shape_str(x, sx, sizeof sx), mmc_dtype_name(w->dtype), mmc_shape_str(w, sw, sizeof sw));
    int64_t M = x->shape[0], N = w->shape[0];
    check_bias("mmc_patch_embed", b, N);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, N));   /* [N, Cout] */
    mmc_cpu_linear_fwd(x->data, w->data, w->dtype == MMC_BF16, b ? b->data : NULL,
                       b && b->dtype == MMC_BF16, y->data, M, N, K);
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "patch_embed", patch_embed_backward, y, b ? 3 : 2, in);
    if (n) {
        n->i[0] = M;
        n->i[1] = N;
        n->i[2] = K;
    }
    return y;
}

/* ------------------------------------------------------------------ conv2d */
/* w as f32: the tensor's own data, or a widened copy in scratch (bf16 weights). */
static const float *weight_f32(mmc_ctx *ctx, const mmc_tensor *w) {
    if (w->dtype == MMC_F32) return w->data;
    float *f = mmc_scratch_alloc(ctx, (size_t)mmc_numel(w) * sizeof(float));
    mmc_convert(f, MMC_F32, w->data, w->dtype, mmc_numel(w));
    return f;
}

typedef struct {
    int64_t B, Cin, H, W, Cout, kh, kw, stride, pad, Ho, Wo;
} conv_dims;

static void conv2d_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    const conv_dims *d = n->extra;
    int64_t K = d->Cin * d->kh * d->kw, P = d->Ho * d->Wo, HW = d->H * d->W;
    float *dx = mmc_requires_grad(x) ? mmc_grad(ctx, x)->data : NULL;
    float *dw = mmc_requires_grad(w) ? mmc_grad(ctx, w)->data : NULL;
    float *db = mmc_requires_grad(b) ? mmc_grad(ctx, b)->data : NULL;
    const float *gy = n->out->grad->data, *xd = x->data;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    const float *wf = dx ? weight_f32(ctx, w) : NULL;
    float *col = mmc_scratch_alloc(ctx, (size_t)(K * P) * sizeof(float));   /* [K, Ho*Wo] */
    for (int64_t bi = 0; bi < d->B; bi++) {
        const float *gyb = gy + bi * d->Cout * P;   /* [Cout, Ho*Wo] */
        if (dx) {
            /* dcol [K, P] = Wᵀ [K, Cout] · dy [Cout, P] */
            mmc_gemm_f32(true, false, K, P, d->Cout, 1.0f, wf, K, gyb, P, 0.0f, col, P);
            mmc_cpu_col2im_acc(col, dx + bi * d->Cin * HW, d->Cin, d->H, d->W, d->kh, d->kw, d->stride,
                               d->pad, d->Ho, d->Wo);
        }
        if (dw) {
            mmc_cpu_im2col(xd + bi * d->Cin * HW, col, d->Cin, d->H, d->W, d->kh, d->kw, d->stride,
                           d->pad, d->Ho, d->Wo);
            /* dW [Cout, K] += dy [Cout, P] · colᵀ [P, K] */
            mmc_gemm_f32(false, true, d->Cout, K, P, 1.0f, gyb, P, col, P, 1.0f, dw, K);
        }
    }
    if (db) {
#pragma omp parallel for schedule(static) if (d->B * d->Cout * P > 32768)
        for (int64_t c = 0; c < d->Cout; c++) {
            float s = 0;
            for (int64_t bi = 0; bi < d->B; bi++) {
                const float *r = gy + (bi * d->Cout + c) * P;
                float sb = 0;
#pragma omp simd reduction(+ : sb)
                for (int64_t p = 0; p < P; p++) sb += r[p];
                s += sb;
            }
            db[c] += s;
        }
    }
    mmc_scratch_release(ctx, m);
}

mmc_tensor *mmc_conv2d(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b, int stride,
                       int padding) {
    char sx[64], sw[64];
    MMC_CHECK(x && w, "mmc_conv2d: x and w are required");
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 4 && mmc_is_contiguous(x) &&
                  (w->dtype == MMC_F32 || w->dtype == MMC_BF16) && w->ndim == 4 &&
                  mmc_is_contiguous(w) && w->shape[1] == x->shape[1] && stride >= 1 && padding >= 0,
              "mmc_conv2d: need x f32 [B, Cin, H, W], w f32/bf16 [Cout, Cin, kh, kw], stride >= 1, "
              "padding >= 0; got x %s, w %s %s, stride %d, padding %d",
              mmc_shape_str(x, sx, sizeof sx), mmc_shape_str(w, sw, sizeof sw),
              mmc_dtype_name(w->dtype), stride, padding);
    conv_dims d = {.B = x->shape[0], .Cin = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                   .Cout = w->shape[0], .kh = w->shape[2], .kw = w->shape[3], .stride = stride,
                   .pad = padding};
    d.Ho = (d.H + 2 * d.pad - d.kh) / d.stride + 1;
    d.Wo = (d.W + 2 * d.pad - d.kw) / d.stride + 1;
    MMC_CHECK(d.H + 2 * d.pad >= d.kh && d.W + 2 * d.pad >= d.kw,
              "mmc_conv2d: kernel %lldx%lld larger than the padded input %s (padding %d)",
              (long long)d.kh, (long long)d.kw, mmc_shape_str(x, sx, sizeof sx), padding);
    check_bias("mmc_conv2d", b, d.Cout);
    int64_t K = d.Cin * d.kh * d.kw, P = d.Ho * d.Wo;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(d.B, d.Cout, d.Ho, d.Wo));   /* [B, Cout, Ho, Wo] */
    float *yd = y->data;
    mmc_arena_mark m = mmc_scratch_mark(ctx);
    const float *wf = weight_f32(ctx, w);
    float *col = mmc_scratch_alloc(ctx, (size_t)(K * P) * sizeof(float));   /* [K, Ho*Wo] */
    for (int64_t bi = 0; bi < d.B; bi++) {
        float *yb = yd + bi * d.Cout * P;   /* [Cout, P] */
        if (b) {
            for (int64_t c = 0; c < d.Cout; c++) {
                float bv = b->dtype == MMC_F32 ? ((const float *)b->data)[c]
                                               : mmc_bf16_to_f32(((const uint16_t *)b->data)[c]);
                for (int64_t p = 0; p < P; p++) yb[c * P + p] = bv;
            }
        }
        mmc_cpu_im2col((const float *)x->data + bi * d.Cin * d.H * d.W, col, d.Cin, d.H, d.W, d.kh,
                       d.kw, d.stride, d.pad, d.Ho, d.Wo);
        /* y [Cout, P] (+)= W [Cout, K] · col [K, P] */
        mmc_gemm_f32(false, false, d.Cout, P, K, 1.0f, wf, K, col, P, b ? 1.0f : 0.0f, yb, P);
    }
    mmc_scratch_release(ctx, m);
    mmc_tensor *in[3] = {x, w, b};
    mmc_node *n = mmc_tape_record(ctx, "conv2d", conv2d_backward, y, b ? 3 : 2, in);
    if (n) {
        conv_dims *ex = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *ex);
        *ex = d;
        n->extra = ex;
    }
    return y;
}
