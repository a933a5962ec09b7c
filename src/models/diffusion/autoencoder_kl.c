/* autoencoder_kl.c — the KL-regularised VAE of latent diffusion, mirroring diffusers'
 * AutoencoderKL (models/autoencoders/autoencoder_kl.py) and its Encoder / Decoder
 * (models/autoencoders/vae.py), built from the blocks of unets/unet_2d_blocks.py:
 *
 *   Encoder: conv_in -> per level DownEncoderBlock2D (layers_per_block ResnetBlock2D, then,
 *            except at the last level, Downsample2D = zero pad (0, 1, 0, 1) + 3x3 conv stride 2)
 *            -> UNetMidBlock2D (resnet, single-head attention over H*W, resnet)
 *            -> GroupNorm -> SiLU -> conv_out to 2 * latent_channels (mean and logvar)
 *   Decoder: conv_in -> UNetMidBlock2D -> per level UpDecoderBlock2D (layers_per_block + 1
 *            resnets, then, except at the last level, Upsample2D = nearest 2x + 3x3 conv)
 *            -> GroupNorm -> SiLU -> conv_out
 *   ResnetBlock2D: GroupNorm -> SiLU -> conv1 -> GroupNorm -> SiLU -> conv2, plus the input
 *            (through a 1x1 conv_shortcut when the channel count changes).
 *
 * GroupNorms use norm_num_groups and eps 1e-6 (hard-coded by diffusers for the VAE), the
 * attention is one head of dim C with a GroupNorm in front and a residual (diffusers'
 * Attention with _from_deprecated_attn_block). quant_conv / post_quant_conv (1x1) exist
 * where use_quant_conv / use_post_quant_conv (SD: yes; Flux / SD3: no). Encoded moments give
 * the DiagonalGaussianDistribution: mean, logvar clamped to [-30, 20], std = exp(logvar / 2).
 *
 * The forward is built from differentiable ops (conv2d, groupnorm, silu, linear, attention,
 * and resample.c's pad / upsample), so it records a tape in grad mode; without one, each
 * block's intermediates are released as soon as its output exists (mw_keep()), so peak memory
 * is about one block's worth of activations, and the decoder (decoder_forward_heap) keeps its large
 * activations on the heap, freed as soon as dead, with the upsample and GroupNorm + SiLU read by the
 * convolutions instead of materialised and the full-resolution convolutions run in row bands whose
 * consumed input rows go back to the system (the same values, bit for bit). Tiled encode / decode
 * follow diffusers' enable_tiling. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")   /* mean + std * noise and the blends: torch's roundings */
#endif

#include "mmc_diffusion.h"
#include "mmc_models.h"
#include "../model_weights.h"
#include "../../nn/resnet2d.h"
#include "../../backend/cpu/gemm.h"
#include "../../backend/cpu/norm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define VAE_EPS 1e-6f

typedef mmc_resnet2d resnet_block;         /* src/nn/resnet2d.c, without time embedding */

typedef struct {
    mmc_tensor *norm_w, *norm_b;          /* [C] */
    mmc_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *o_b;   /* [C, C], [C] */
} attn_block;

typedef struct {
    int n_res;
    resnet_block *res;
    mmc_tensor *sample_w, *sample_b;      /* down/upsampler conv [C, C, 3, 3]; NULL at the last level */
} level_block;

typedef struct {
    resnet_block res0, res1;
    attn_block attn;
    bool has_attn;
} mid_block;

typedef struct {
    mmc_tensor *conv_in_w, *conv_in_b;
    level_block levels[MMC_VAE_MAX_LEVELS];
    mid_block mid;
    mmc_tensor *norm_out_w, *norm_out_b;
    mmc_tensor *conv_out_w, *conv_out_b;
} coder;

struct mmc_vae {
    mmc_vae_config cfg;
    coder enc, dec;
    mmc_tensor *quant_w, *quant_b;        /* [2Cl, 2Cl, 1, 1]; NULL without use_quant_conv */
    mmc_tensor *post_quant_w, *post_quant_b;   /* [Cl, Cl, 1, 1]; NULL without use_post_quant_conv */
    mw_set w;                             /* every tensor bound, and the open checkpoint */
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_vae_config_read(const mmc_json *j, const char *what, mmc_vae_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *cls = NULL, *act = NULL;
    if ((st = mmc_json_str(j, "_class_name", "AutoencoderKL", &cls))) return st;
    if (strcmp(cls, "AutoencoderKL") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: _class_name '%s' is not AutoencoderKL", what, cls);
    int n = MMC_VAE_MAX_LEVELS;
    if (!mmc_json_has(j, "block_out_channels")) c->block_out_channels[0] = 64, n = 1;
    else if ((st = mmc_json_int_array(j, "block_out_channels", c->block_out_channels, &n)))
        return mmc_error_prefix(st, "%s: ", what);
    c->levels = n;
    if ((st = mmc_json_int(j, "in_channels", 3, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", 3, &c->out_channels)) ||
        (st = mmc_json_int(j, "latent_channels", 4, &c->latent_channels)) ||
        (st = mmc_json_int(j, "layers_per_block", 1, &c->layers_per_block)) ||
        (st = mmc_json_int(j, "norm_num_groups", 32, &c->norm_num_groups)) ||
        (st = mmc_json_num(j, "scaling_factor", 0.18215, &c->scaling_factor)) ||
        (st = mmc_json_num(j, "shift_factor", 0.0, &c->shift_factor)) ||
        (st = mmc_json_bool(j, "use_quant_conv", true, &c->use_quant_conv)) ||
        (st = mmc_json_bool(j, "use_post_quant_conv", true, &c->use_post_quant_conv)) ||
        (st = mmc_json_bool(j, "mid_block_add_attention", true, &c->mid_block_add_attention)) ||
        (st = mmc_json_str(j, "act_fn", "silu", &act)))
        return mmc_error_prefix(st, "%s: ", what);
    /* sample_size: an int, or [h, w] (diffusers then tiles with the first) */
    if (mmc_json_has(j, "sample_size.0")) st = mmc_json_int(j, "sample_size.0", 32, &c->sample_size);
    else st = mmc_json_int(j, "sample_size", 32, &c->sample_size);
    if (st) return mmc_error_prefix(st, "%s: ", what);
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: act_fn '%s' is not supported (silu)", what, act);
    static const char *const kinds[2] = {"down_block_types", "up_block_types"};
    static const char *const want[2] = {"DownEncoderBlock2D", "UpDecoderBlock2D"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n; i++) {
            char key[64];
            const char *t = NULL;
            snprintf(key, sizeof key, "%s.%d", kinds[k], i);
            if ((st = mmc_json_str(j, key, want[k], &t))) return mmc_error_prefix(st, "%s: ", what);
            if (strcmp(t, want[k]) != 0)
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s[%d] is '%s'; AutoencoderKL supports %s only", what,
                                 kinds[k], i, t, want[k]);
        }
        char key[64];
        snprintf(key, sizeof key, "%s.%d", kinds[k], n);
        if (mmc_json_has(j, key))
            return mmc_error(MMC_ERR_FORMAT, "%s: %s has more entries than block_out_channels (%d)", what, kinds[k], n);
    }
    if (c->in_channels < 1 || c->out_channels < 1 || c->latent_channels < 1 || c->layers_per_block < 1 ||
        c->norm_num_groups < 1 || c->sample_size < 1 || c->levels < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: channel counts, layers_per_block, norm_num_groups and sample_size "
                         "must be positive", what);
    for (int i = 0; i < n; i++)
        if (c->block_out_channels[i] < 1 || c->block_out_channels[i] % c->norm_num_groups)
            return mmc_error(MMC_ERR_FORMAT, "%s: block_out_channels[%d] = %lld is not a positive multiple of "
                             "norm_num_groups %lld", what, i, (long long)c->block_out_channels[i],
                             (long long)c->norm_num_groups);
    if (c->scaling_factor == 0)
        return mmc_error(MMC_ERR_FORMAT, "%s: scaling_factor is 0", what);
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
/* The loader binds into the VAE's weight set (src/models/model_weights.c). */
typedef struct {
    mmc_vae *v;
} binder;

static void bind_wb(binder *b, const char *prefix, const char *name, mmc_tensor **w, mmc_tensor **bias, int ndim,
                    const int64_t *shape) {
    mw_bind_wb(&b->v->w, prefix, name, w, bias, ndim, shape);
}
#define bind_conv(b, prefix, name, w, bias, cout, cin, k) \
    bind_wb(b, prefix, name, w, bias, 4, MMC_SHAPE(cout, cin, k, k))   /* Conv2d [Cout, Cin, k, k] */
#define bind_vec(b, prefix, name, w, bias, c) bind_wb(b, prefix, name, w, bias, 1, MMC_SHAPE(c))   /* GroupNorm */
#define bind_linear(b, prefix, name, w, bias, c) bind_wb(b, prefix, name, w, bias, 2, MMC_SHAPE(c, c))

static void bind_resnet(binder *b, const char *prefix, resnet_block *r, int64_t cin, int64_t cout) {
    mmc_resnet2d_bind(&b->v->w, prefix, r, cin, cout, 0);
}

static void bind_mid(binder *b, const char *coder_prefix, mid_block *m, int64_t C, bool attn) {
    char p[128];
    snprintf(p, sizeof p, "%smid_block.resnets.0.", coder_prefix);
    bind_resnet(b, p, &m->res0, C, C);
    snprintf(p, sizeof p, "%smid_block.resnets.1.", coder_prefix);
    bind_resnet(b, p, &m->res1, C, C);
    m->has_attn = attn;
    if (!attn) return;
    snprintf(p, sizeof p, "%smid_block.attentions.0.", coder_prefix);
    /* diffusers' names, or those of checkpoints saved before diffusers 0.14 (its
     * _convert_deprecated_attention_blocks maps query/key/value/proj_attn to these) */
    char probe[192];
    snprintf(probe, sizeof probe, "%sto_q.weight", p);
    bool old = b->v->w.st && !mmc_st_find(b->v->w.st, probe);   /* a fresh model: diffusers' names */
    attn_block *a = &m->attn;
    bind_vec(b, p, "group_norm", &a->norm_w, &a->norm_b, C);
    bind_linear(b, p, old ? "query" : "to_q", &a->q_w, &a->q_b, C);
    bind_linear(b, p, old ? "key" : "to_k", &a->k_w, &a->k_b, C);
    bind_linear(b, p, old ? "value" : "to_v", &a->v_w, &a->v_b, C);
    bind_linear(b, p, old ? "proj_attn" : "to_out.0", &a->o_w, &a->o_b, C);
}

static mmc_status alloc_levels(coder *cd, int64_t levels, int n_res) {
    for (int64_t i = 0; i < levels; i++) {
        cd->levels[i].n_res = n_res;
        cd->levels[i].res = calloc((size_t)n_res, sizeof(resnet_block));
        if (!cd->levels[i].res) return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    return MMC_OK;
}

static void bind_all(binder *b) {
    mmc_vae *v = b->v;
    const mmc_vae_config *c = &v->cfg;
    const int64_t *ch = c->block_out_channels, L = c->levels, Cl = c->latent_channels, top = ch[L - 1];
    char p[128];
    /* encoder */
    bind_conv(b, "encoder.", "conv_in", &v->enc.conv_in_w, &v->enc.conv_in_b, ch[0], c->in_channels, 3);
    for (int64_t i = 0; i < L; i++) {
        level_block *lv = &v->enc.levels[i];
        int64_t cin = i ? ch[i - 1] : ch[0];
        for (int r = 0; r < lv->n_res; r++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%lld.resnets.%d.", (long long)i, r);
            bind_resnet(b, p, &lv->res[r], r ? ch[i] : cin, ch[i]);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%lld.downsamplers.0.", (long long)i);
            bind_conv(b, p, "conv", &lv->sample_w, &lv->sample_b, ch[i], ch[i], 3);
        }
    }
    bind_mid(b, "encoder.", &v->enc.mid, top, c->mid_block_add_attention);
    bind_vec(b, "encoder.", "conv_norm_out", &v->enc.norm_out_w, &v->enc.norm_out_b, top);
    bind_conv(b, "encoder.", "conv_out", &v->enc.conv_out_w, &v->enc.conv_out_b, 2 * Cl, top, 3);
    if (c->use_quant_conv) bind_conv(b, "", "quant_conv", &v->quant_w, &v->quant_b, 2 * Cl, 2 * Cl, 1);
    /* decoder: levels in reverse channel order */
    if (c->use_post_quant_conv) bind_conv(b, "", "post_quant_conv", &v->post_quant_w, &v->post_quant_b, Cl, Cl, 1);
    bind_conv(b, "decoder.", "conv_in", &v->dec.conv_in_w, &v->dec.conv_in_b, top, Cl, 3);
    bind_mid(b, "decoder.", &v->dec.mid, top, c->mid_block_add_attention);
    for (int64_t i = 0; i < L; i++) {
        level_block *lv = &v->dec.levels[i];
        int64_t cout = ch[L - 1 - i], cin = i ? ch[L - i] : top;
        for (int r = 0; r < lv->n_res; r++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%lld.resnets.%d.", (long long)i, r);
            bind_resnet(b, p, &lv->res[r], r ? cout : cin, cout);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%lld.upsamplers.0.", (long long)i);
            bind_conv(b, p, "conv", &lv->sample_w, &lv->sample_b, cout, cout, 3);
        }
    }
    bind_vec(b, "decoder.", "conv_norm_out", &v->dec.norm_out_w, &v->dec.norm_out_b, ch[0]);
    bind_conv(b, "decoder.", "conv_out", &v->dec.conv_out_w, &v->dec.conv_out_b, c->out_channels, ch[0], 3);
}

void mmc_vae_free(mmc_vae *v) {
    if (!v) return;
    mw_close(&v->w);
    for (int i = 0; i < MMC_VAE_MAX_LEVELS; i++) free(v->enc.levels[i].res), free(v->dec.levels[i].res);
    free(v);
}

/* dir holds config.json; the weights are its diffusion_pytorch_model.safetensors, or `from` (taken) */
static mmc_status vae_load(const char *dir, mmc_st *from, const char *what, mmc_vae **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_vae *v = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) goto fail;
    v = calloc(1, sizeof *v);
    binder b = {.v = v};
    if (!v) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_vae_config_read(j, path, &v->cfg))) goto fail;
    if ((st = alloc_levels(&v->enc, v->cfg.levels, (int)v->cfg.layers_per_block)) ||
        (st = alloc_levels(&v->dec, v->cfg.levels, (int)v->cfg.layers_per_block + 1)))
        goto fail;
    st = from ? mw_adopt(from, &v->w) : mw_open(dir, "diffusion_pytorch_model", &v->w);
    from = NULL;
    if (st) goto fail;
    bind_all(&b);
    /* a checkpoint with tensors this config does not use was saved from another config */
    if ((st = mw_status(&v->w, what, "AutoencoderKL")) || (st = mw_check_unused(&v->w, what, "AutoencoderKL")))
        goto fail;
    mmc_json_free(j);
    *out = v;
    return MMC_OK;
fail:
    if (from) mmc_st_close(from);
    mmc_json_free(j);
    mmc_vae_free(v);
    return st;
}

mmc_status mmc_vae_load(const char *dir, mmc_vae **out) { return vae_load(dir, NULL, dir, out); }

mmc_status mmc_vae_load_st(const char *config_dir, mmc_st *weights, const char *what, mmc_vae **out) {
    return vae_load(config_dir, weights, what, out);
}

/* A fresh VAE (training from scratch, trainer_vae.c): torch's default init of diffusers' modules:
 * Conv2d / Linear weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (fan_in = Cin * k * k),
 * GroupNorm weight 1 and bias 0. Every tensor is a trainable f32 parameter. */
mmc_status mmc_vae_new(const mmc_vae_config *cfg, uint64_t seed, mmc_vae **out) {
    *out = NULL;
    mmc_vae *v = calloc(1, sizeof *v);
    if (!v) return mmc_error(MMC_ERR_OOM, "out of memory");
    v->cfg = *cfg;
    binder b = {.v = v};
    mmc_status st;
    if ((st = alloc_levels(&v->enc, v->cfg.levels, (int)v->cfg.layers_per_block)) ||
        (st = alloc_levels(&v->dec, v->cfg.levels, (int)v->cfg.layers_per_block + 1)) ||
        (st = mw_init_random(&v->w, seed, MW_INIT_TORCH_LINEAR)))
        goto fail;
    v->w.trainable = true;
    bind_all(&b);
    if ((st = mw_status(&v->w, "random init", "AutoencoderKL"))) goto fail;
    /* the weight set draws a bias of a [N] vector as U(-1, 1) (no fan-in known at bind time):
     * redraw each bias with its weight's fan-in, and zero the GroupNorm biases */
    mmc_rng r;
    mmc_rng_init(&r, seed ^ 0xB1A5B1A5B1A5B1A5ull);
    for (int i = 0; i < v->w.n_params; i++) {
        const char *nm = v->w.names[i], *dot = strrchr(nm, '.');
        if (!dot || strcmp(dot, ".bias") != 0) continue;
        mmc_tensor *bias = v->w.params[i];
        const mmc_tensor *wt = i > 0 ? v->w.params[i - 1] : NULL;   /* bound just before its bias */
        if (!wt || wt->ndim == 1) {
            memset(bias->data, 0, mmc_nbytes(bias));
            continue;
        }
        const float bound = 1.0f / sqrtf((float)(mmc_numel(wt) / wt->shape[0]));
        mmc_rng_uniform(&r, bias->data, mmc_numel(bias), -bound, bound);
    }
    *out = v;
    return MMC_OK;
fail:
    mmc_vae_free(v);
    return st;
}

int mmc_vae_param_list(mmc_vae *v, mmc_tensor ***params, const char (**names)[256]) {
    *params = v->w.params;
    *names = (const char (*)[256])v->w.names;
    return v->w.n_params;
}

const mmc_vae_config *mmc_vae_cfg(const mmc_vae *v) { return &v->cfg; }
int mmc_vae_downscale(const mmc_vae *v) { return 1 << (v->cfg.levels - 1); }
int64_t mmc_vae_param_count(const mmc_vae *v) {
    return mw_count(&v->w);
}

/* ------------------------------------------------------------------ forward */
static mmc_tensor *norm_silu(mmc_ctx *ctx, const mmc_vae *v, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    return mmc_silu(ctx, mmc_groupnorm(ctx, x, (int)v->cfg.norm_num_groups, w, b, VAE_EPS));
}

/* ResnetBlock2D (temb None, output_scale_factor 1): x [B, Cin, H, W] -> [B, Cout, H, W] */
static mmc_tensor *resnet_forward(mmc_ctx *ctx, const mmc_vae *v, const resnet_block *r, mmc_tensor *x) {
    return mmc_resnet2d_forward(ctx, r, x, NULL, (int)v->cfg.norm_num_groups, VAE_EPS, 1.0);
}

/* Attention (AttnProcessor2_0, one head of dim C, residual): x [B, C, H, W] -> same */
static mmc_tensor *attn_forward(mmc_ctx *ctx, const mmc_vae *v, const attn_block *a, mmc_tensor *x) {
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    const int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    mmc_tensor *h = mmc_groupnorm(ctx, x, (int)v->cfg.norm_num_groups, a->norm_w, a->norm_b, VAE_EPS);
    h = mmc_reshape(ctx, h, 3, MMC_SHAPE(B, C, H * W));
    h = mmc_contiguous(ctx, mmc_transpose(ctx, h, 1, 2));                  /* [B, HW, C] */
    mmc_tensor *q = mmc_reshape(ctx, mmc_linear(ctx, h, a->q_w, a->q_b), 4, MMC_SHAPE(B, H * W, 1, C));
    mmc_tensor *k = mmc_reshape(ctx, mmc_linear(ctx, h, a->k_w, a->k_b), 4, MMC_SHAPE(B, H * W, 1, C));
    mmc_tensor *val = mmc_reshape(ctx, mmc_linear(ctx, h, a->v_w, a->v_b), 4, MMC_SHAPE(B, H * W, 1, C));
    mmc_attn_opts opts = {.scale = (float)(1.0 / sqrt((double)C))};        /* attn.scale = dim_head ** -0.5 */
    h = mmc_attention(ctx, q, k, val, &opts);                              /* [B, HW, 1, C] */
    h = mmc_linear(ctx, mmc_reshape(ctx, h, 3, MMC_SHAPE(B, H * W, C)), a->o_w, a->o_b);
    h = mmc_contiguous(ctx, mmc_transpose(ctx, h, 1, 2));                  /* [B, C, HW] */
    h = mmc_reshape(ctx, h, 4, MMC_SHAPE(B, C, H, W));
    return mw_keep(ctx, m, mmc_add(ctx, h, x));                               /* rescale_output_factor 1 */
}

/* UNetMidBlock2D: resnet, attention, resnet */
static mmc_tensor *mid_forward(mmc_ctx *ctx, const mmc_vae *v, const mid_block *mb, mmc_tensor *x) {
    x = resnet_forward(ctx, v, &mb->res0, x);
    if (mb->has_attn) x = attn_forward(ctx, v, &mb->attn, x);
    return resnet_forward(ctx, v, &mb->res1, x);
}

/* GroupNorm -> SiLU -> conv_out */
static mmc_tensor *out_forward(mmc_ctx *ctx, const mmc_vae *v, const coder *cd, mmc_tensor *x) {
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *h = norm_silu(ctx, v, x, cd->norm_out_w, cd->norm_out_b);
    return mw_keep(ctx, m, mmc_conv2d(ctx, h, cd->conv_out_w, cd->conv_out_b, 1, 1));
}

/* Encoder: x [B, Cin, H, W] -> [B, 2*Cl, H/f, W/f] */
static mmc_tensor *encoder_forward(mmc_ctx *ctx, const mmc_vae *v, mmc_tensor *x) {
    const coder *e = &v->enc;
    /* without a tape only the running h is kept: each block's input is dropped once its output exists */
    const mmc_arena_mark m0 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *h = mmc_conv2d(ctx, x, e->conv_in_w, e->conv_in_b, 1, 1);   /* [B, ch0, H, W] */
    for (int64_t i = 0; i < v->cfg.levels; i++) {
        const level_block *lv = &e->levels[i];
        for (int r = 0; r < lv->n_res; r++) h = mw_keep(ctx, m0, resnet_forward(ctx, v, &lv->res[r], h));
        if (lv->sample_w) {   /* Downsample2D(padding=0): pad right and bottom, conv stride 2 */
            mmc_tensor *p = mmc_pad2d(ctx, h, 0, 1, 0, 1);
            h = mw_keep(ctx, m0, mmc_conv2d(ctx, p, lv->sample_w, lv->sample_b, 2, 0));   /* [B, C, H/2, W/2] */
        }
    }
    h = mw_keep(ctx, m0, mid_forward(ctx, v, &e->mid, h));
    return out_forward(ctx, v, e, h);
}

/* Decoder: z [B, Cl, h, w] -> [B, Cout, h*f, w*f] */
static mmc_tensor *decoder_forward(mmc_ctx *ctx, const mmc_vae *v, mmc_tensor *z) {
    const coder *d = &v->dec;
    /* without a tape only the running h is kept (at 1024² a 128-channel activation is 512 MiB) */
    const mmc_arena_mark m0 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *h = mmc_conv2d(ctx, z, d->conv_in_w, d->conv_in_b, 1, 1);   /* [B, top, h, w] */
    h = mw_keep(ctx, m0, mid_forward(ctx, v, &d->mid, h));
    for (int64_t i = 0; i < v->cfg.levels; i++) {
        const level_block *lv = &d->levels[i];
        for (int r = 0; r < lv->n_res; r++) h = mw_keep(ctx, m0, resnet_forward(ctx, v, &lv->res[r], h));
        if (lv->sample_w) {   /* Upsample2D: nearest 2x, 3x3 conv */
            mmc_tensor *u = mmc_upsample_nearest2x(ctx, h);                  /* [B, C, 2h, 2w] */
            h = mw_keep(ctx, m0, mmc_conv2d(ctx, u, lv->sample_w, lv->sample_b, 1, 1));
        }
    }
    return out_forward(ctx, v, d, h);
}

/* ------------------------------------------------------------------ decoder without a tape
 * The same values as decoder_forward, bit for bit, with the large activations off the arena (malloc'd,
 * so each is returned to the system the moment it is dead: the arena would keep its chunks) and no
 * full-size temporary: Upsample2D's conv reads the nearest 2x upsample of its input on the fly, each
 * ResnetBlock2D's convs read GroupNorm + SiLU of their input on the fly (mmc_conv3x3_fused: the
 * statistics in a pass, then the affine and SiLU in the convolution's input transform), and the
 * convolutions run in row bands (mmc_conv_input's output window: the same tiles, so the same values):
 *   - a ResnetBlock2D computes conv1 band by band into h1 and, with a 1x1 conv_shortcut, the
 *     shortcut of the same rows into the output; the input rows no later band reads go back to the
 *     system as the bands advance (drop_rows), so the input shrinks while h1 and the output grow;
 *     then conv2 runs band by band into a small buffer added to the output rows (the shortcut's, or
 *     the input itself where the channels do not change: the sum is made in place);
 *   - Upsample2D's conv drops the rows of its input behind its bands the same way;
 *   - the last GroupNorm + SiLU are applied in place before conv_out.
 * What is alive at the largest step is about one full-resolution activation of the widest channel
 * count there (the 256 -> 128-channel block at 1024²: 1 GiB, against 2 GiB before the bands and 4.5
 * before the fused reads). Where the layers leave Winograd (no AVX-512, narrow layers) the ops run one
 * after the other as before. MMC_VAE_BAND_ROWS=N sets the band height (a multiple of 4; tests). */
static mmc_tensor *heap_act(int64_t B, int64_t C, int64_t H, int64_t W) {
    const size_t n = (size_t)(B * C * H * W) * sizeof(float);
    const size_t align = n >= ((size_t)1 << 20) ? 4096 : 64;   /* page-aligned planes where rows are dropped */
    void *d = aligned_alloc(align, (n + align - 1) / align * align);
    MMC_CHECK(d, "mmc_vae_decode: out of memory allocating a [%lld, %lld, %lld, %lld] activation (%.1f MiB); "
                 "decode in tiles (--tiled-decode) to need less",
              (long long)B, (long long)C, (long long)H, (long long)W, n / 1048576.0);
    mmc_tensor *t = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(B, C, H, W), d);
    MMC_CHECK(t, "%s", mmc_last_error());
    t->flags |= MMC_OWNS_DATA;
    return t;
}

/* The whole pages inside rows [r0, r1) of each [H, W] plane of the heap activation t go back to the
 * system: nothing reads those rows again before t is freed (a page read again would read zeros, so the
 * bit-for-bit checks of test_autoencoder_kl would catch a wrong bound). Linux only; elsewhere a no-op. */
static void drop_rows(mmc_tensor *t, int64_t r0, int64_t r1) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    const int64_t H = t->shape[2], W = t->shape[3], planes = t->shape[0] * t->shape[1];
    if (r0 < 0) r0 = 0;
    if (r1 > H) r1 = H;
    if (r1 <= r0) return;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int64_t p = 0; p < planes; p++) {
        const uintptr_t a = (uintptr_t)((float *)t->data + (p * H + r0) * W), e = (uintptr_t)((float *)t->data + (p * H + r1) * W);
        const uintptr_t a0 = (a + pg - 1) / pg * pg, e0 = e / pg * pg;
        if (e0 > a0) madvise((void *)a0, e0 - a0, MADV_DONTNEED);
    }
#else
    (void)t, (void)r0, (void)r1;
#endif
}

/* Rows a band: a multiple of 4 (the Winograd tile) holding about 16 MiB of a C-channel output, or
 * MMC_VAE_BAND_ROWS */
static int64_t band_rows(int64_t B, int64_t C, int64_t H, int64_t W) {
    const char *e = getenv("MMC_VAE_BAND_ROWS");
    int64_t r = e && atoi(e) > 0 ? atoi(e) : (int64_t)((16 << 20) / (B * C * W * (int64_t)sizeof(float)));
    r = r / 4 * 4;
    if (r < 4) r = 4;
    return r < H ? r : H;
}

/* an arena tensor's copy on the heap, then the arena back to m */
static mmc_tensor *heap_keep(mmc_ctx *ctx, mmc_arena_mark m, mmc_tensor *t) {
    mmc_tensor *h = heap_act(t->shape[0], t->shape[1], t->shape[2], t->shape[3]);
    memcpy(h->data, t->data, mmc_nbytes(t));
    mmc_arena_release(mmc_ctx_arena(ctx), m);
    return h;
}

/* GroupNorm's affine of x for a fused convolution's input (ab: 2 * B * C floats) */
static mmc_conv_input norm_input(const mmc_vae *v, const mmc_tensor *x, mmc_tensor *norm_w, mmc_tensor *norm_b,
                                 float *ab) {
    const int64_t BC = x->shape[0] * x->shape[1];
    mmc_groupnorm_affine(x, (int)v->cfg.norm_num_groups, norm_w, norm_b, VAE_EPS, ab, ab + BC);
    return (mmc_conv_input){.scale = ab, .shift = ab + BC, .silu = true};
}

/* y = conv3x3(in(x)) + b on the heap, in(x) = x, its nearest 2x upsample (up2), or SiLU(GroupNorm(x))
 * (norm_w / norm_b given); x is left as it is, or with drop, its rows behind the bands are dropped (x
 * is dead after this) */
static mmc_tensor *conv3_in(mmc_ctx *ctx, const mmc_vae *v, mmc_tensor *x, bool up2, mmc_tensor *norm_w,
                            mmc_tensor *norm_b, mmc_tensor *w, mmc_tensor *b, bool drop) {
    const int64_t B = x->shape[0], C = x->shape[1], f = up2 ? 2 : 1, H = f * x->shape[2], W = f * x->shape[3];
    const int64_t K = w->shape[0];
    mmc_tensor *y = heap_act(B, K, H, W);
    if (mmc_conv3x3_winograd_applies(C, K, H, W)) {
        mmc_conv_input in = {.up2 = up2};
        float *ab = NULL;
        if (norm_w) {
            ab = malloc((size_t)(2 * B * C) * sizeof(float));
            MMC_CHECK(ab, "out of memory");
            in = norm_input(v, x, norm_w, norm_b, ab);
        }
        const int64_t bh = band_rows(B, K, H, W);
        bool done = true;
        for (int64_t r0 = 0; r0 < H && done; r0 += bh) {   /* output rows [r0, r1): input rows r0 - 1 .. r1 */
            const int64_t r1 = r0 + bh < H ? r0 + bh : H;
            in.row0 = r0, in.row1 = r1, in.yplane = H * W;
            done = mmc_conv3x3_fused(ctx, x, &in, w, b, (float *)y->data + r0 * W);
            if (done && drop && r1 < H) drop_rows(x, 0, (r1 - 1) / f);   /* stored rows below (r1 - 1) / f: read by no later band */
        }
        free(ab);
        if (done) return y;
    }
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));   /* the ops one after the other */
    mmc_tensor *u = up2 ? mmc_upsample_nearest2x(ctx, x) : x;
    if (norm_w) u = norm_silu(ctx, v, u, norm_w, norm_b);
    mmc_conv2d_into(ctx, u, w, b, 1, 1, y->data);
    mmc_arena_release(mmc_ctx_arena(ctx), m);
    return y;
}

/* y rows [r0, r1) of every [Cout, H, W] image = the 1x1 conv_shortcut of x's rows (mmc_conv2d's
 * arithmetic: the bias, then one GEMM over the input channels onto it; each output column is the same
 * GEMM column over the same K, so the values equal the whole convolution's). ws: the weight [Cout, Cin]
 * as f32, bias as f32 or NULL. */
static void shortcut_rows(const mmc_tensor *x, const float *ws, const float *bias, int64_t Cout, int64_t r0, int64_t r1,
                          float *y) {
    const int64_t B = x->shape[0], Cin = x->shape[1], P = x->shape[2] * x->shape[3], W = x->shape[3];
    const int64_t Q = (r1 - r0) * W;
    for (int64_t bi = 0; bi < B; bi++) {
        float *yb = y + bi * Cout * P + r0 * W;
        if (bias)
#pragma omp parallel for schedule(static) if (Cout * Q > 32768)
            for (int64_t c = 0; c < Cout; c++)
                for (int64_t q = 0; q < Q; q++) yb[c * P + q] = bias[c];
        mmc_gemm_f32(false, false, Cout, Q, Cin, 1.0f, ws, Cin, (const float *)x->data + bi * Cin * P + r0 * W, P,
                     bias ? 1.0f : 0.0f, yb, P);
    }
}

/* a weight or bias as f32: its data, or a malloc'd copy (*own) */
static const float *as_f32(const mmc_tensor *t, float **own) {
    *own = NULL;
    if (!t || t->dtype == MMC_F32) return t ? t->data : NULL;
    *own = malloc((size_t)mmc_numel(t) * sizeof(float));
    MMC_CHECK(*own, "out of memory");
    mmc_convert(*own, MMC_F32, t->data, t->dtype, mmc_numel(t));
    return *own;
}

/* ResnetBlock2D (no time embedding, output_scale_factor 1) on a heap x it frees: the output on the heap */
static mmc_tensor *resnet_heap(mmc_ctx *ctx, const mmc_vae *v, const resnet_block *r, mmc_tensor *x) {
    const int64_t B = x->shape[0], Cin = x->shape[1], H = x->shape[2], W = x->shape[3], Cout = r->cout, P = H * W;
    if (!mmc_conv3x3_winograd_applies(Cin, Cout, H, W) || !mmc_conv3x3_winograd_applies(Cout, Cout, H, W)) {
        mmc_tensor *h1 = conv3_in(ctx, v, x, false, r->norm1_w, r->norm1_b, r->conv1_w, r->conv1_b, false);
        mmc_tensor *res = x;                                    /* the residual: x or conv_shortcut(x) */
        if (r->short_w) {
            res = heap_act(B, Cout, H, W);
            mmc_conv2d_into(ctx, x, r->short_w, r->short_b, 1, 0, res->data);
            mmc_tensor_free(x);
        }
        mmc_tensor *h2 = conv3_in(ctx, v, h1, false, r->norm2_w, r->norm2_b, r->conv2_w, r->conv2_b, false);
        mmc_tensor_free(h1);
        float *y = h2->data;
        const float *a = res->data;
        const int64_t n = mmc_numel(h2);
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) y[i] = a[i] + y[i];     /* mmc_add(shortcut, h) */
        mmc_tensor_free(res);
        return h2;
    }
    const int64_t bh = band_rows(B, Cout, H, W);
    float *ab = malloc((size_t)(2 * B * (Cin > Cout ? Cin : Cout)) * sizeof(float));
    MMC_CHECK(ab, "out of memory");
    /* conv1 (and the shortcut) band by band; with a shortcut, x's rows behind the bands are dropped */
    mmc_tensor *h1 = heap_act(B, Cout, H, W), *y = r->short_w ? heap_act(B, Cout, H, W) : x;
    float *ws_own = NULL, *bs_own = NULL;
    const float *ws = r->short_w ? as_f32(r->short_w, &ws_own) : NULL, *bs = r->short_w ? as_f32(r->short_b, &bs_own) : NULL;
    mmc_conv_input in = norm_input(v, x, r->norm1_w, r->norm1_b, ab);
    for (int64_t r0 = 0; r0 < H; r0 += bh) {
        const int64_t r1 = r0 + bh < H ? r0 + bh : H;
        in.row0 = r0, in.row1 = r1, in.yplane = P;
        MMC_CHECK(mmc_conv3x3_fused(ctx, x, &in, r->conv1_w, r->conv1_b, (float *)h1->data + r0 * W),
                  "mmc_vae_decode: conv1 left Winograd");
        if (!r->short_w) continue;
        shortcut_rows(x, ws, bs, Cout, r0, r1, y->data);
        if (r1 < H) drop_rows(x, 0, r1 - 1);   /* rows below r1 - 1: read by no later band */
    }
    free(ws_own), free(bs_own);
    if (r->short_w) mmc_tensor_free(x);
    /* conv2 band by band into t, then y's rows (the residual) + t: mmc_add(shortcut, h)'s sums */
    in = norm_input(v, h1, r->norm2_w, r->norm2_b, ab);
    float *t = malloc((size_t)(B * Cout * bh * W) * sizeof(float));
    MMC_CHECK(t, "out of memory");
    for (int64_t r0 = 0; r0 < H; r0 += bh) {
        const int64_t r1 = r0 + bh < H ? r0 + bh : H, Q = (r1 - r0) * W;
        in.row0 = r0, in.row1 = r1, in.yplane = 0;
        MMC_CHECK(mmc_conv3x3_fused(ctx, h1, &in, r->conv2_w, r->conv2_b, t), "mmc_vae_decode: conv2 left Winograd");
        float *yd = y->data;
#pragma omp parallel for schedule(static) if (B * Cout * Q > 65536)
        for (int64_t p = 0; p < B * Cout; p++) {
            float *yr = yd + p * P + r0 * W;
            const float *tr = t + p * Q;
            for (int64_t q = 0; q < Q; q++) yr[q] = yr[q] + tr[q];
        }
    }
    free(t), free(ab);
    mmc_tensor_free(h1);
    return y;
}

/* A fresh context for the next stage of the decoder (grad off), old (if any) freed: the arena and scratch
 * chunks the mid block's attention and the 512-channel Winograd weights grew (~160 MiB at 512²) go back to
 * the system instead of staying resident under the full-resolution levels, and so does what glibc keeps
 * of the freed bands (malloc_trim). */
static mmc_ctx *stage_ctx(mmc_ctx *old) {
    if (old) {
        mmc_ctx_free(old);
#ifdef __GLIBC__
        malloc_trim(0);
#endif
    }
    mmc_ctx *c = mmc_ctx_new();
    MMC_CHECK(c, "mmc_vae_decode: out of memory");
    mmc_set_grad_enabled(c, false);
    return c;
}

static mmc_tensor *decoder_forward_heap(mmc_ctx *ctx, const mmc_vae *v, mmc_tensor *z) {
    const coder *d = &v->dec;
    mmc_ctx *caller = ctx;
    ctx = stage_ctx(NULL);
    mmc_tensor *h = mmc_conv2d(ctx, z, d->conv_in_w, d->conv_in_b, 1, 1);   /* [B, top, h, w]: small */
    h = heap_keep(ctx, (mmc_arena_mark){0}, mid_forward(ctx, v, &d->mid, h));
    for (int64_t i = 0; i < v->cfg.levels; i++) {
        const level_block *lv = &d->levels[i];
        ctx = stage_ctx(ctx);
        for (int r = 0; r < lv->n_res; r++) h = resnet_heap(ctx, v, &lv->res[r], h);
        if (lv->sample_w) {   /* Upsample2D: nearest 2x read by the 3x3 conv */
            mmc_tensor *u = conv3_in(ctx, v, h, true, NULL, NULL, lv->sample_w, lv->sample_b, true);   /* [B, C, 2h, 2w] */
            mmc_tensor_free(h);
            h = u;
        }
    }
    /* GroupNorm -> SiLU in place (mmc_groupnorm's and mmc_silu's arithmetic), then conv_out */
    const int64_t B = h->shape[0], C = h->shape[1], G = v->cfg.norm_num_groups;
    MMC_CHECK(d->norm_out_w->dtype == MMC_F32 && d->norm_out_b->dtype == MMC_F32,
              "mmc_vae_decode: decoder.conv_norm_out must be f32 (as mmc_groupnorm needs)");
    float *stats = malloc((size_t)(2 * B * G) * sizeof(float));
    MMC_CHECK(stats, "out of memory");
    mmc_cpu_groupnorm_fwd(h->data, d->norm_out_w->data, d->norm_out_b->data, h->data, stats, stats + B * G, B, C,
                          h->shape[2] * h->shape[3], G, VAE_EPS);
    free(stats);
    mmc_silu_inplace(ctx, h);
    mmc_tensor *y = mmc_new(caller, MMC_F32, 4, MMC_SHAPE(B, v->cfg.out_channels, h->shape[2], h->shape[3]));
    mmc_conv2d_into(ctx, h, d->conv_out_w, d->conv_out_b, 1, 1, y->data);
    mmc_tensor_free(h);
    mmc_ctx_free(ctx);
    return y;
}

static void check_input(const mmc_vae *v, const mmc_tensor *x, int64_t channels, int64_t multiple,
                        const char *op) {
    char s[64];
    MMC_CHECK(x && x->dtype == MMC_F32 && x->ndim == 4 && mmc_is_contiguous(x) && x->shape[1] == channels &&
                  x->shape[2] % multiple == 0 && x->shape[3] % multiple == 0 && x->shape[2] > 0 && x->shape[3] > 0,
              "%s: need contiguous f32 [B, %lld, H, W] with H, W multiples of %lld, got %s", op,
              (long long)channels, (long long)multiple, x ? mmc_shape_str(x, s, sizeof s) : "NULL");
}

mmc_tensor *mmc_vae_encode(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *x) {
    check_input(v, x, v->cfg.in_channels, mmc_vae_downscale(v), "mmc_vae_encode");
    mmc_tensor *h = encoder_forward(ctx, v, x);
    if (v->quant_w) h = mmc_conv2d(ctx, h, v->quant_w, v->quant_b, 1, 0);
    return h;                                                              /* [B, 2Cl, H/f, W/f] */
}

mmc_tensor *mmc_vae_decode(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *z) {
    check_input(v, z, v->cfg.latent_channels, 1, "mmc_vae_decode");
    if (v->post_quant_w) z = mmc_conv2d(ctx, z, v->post_quant_w, v->post_quant_b, 1, 0);
    const bool tape = mmc_grad_enabled(ctx) && (mmc_requires_grad(z) || mmc_requires_grad(v->dec.conv_in_w) ||
                                                 mmc_requires_grad(v->dec.conv_out_w));
    if (!tape && !getenv("MMC_VAE_ARENA_DECODE")) return decoder_forward_heap(ctx, v, z);
    return decoder_forward(ctx, v, z);
}

/* ------------------------------------------------------------------ latent distribution */
void mmc_vae_latent_dist(mmc_ctx *ctx, mmc_tensor *moments, mmc_tensor **mean, mmc_tensor **logvar,
                         mmc_tensor **std) {
    char s[64];
    MMC_CHECK(moments->dtype == MMC_F32 && moments->ndim == 4 && mmc_is_contiguous(moments) &&
                  moments->shape[1] % 2 == 0,
              "mmc_vae_latent_dist: moments must be contiguous f32 [B, 2*Cl, h, w], got %s",
              mmc_shape_str(moments, s, sizeof s));
    const int64_t B = moments->shape[0], Cl = moments->shape[1] / 2, P = Cl * moments->shape[2] * moments->shape[3];
    const int64_t shape[4] = {B, Cl, moments->shape[2], moments->shape[3]};
    mmc_tensor *mu = mean ? mmc_new(ctx, MMC_F32, 4, shape) : NULL;
    mmc_tensor *lv = logvar ? mmc_new(ctx, MMC_F32, 4, shape) : NULL;
    mmc_tensor *sd = std ? mmc_new(ctx, MMC_F32, 4, shape) : NULL;
    const float *md = moments->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < P; i++) {   /* torch.chunk(moments, 2, dim=1): mean first */
            float l = md[(2 * b + 1) * P + i];
            l = l < -30.0f ? -30.0f : l > 20.0f ? 20.0f : l;
            if (mu) ((float *)mu->data)[b * P + i] = md[2 * b * P + i];
            if (lv) ((float *)lv->data)[b * P + i] = l;
            if (sd) ((float *)sd->data)[b * P + i] = expf(0.5f * l);
        }
    if (mean) *mean = mu;
    if (logvar) *logvar = lv;
    if (std) *std = sd;
}

mmc_tensor *mmc_vae_sample(mmc_ctx *ctx, mmc_tensor *moments, mmc_tensor *noise, uint64_t seed) {
    mmc_tensor *mean, *std;
    mmc_vae_latent_dist(ctx, moments, &mean, NULL, &std);
    const int64_t n = mmc_numel(mean);
    const float *e;
    mmc_arena_mark sm = mmc_scratch_mark(ctx);
    if (noise) {
        char a[64], b[64];
        MMC_CHECK(noise->dtype == MMC_F32 && mmc_is_contiguous(noise) && mmc_same_shape(noise, mean),
                  "mmc_vae_sample: noise %s must be contiguous f32 of the latent's shape %s",
                  mmc_shape_str(noise, a, sizeof a), mmc_shape_str(mean, b, sizeof b));
        e = noise->data;
    } else {
        float *r = mmc_scratch_alloc(ctx, (size_t)n * sizeof(float));
        mmc_rng rng;
        mmc_rng_init(&rng, seed);
        mmc_rng_normal(&rng, r, n, 0.0f, 1.0f);
        e = r;
    }
    float *md = mean->data;
    const float *sd = std->data;
    for (int64_t i = 0; i < n; i++) md[i] = md[i] + sd[i] * e[i];
    mmc_scratch_release(ctx, sm);
    return mean;                                                           /* [B, Cl, h, w] */
}

void mmc_vae_scale_latents(const mmc_vae *v, mmc_tensor *z) {
    const float sh = (float)v->cfg.shift_factor, sc = (float)v->cfg.scaling_factor;
    float *d = z->data;
    for (int64_t i = 0; i < mmc_numel(z); i++) d[i] = (d[i] - sh) * sc;
}

mmc_tensor *mmc_vae_postprocess(mmc_ctx *ctx, mmc_tensor *x) {
    (void)ctx;
    float *d = x->data;   /* VaeImageProcessor.denormalize: (x / 2 + 0.5).clamp(0, 1), in place */
    for (int64_t i = 0, n = mmc_numel(x); i < n; i++) {
        const float v = d[i] / 2.0f + 0.5f;
        d[i] = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
    }
    return x;
}

void mmc_vae_unscale_latents(const mmc_vae *v, mmc_tensor *z) {
    const float sh = (float)v->cfg.shift_factor, sc = (float)v->cfg.scaling_factor;
    float *d = z->data;
    for (int64_t i = 0; i < mmc_numel(z); i++) d[i] = d[i] / sc + sh;
}

/* ------------------------------------------------------------------ tiled decode */
typedef struct {
    int64_t h, w;       /* decoded tile [B, C, h, w] */
    float *data;
} tile;

/* blend_v / blend_h: the first `ext` rows (columns) of b fade in from the last ext of a:
 * b = a * (1 - y / ext) + b * (y / ext), with the weights Python doubles cast to float32 */
static void blend(const tile *a, tile *b, int64_t BC, int64_t ext, bool vertical) {
    const int64_t lim = vertical ? (a->h < b->h ? a->h : b->h) : (a->w < b->w ? a->w : b->w);
    if (ext > lim) ext = lim;   /* blend_extent = min(a.shape[d], b.shape[d], blend_extent) */
    for (int64_t y = 0; y < ext; y++) {
        const float wa = (float)(1.0 - (double)y / (double)ext), wb = (float)((double)y / (double)ext);
        for (int64_t p = 0; p < BC; p++) {
            if (vertical) {   /* row y of b, row a->h - ext + y of a (same width) */
                const float *ar = a->data + (p * a->h + a->h - ext + y) * a->w;
                float *br = b->data + (p * b->h + y) * b->w;
                for (int64_t x = 0; x < b->w; x++) br[x] = ar[x] * wa + br[x] * wb;
            } else {          /* column y of b, column a->w - ext + y of a (same height) */
                for (int64_t r = 0; r < b->h; r++) {
                    float *bv = b->data + (p * b->h + r) * b->w + y;
                    *bv = a->data[(p * a->h + r) * a->w + a->w - ext + y] * wa + *bv * wb;
                }
            }
        }
    }
}

/* diffusers' tiled_decode / _tiled_encode: input tiles of tile_in (every 3/4 of a tile), each
 * run through fn (decode, or encode + quant_conv) to an output tile of up to tile_out, blended
 * over tile_out/4 with its upper and left neighbours, cropped to tile_out - tile_out/4. */
typedef mmc_tensor *(*tile_fn)(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *x);

static mmc_tensor *tiled(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *z, int64_t tile_in, int64_t tile_out, int64_t C,
                         tile_fn fn) {
    const int64_t B = z->shape[0], Cin = z->shape[1], H = z->shape[2], W = z->shape[3];
    const int64_t overlap = (int64_t)((double)tile_in * (1 - 0.25));
    const int64_t ext = (int64_t)((double)tile_out * 0.25), limit = tile_out - ext;
    const int64_t rows = (H + overlap - 1) / overlap, cols = (W + overlap - 1) / overlap;
    tile *t = calloc((size_t)(rows * cols), sizeof *t);
    MMC_CHECK(t, "mmc_vae tiling: out of memory");
    mmc_arena_mark m = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const int64_t i0 = i * overlap, j0 = j * overlap;
            const int64_t th = H - i0 < tile_in ? H - i0 : tile_in, tw = W - j0 < tile_in ? W - j0 : tile_in;
            mmc_tensor *zt = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, Cin, th, tw));   /* z[:, :, i0:, j0:] */
            for (int64_t p = 0; p < B * Cin; p++)
                for (int64_t r = 0; r < th; r++)
                    memcpy((float *)zt->data + (p * th + r) * tw, (const float *)z->data + (p * H + i0 + r) * W + j0,
                           (size_t)tw * sizeof(float));
            mmc_tensor *d = fn(ctx, v, zt);                                /* [B, C, th', tw'] */
            tile *tt = &t[i * cols + j];
            tt->h = d->shape[2], tt->w = d->shape[3];
            tt->data = malloc(mmc_nbytes(d));
            MMC_CHECK(tt->data, "mmc_vae tiling: out of memory");
            memcpy(tt->data, d->data, mmc_nbytes(d));
            mmc_arena_release(mmc_ctx_arena(ctx), m);
        }
    /* blend in diffusers' order (in place, so later tiles blend with already-blended ones) */
    int64_t Ho = 0, Wo = 0;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            if (i > 0) blend(&t[(i - 1) * cols + j], &t[i * cols + j], B * C, ext, true);
            if (j > 0) blend(&t[i * cols + j - 1], &t[i * cols + j], B * C, ext, false);
        }
        Ho += t[i * cols].h < limit ? t[i * cols].h : limit;
    }
    for (int64_t j = 0; j < cols; j++) Wo += t[j].w < limit ? t[j].w : limit;
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, C, Ho, Wo));     /* [B, C, Ho, Wo] */
    int64_t y0 = 0;
    for (int64_t i = 0; i < rows; i++) {
        int64_t x0 = 0, rh = 0;
        for (int64_t j = 0; j < cols; j++) {
            const tile *tt = &t[i * cols + j];
            const int64_t ch = tt->h < limit ? tt->h : limit, cw = tt->w < limit ? tt->w : limit;
            for (int64_t p = 0; p < B * C; p++)
                for (int64_t r = 0; r < ch; r++)
                    memcpy((float *)y->data + (p * Ho + y0 + r) * Wo + x0, tt->data + (p * tt->h + r) * tt->w,
                           (size_t)cw * sizeof(float));
            x0 += cw, rh = ch;
        }
        y0 += rh;
    }
    for (int64_t k = 0; k < rows * cols; k++) free(t[k].data);
    free(t);
    return y;
}

mmc_tensor *mmc_vae_decode_tiled(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *z, int64_t tile_sample) {
    check_input(v, z, v->cfg.latent_channels, 1, "mmc_vae_decode_tiled");
    MMC_CHECK(!mmc_requires_grad(z), "mmc_vae_decode_tiled is inference-only");
    if (tile_sample <= 0) tile_sample = v->cfg.sample_size;
    const int64_t tl = tile_sample / mmc_vae_downscale(v);                 /* tile_latent_min_size */
    MMC_CHECK(tl >= 1, "mmc_vae_decode_tiled: a tile of %lld pixels is below the downscale %d",
              (long long)tile_sample, mmc_vae_downscale(v));
    if (z->shape[2] <= tl && z->shape[3] <= tl) return mmc_vae_decode(ctx, v, z);
    return tiled(ctx, v, z, tl, tile_sample, v->cfg.out_channels, mmc_vae_decode);
}

mmc_tensor *mmc_vae_encode_tiled(mmc_ctx *ctx, mmc_vae *v, mmc_tensor *x, int64_t tile_sample) {
    check_input(v, x, v->cfg.in_channels, mmc_vae_downscale(v), "mmc_vae_encode_tiled");
    MMC_CHECK(!mmc_requires_grad(x), "mmc_vae_encode_tiled is inference-only");
    if (tile_sample <= 0) tile_sample = v->cfg.sample_size;
    const int64_t tl = tile_sample / mmc_vae_downscale(v);
    MMC_CHECK(tl >= 1 && tile_sample % mmc_vae_downscale(v) == 0,
              "mmc_vae_encode_tiled: a tile of %lld pixels is not a positive multiple of the downscale %d",
              (long long)tile_sample, mmc_vae_downscale(v));
    if (x->shape[2] <= tile_sample && x->shape[3] <= tile_sample) return mmc_vae_encode(ctx, v, x);
    /* input tiles of tile_sample pixels, blended over tl/4 latents */
    return tiled(ctx, v, x, tile_sample, tl, 2 * v->cfg.latent_channels, mmc_vae_encode);
}
