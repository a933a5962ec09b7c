/* resample.c — the two layout ops a convolutional VAE / UNet needs besides conv2d:
 * mmc_upsample_nearest2x (F.interpolate(scale_factor=2.0, mode="nearest"), diffusers'
 * Upsample2D) and mmc_pad2d (F.pad with zeros, diffusers' Downsample2D pads (0, 1, 0, 1)
 * before its stride-2 conv). Both are pure data movement, so their backward rules are exact:
 * the 2x2 sum of the output gradient, and the crop of it. Declared in mmc_diffusion.h. */
#include "mmc_diffusion.h"

#include <string.h>

static void check4(const char *op, const mmc_tensor *x) {
    char s[64];
    MMC_CHECK(x && x->dtype == MMC_F32 && x->ndim == 4 && mmc_is_contiguous(x),
              "%s: x must be contiguous f32 [B, C, H, W], got %s", op, x ? mmc_shape_str(x, s, sizeof s) : "NULL");
}

/* ------------------------------------------------------------------ nearest 2x */
static void upsample_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    float *dx = mmc_grad(ctx, x)->data;
    const float *gy = n->out->grad->data;
    const int64_t R = x->shape[0] * x->shape[1] * x->shape[2], W = x->shape[3];
#pragma omp parallel for schedule(static) if (R * W > 65536)
    for (int64_t r = 0; r < R; r++) {   /* input row r <- output rows 2r, 2r+1 */
        const float *g0 = gy + 2 * r * 2 * W, *g1 = g0 + 2 * W;
        float *d = dx + r * W;
        for (int64_t w = 0; w < W; w++) d[w] += (g0[2 * w] + g0[2 * w + 1]) + (g1[2 * w] + g1[2 * w + 1]);
    }
}

mmc_tensor *mmc_upsample_nearest2x(mmc_ctx *ctx, mmc_tensor *x) {
    check4("mmc_upsample_nearest2x", x);
    const int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, C, 2 * H, 2 * W));   /* [B, C, 2H, 2W] */
    const float *xd = x->data;
    float *yd = y->data;
    const int64_t R = B * C * H;
#pragma omp parallel for schedule(static) if (R * W > 65536)
    for (int64_t r = 0; r < R; r++) {
        const float *src = xd + r * W;
        float *d0 = yd + 2 * r * 2 * W;
        for (int64_t w = 0; w < W; w++) d0[2 * w] = d0[2 * w + 1] = src[w];
        memcpy(d0 + 2 * W, d0, (size_t)(2 * W) * sizeof(float));
    }
    mmc_tensor *in[1] = {x};
    mmc_tape_record(ctx, "upsample_nearest2x", upsample_backward, y, 1, in);
    return y;
}

/* ------------------------------------------------------------------ zero padding */
static void pad_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    float *dx = mmc_grad(ctx, x)->data;
    const float *gy = n->out->grad->data;
    const int64_t l = n->i[0], t = n->i[2], H = x->shape[2], W = x->shape[3];
    const int64_t Ho = n->out->shape[2], Wo = n->out->shape[3], P = x->shape[0] * x->shape[1];
#pragma omp parallel for schedule(static) if (P * H * W > 65536)
    for (int64_t p = 0; p < P; p++)
        for (int64_t h = 0; h < H; h++) {
            const float *g = gy + (p * Ho + h + t) * Wo + l;
            float *d = dx + (p * H + h) * W;
            for (int64_t w = 0; w < W; w++) d[w] += g[w];
        }
}

mmc_tensor *mmc_pad2d(mmc_ctx *ctx, mmc_tensor *x, int left, int right, int top, int bottom) {
    check4("mmc_pad2d", x);
    MMC_CHECK(left >= 0 && right >= 0 && top >= 0 && bottom >= 0, "mmc_pad2d: negative padding (%d, %d, %d, %d)",
              left, right, top, bottom);
    const int64_t P = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t Ho = H + top + bottom, Wo = W + left + right;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(x->shape[0], x->shape[1], Ho, Wo));   /* [B, C, Ho, Wo] */
    const float *xd = x->data;
    float *yd = y->data;
#pragma omp parallel for schedule(static) if (P * Ho * Wo > 65536)
    for (int64_t p = 0; p < P; p++)
        for (int64_t h = 0; h < Ho; h++) {
            float *d = yd + (p * Ho + h) * Wo;
            const int64_t hs = h - top;
            if (hs < 0 || hs >= H) {
                memset(d, 0, (size_t)Wo * sizeof(float));
                continue;
            }
            memset(d, 0, (size_t)left * sizeof(float));
            memcpy(d + left, xd + (p * H + hs) * W, (size_t)W * sizeof(float));
            memset(d + left + W, 0, (size_t)right * sizeof(float));
        }
    mmc_tensor *in[1] = {x};
    mmc_node *n = mmc_tape_record(ctx, "pad2d", pad_backward, y, 1, in);
    if (n) n->i[0] = left, n->i[1] = right, n->i[2] = top, n->i[3] = bottom;
    return y;
}
