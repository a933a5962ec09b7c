/* resnet2d.h — diffusers' ResnetBlock2D (models/resnet.py), the convolutional block every latent
 * diffusion model is built from, shared by AutoencoderKL (no time embedding) and
 * UNet2DConditionModel (with one): src/nn/resnet2d.c. Internal to src/ (binds through the model
 * weight set of src/models/model_weights.h). */
#ifndef MMC_NN_RESNET2D_H
#define MMC_NN_RESNET2D_H

#include "../models/model_weights.h"

typedef struct {
    int64_t cin, cout;
    mmc_tensor *norm1_w, *norm1_b;        /* [Cin] */
    mmc_tensor *conv1_w, *conv1_b;        /* [Cout, Cin, 3, 3], [Cout] */
    mmc_tensor *temb_w, *temb_b;          /* time_emb_proj [Cout, Temb], [Cout]; NULL without time embedding */
    mmc_tensor *norm2_w, *norm2_b;        /* [Cout] */
    mmc_tensor *conv2_w, *conv2_b;        /* [Cout, Cout, 3, 3], [Cout] */
    mmc_tensor *short_w, *short_b;        /* conv_shortcut [Cout, Cin, 1, 1], [Cout]; NULL when Cin == Cout */
} mmc_resnet2d;

/* Bind "<prefix>norm1.weight" ... ; temb_channels 0: a block without time_emb_proj (temb_channels=None). */
void mmc_resnet2d_bind(mw_set *w, const char *prefix, mmc_resnet2d *r, int64_t cin, int64_t cout,
                       int64_t temb_channels);
/* x [B, Cin, H, W] -> [B, Cout, H, W]: GroupNorm, SiLU, conv1, (+ time_emb_proj(temb_act)), GroupNorm,
 * SiLU, conv2, plus the input (through conv_shortcut when channels change), / output_scale_factor.
 * temb_act: SiLU(emb) [B, Temb] (the block's own nonlinearity on temb, computed once by the caller),
 * NULL without time embedding. Without a tape each stage's intermediates are released at once. */
mmc_tensor *mmc_resnet2d_forward(mmc_ctx *ctx, const mmc_resnet2d *r, mmc_tensor *x, mmc_tensor *temb_act,
                                 int groups, float eps, double output_scale_factor);

#endif
