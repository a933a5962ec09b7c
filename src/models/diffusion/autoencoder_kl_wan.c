/* autoencoder_kl_wan.c — the causal 3D VAE of Wan2.1, mirroring diffusers' AutoencoderKLWan
 * (models/autoencoders/autoencoder_kl_wan.py: WanEncoder3d, WanDecoder3d and their blocks):
 *
 *   Encoder: conv_in -> per level num_res_blocks WanResidualBlock, then (but at the last level) a
 *            WanResample: "downsample2d" (zero pad right/bottom + 3x3 conv stride 2 per frame) or
 *            "downsample3d" (that, then a (3,1,1) time conv of temporal stride 2) -> WanMidBlock
 *            (residual, single-head attention per frame, residual) -> RMS norm -> SiLU -> conv_out
 *            to 2 * z_dim, then quant_conv (1x1x1): the DiagonalGaussian's mean and logvar.
 *   Decoder: post_quant_conv (1x1x1) -> conv_in -> WanMidBlock -> per level num_res_blocks + 1
 *            residual blocks, then (but at the last level) "upsample3d" (a (3,1,1) time conv to 2C
 *            whose halves become two frames, then nearest 2x + 3x3 conv to C/2 per frame) or
 *            "upsample2d" -> RMS norm -> SiLU -> conv_out, clamped to [-1, 1].
 *   WanResidualBlock: RMS -> SiLU -> conv1 (3x3x3) -> RMS -> SiLU -> conv2, plus the input through
 *            a 1x1x1 conv_shortcut when the channel count changes. WanRMS_norm is F.normalize over
 *            the channels (x / max(||x||, 1e-12)) * sqrt(C) * gamma.
 *
 * Every WanCausalConv3d pads time on the left only (2 frames for a 3-tap kernel), and diffusers
 * runs a clip in chunks (encoder: the first frame, then 4 at a time; decoder: one latent frame at
 * a time) with a feature cache holding each causal conv's last CACHE_T = 2 input frames. That cache
 * is exactly a streaming convolution: the conv over [zeros(2), all frames so far] seen through a
 * window, so here every causal conv keeps a 2-frame buffer (zeros at first) that it convolves in
 * front of the chunk and then refreshes with the chunk's last frames. The two resamplers have their
 * own rules, as in diffusers: the upsample3d time conv is skipped on the first chunk (its stream
 * starts at the second, from zeros: the "Rep" marker), and the downsample3d time conv passes the
 * first chunk through and then convolves [last frame of the previous chunk, chunk] with stride 2.
 * Memory therefore depends on the frame size, never on the clip length. Decoding keeps little beyond
 * the caches (which diffusers keeps too): each chunk goes through the decoder one frame at a time after
 * every temporal upsampler (decoder_levels), a residual block on one frame keeps its two caches as
 * rings that receive the conv inputs in place and accumulates conv2 into the residual (res_ring: two
 * activations alive), the narrow conv_out caches its pending output sums (causal_conv_narrow), and
 * the im2col band / heap scratch are returned after each conv. On the released configuration at
 * 320x192 that is ~495 MiB of caches, ~280 MiB of the decoder's weights (mapped from the file) and
 * ~60 MiB of activations (bench_wan_vae).
 *
 * Convolutions are implicit GEMMs: an im2col of a band of output rows (bounded to 32 MB) times the
 * [Cout, Cin*kt*kh*kw] weight on the project's blocked GEMM (src/backend/cpu/gemm.c). Weights of any
 * float dtype are widened to f32 once at load. Inference only (no tape). */
#include "mmc_diffusion.h"
#include "mmc_ops.h"
#include "mmc_models.h"
#include "../model_weights.h"
#include "../../backend/cpu/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define CACHE_T 2
#define COL_BYTES (8u << 20)       /* im2col band budget: wide enough that repacking the weights per band is cheap, small
                                      next to the full-resolution caches (the 2x upsampling conv runs while they are live) */

/* ------------------------------------------------------------------ weights */
typedef struct {
    int64_t cout, cin, kt, kh, kw;
    mmc_tensor *tw, *tb;          /* as bound (maybe bf16 views) */
    float *w, *b;                 /* [cout, cin*kt*kh*kw], [cout] f32 (owned copies unless tw is f32) */
} conv_w;

typedef struct {
    int64_t C;
    mmc_tensor *t;
    float *g;                     /* [C] gamma */
} rms_w;

typedef struct {
    rms_w norm1, norm2;
    conv_w conv1, conv2, shortcut;   /* shortcut.cout 0 when in == out */
} resblock;

enum { RS_NONE, RS_UP2D, RS_UP3D, RS_DOWN2D, RS_DOWN3D };
typedef struct {
    int mode;
    conv_w conv;                  /* the per-frame 3x3 */
    conv_w time_conv;             /* (3,1,1): up3d C -> 2C, down3d C -> C stride 2 */
} resample;

typedef struct {
    rms_w norm;
    conv_w qkv, proj;             /* 1x1 Conv2d: [3C, C], [C, C] */
} attnblock;

typedef struct {
    resblock r0, r1;
    attnblock attn;
} midblock;

typedef struct {                  /* an encoder down_blocks entry: a residual block or a resampler */
    bool is_res;
    resblock res;
    resample rs;
} enc_layer;

typedef struct {
    int n_res;
    resblock *res;
    resample up;                  /* mode RS_NONE at the last level */
} up_block;

struct mmc_wan_vae {
    mmc_wan_vae_config cfg;
    conv_w enc_in, enc_out, quant, post_quant, dec_in, dec_out;
    int n_enc;
    enc_layer *enc;
    midblock enc_mid, dec_mid;
    rms_w enc_norm_out, dec_norm_out;
    up_block up[MMC_WAN_VAE_MAX_LEVELS];
    mw_set w;
    float **owned;                /* f32 copies of non-f32 weights */
    int n_owned, cap_owned;
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_wan_vae_config_read(const mmc_json *j, const char *what, mmc_wan_vae_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *cls = NULL;
    if ((st = mmc_json_str(j, "_class_name", "AutoencoderKLWan", &cls))) return mmc_error_prefix(st, "%s: ", what);
    if (strcmp(cls, "AutoencoderKLWan") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: _class_name '%s' is not AutoencoderKLWan", what, cls);
    bool residual = false;
    if ((st = mmc_json_int(j, "base_dim", 96, &c->base_dim)) ||
        (st = mmc_json_int(j, "decoder_base_dim", c->base_dim, &c->decoder_base_dim)) ||
        (st = mmc_json_int(j, "z_dim", 16, &c->z_dim)) ||
        (st = mmc_json_int(j, "num_res_blocks", 2, &c->num_res_blocks)) ||
        (st = mmc_json_int(j, "in_channels", 3, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", 3, &c->out_channels)) ||
        (st = mmc_json_int(j, "scale_factor_temporal", 4, &c->scale_factor_temporal)) ||
        (st = mmc_json_int(j, "scale_factor_spatial", 8, &c->scale_factor_spatial)) ||
        (st = mmc_json_bool(j, "is_residual", false, &residual)))
        return mmc_error_prefix(st, "%s: ", what);
    if (residual)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: is_residual true is the Wan2.2 VAE; mmc runs the Wan2.1 one "
                         "(is_residual false)", what);
    int64_t patch = 0;
    if ((st = mmc_json_int(j, "patch_size", 0, &patch))) return mmc_error_prefix(st, "%s: ", what);
    if (patch > 1)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: patch_size %lld (the Wan2.2 VAE) is not supported; Wan2.1 has "
                         "null", what, (long long)patch);
    if (mmc_json_has(j, "attn_scales.0"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: attn_scales is not empty; mmc supports the Wan2.1 layout "
                         "(attn_scales [])", what);
    int n = MMC_WAN_VAE_MAX_LEVELS;
    if (!mmc_json_has(j, "dim_mult")) {
        static const int64_t def[4] = {1, 2, 4, 4};
        memcpy(c->dim_mult, def, sizeof def), n = 4;
    } else if ((st = mmc_json_int_array(j, "dim_mult", c->dim_mult, &n))) {
        return mmc_error_prefix(st, "%s: dim_mult: ", what);
    }
    c->levels = n;
    if (n < 1) return mmc_error(MMC_ERR_FORMAT, "%s: dim_mult is empty", what);
    int n_t = 0;
    for (int i = 0; i < n - 1; i++) {
        char key[48];
        snprintf(key, sizeof key, "temperal_downsample.%d", i);
        bool def = i > 0;   /* diffusers' default [False, True, True] */
        if (mmc_json_has(j, "temperal_downsample") && !mmc_json_has(j, key))
            return mmc_error(MMC_ERR_FORMAT, "%s: temperal_downsample has fewer than len(dim_mult) - 1 = %d "
                             "entries", what, n - 1);
        if ((st = mmc_json_bool(j, key, def, &c->temperal_downsample[i]))) return mmc_error_prefix(st, "%s: ", what);
        n_t += c->temperal_downsample[i];
    }
    if (c->base_dim < 1 || c->decoder_base_dim < 1 || c->z_dim < 1 || c->num_res_blocks < 1 || c->in_channels < 1 ||
        c->out_channels < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: base_dim, decoder_base_dim, z_dim, num_res_blocks, in_channels and "
                         "out_channels must be positive", what);
    if (c->z_dim > MMC_WAN_VAE_MAX_Z)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: z_dim %lld exceeds %d", what, (long long)c->z_dim,
                         MMC_WAN_VAE_MAX_Z);
    for (int i = 0; i < n; i++)
        if (c->dim_mult[i] < 1 || (i > 0 && (c->decoder_base_dim * c->dim_mult[i]) % 2))
            return mmc_error(MMC_ERR_FORMAT, "%s: dim_mult[%d] = %lld: entries must be positive (and give even "
                             "decoder widths past the first level)", what, i, (long long)c->dim_mult[i]);
    /* diffusers' _encode always takes 4-frame chunks to one latent frame: two temporal halvings */
    if (n_t != 2 || c->scale_factor_temporal != 4)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: temperal_downsample has %d true entries and "
                         "scale_factor_temporal is %lld; the Wan VAE's chunking needs 2 and 4", what, n_t,
                         (long long)c->scale_factor_temporal);
    if (c->scale_factor_spatial != (1LL << (n - 1)))
        return mmc_error(MMC_ERR_FORMAT, "%s: scale_factor_spatial %lld does not match the %d levels of dim_mult "
                         "(2^%d = %lld)", what, (long long)c->scale_factor_spatial, n, n - 1, 1LL << (n - 1));
    static const char *const stat_keys[2] = {"latents_mean", "latents_std"};
    float *stats[2] = {c->latents_mean, c->latents_std};
    for (int k = 0; k < 2; k++) {
        char key[48];
        snprintf(key, sizeof key, "%s.%lld", stat_keys[k], (long long)c->z_dim);
        bool has = mmc_json_has(j, stat_keys[k]);
        if (has && (mmc_json_has(j, key) || !mmc_json_get(j, stat_keys[k]))) goto bad_len;
        for (int64_t i = 0; i < c->z_dim; i++) {
            double v = k ? 1.0 : 0.0;
            snprintf(key, sizeof key, "%s.%lld", stat_keys[k], (long long)i);
            if (has && !mmc_json_has(j, key)) goto bad_len;
            if ((st = mmc_json_num(j, key, v, &v))) return mmc_error_prefix(st, "%s: ", what);
            stats[k][i] = (float)v;
            if (k == 1 && !(v != 0)) return mmc_error(MMC_ERR_FORMAT, "%s: latents_std[%lld] is 0", what, (long long)i);
        }
        continue;
    bad_len:
        return mmc_error(MMC_ERR_FORMAT, "%s: %s must have z_dim = %lld entries", what, stat_keys[k],
                         (long long)c->z_dim);
    }
    if (!mmc_json_has(j, "latents_mean") || !mmc_json_has(j, "latents_std")) {
        if (c->z_dim != 16)
            return mmc_error(MMC_ERR_FORMAT, "%s: latents_mean / latents_std missing (diffusers' defaults are for "
                             "z_dim 16, this is %lld)", what, (long long)c->z_dim);
        static const float dm[16] = {-0.7571f, -0.7089f, -0.9113f, 0.1075f, -0.1745f, 0.9653f, -0.1517f, 1.5508f,
                                     0.4134f, -0.0715f, 0.5517f, -0.3632f, -0.1922f, -0.9497f, 0.2503f, -0.2921f};
        static const float ds[16] = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
                                     3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.9160f};
        if (!mmc_json_has(j, "latents_mean")) memcpy(c->latents_mean, dm, sizeof dm);
        if (!mmc_json_has(j, "latents_std")) memcpy(c->latents_std, ds, sizeof ds);
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ binding */
static void bind_conv(mmc_wan_vae *v, const char *prefix, const char *name, conv_w *c, int64_t cout, int64_t cin,
                      int64_t kt, int64_t kh, int64_t kw) {
    c->cout = cout, c->cin = cin, c->kt = kt, c->kh = kh, c->kw = kw;
    if (kt) mw_bind_wb(&v->w, prefix, name, &c->tw, &c->tb, 5, MMC_SHAPE(cout, cin, kt, kh, kw));
    else {   /* nn.Conv2d */
        c->kt = 1;
        mw_bind_wb(&v->w, prefix, name, &c->tw, &c->tb, 4, MMC_SHAPE(cout, cin, kh, kw));
    }
}

static void bind_rms(mmc_wan_vae *v, const char *prefix, const char *name, rms_w *r, int64_t C, bool images) {
    char nm[160];
    snprintf(nm, sizeof nm, "%s.gamma", name);
    r->C = C;
    if (images) mw_bind(&v->w, prefix, nm, &r->t, 3, MMC_SHAPE(C, 1, 1));
    else mw_bind(&v->w, prefix, nm, &r->t, 4, MMC_SHAPE(C, 1, 1, 1));
}

static void bind_res(mmc_wan_vae *v, const char *prefix, resblock *r, int64_t in, int64_t out) {
    bind_rms(v, prefix, "norm1", &r->norm1, in, false);
    bind_conv(v, prefix, "conv1", &r->conv1, out, in, 3, 3, 3);
    bind_rms(v, prefix, "norm2", &r->norm2, out, false);
    bind_conv(v, prefix, "conv2", &r->conv2, out, out, 3, 3, 3);
    if (in != out) bind_conv(v, prefix, "conv_shortcut", &r->shortcut, out, in, 1, 1, 1);
}

static void bind_mid(mmc_wan_vae *v, const char *coder, midblock *m, int64_t C) {
    char p[128];
    snprintf(p, sizeof p, "%smid_block.resnets.0.", coder);
    bind_res(v, p, &m->r0, C, C);
    snprintf(p, sizeof p, "%smid_block.resnets.1.", coder);
    bind_res(v, p, &m->r1, C, C);
    snprintf(p, sizeof p, "%smid_block.attentions.0.", coder);
    bind_rms(v, p, "norm", &m->attn.norm, C, true);
    bind_conv(v, p, "to_qkv", &m->attn.qkv, 3 * C, C, 0, 1, 1);
    bind_conv(v, p, "proj", &m->attn.proj, C, C, 0, 1, 1);
}

static void bind_resample(mmc_wan_vae *v, const char *prefix, resample *r, int mode, int64_t C) {
    char p[160];
    r->mode = mode;
    snprintf(p, sizeof p, "%sresample.", prefix);
    int64_t cout = (mode == RS_UP2D || mode == RS_UP3D) ? C / 2 : C;   /* upsample_out_dim = dim // 2 */
    bind_conv(v, p, "1", &r->conv, cout, C, 0, 3, 3);
    if (mode == RS_UP3D) bind_conv(v, prefix, "time_conv", &r->time_conv, 2 * C, C, 3, 1, 1);
    if (mode == RS_DOWN3D) bind_conv(v, prefix, "time_conv", &r->time_conv, C, C, 3, 1, 1);
}

static mmc_status bind_all(mmc_wan_vae *v) {
    const mmc_wan_vae_config *c = &v->cfg;
    const int L = c->levels;
    int64_t dims[MMC_WAN_VAE_MAX_LEVELS + 1];
    char p[160];
    /* encoder: dims = base_dim * [1] + dim_mult */
    dims[0] = c->base_dim;
    for (int i = 0; i < L; i++) dims[i + 1] = c->base_dim * c->dim_mult[i];
    bind_conv(v, "encoder.", "conv_in", &v->enc_in, dims[0], c->in_channels, 3, 3, 3);
    v->n_enc = (int)(L * c->num_res_blocks + (L - 1));
    v->enc = calloc((size_t)v->n_enc, sizeof *v->enc);
    if (!v->enc) return mmc_error(MMC_ERR_OOM, "out of memory");
    int k = 0;
    for (int i = 0; i < L; i++) {
        int64_t in = dims[i], out = dims[i + 1];
        for (int r = 0; r < c->num_res_blocks; r++, k++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.", k);
            v->enc[k].is_res = true;
            bind_res(v, p, &v->enc[k].res, in, out);
            in = out;
        }
        if (i != L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.", k);
            bind_resample(v, p, &v->enc[k].rs, c->temperal_downsample[i] ? RS_DOWN3D : RS_DOWN2D, out);
            k++;
        }
    }
    const int64_t top = dims[L];
    bind_mid(v, "encoder.", &v->enc_mid, top);
    bind_rms(v, "encoder.", "norm_out", &v->enc_norm_out, top, false);
    bind_conv(v, "encoder.", "conv_out", &v->enc_out, 2 * c->z_dim, top, 3, 3, 3);
    bind_conv(v, "", "quant_conv", &v->quant, 2 * c->z_dim, 2 * c->z_dim, 1, 1, 1);
    bind_conv(v, "", "post_quant_conv", &v->post_quant, c->z_dim, c->z_dim, 1, 1, 1);
    /* decoder: dims = decoder_base_dim * ([dim_mult[-1]] + reversed dim_mult) */
    int64_t dd[MMC_WAN_VAE_MAX_LEVELS + 1];
    dd[0] = c->decoder_base_dim * c->dim_mult[L - 1];
    for (int i = 0; i < L; i++) dd[i + 1] = c->decoder_base_dim * c->dim_mult[L - 1 - i];
    bind_conv(v, "decoder.", "conv_in", &v->dec_in, dd[0], c->z_dim, 3, 3, 3);
    bind_mid(v, "decoder.", &v->dec_mid, dd[0]);
    for (int i = 0; i < L; i++) {
        up_block *u = &v->up[i];
        int64_t in = i > 0 ? dd[i] / 2 : dd[i], out = dd[i + 1];   /* Wan2.1: the upsampler halves the width */
        u->n_res = (int)c->num_res_blocks + 1;
        u->res = calloc((size_t)u->n_res, sizeof *u->res);
        if (!u->res) return mmc_error(MMC_ERR_OOM, "out of memory");
        for (int r = 0; r < u->n_res; r++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d.", i, r);
            bind_res(v, p, &u->res[r], in, out);
            in = out;
        }
        /* temperal_upsample = temperal_downsample[::-1] */
        if (i != L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.", i);
            bind_resample(v, p, &u->up, c->temperal_downsample[L - 2 - i] ? RS_UP3D : RS_UP2D, out);
        }
    }
    bind_rms(v, "decoder.", "norm_out", &v->dec_norm_out, dd[L], false);
    bind_conv(v, "decoder.", "conv_out", &v->dec_out, c->out_channels, dd[L], 3, 3, 3);
    return MMC_OK;
}

/* f32 view of a bound tensor (a copy when stored in bf16 / f16) */
static mmc_status widen(mmc_wan_vae *v, mmc_tensor *t, float **out) {
    *out = NULL;
    if (!t) return MMC_OK;
    if (t->dtype == MMC_F32) { *out = t->data; return MMC_OK; }
    int64_t n = mmc_numel(t);
    if (v->n_owned == v->cap_owned) {
        int cap = v->cap_owned ? 2 * v->cap_owned : 64;
        float **o = realloc(v->owned, (size_t)cap * sizeof *o);
        if (!o) return mmc_error(MMC_ERR_OOM, "out of memory");
        v->owned = o, v->cap_owned = cap;
    }
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) return mmc_error(MMC_ERR_OOM, "out of memory widening VAE weights");
    mmc_convert(f, MMC_F32, t->data, t->dtype, n);
    v->owned[v->n_owned++] = f;
    *out = f;
    return MMC_OK;
}

static mmc_status widen_conv(mmc_wan_vae *v, conv_w *c) {
    mmc_status st;
    if (!c->tw) return MMC_OK;
    if ((st = widen(v, c->tw, &c->w)) || (st = widen(v, c->tb, &c->b))) return st;
    return MMC_OK;
}
static mmc_status widen_res(mmc_wan_vae *v, resblock *r) {
    mmc_status st;
    if ((st = widen(v, r->norm1.t, &r->norm1.g)) || (st = widen(v, r->norm2.t, &r->norm2.g)) ||
        (st = widen_conv(v, &r->conv1)) || (st = widen_conv(v, &r->conv2)) || (st = widen_conv(v, &r->shortcut)))
        return st;
    return MMC_OK;
}
static mmc_status widen_mid(mmc_wan_vae *v, midblock *m) {
    mmc_status st;
    if ((st = widen_res(v, &m->r0)) || (st = widen_res(v, &m->r1)) || (st = widen(v, m->attn.norm.t, &m->attn.norm.g)) ||
        (st = widen_conv(v, &m->attn.qkv)) || (st = widen_conv(v, &m->attn.proj)))
        return st;
    return MMC_OK;
}
static mmc_status widen_rs(mmc_wan_vae *v, resample *r) {
    mmc_status st;
    if ((st = widen_conv(v, &r->conv)) || (st = widen_conv(v, &r->time_conv))) return st;
    return MMC_OK;
}

static mmc_status widen_all(mmc_wan_vae *v) {
    mmc_status st;
    conv_w *convs[] = {&v->enc_in, &v->enc_out, &v->quant, &v->post_quant, &v->dec_in, &v->dec_out};
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++)
        if ((st = widen_conv(v, convs[i]))) return st;
    for (int i = 0; i < v->n_enc; i++)
        if ((st = v->enc[i].is_res ? widen_res(v, &v->enc[i].res) : widen_rs(v, &v->enc[i].rs))) return st;
    if ((st = widen_mid(v, &v->enc_mid)) || (st = widen_mid(v, &v->dec_mid)) ||
        (st = widen(v, v->enc_norm_out.t, &v->enc_norm_out.g)) || (st = widen(v, v->dec_norm_out.t, &v->dec_norm_out.g)))
        return st;
    for (int i = 0; i < v->cfg.levels; i++) {
        for (int r = 0; r < v->up[i].n_res; r++)
            if ((st = widen_res(v, &v->up[i].res[r]))) return st;
        if ((st = widen_rs(v, &v->up[i].up))) return st;
    }
    return MMC_OK;
}

void mmc_wan_vae_free(mmc_wan_vae *v) {
    if (!v) return;
    for (int i = 0; i < v->n_owned; i++) free(v->owned[i]);
    free(v->owned);
    free(v->enc);
    for (int i = 0; i < MMC_WAN_VAE_MAX_LEVELS; i++) free(v->up[i].res);
    mw_close(&v->w);
    free(v);
}

mmc_status mmc_wan_vae_load(const char *dir, mmc_wan_vae **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_wan_vae *v = calloc(1, sizeof *v);
    if (!v) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_wan_vae_config_read(j, path, &v->cfg))) goto fail;
    if ((st = mw_open(dir, "diffusion_pytorch_model", &v->w))) goto fail;
    if ((st = bind_all(v))) goto fail;
    if ((st = mw_status(&v->w, dir, "AutoencoderKLWan")) || (st = mw_check_unused(&v->w, dir, "AutoencoderKLWan")))
        goto fail;
    if ((st = widen_all(v))) goto fail;
    mmc_json_free(j);
    *out = v;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_wan_vae_free(v);
    return st;
}

const mmc_wan_vae_config *mmc_wan_vae_cfg(const mmc_wan_vae *v) { return &v->cfg; }
int64_t mmc_wan_vae_param_count(const mmc_wan_vae *v) { return mw_count(&v->w); }

mmc_status mmc_wan_check_frames(int64_t frames) {
    if (frames >= 1 && (frames - 1) % 4 == 0) return MMC_OK;
    if (frames < 1) return mmc_error(MMC_ERR_INVALID, "frame count %lld: the Wan VAE needs 4k + 1 frames (1, 5, 9, ...)",
                                     (long long)frames);
    int64_t lo = (frames - 1) / 4 * 4 + 1, hi = lo + 4;
    if (frames - lo == 2)
        return mmc_error(MMC_ERR_INVALID, "frame count %lld is not 4k + 1 (the Wan VAE's temporal factor is 4): "
                         "use %lld or %lld", (long long)frames, (long long)lo, (long long)hi);
    return mmc_error(MMC_ERR_INVALID, "frame count %lld is not 4k + 1 (the Wan VAE's temporal factor is 4): the "
                     "nearest valid count is %lld", (long long)frames, (long long)(frames - lo < 2 ? lo : hi));
}

int64_t mmc_wan_vae_latent_frames(int64_t frames) { return (frames - 1) / 4 + 1; }

/* ------------------------------------------------------------------ kernels */
/* Activations, caches and im2col bands are mapped and unmapped whole (never from the heap): the chunk
 * loop frees and re-allocates the same sizes over and over, and glibc's adaptive mmap threshold would
 * otherwise move them onto the heap, whose fragments then stay resident (~70 MB at 320x192). Fresh
 * pages are zero, which the caches rely on. */
#define MAP_HDR 64
static float *fmap(size_t n) {
    size_t bytes = n * sizeof(float) + MAP_HDR;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *(size_t *)p = bytes;
    return (float *)((char *)p + MAP_HDR);
}
static void ffree(float *f) {
    if (!f) return;
    void *p = (char *)f - MAP_HDR;
    munmap(p, *(size_t *)p);
}
typedef struct {
    float *col;
    size_t col_cap;               /* floats */
    mmc_status st;
} scratch;

static float *scratch_col(scratch *s, size_t n) {
    if (n > s->col_cap) {
        ffree(s->col);
        s->col = fmap(n);
        s->col_cap = s->col ? n : 0;
    }
    return s->col;
}

/* The valid output columns ow of a kernel column kj: 0 <= ow*ss - pl + kj < W. */
static void ow_range(int64_t W, int64_t Wo, int64_t ss, int64_t pl, int64_t kj, int64_t *a, int64_t *b) {
    int64_t lo = pl - kj, hi = W - 1 + pl - kj;
    int64_t x0 = lo <= 0 ? 0 : (lo + ss - 1) / ss, x1 = hi < 0 ? 0 : hi / ss + 1;
    if (x1 > Wo) x1 = Wo;
    if (x0 > x1) x0 = x1;
    *a = x0, *b = x1;
}

/* y [Cout, H, W] (+)= the 2D conv of one frame x [Cin, H, W] with temporal tap a of the 3x3x3 kernel on the
 * Winograd kernels: acc adds to y (no bias), else y = conv + bias. */
static void wino_tap(scratch *s, const conv_w *c, int64_t a, const float *x, int64_t B, int64_t H, int64_t W, bool acc,
                     float *y) {
    if (s->st) return;
    const int64_t Ci = c->cin, Co = c->cout;
    float *wa = fmap((size_t)(Co * Ci * 9));
    if (!wa) { s->st = mmc_error(MMC_ERR_OOM, "out of memory (VAE conv3d weights)"); return; }
    for (int64_t r = 0; r < Co * Ci; r++) memcpy(wa + r * 9, c->w + r * 27 + a * 9, 9 * sizeof(float));
    s->st = mmc_conv3x3_winograd(x, B, Ci, H, W, wa, Co, acc ? NULL : c->b, acc, y);
    ffree(wa);
#ifdef __GLIBC__
    /* mmc_conv3x3_winograd's scratch comes from malloc: once a large one has been freed, glibc's adaptive
     * mmap threshold keeps the next ones on the heap, whose freed top then stays resident (~40 MB next to
     * the full-resolution caches); hand it back */
    malloc_trim(0);
#endif
}

/* y [C, N] += bias */
static void add_bias(const conv_w *c, int64_t N, float *y) {
#pragma omp parallel for schedule(static) if (c->cout * N > 65536)
    for (int64_t o = 0; o < c->cout; o++) {
        float *yo = y + o * N, bv = c->b[o];
        for (int64_t i = 0; i < N; i++) yo[i] += bv;
    }
}

/* A 3x3x3 conv (strides 1, spatial padding 1, the causal frames in prev) as three accumulated 3x3 convs on the
 * Winograd kernels (mmc_conv3x3_winograd), one per temporal tap a: y[to] = sum_a conv2d(frame[to + a], w[:, :, a]).
 * Tap a's batch of To frames must be contiguous frame-major ([To, Cin, H, W]): for one output frame (the decoder's
 * frame-by-frame tail: P = 2 cached frames, T = 1) the cache (frame-major) and the chunk are read in place and the
 * result is written straight into y; otherwise the frames are gathered into [P + T, Cin, H, W] and the result
 * [To, Cout, H, W] is written back channel-major. Each tap's weights [Cout, Cin, 3, 3] are copied out of
 * [Cout, Cin, 3, 3, 3] for the call. acc: y += conv + bias. False (nothing done) when the layer is not for
 * Winograd. */
static bool conv3d_wino(scratch *s, const conv_w *c, const float *prev, int64_t P, const float *x, int64_t T,
                        int64_t H, int64_t W, bool acc, float *y) {
    const int64_t Ci = c->cin, Co = c->cout, HW = H * W, F = P + T, To = F - 2;
    if (To < 1 || !mmc_conv3x3_winograd_applies(Ci, Co, H, W)) return false;
    if (To == 1 && T == 1) {   /* in place: cached frames 0, 1 and x, straight into y */
        if (acc) add_bias(c, HW, y);
        for (int64_t a = 0; a < 3; a++) wino_tap(s, c, a, a < P ? prev + a * Ci * HW : x, 1, H, W, a > 0 || acc, y);
        return true;
    }
    float *xf = fmap((size_t)(F * Ci * HW)), *yf = fmap((size_t)(To * Co * HW));
    if (!xf || !yf) {
        s->st = mmc_error(MMC_ERR_OOM, "out of memory (VAE conv3d frames)");
        ffree(xf), ffree(yf);
        return true;
    }
    memcpy(xf, prev, (size_t)(P * Ci * HW) * sizeof(float));   /* the cache is frame-major already */
#pragma omp parallel for schedule(static) if (T * Ci * HW > 65536)
    for (int64_t fc = 0; fc < T * Ci; fc++) {   /* x [Cin, T, HW] -> [T, Cin, HW] */
        const int64_t f = fc / Ci, ci = fc % Ci;
        memcpy(xf + (P * Ci + fc) * HW, x + (ci * T + f) * HW, (size_t)HW * sizeof(float));
    }
    for (int64_t a = 0; a < 3; a++) wino_tap(s, c, a, xf + a * Ci * HW, To, H, W, a > 0, yf);
#pragma omp parallel for schedule(static) if (To * Co * HW > 65536)
    for (int64_t oc = 0; oc < Co * To; oc++) {   /* [To, Cout, HW] -> [Cout, To, HW] */
        const int64_t o = oc / To, t = oc % To;
        float *yd = y + oc * HW;
        const float *ys = yf + (t * Co + o) * HW;
        if (acc)
            for (int64_t i = 0; i < HW; i++) yd[i] += ys[i];
        else
            memcpy(yd, ys, (size_t)HW * sizeof(float));
    }
    ffree(xf), ffree(yf);
    return true;
}

/* y [Cout, To, Ho, Wo] = conv3d over the frame sequence prev [P, Cin, H, W] (frame-major) then x [Cin, T, H, W]
 * (temporal stride st, no temporal padding: the caller puts the causal frames in prev; spatial stride
 * ss, zero padding pt rows on top / pl columns on the left, and whatever Ho, Wo leave at the bottom /
 * right), + bias (acc: added to y). To = (P + T - kt) / st + 1. With up = 2 the input is read as its
 * nearest-neighbour 2x upsampling (2H x 2W), which is never stored. The im2col band is unmapped before
 * returning (it would otherwise stay resident next to the full-resolution caches). */
static void conv3d_up(scratch *s, const conv_w *c, const float *prev, int64_t P, const float *x, int64_t T,
                      int64_t H, int64_t W, int64_t up, int64_t st, int64_t ss, int64_t pt, int64_t pl, int64_t Ho,
                      int64_t Wo, bool acc, float *y) {
    const int64_t To = (P + T - c->kt) / st + 1, HW = H * W, HWo = Ho * Wo, N = To * HWo, Hv = H * up, Wv = W * up;
    const int64_t K = c->cin * c->kt * c->kh * c->kw;
    if (c->kt == 3 && c->kh == 3 && c->kw == 3 && ss == 1 && st == 1 && up == 1 && pt == 1 && pl == 1 && Ho == H &&
        Wo == W && conv3d_wino(s, c, prev, P, x, T, H, W, acc, y))
        return;   /* (bias included) */
    if (c->kt == 1 && c->kh == 1 && c->kw == 1 && ss == 1 && P == 0 && st == 1 && up == 1) {
        mmc_gemm_f32(false, false, c->cout, T * HW, c->cin, 1.0f, c->w, c->cin, x, T * HW, acc ? 1.0f : 0.0f, y, N);
    } else {
        /* bands of whole output rows r = (to, oh) of the flattened [To * Ho] */
        int64_t rows = (int64_t)(COL_BYTES / sizeof(float)) / (K * Wo);
        if (rows < 1) rows = 1;
        if (rows > To * Ho) rows = To * Ho;
        float *col = scratch_col(s, (size_t)(K * rows * Wo));
        if (!col) { s->st = mmc_error(MMC_ERR_OOM, "out of memory (im2col band)"); return; }
        for (int64_t r0 = 0; r0 < To * Ho; r0 += rows) {
            const int64_t r1 = r0 + rows < To * Ho ? r0 + rows : To * Ho, nr = r1 - r0, ldc = nr * Wo;
#pragma omp parallel for schedule(static) if (K * ldc > 32768)
            for (int64_t k = 0; k < K; k++) {
                const int64_t kj = k % c->kw, ki = (k / c->kw) % c->kh, a = (k / (c->kw * c->kh)) % c->kt,
                              ci = k / (c->kw * c->kh * c->kt);
                int64_t ow0, ow1;
                ow_range(Wv, Wo, ss, pl, kj, &ow0, &ow1);
                const int64_t off = kj - pl;
                float *crow = col + k * ldc;
                for (int64_t r = r0; r < r1; r++) {
                    const int64_t to = r / Ho, oh = r % Ho, f = to * st + a, ih = oh * ss - pt + ki;
                    float *restrict dst = crow + (r - r0) * Wo;
                    if (ih < 0 || ih >= Hv) { memset(dst, 0, (size_t)Wo * sizeof(float)); continue; }
                    const float *frame = f < P ? prev + (f * c->cin + ci) * HW : x + (ci * T + f - P) * HW;
                    const float *restrict src = frame + (ih / up) * W;
                    for (int64_t ow = 0; ow < ow0; ow++) dst[ow] = 0.0f;
                    if (up == 2) {   /* nearest 2x: virtual column v reads v / 2 */
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[(ow * ss + off) >> 1];
                    } else if (ss == 1) {
                        if (ow1 > ow0) memcpy(dst + ow0, src + ow0 + off, (size_t)(ow1 - ow0) * sizeof(float));
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[ow * ss + off];
                    }
                    for (int64_t ow = ow1; ow < Wo; ow++) dst[ow] = 0.0f;
                }
            }
            mmc_gemm_f32(false, false, c->cout, ldc, K, 1.0f, c->w, K, col, ldc, acc ? 1.0f : 0.0f, y + r0 * Wo, N);
        }
        ffree(s->col), s->col = NULL, s->col_cap = 0;
    }
#pragma omp parallel for schedule(static) if (c->cout * N > 65536)
    for (int64_t o = 0; o < c->cout; o++) {
        float *yo = y + o * N, b = c->b[o];
        for (int64_t i = 0; i < N; i++) yo[i] += b;
    }
}

static void conv3d(scratch *s, const conv_w *c, const float *prev, int64_t P, const float *x, int64_t T, int64_t H,
                   int64_t W, int64_t st, int64_t ss, int64_t pt, int64_t pl, int64_t Ho, int64_t Wo, float *y) {
    conv3d_up(s, c, prev, P, x, T, H, W, 1, st, ss, pt, pl, Ho, Wo, false, y);
}

/* WanRMS_norm over the channels of x [C, N] (F.normalize: x / max(||x||_2, 1e-12), times sqrt(C) and
 * gamma), then SiLU when silu; into y (may be x). */
static void rms_norm(const rms_w *r, const float *x, int64_t N, bool silu, float *y) {
    const int64_t C = r->C;
    const float scale = (float)sqrt((double)C);
#pragma omp parallel for schedule(static) if (C * N > 65536)
    for (int64_t n0 = 0; n0 < N; n0 += 256) {
        const int64_t n1 = n0 + 256 < N ? n0 + 256 : N;
        float ss[256];
        for (int64_t n = n0; n < n1; n++) ss[n - n0] = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            const float *xc = x + c * N;
            for (int64_t n = n0; n < n1; n++) ss[n - n0] += xc[n] * xc[n];
        }
        for (int64_t n = n0; n < n1; n++) {
            float d = sqrtf(ss[n - n0]);
            ss[n - n0] = d > 1e-12f ? d : 1e-12f;
        }
        for (int64_t c = 0; c < C; c++) {
            const float *xc = x + c * N;
            float *yc = y + c * N;
            const float g = r->g[c];
            for (int64_t n = n0; n < n1; n++) {
                float v = xc[n] / ss[n - n0] * scale * g;
                yc[n] = silu ? v / (1.0f + expf(-v)) : v;
            }
        }
    }
}

/* ------------------------------------------------------------------ the feature cache */
typedef struct {
    float *buf;                   /* [n, Cin, H, W] the last input frames, frame-major (zeros before the stream starts) */
    int n;                        /* frames held: 2 (3-tap causal convs), 1 (downsample3d) */
    bool started;                 /* the resampler's first chunk has been seen */
    bool psum;                    /* holds partial output sums instead (causal_conv_narrow) */
    int head;                     /* a residual block's ring (res_ring): the slot of the older frame */
} tcache;

typedef struct {
    tcache *c;
    int n, idx;
    scratch s;
} stream;

static tcache *next_cache(stream *s) {
    if (s->idx == s->n) {
        int n = s->n ? 2 * s->n : 64;
        tcache *c = realloc(s->c, (size_t)n * sizeof *c);
        if (!c) return NULL;
        memset(c + s->n, 0, (size_t)(n - s->n) * sizeof *c);
        s->c = c, s->n = n;
    }
    return &s->c[s->idx++];
}

static void stream_free(stream *s) {
    for (int i = 0; i < s->n; i++) ffree(s->c[i].buf);
    free(s->c);
    ffree(s->s.col);
}

/* keep the last n frames of [cache (n frames), x (T frames, [C, T, HW])] in the cache ([n, C, HW]) */
static void cache_push(tcache *c, int64_t C, const float *x, int64_t T, int64_t HW) {
    const int64_t n = c->n, keep = T >= n ? 0 : n - T;
    if (keep) memmove(c->buf, c->buf + (n - keep) * C * HW, (size_t)(keep * C * HW) * sizeof(float));
    for (int64_t j = keep; j < n; j++)   /* cache frame j <- x frame T - n + j */
        for (int64_t ch = 0; ch < C; ch++)
            memcpy(c->buf + (j * C + ch) * HW, x + (ch * T + T - n + j) * HW, (size_t)HW * sizeof(float));
}

/* A ring-used 2-frame cache (res_ring) back in frame order [older, newer] for the other paths. */
static void cache_order(tcache *c, int64_t C, int64_t HW) {
    if (!c->head) return;
    float *a = c->buf, *b = c->buf + C * HW;
    for (int64_t i = 0; i < C * HW; i++) {
        const float t = a[i];
        a[i] = b[i], b[i] = t;
    }
    c->head = 0;
}

static float *falloc(stream *s, int64_t n) {
    float *p = fmap((size_t)n);
    if (!p && !s->s.st) s->s.st = mmc_error(MMC_ERR_OOM, "out of memory (%lld floats of VAE activations)", (long long)n);
    return p;
}

/* WanCausalConv3d of a 3x3x3 (or (3,1,1)) kernel, spatial padding (kh-1)/2, over one chunk x [Cin, T, H, W]
 * with the cached frames in front: a new [Cout, T, H, W], or with acc added into acc [Cout, T, H, W] (the
 * residual) and acc returned (NULL on error, s->s.st set; acc is not freed). */
static float *causal_conv(stream *s, const conv_w *c, const float *x, int64_t T, int64_t H, int64_t W, float *acc) {
    tcache *tc = next_cache(s);
    if (!tc) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); return NULL; }
    const int64_t HW = H * W;
    if (!tc->buf) {
        tc->n = CACHE_T;
        tc->buf = fmap((size_t)(c->cin * CACHE_T * HW));   /* zero pages */
        if (!tc->buf) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory (VAE feature cache)"); return NULL; }
    }
    cache_order(tc, c->cin, HW);
    float *y = acc ? acc : falloc(s, c->cout * T * HW);
    if (!y) return NULL;
    conv3d_up(&s->s, c, tc->buf, CACHE_T, x, T, H, W, 1, 1, 1, (c->kh - 1) / 2, (c->kw - 1) / 2, H, W, acc != NULL, y);
    cache_push(tc, c->cin, x, T, HW);
    if (s->s.st) { if (!acc) ffree(y); return NULL; }
    return y;
}

/* a pointwise (1x1x1) conv: no cache */
static float *pointwise(stream *s, const conv_w *c, const float *x, int64_t T, int64_t HW) {
    float *y = falloc(s, c->cout * T * HW);
    if (!y) return NULL;
    conv3d(&s->s, c, NULL, 0, x, T, 1, HW, 1, 1, 0, 0, 1, HW, y);
    return y;
}

/* A residual block on one frame (T = 1, in == out, both convs on the Winograd taps) with its two caches
 * as rings: tap 0 of each conv reads the older cached frame first, whose slot then receives the conv's
 * new input (norm1's / norm2's output), which taps 1 and 2 read with the newer one; the slot roles then
 * swap. Nothing is copied into the caches and only conv1's output is alive next to the residual x,
 * into which conv2 accumulates. The same sums in the same order as res_forward's other path. */
static bool res_ring_applies(const resblock *r, int64_t T, int64_t H, int64_t W) {
    const conv_w *c1 = &r->conv1, *c2 = &r->conv2;
    return T == 1 && !r->shortcut.cout && c1->kt == 3 && c1->kh == 3 && c1->kw == 3 && c2->kt == 3 && c2->kh == 3 &&
           c2->kw == 3 && mmc_conv3x3_winograd_applies(c1->cin, c1->cout, H, W) &&
           mmc_conv3x3_winograd_applies(c2->cin, c2->cout, H, W);
}

static tcache *ring_cache(stream *s, int64_t C, int64_t HW) {
    tcache *tc = next_cache(s);
    if (tc && !tc->buf) {
        tc->n = CACHE_T, tc->head = 0;
        tc->buf = fmap((size_t)(C * CACHE_T * HW));   /* zero pages */
    }
    if (!tc || !tc->buf) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory (VAE feature cache)"); return NULL; }
    return tc;
}

static float *res_ring(stream *s, const resblock *r, float *x, int64_t H, int64_t W) {
    const int64_t HW = H * W;
    tcache *t1 = ring_cache(s, r->conv1.cin, HW);
    const int i1 = s->idx - 1;
    tcache *t2 = t1 ? ring_cache(s, r->conv2.cin, HW) : NULL;
    if (t2) t1 = &s->c[i1];   /* (the second lookup may have moved the array) */
    float *y1 = t2 ? falloc(s, r->conv1.cout * HW) : NULL;
    if (!y1) { ffree(x); return NULL; }
    float *o1 = t1->buf + t1->head * r->conv1.cin * HW, *m1 = t1->buf + (1 - t1->head) * r->conv1.cin * HW;
    float *o2 = t2->buf + t2->head * r->conv2.cin * HW, *m2 = t2->buf + (1 - t2->head) * r->conv2.cin * HW;
    wino_tap(&s->s, &r->conv1, 0, o1, 1, H, W, false, y1);   /* y1 = A1 a[t-2] + b1 */
    rms_norm(&r->norm1, x, HW, true, o1);                   /* a[t] into the freed slot */
    wino_tap(&s->s, &r->conv1, 1, m1, 1, H, W, true, y1);
    wino_tap(&s->s, &r->conv1, 2, o1, 1, H, W, true, y1);
    t1->head ^= 1;
    add_bias(&r->conv2, HW, x);                              /* x += b2 + A2 b[t-2] */
    wino_tap(&s->s, &r->conv2, 0, o2, 1, H, W, true, x);
    rms_norm(&r->norm2, y1, HW, true, o2);                  /* b[t] */
    ffree(y1);
    wino_tap(&s->s, &r->conv2, 1, m2, 1, H, W, true, x);
    wino_tap(&s->s, &r->conv2, 2, o2, 1, H, W, true, x);
    t2->head ^= 1;
    if (s->s.st) { ffree(x); return NULL; }
    return x;
}

/* WanResidualBlock: x [in, T, H, W] -> [out, T, H, W] (x itself when in == out: conv2 accumulates into the
 * residual); x is consumed. At most three activations are alive: the residual, norm1's output, conv1's. */
static float *res_forward(stream *s, const resblock *r, float *x, int64_t T, int64_t H, int64_t W) {
    if (res_ring_applies(r, T, H, W)) return res_ring(s, r, x, H, W);
    const int64_t HW = H * W, N = T * HW;
    float *h = NULL, *a = NULL, *b = NULL;
    a = falloc(s, r->norm1.C * N);
    if (!a) goto fail;
    rms_norm(&r->norm1, x, N, true, a);
    if (r->shortcut.cout) {
        h = pointwise(s, &r->shortcut, x, T, HW);
        ffree(x);
    } else
        h = x;
    x = NULL;
    if (!h) goto fail;
    b = causal_conv(s, &r->conv1, a, T, H, W, NULL);
    ffree(a), a = NULL;
    if (!b) goto fail;
    rms_norm(&r->norm2, b, N, true, b);
    float *o = causal_conv(s, &r->conv2, b, T, H, W, h);   /* h += conv2(b) */
    ffree(b);
    if (!o) { ffree(h); return NULL; }
    return h;
fail:
    ffree(x), ffree(h), ffree(a), ffree(b);
    return NULL;
}

/* WanAttentionBlock, frame by frame: x [C, T, H, W] -> a new one; x is freed. */
static float *attn_forward(stream *s, const attnblock *ab, float *x, int64_t T, int64_t H, int64_t W) {
    const int64_t C = ab->norm.C, HW = H * W, QB = 256;
    float *xt = falloc(s, C * HW), *qkv = falloc(s, 3 * C * HW), *o = falloc(s, C * HW), *pr = falloc(s, C * HW);
    float *S = falloc(s, (QB < HW ? QB : HW) * HW);
    if (!xt || !qkv || !o || !pr || !S) goto done;
    const float scale = (float)(1.0 / sqrt((double)C));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = 0; c < C; c++) memcpy(xt + c * HW, x + (c * T + t) * HW, (size_t)HW * sizeof(float));
        rms_norm(&ab->norm, xt, HW, false, xt);
        conv3d(&s->s, &ab->qkv, NULL, 0, xt, 1, 1, HW, 1, 1, 0, 0, 1, HW, qkv);   /* [3C, HW]: q, k, v */
        const float *q = qkv, *k = qkv + C * HW, *v = qkv + 2 * C * HW;
        for (int64_t q0 = 0; q0 < HW; q0 += QB) {
            const int64_t nq = q0 + QB < HW ? QB : HW - q0;
            /* S [nq, HW] = q^T k * scale */
            mmc_gemm_f32(true, false, nq, HW, C, scale, q + q0, HW, k, HW, 0.0f, S, HW);
#pragma omp parallel for schedule(static) if (nq * HW > 65536)
            for (int64_t i = 0; i < nq; i++) {
                float *row = S + i * HW, m = row[0], sum = 0.0f;
                for (int64_t j = 1; j < HW; j++) m = row[j] > m ? row[j] : m;
                for (int64_t j = 0; j < HW; j++) row[j] = expf(row[j] - m), sum += row[j];
                const float inv = 1.0f / sum;
                for (int64_t j = 0; j < HW; j++) row[j] *= inv;
            }
            /* o[:, q0:q0+nq] = v [C, HW] . S^T */
            mmc_gemm_f32(false, true, C, nq, HW, 1.0f, v, HW, S, HW, 0.0f, o + q0, HW);
        }
        conv3d(&s->s, &ab->proj, NULL, 0, o, 1, 1, HW, 1, 1, 0, 0, 1, HW, pr);
        for (int64_t c = 0; c < C; c++) {
            float *xc = x + (c * T + t) * HW;
            const float *pc = pr + c * HW;
            for (int64_t i = 0; i < HW; i++) xc[i] = pc[i] + xc[i];
        }
    }
done:
    ffree(xt), ffree(qkv), ffree(o), ffree(pr), ffree(S);
    if (s->s.st) { ffree(x); return NULL; }
    return x;
}

static float *mid_forward(stream *s, const midblock *m, float *x, int64_t T, int64_t H, int64_t W) {
    x = res_forward(s, &m->r0, x, T, H, W);
    if (x) x = attn_forward(s, &m->attn, x, T, H, W);
    if (x) x = res_forward(s, &m->r1, x, T, H, W);
    return x;
}

/* WanResample: x [C, T, H, W] -> a new [C', T', H', W'] (*T, *H, *W updated); x is freed. part 1 stops
 * after upsample3d's time step, part 2 skips it (the frames were split in between). */
static float *resample_part(stream *s, const resample *r, float *x, int64_t *pT, int64_t *pH, int64_t *pW,
                            int part) {
    int64_t T = *pT, H = *pH, W = *pW;
    const int64_t C = r->conv.cin;
    if (r->mode == RS_UP3D && part != 2) {
        tcache *tc = next_cache(s);
        if (!tc) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); ffree(x); return NULL; }
        if (!tc->started) {
            tc->started = true;   /* diffusers' "Rep": the first chunk is not upsampled in time */
        } else {
            const int64_t HW = H * W;
            if (!tc->buf) {
                tc->n = CACHE_T;
                tc->buf = fmap((size_t)(C * CACHE_T * HW));   /* zero pages */
                if (!tc->buf) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); ffree(x); return NULL; }
            }
            float *tcv = falloc(s, 2 * C * T * HW), *y = falloc(s, C * 2 * T * HW);
            if (!tcv || !y) { ffree(tcv), ffree(y), ffree(x); return NULL; }
            conv3d(&s->s, &r->time_conv, tc->buf, CACHE_T, x, T, H, W, 1, 1, 0, 0, H, W, tcv);
            cache_push(tc, C, x, T, HW);
            /* [2, C, T] -> [C, T, 2]: channel half h of time step t becomes frame 2t + h */
            for (int64_t c = 0; c < C; c++)
                for (int64_t t = 0; t < T; t++)
                    for (int h = 0; h < 2; h++)
                        memcpy(y + (c * 2 * T + 2 * t + h) * HW, tcv + ((h * C + c) * T + t) * HW,
                               (size_t)HW * sizeof(float));
            ffree(tcv), ffree(x);
            x = y, T *= 2;
        }
        if (part == 1) { *pT = T; return x; }
    }
    float *y = NULL;
    if (r->mode == RS_UP2D || r->mode == RS_UP3D) {
        /* nearest-exact 2x (for a factor of 2: source index dst / 2), then the 3x3 conv, padding 1 */
        const int64_t H2 = 2 * H, W2 = 2 * W;
        y = falloc(s, r->conv.cout * T * H2 * W2);
        if (!y) { ffree(x); return NULL; }
        /* per frame (kt = 1), the whole chunk as one conv; the im2col reads the upsampled frame */
        conv3d_up(&s->s, &r->conv, NULL, 0, x, T, H, W, 2, 1, 1, 1, 1, H2, W2, false, y);
        ffree(x);
        H = H2, W = W2;
    } else {
        /* ZeroPad2d((0, 1, 0, 1)) + 3x3 conv stride 2: the zero column / row is what the band reads
         * past the right / bottom edge */
        const int64_t Ho = (H + 1 - 3) / 2 + 1, Wo = (W + 1 - 3) / 2 + 1;
        y = falloc(s, C * T * Ho * Wo);
        if (!y) { ffree(x); return NULL; }
        conv3d(&s->s, &r->conv, NULL, 0, x, T, H, W, 1, 2, 0, 0, Ho, Wo, y);
        ffree(x);
        H = Ho, W = Wo;
        if (r->mode == RS_DOWN3D) {
            tcache *tc = next_cache(s);
            if (!tc) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); ffree(y); return NULL; }
            const int64_t HW = H * W;
            if (!tc->started) {
                /* the first chunk passes through; its last frame is kept */
                tc->started = true, tc->n = 1;
                tc->buf = fmap((size_t)(C * HW));
                if (!tc->buf) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); ffree(y); return NULL; }
                for (int64_t c = 0; c < C; c++)
                    memcpy(tc->buf + c * HW, y + (c * T + T - 1) * HW, (size_t)HW * sizeof(float));
            } else {
                /* (3,1,1) conv, temporal stride 2, over [last frame of the previous chunk, chunk] */
                const int64_t To = (1 + T - 3) / 2 + 1;
                float *z = To >= 1 ? falloc(s, C * To * HW) : NULL;
                if (!z) {
                    if (To < 1) s->s.st = mmc_error(MMC_ERR_INVALID, "Wan VAE: a chunk of %lld frames is too short "
                                                     "for the temporal downsampler", (long long)T);
                    ffree(y);
                    return NULL;
                }
                conv3d(&s->s, &r->time_conv, tc->buf, 1, y, T, H, W, 2, 1, 0, 0, H, W, z);
                cache_push(tc, C, y, T, HW);
                ffree(y);
                y = z, T = To;
            }
        }
    }
    if (s->s.st) { ffree(y); return NULL; }
    *pT = T, *pH = H, *pW = W;
    return y;
}

/* part 0: the whole WanResample; 1: only the time step of upsample3d; 2: only the spatial step */
static float *resample_forward(stream *s, const resample *r, float *x, int64_t *pT, int64_t *pH, int64_t *pW) {
    return resample_part(s, r, x, pT, pH, pW, 0);
}

/* A causal 3x3x3 conv with fewer output than input channels, one frame at a time (T = 1: the heads'
 * conv_out, 96 -> 3 at full resolution in the decoder): instead of the last two input frames the cache
 * holds the two pending output sums, 2 x Cout channels instead of 2 x Cin. With taps A, B, C (kernel
 * frame a = 0, 1, 2) y[t] = A x[t-2] + B x[t-1] + C x[t] + bias, so with s1 = A x[t-2] + B x[t-1] and
 * s2 = A x[t-1] (zeros at the start, as the zero frames in front): y = s1 + C x[t] + bias, then
 * s1 <- s2 + B x[t], s2 <- A x[t]. Each tap runs as a 2D conv (kt 1) of its kernel slice. Other
 * shapes go to causal_conv. */
static float *causal_conv_narrow(stream *s, const conv_w *c, const float *x, int64_t T, int64_t H, int64_t W) {
    if (c->kt != 3 || c->cout >= c->cin) return causal_conv(s, c, x, T, H, W, NULL);
    tcache *tc = next_cache(s);
    if (!tc) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory"); return NULL; }
    if (T != 1) {
        s->s.st = mmc_error(MMC_ERR_INVALID, "Wan VAE: a %lld-frame chunk at a conv_out (one frame at a time expected)",
                            (long long)T);
        return NULL;
    }
    const int64_t Co = c->cout, Ci = c->cin, HW = H * W, K9 = Ci * c->kh * c->kw;
    if (!tc->buf) {
        tc->n = 2, tc->psum = true;
        tc->buf = fmap((size_t)(2 * Co * HW));   /* zero pages: s1 = s2 = 0 */
        if (!tc->buf) { s->s.st = mmc_error(MMC_ERR_OOM, "out of memory (VAE feature cache)"); return NULL; }
    }
    float *y = falloc(s, Co * HW), *tw = falloc(s, 3 * Co * K9 + Co), *s1 = tc->buf, *s2 = tc->buf + Co * HW;
    if (!y || !tw) { ffree(y), ffree(tw); return NULL; }
    float *zb = tw + 3 * Co * K9;   /* a zero bias (fresh pages) */
    conv_w tap[3];
    for (int a = 0; a < 3; a++) {   /* kernel frame a: [Cout, Cin, 1, kh, kw] out of [Cout, Cin, 3, kh, kw] */
        float *wa = tw + a * Co * K9;
        const int64_t k2 = c->kh * c->kw;
        for (int64_t r = 0; r < Co * Ci; r++) memcpy(wa + r * k2, c->w + (r * 3 + a) * k2, (size_t)k2 * sizeof(float));
        tap[a] = (conv_w){.cout = Co, .cin = Ci, .kt = 1, .kh = c->kh, .kw = c->kw, .w = wa, .b = a == 2 ? c->b : zb};
    }
    const int64_t pt = (c->kh - 1) / 2, pl = (c->kw - 1) / 2;
    memcpy(y, s1, (size_t)(Co * HW) * sizeof(float));
    conv3d_up(&s->s, &tap[2], NULL, 0, x, 1, H, W, 1, 1, 1, pt, pl, H, W, true, y);    /* y = s1 + C x + bias */
    memcpy(s1, s2, (size_t)(Co * HW) * sizeof(float));
    conv3d_up(&s->s, &tap[1], NULL, 0, x, 1, H, W, 1, 1, 1, pt, pl, H, W, true, s1);   /* s1 = s2 + B x */
    conv3d_up(&s->s, &tap[0], NULL, 0, x, 1, H, W, 1, 1, 1, pt, pl, H, W, false, s2);  /* s2 = A x */
    ffree(tw);
    if (s->s.st) { ffree(y); return NULL; }
    return y;
}

/* RMS -> SiLU -> causal conv_out */
static float *head_forward(stream *s, const rms_w *norm, const conv_w *conv, float *x, int64_t T, int64_t H,
                           int64_t W) {
    rms_norm(norm, x, T * H * W, true, x);
    float *y = causal_conv_narrow(s, conv, x, T, H, W);
    ffree(x);
    return y;
}

/* WanEncoder3d on one chunk x [Cin, T, H, W] (copied): a new [2 z_dim, T', h, w] */
static float *encoder_chunk(stream *s, const mmc_wan_vae *v, const float *x, int64_t T, int64_t H, int64_t W,
                            int64_t *pT) {
    float *h = causal_conv(s, &v->enc_in, x, T, H, W, NULL);
    for (int i = 0; h && i < v->n_enc; i++) {
        const enc_layer *l = &v->enc[i];
        if (l->is_res) h = res_forward(s, &l->res, h, T, H, W);
        else h = resample_forward(s, &l->rs, h, &T, &H, &W);
    }
    if (h) h = mid_forward(s, &v->enc_mid, h, T, H, W);
    if (h) h = head_forward(s, &v->enc_norm_out, &v->enc_out, h, T, H, W);
    *pT = T;
    return h;
}

/* Where decoded frames go: frames [Cout, Tout, H, W], clamped as diffusers' _decode does. */
typedef struct {
    float *frames;
    int64_t Tout, done, Cout, HW;
} sink;

static void emit(sink *k, const float *o, int64_t T, int64_t HW) {
    MMC_ASSERT(k->done + T <= k->Tout && HW == k->HW);
    for (int64_t c = 0; c < k->Cout; c++)
        for (int64_t i = 0; i < T * HW; i++) {
            float val = o[c * T * HW + i];
            val = val < -1.0f ? -1.0f : val > 1.0f ? 1.0f : val;   /* torch.clamp; NaN passes */
            k->frames[(c * k->Tout + k->done) * HW + i] = val;
        }
    k->done += T;
}

/* The decoder from up block i on (its residual blocks, resamplers, then the head) for h [C, T, H, W]
 * (consumed), emitting the output frames. Every layer is causal in time, so a chunk can go through it
 * frame by frame, each conv's cache carrying the previous frames: after each temporal upsampler's time
 * step the frames it made go through the rest one at a time (the cache entries from there on revisited
 * for each), which gives diffusers' 4-frame pass exactly with one frame of activations at each level
 * (and one waiting sibling per temporal upsampler). */
static bool decoder_levels(stream *s, const mmc_wan_vae *v, int i, float *h, int64_t T, int64_t H, int64_t W,
                           sink *k) {
    for (; h && i < v->cfg.levels; i++) {
        const up_block *u = &v->up[i];
        for (int r = 0; h && r < u->n_res; r++) h = res_forward(s, &u->res[r], h, T, H, W);
        if (!h || u->up.mode == RS_NONE) continue;
        if (u->up.mode != RS_UP3D) { h = resample_forward(s, &u->up, h, &T, &H, &W); continue; }
        h = resample_part(s, &u->up, h, &T, &H, &W, 1);   /* the time step: T -> 2T (but on the first chunk) */
        if (!h) return false;
        if (T == 1) { h = resample_part(s, &u->up, h, &T, &H, &W, 2); continue; }
        const int mark = s->idx;   /* the caches from here on, revisited for each frame */
        const int64_t C = u->up.conv.cin, HW = H * W;
        float *one[8] = {0};
        bool ok = T <= 8;
        if (!ok) s->s.st = mmc_error(MMC_ERR_INVALID, "Wan VAE: %lld frames at an upsampler (at most 8)", (long long)T);
        for (int64_t f = 0; ok && f < T; f++) {
            if (!(one[f] = falloc(s, C * HW))) { ok = false; break; }
            for (int64_t c = 0; c < C; c++) memcpy(one[f] + c * HW, h + (c * T + f) * HW, (size_t)HW * sizeof(float));
        }
        ffree(h);
        for (int64_t f = 0; ok && f < T; f++) {
            int64_t T1 = 1, H1 = H, W1 = W;
            s->idx = mark;
            float *x = resample_part(s, &u->up, one[f], &T1, &H1, &W1, 2);   /* the spatial step (frees one[f]) */
            one[f] = NULL;
            ok = x && decoder_levels(s, v, i + 1, x, 1, H1, W1, k);
        }
        for (int64_t f = 0; f < T && f < 8; f++) ffree(one[f]);
        return ok;
    }
    if (h) h = head_forward(s, &v->dec_norm_out, &v->dec_out, h, T, H, W);
    if (!h) return false;
    emit(k, h, T, H * W);
    ffree(h);
    return true;
}

/* WanDecoder3d on one chunk x [z_dim, T, h, w] (one latent frame in diffusers' _decode). */
static bool decoder_chunk(stream *s, const mmc_wan_vae *v, const float *x, int64_t T, int64_t H, int64_t W, sink *k) {
    float *h = causal_conv(s, &v->dec_in, x, T, H, W, NULL);
    if (h) h = mid_forward(s, &v->dec_mid, h, T, H, W);
    return h && decoder_levels(s, v, 0, h, T, H, W, k);
}

static mmc_status check_latent_size(const mmc_wan_vae *v, int64_t t, int64_t h, int64_t w) {
    (void)v;
    if (t < 1 || h < 1 || w < 1)
        return mmc_error(MMC_ERR_INVALID, "Wan VAE decode: latent size %lld x %lld x %lld (frames x height x width) "
                         "must be positive", (long long)t, (long long)h, (long long)w);
    return MMC_OK;
}

mmc_status mmc_wan_vae_decode(mmc_wan_vae *v, const float *z, int64_t t, int64_t h, int64_t w, float *frames,
                              mmc_wan_vae_progress progress, void *user) {
    mmc_status st = check_latent_size(v, t, h, w);
    if (st) return st;
    const int64_t Z = v->cfg.z_dim, f = v->cfg.scale_factor_spatial, Cout = v->cfg.out_channels;
    const int64_t Tout = 4 * (t - 1) + 1, Ho = h * f, Wo = w * f, hw = h * w;
    stream s = {0};
    float *pq = NULL, *zt = NULL;
    /* post_quant_conv over the whole latent, as diffusers runs it before the frame loop */
    pq = pointwise(&s, &v->post_quant, z, t, hw);
    zt = falloc(&s, Z * hw);
    if (!pq || !zt) goto done;
    sink k = {.frames = frames, .Tout = Tout, .Cout = Cout, .HW = Ho * Wo};
    for (int64_t i = 0; i < t; i++) {
        s.idx = 0;
        for (int64_t c = 0; c < Z; c++) memcpy(zt + c * hw, pq + (c * t + i) * hw, (size_t)hw * sizeof(float));
        if (!decoder_chunk(&s, v, zt, 1, h, w, &k)) goto done;
        if (progress) progress(user, (int)(i + 1), (int)t);
    }
    MMC_ASSERT(k.done == Tout);
done:
    st = s.s.st;
    ffree(pq), ffree(zt);
    stream_free(&s);
    return st;
}

mmc_status mmc_wan_vae_encode(mmc_wan_vae *v, const float *x, int64_t T, int64_t H, int64_t W, float *mean,
                              float *logvar, mmc_wan_vae_progress progress, void *user) {
    mmc_status st = mmc_wan_check_frames(T);
    if (st) return mmc_error_prefix(st, "Wan VAE encode: ");
    const int64_t f = v->cfg.scale_factor_spatial;
    if (H < f || W < f || H % f || W % f)
        return mmc_error(MMC_ERR_INVALID, "Wan VAE encode: frame size %lld x %lld must be positive multiples of %lld "
                         "(nearest: %lld x %lld)", (long long)H, (long long)W, (long long)f,
                         (long long)((H + f / 2) / f > 0 ? (H + f / 2) / f * f : f),
                         (long long)((W + f / 2) / f > 0 ? (W + f / 2) / f * f : f));
    const int64_t Cin = v->cfg.in_channels, Z = v->cfg.z_dim, HW = H * W, h = H / f, w = W / f, hw = h * w;
    const int64_t t = mmc_wan_vae_latent_frames(T), n_chunks = t;
    stream s = {0};
    float *chunk = falloc(&s, Cin * 4 * HW), *moments = falloc(&s, 2 * Z * t * hw), *q = NULL;
    if (!chunk || !moments) goto done;
    for (int64_t i = 0; i < n_chunks; i++) {
        s.idx = 0;
        const int64_t f0 = i ? 1 + 4 * (i - 1) : 0, nf = i ? 4 : 1;
        for (int64_t c = 0; c < Cin; c++)
            memcpy(chunk + c * nf * HW, x + (c * T + f0) * HW, (size_t)(nf * HW) * sizeof(float));
        int64_t To = 0;
        float *o = encoder_chunk(&s, v, chunk, nf, H, W, &To);
        if (!o) goto done;
        MMC_ASSERT(To == 1);
        for (int64_t c = 0; c < 2 * Z; c++) memcpy(moments + (c * t + i) * hw, o + c * hw, (size_t)hw * sizeof(float));
        ffree(o);
        if (progress) progress(user, (int)(i + 1), (int)n_chunks);
    }
    q = pointwise(&s, &v->quant, moments, t, hw);
    if (!q) goto done;
    memcpy(mean, q, (size_t)(Z * t * hw) * sizeof(float));
    if (logvar)
        for (int64_t i = 0; i < Z * t * hw; i++) {
            float lv = q[Z * t * hw + i];
            logvar[i] = lv < -30.0f ? -30.0f : lv > 20.0f ? 20.0f : lv;
        }
done:
    st = s.s.st;
    ffree(chunk), ffree(moments), ffree(q);
    stream_free(&s);
    return st;
}

void mmc_wan_vae_sample(const float *mean, const float *logvar, const float *noise, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) {
        float sd = expf(0.5f * logvar[i]);
        float p = sd * noise[i];
        out[i] = mean[i] + p;
    }
}

void mmc_wan_vae_normalize(const mmc_wan_vae *v, float *z, int64_t n) {
    for (int64_t c = 0; c < v->cfg.z_dim; c++) {
        const float m = v->cfg.latents_mean[c], inv = 1.0f / v->cfg.latents_std[c];
        float *zc = z + c * n;
        for (int64_t i = 0; i < n; i++) {
            float d = zc[i] - m;
            zc[i] = d * inv;
        }
    }
}

void mmc_wan_vae_denormalize(const mmc_wan_vae *v, float *z, int64_t n) {
    for (int64_t c = 0; c < v->cfg.z_dim; c++) {
        const float m = v->cfg.latents_mean[c], inv = 1.0f / v->cfg.latents_std[c];
        float *zc = z + c * n;
        for (int64_t i = 0; i < n; i++) {
            float d = zc[i] / inv;
            zc[i] = d + m;
        }
    }
}
