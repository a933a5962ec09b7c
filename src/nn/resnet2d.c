/* resnet2d.c — diffusers' ResnetBlock2D (models/resnet.py, time_embedding_norm "default", no up / down
 * sampling inside the block), shared by AutoencoderKL and UNet2DConditionModel:
 *
 *   h = conv1(SiLU(GroupNorm(x)))  (+ time_emb_proj(SiLU(temb))[:, :, None, None])
 *   h = conv2(SiLU(GroupNorm(h)))                     (dropout is the identity at inference)
 *   y = (conv_shortcut(x) or x + h) / output_scale_factor
 *
 * Built from differentiable ops, so it records a tape in grad mode; without one each stage's
 * intermediates are released as soon as its output exists (mw_keep), which keeps a VAE decode at
 * large sizes to about two full-resolution activations per block. */
#include "resnet2d.h"

void mmc_resnet2d_bind(mw_set *w, const char *p, mmc_resnet2d *r, int64_t cin, int64_t cout, int64_t temb) {
    r->cin = cin, r->cout = cout;
    mw_bind_wb(w, p, "norm1", &r->norm1_w, &r->norm1_b, 1, MMC_SHAPE(cin));
    mw_bind_wb(w, p, "conv1", &r->conv1_w, &r->conv1_b, 4, MMC_SHAPE(cout, cin, 3, 3));
    if (temb > 0) mw_bind_wb(w, p, "time_emb_proj", &r->temb_w, &r->temb_b, 2, MMC_SHAPE(cout, temb));
    mw_bind_wb(w, p, "norm2", &r->norm2_w, &r->norm2_b, 1, MMC_SHAPE(cout));
    mw_bind_wb(w, p, "conv2", &r->conv2_w, &r->conv2_b, 4, MMC_SHAPE(cout, cout, 3, 3));
    if (cin != cout) mw_bind_wb(w, p, "conv_shortcut", &r->short_w, &r->short_b, 4, MMC_SHAPE(cout, cin, 1, 1));
}

static mmc_tensor *norm_silu(mmc_ctx *ctx, mmc_tensor *x, int groups, mmc_tensor *w, mmc_tensor *b, float eps) {
    mmc_tensor *g = mmc_groupnorm(ctx, x, groups, w, b, eps);
    /* without a tape the norm's output is a temporary: SiLU over it in place (one full activation less) */
    return mmc_requires_grad(g) || g->dtype != MMC_F32 || !mmc_is_contiguous(g) ? mmc_silu(ctx, g)
                                                                             : mmc_silu_inplace(ctx, g);
}

mmc_tensor *mmc_resnet2d_forward(mmc_ctx *ctx, const mmc_resnet2d *r, mmc_tensor *x, mmc_tensor *temb_act,
                                 int groups, float eps, double out_scale) {
    MMC_CHECK(!r->temb_w || temb_act, "mmc_resnet2d_forward: this block has time_emb_proj; pass temb_act");
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *h = norm_silu(ctx, x, groups, r->norm1_w, r->norm1_b, eps);
    h = mw_keep(ctx, m, mmc_conv2d(ctx, h, r->conv1_w, r->conv1_b, 1, 1));      /* [B, Cout, H, W] */
    mmc_arena_mark m2 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    if (r->temb_w) {
        mmc_tensor *t = mmc_linear(ctx, temb_act, r->temb_w, r->temb_b);        /* [B, Cout] */
        h = mmc_add(ctx, h, mmc_reshape(ctx, t, 4, MMC_SHAPE(x->shape[0], r->cout, 1, 1)));
    }
    h = norm_silu(ctx, h, groups, r->norm2_w, r->norm2_b, eps);
    h = mw_keep(ctx, m2, mmc_conv2d(ctx, h, r->conv2_w, r->conv2_b, 1, 1));
    mmc_tensor *sc = r->short_w ? mmc_conv2d(ctx, x, r->short_w, r->short_b, 1, 0) : x;
    mmc_tensor *y = mmc_add(ctx, sc, h);
    if (out_scale != 1.0) y = mmc_scale(ctx, y, (float)(1.0 / out_scale));
    return mw_keep(ctx, m, y);
}
