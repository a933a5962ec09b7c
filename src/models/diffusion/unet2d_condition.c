/* unet2d_condition.c — the text-conditioned UNet of Stable Diffusion 1.x / 2.x and SDXL, mirroring
 * diffusers' UNet2DConditionModel (models/unets/unet_2d_condition.py) with the blocks of
 * unets/unet_2d_blocks.py, resnet.py, transformers/transformer_2d.py and attention.py:
 *
 *   emb    = TimestepEmbedding(Timesteps(t))                      (linear, SiLU, linear)
 *            + add_embedding(cat(text_embeds, Timesteps(time_ids)))   with addition_embed_type "text_time"
 *   conv_in -> down blocks: per level layers_per_block ResnetBlock2D (each followed by a
 *            Transformer2DModel in CrossAttnDownBlock2D), then, except at the last level, a 3x3
 *            stride-2 conv; every output is kept as a skip
 *   mid    : ResnetBlock2D, Transformer2DModel, ResnetBlock2D (UNetMidBlock2DCrossAttn)
 *   up     : per level layers_per_block + 1 ResnetBlock2D over cat(h, skip) on channels (each followed
 *            by a Transformer2DModel in CrossAttnUpBlock2D), then, except at the last level, nearest
 *            2x upsampling and a 3x3 conv
 *   out    : GroupNorm, SiLU, conv_out
 *
 *   ResnetBlock2D  : GroupNorm, SiLU, conv1, + time_emb_proj(SiLU(emb)), GroupNorm, SiLU, conv2, plus the
 *                    input (1x1 conv_shortcut when channels change), / output_scale_factor
 *   Transformer2D  : GroupNorm (eps 1e-6), proj_in (1x1 conv, or linear with use_linear_projection),
 *                    transformer_layers BasicTransformerBlocks, proj_out, plus the input
 *   BasicTransformerBlock: LayerNorm -> self-attention, LayerNorm -> cross-attention to the text
 *                    states, LayerNorm -> GEGLU feed-forward (proj to 2 x 4C, hidden * gelu(gate)),
 *                    each with a residual; q/k/v without bias, to_out with bias
 *
 * The config key attention_head_dim is, for these models, the number of heads (diffusers keeps the
 * misnomer for compatibility: num_attention_heads = num_attention_heads or attention_head_dim), the
 * head dim being channels / heads. Without a tape, each block's intermediates are released once its
 * output exists (mw_keep), so peak memory is the skips plus one block's activations. In grad mode
 * (training) every op records onto the tape and nothing is released; the nn.Linear modules are
 * mmc_linear_w under diffusers' module names (mmc_unet_linears), so LoRA attaches as PEFT's does. */
#include "mmc_diffusion.h"
#include "mmc_models.h"
#include "../model_weights.h"
#include "../../nn/resnet2d.h"
#include "mmc_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T2D_GN_EPS 1e-6f   /* Transformer2DModel's GroupNorm */
#define LN_EPS 1e-5f       /* BasicTransformerBlock's LayerNorms (norm_eps default) */

typedef mmc_resnet2d resnet;                /* src/nn/resnet2d.c */

typedef struct {
    mmc_linear_w q, k, v;                 /* [C, C], [C, Ckv], [C, Ckv]: no bias */
    mmc_linear_w o;                       /* to_out.0 [C, C] + bias */
} attention;

typedef struct {
    mmc_tensor *n1_w, *n1_b, *n2_w, *n2_b, *n3_w, *n3_b;   /* LayerNorms [C] */
    attention self, cross;
    mmc_linear_w ff0;                     /* GEGLU proj [8C, C] + bias */
    mmc_linear_w ff2;                     /* [C, 4C] + bias */
} tblock;

typedef struct {
    int64_t C, heads;
    int n_blocks;
    mmc_tensor *norm_w, *norm_b;          /* GroupNorm [C] */
    mmc_tensor *in_w, *in_b;              /* proj_in [C, C, 1, 1] (use_linear_projection false) */
    mmc_tensor *out_w, *out_b;            /* proj_out */
    mmc_linear_w in_l, out_l;             /* proj_in / proj_out [C, C] (use_linear_projection true) */
    tblock *blocks;
} transformer2d;

typedef struct {
    int n;                                /* resnets (== transformers where cross) */
    resnet *res;
    transformer2d *attn;                  /* NULL in DownBlock2D / UpBlock2D */
    mmc_tensor *sample_w, *sample_b;      /* downsampler / upsampler conv [C, C, 3, 3]; NULL at the end */
} level;

struct mmc_unet {
    mmc_unet_config cfg;
    mmc_tensor *conv_in_w, *conv_in_b;
    mmc_linear_w t1, t2;                          /* time_embedding.linear_1 / linear_2 */
    mmc_linear_w a1, a2;                          /* add_embedding (text_time) */
    level down[MMC_UNET_MAX_LEVELS], up[MMC_UNET_MAX_LEVELS];
    resnet mid_res[2];
    transformer2d mid_attn;
    mmc_tensor *norm_out_w, *norm_out_b, *conv_out_w, *conv_out_b;
    mw_set w;
    const char **train_names;                     /* mmc_unet_param_list's view of w.names */
};

/* ------------------------------------------------------------------ config */

/* An int, or a list with one value per level (diffusers accepts both for these keys). */
static mmc_status per_level(const mmc_json *j, const char *what, const char *key, int64_t def, int L, int64_t *out) {
    char k0[96];
    snprintf(k0, sizeof k0, "%s.0", key);
    mmc_status st;
    if (mmc_json_has(j, k0)) {
        int n = MMC_UNET_MAX_LEVELS;
        if ((st = mmc_json_int_array(j, key, out, &n))) return mmc_error_prefix(st, "%s: ", what);
        if (n != L)
            return mmc_error(MMC_ERR_FORMAT, "%s: %s has %d entries, block_out_channels %d", what, key, n, L);
        return MMC_OK;
    }
    int64_t v;
    if ((st = mmc_json_int(j, key, def, &v))) return mmc_error_prefix(st, "%s: ", what);
    for (int i = 0; i < L; i++) out[i] = v;
    return MMC_OK;
}

static bool null_or_absent(const mmc_json *j, const char *key) {
    const char *v = NULL;
    if (!mmc_json_has(j, key)) return true;
    return mmc_json_str(j, key, NULL, &v) == MMC_OK && v == NULL;
}

mmc_status mmc_unet_config_read(const mmc_json *j, const char *what, mmc_unet_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *cls = NULL;
    if ((st = mmc_json_str(j, "_class_name", "UNet2DConditionModel", &cls))) return mmc_error_prefix(st, "%s: ", what);
    if (strcmp(cls, "UNet2DConditionModel") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: _class_name '%s' is not UNet2DConditionModel", what, cls);
    int n = MMC_UNET_MAX_LEVELS;
    if (!mmc_json_has(j, "block_out_channels")) {
        static const int64_t def[4] = {320, 640, 1280, 1280};
        memcpy(c->block_out_channels, def, sizeof def);
        n = 4;
    } else if ((st = mmc_json_int_array(j, "block_out_channels", c->block_out_channels, &n))) {
        return mmc_error_prefix(st, "%s: ", what);
    }
    if (n < 1) return mmc_error(MMC_ERR_FORMAT, "%s: block_out_channels is empty", what);
    const int L = c->levels = n;
    const char *mid = NULL, *add = NULL, *act = NULL, *shift = NULL, *temb_type = NULL, *attn_type = NULL;
    bool dual = false, only_cross = false, center = false, skip_act = false, concat = false;
    double res_osf = 1.0;
    int64_t kin = 3, kout = 3, temb_dim = 0;
    if ((st = mmc_json_int(j, "in_channels", 4, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", 4, &c->out_channels)) ||
        (st = mmc_json_int(j, mmc_json_has(j, "sample_size.0") ? "sample_size.0" : "sample_size", 64, &c->sample_size)) ||
        (st = mmc_json_int(j, "norm_num_groups", 32, &c->norm_num_groups)) ||
        (st = mmc_json_num(j, "norm_eps", 1e-5, &c->norm_eps)) ||
        (st = mmc_json_bool(j, "use_linear_projection", false, &c->use_linear_projection)) ||
        (st = mmc_json_bool(j, "flip_sin_to_cos", true, &c->flip_sin_to_cos)) ||
        (st = mmc_json_num(j, "freq_shift", 0, &c->freq_shift)) ||
        (st = mmc_json_num(j, "mid_block_scale_factor", 1.0, &c->mid_block_scale_factor)) ||
        (st = mmc_json_str(j, "mid_block_type", "UNetMidBlock2DCrossAttn", &mid)) ||
        (st = mmc_json_str(j, "addition_embed_type", "", &add)) ||
        (st = mmc_json_int(j, "addition_time_embed_dim", 0, &c->addition_time_embed_dim)) ||
        (st = mmc_json_int(j, "projection_class_embeddings_input_dim", 0, &c->projection_class_embeddings_input_dim)) ||
        (st = mmc_json_int(j, "time_embedding_dim", 0, &temb_dim)) ||
        (st = mmc_json_str(j, "act_fn", "silu", &act)) ||
        (st = mmc_json_str(j, "resnet_time_scale_shift", "default", &shift)) ||
        (st = mmc_json_str(j, "time_embedding_type", "positional", &temb_type)) ||
        (st = mmc_json_str(j, "attention_type", "default", &attn_type)) ||
        (st = mmc_json_bool(j, "dual_cross_attention", false, &dual)) ||
        (st = mmc_json_bool(j, "center_input_sample", false, &center)) ||
        (st = mmc_json_bool(j, "resnet_skip_time_act", false, &skip_act)) ||
        (st = mmc_json_bool(j, "class_embeddings_concat", false, &concat)) ||
        (st = mmc_json_num(j, "resnet_out_scale_factor", 1.0, &res_osf)) ||
        (st = mmc_json_int(j, "conv_in_kernel", 3, &kin)) ||
        (st = mmc_json_int(j, "conv_out_kernel", 3, &kout)))
        return mmc_error_prefix(st, "%s: ", what);
    /* only_cross_attention: a bool or a per-level list; mmc runs self + cross attention only */
    if (mmc_json_has(j, "only_cross_attention.0")) {
        for (int i = 0; i < L; i++) {
            char k[48];
            bool b = false;
            snprintf(k, sizeof k, "only_cross_attention.%d", i);
            if ((st = mmc_json_bool(j, k, false, &b))) return mmc_error_prefix(st, "%s: ", what);
            only_cross |= b;
        }
    } else if ((st = mmc_json_bool(j, "only_cross_attention", false, &only_cross))) {
        return mmc_error_prefix(st, "%s: ", what);
    }
    /* what this implementation does not cover is an error naming the key, never a silent difference */
    static const char *const must_be_null[] = {"class_embed_type", "encoder_hid_dim", "encoder_hid_dim_type",
                                               "time_cond_proj_dim", "time_embedding_act_fn", "timestep_post_act",
                                               "cross_attention_norm", "num_class_embeds"};
    for (size_t i = 0; i < sizeof must_be_null / sizeof *must_be_null; i++)
        if (!null_or_absent(j, must_be_null[i]))
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s is set; mmc's UNet2DConditionModel supports it null only",
                             what, must_be_null[i]);
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: act_fn '%s' is not supported (silu)", what, act);
    if (strcmp(shift, "default"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: resnet_time_scale_shift '%s' is not supported (default)", what, shift);
    if (strcmp(temb_type, "positional"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: time_embedding_type '%s' is not supported (positional)", what,
                         temb_type);
    if (strcmp(attn_type, "default"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: attention_type '%s' is not supported (default)", what, attn_type);
    if (dual || only_cross || center || skip_act || concat || res_osf != 1.0 || kin != 3 || kout != 3)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: dual_cross_attention, only_cross_attention, center_input_sample, "
                         "resnet_skip_time_act, class_embeddings_concat must be false, resnet_out_scale_factor 1 and "
                         "conv_in_kernel / conv_out_kernel 3", what);
    if (!strcmp(mid, "UNetMidBlock2DCrossAttn")) c->mid_cross = true;
    else if (mid[0])
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: mid_block_type '%s' is not supported (UNetMidBlock2DCrossAttn or "
                         "null)", what, mid);
    if (!strcmp(add, "text_time")) c->text_time = true;
    else if (add[0])
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: addition_embed_type '%s' is not supported (text_time or null)",
                         what, add);
    if (mmc_json_has(j, "cross_attention_dim.0"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: a per-block cross_attention_dim list is not supported", what);
    if ((st = mmc_json_int(j, "cross_attention_dim", 1280, &c->cross_attention_dim)))
        return mmc_error_prefix(st, "%s: ", what);
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "up_block_types" : "down_block_types";
        for (int i = 0; i < L; i++) {
            char kk[64];
            const char *t = NULL;
            snprintf(kk, sizeof kk, "%s.%d", key, i);
            if ((st = mmc_json_str(j, kk, NULL, &t))) return mmc_error_prefix(st, "%s: ", what);
            if (!t) return mmc_error(MMC_ERR_FORMAT, "%s: %s needs %d entries (one per block_out_channels)", what, key, L);
            const char *plain = k ? "UpBlock2D" : "DownBlock2D", *cross = k ? "CrossAttnUpBlock2D" : "CrossAttnDownBlock2D";
            bool *dst = k ? &c->up_cross[i] : &c->down_cross[i];
            if (!strcmp(t, cross)) *dst = true;
            else if (strcmp(t, plain))
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: %s[%d] '%s' is not supported (%s or %s)", what, key, i, t,
                                 plain, cross);
        }
        char kk[64];
        snprintf(kk, sizeof kk, "%s.%d", key, L);
        if (mmc_json_has(j, kk))
            return mmc_error(MMC_ERR_FORMAT, "%s: %s has more entries than block_out_channels (%d)", what, key, L);
    }
    if ((st = per_level(j, what, "layers_per_block", 2, L, c->layers_per_block)) ||
        (st = per_level(j, what, "transformer_layers_per_block", 1, L, c->transformer_layers)))
        return st;
    /* heads: num_attention_heads when set, else attention_head_dim (the misnomer) */
    if (!null_or_absent(j, "num_attention_heads")) st = per_level(j, what, "num_attention_heads", 8, L, c->heads);
    else st = per_level(j, what, "attention_head_dim", 8, L, c->heads);
    if (st) return st;
    for (int i = 0; i < L; i++) c->up_transformer_layers[i] = c->transformer_layers[L - 1 - i];
    if (!null_or_absent(j, "reverse_transformer_layers_per_block"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: reverse_transformer_layers_per_block is not supported", what);
    c->time_embed_dim = temb_dim ? temb_dim : c->block_out_channels[0] * 4;
    for (int i = 0; i < L; i++) {
        const int64_t C = c->block_out_channels[i];
        if (C < 1 || C % c->norm_num_groups)
            return mmc_error(MMC_ERR_FORMAT, "%s: block_out_channels[%d] = %lld is not a positive multiple of "
                             "norm_num_groups %lld", what, i, (long long)C, (long long)c->norm_num_groups);
        if (c->layers_per_block[i] < 1 || c->transformer_layers[i] < 1 || c->heads[i] < 1 || C % c->heads[i])
            return mmc_error(MMC_ERR_FORMAT, "%s: level %d: layers_per_block, transformer_layers_per_block and heads "
                             "must be positive, heads (%lld) dividing the channels (%lld)", what, i,
                             (long long)c->heads[i], (long long)C);
    }
    if (c->in_channels < 1 || c->out_channels < 1 || c->cross_attention_dim < 1 || c->norm_num_groups < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: in_channels, out_channels, cross_attention_dim and norm_num_groups must "
                         "be positive", what);
    if (c->text_time && (c->addition_time_embed_dim < 1 || c->projection_class_embeddings_input_dim < 1))
        return mmc_error(MMC_ERR_FORMAT, "%s: addition_embed_type text_time needs addition_time_embed_dim and "
                         "projection_class_embeddings_input_dim", what);
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */

static void bind_resnet(mw_set *w, const char *p, resnet *r, int64_t cin, int64_t cout, int64_t temb) {
    mmc_resnet2d_bind(w, p, r, cin, cout, temb);
}

static void bind_attention(mw_set *w, const char *p, const char *name, attention *a, int64_t C, int64_t ckv) {
    char q[256];
    snprintf(q, sizeof q, "%s%s.", p, name);
    mw_bind_linear(w, q, "to_q", &a->q, C, C, false);
    mw_bind_linear(w, q, "to_k", &a->k, C, ckv, false);
    mw_bind_linear(w, q, "to_v", &a->v, C, ckv, false);
    mw_bind_linear(w, q, "to_out.0", &a->o, C, C, true);
}

static mmc_status bind_transformer(mw_set *w, const mmc_unet_config *c, const char *p, transformer2d *t, int64_t C,
                                   int64_t heads, int64_t n_blocks) {
    t->C = C, t->heads = heads, t->n_blocks = (int)n_blocks;
    t->blocks = calloc((size_t)n_blocks, sizeof *t->blocks);
    if (!t->blocks) return mmc_error(MMC_ERR_OOM, "out of memory");
    mw_bind_wb(w, p, "norm", &t->norm_w, &t->norm_b, 1, MMC_SHAPE(C));
    if (c->use_linear_projection) {
        mw_bind_linear(w, p, "proj_in", &t->in_l, C, C, true);
        mw_bind_linear(w, p, "proj_out", &t->out_l, C, C, true);
    } else {
        mw_bind_wb(w, p, "proj_in", &t->in_w, &t->in_b, 4, MMC_SHAPE(C, C, 1, 1));
        mw_bind_wb(w, p, "proj_out", &t->out_w, &t->out_b, 4, MMC_SHAPE(C, C, 1, 1));
    }
    for (int64_t k = 0; k < n_blocks; k++) {
        tblock *b = &t->blocks[k];
        char q[256];
        snprintf(q, sizeof q, "%stransformer_blocks.%lld.", p, (long long)k);
        mw_bind_wb(w, q, "norm1", &b->n1_w, &b->n1_b, 1, MMC_SHAPE(C));
        mw_bind_wb(w, q, "norm2", &b->n2_w, &b->n2_b, 1, MMC_SHAPE(C));
        mw_bind_wb(w, q, "norm3", &b->n3_w, &b->n3_b, 1, MMC_SHAPE(C));
        bind_attention(w, q, "attn1", &b->self, C, C);
        bind_attention(w, q, "attn2", &b->cross, C, c->cross_attention_dim);
        mw_bind_linear(w, q, "ff.net.0.proj", &b->ff0, 8 * C, C, true);
        mw_bind_linear(w, q, "ff.net.2", &b->ff2, C, 4 * C, true);
    }
    return MMC_OK;
}

static mmc_status alloc_level(level *lv, int n, bool cross) {
    lv->n = n;
    lv->res = calloc((size_t)n, sizeof *lv->res);
    lv->attn = cross ? calloc((size_t)n, sizeof *lv->attn) : NULL;
    if (!lv->res || (cross && !lv->attn)) return mmc_error(MMC_ERR_OOM, "out of memory");
    return MMC_OK;
}

static mmc_status bind_all(mmc_unet *m) {
    const mmc_unet_config *c = &m->cfg;
    mw_set *w = &m->w;
    const int L = c->levels;
    const int64_t *ch = c->block_out_channels, temb = c->time_embed_dim;
    char p[256];
    mmc_status st;
    mw_bind_wb(w, "", "conv_in", &m->conv_in_w, &m->conv_in_b, 4, MMC_SHAPE(ch[0], c->in_channels, 3, 3));
    mw_bind_linear(w, "time_embedding.", "linear_1", &m->t1, temb, ch[0], true);
    mw_bind_linear(w, "time_embedding.", "linear_2", &m->t2, temb, temb, true);
    if (c->text_time) {
        mw_bind_linear(w, "add_embedding.", "linear_1", &m->a1, temb, c->projection_class_embeddings_input_dim, true);
        mw_bind_linear(w, "add_embedding.", "linear_2", &m->a2, temb, temb, true);
    }
    for (int i = 0; i < L; i++) {
        level *lv = &m->down[i];
        if ((st = alloc_level(lv, (int)c->layers_per_block[i], c->down_cross[i]))) return st;
        const int64_t cin = i ? ch[i - 1] : ch[0], cout = ch[i];
        for (int r = 0; r < lv->n; r++) {
            snprintf(p, sizeof p, "down_blocks.%d.resnets.%d.", i, r);
            bind_resnet(w, p, &lv->res[r], r ? cout : cin, cout, temb);
            if (lv->attn) {
                snprintf(p, sizeof p, "down_blocks.%d.attentions.%d.", i, r);
                if ((st = bind_transformer(w, c, p, &lv->attn[r], cout, c->heads[i], c->transformer_layers[i])))
                    return st;
            }
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "down_blocks.%d.downsamplers.0.", i);
            mw_bind_wb(w, p, "conv", &lv->sample_w, &lv->sample_b, 4, MMC_SHAPE(cout, cout, 3, 3));
        }
    }
    const int64_t top = ch[L - 1];
    if (c->mid_cross) {   /* mid_block_type null: no mid block at all */
        bind_resnet(w, "mid_block.resnets.0.", &m->mid_res[0], top, top, temb);
        bind_resnet(w, "mid_block.resnets.1.", &m->mid_res[1], top, top, temb);
        if ((st = bind_transformer(w, c, "mid_block.attentions.0.", &m->mid_attn, top, c->heads[L - 1],
                                   c->transformer_layers[L - 1])))
            return st;
    }
    for (int i = 0; i < L; i++) {
        level *lv = &m->up[i];
        const int n = (int)c->layers_per_block[L - 1 - i] + 1;
        if ((st = alloc_level(lv, n, c->up_cross[i]))) return st;
        const int64_t prev = i ? ch[L - i] : top, cout = ch[L - 1 - i], cin = ch[L - 1 - (i + 1 < L ? i + 1 : L - 1)];
        for (int r = 0; r < n; r++) {
            const int64_t skip = r == n - 1 ? cin : cout, rin = r ? cout : prev;
            snprintf(p, sizeof p, "up_blocks.%d.resnets.%d.", i, r);
            bind_resnet(w, p, &lv->res[r], rin + skip, cout, temb);
            if (lv->attn) {
                snprintf(p, sizeof p, "up_blocks.%d.attentions.%d.", i, r);
                if ((st = bind_transformer(w, c, p, &lv->attn[r], cout, c->heads[L - 1 - i], c->up_transformer_layers[i])))
                    return st;
            }
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "up_blocks.%d.upsamplers.0.", i);
            mw_bind_wb(w, p, "conv", &lv->sample_w, &lv->sample_b, 4, MMC_SHAPE(cout, cout, 3, 3));
        }
    }
    mw_bind_wb(w, "", "conv_norm_out", &m->norm_out_w, &m->norm_out_b, 1, MMC_SHAPE(ch[0]));
    mw_bind_wb(w, "", "conv_out", &m->conv_out_w, &m->conv_out_b, 4, MMC_SHAPE(c->out_channels, ch[0], 3, 3));
    return MMC_OK;
}

static void free_level(level *lv) {
    if (lv->attn)
        for (int r = 0; r < lv->n; r++) free(lv->attn[r].blocks);
    free(lv->attn);
    free(lv->res);
}

void mmc_unet_free(mmc_unet *m) {
    if (!m) return;
    mw_close(&m->w);
    for (int i = 0; i < MMC_UNET_MAX_LEVELS; i++) free_level(&m->down[i]), free_level(&m->up[i]);
    free(m->mid_attn.blocks);
    free(m->train_names);
    free(m);
}

/* dir holds config.json; the weights are its diffusion_pytorch_model.safetensors, or `from` (taken) */
static mmc_status unet_load(const char *dir, mmc_st *from, const char *what, bool trainable, mmc_unet **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_unet *m = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) goto fail;
    m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_unet_config_read(j, path, &m->cfg))) goto fail;
    st = from ? mw_adopt(from, &m->w) : mw_open(dir, "diffusion_pytorch_model", &m->w);
    from = NULL;
    if (st) goto fail;
    m->w.trainable = trainable;
    if ((st = bind_all(m))) goto fail;
    if ((st = mw_status(&m->w, what, "UNet2DConditionModel")) ||
        (st = mw_check_unused(&m->w, what, "UNet2DConditionModel")))
        goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    if (from) mmc_st_close(from);
    mmc_json_free(j);
    mmc_unet_free(m);
    return st;
}

mmc_status mmc_unet_load(const char *dir, bool trainable, mmc_unet **out) {
    return unet_load(dir, NULL, dir, trainable, out);
}

mmc_status mmc_unet_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_unet **out) {
    *out = NULL;
    mmc_unet *m = calloc(1, sizeof *m);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st;
    if ((st = mmc_unet_config_read(cfg, what, &m->cfg)) || (st = mw_init_random(&m->w, seed, MW_INIT_TORCH_LINEAR)) ||
        (st = bind_all(m)) || (st = mw_status(&m->w, "random init", "UNet2DConditionModel"))) {
        mmc_unet_free(m);
        return st;
    }
    *out = m;
    return MMC_OK;
}

mmc_status mmc_unet_load_st(const char *config_dir, mmc_st *weights, const char *what, bool trainable,
                            mmc_unet **out) {
    return unet_load(config_dir, weights, what, trainable, out);
}

const mmc_unet_config *mmc_unet_cfg(const mmc_unet *m) { return &m->cfg; }
int64_t mmc_unet_param_count(const mmc_unet *m) { return mw_count(&m->w); }

int mmc_unet_param_list(mmc_unet *m, mmc_tensor ***params, const char *const **names) {
    if (!m->train_names) {
        m->train_names = calloc((size_t)m->w.n_params + 1, sizeof *m->train_names);
        MMC_CHECK(m->train_names, "out of memory");
        for (int i = 0; i < m->w.n_params; i++) m->train_names[i] = m->w.names[i];
    }
    *params = m->w.params;
    *names = m->train_names;
    return m->w.n_params;
}

static mmc_status add_transformer_linears(const mmc_unet *m, transformer2d *t, const char *p, mmc_module_list *out) {
    char name[MMC_MODULE_NAME];
    mmc_status st;
    if (m->cfg.use_linear_projection) {
        snprintf(name, sizeof name, "%sproj_in", p);
        if ((st = mmc_module_list_add(out, &t->in_l, name))) return st;
    }
    for (int k = 0; k < t->n_blocks; k++) {
        tblock *b = &t->blocks[k];
        struct { mmc_linear_w *l; const char *name; } ls[] = {
            {&b->self.q, "attn1.to_q"},  {&b->self.k, "attn1.to_k"},  {&b->self.v, "attn1.to_v"},
            {&b->self.o, "attn1.to_out.0"}, {&b->cross.q, "attn2.to_q"}, {&b->cross.k, "attn2.to_k"},
            {&b->cross.v, "attn2.to_v"}, {&b->cross.o, "attn2.to_out.0"}, {&b->ff0, "ff.net.0.proj"},
            {&b->ff2, "ff.net.2"},
        };
        for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
            snprintf(name, sizeof name, "%stransformer_blocks.%d.%s", p, k, ls[i].name);
            if ((st = mmc_module_list_add(out, ls[i].l, name))) return st;
        }
    }
    if (m->cfg.use_linear_projection) {
        snprintf(name, sizeof name, "%sproj_out", p);
        if ((st = mmc_module_list_add(out, &t->out_l, name))) return st;
    }
    return MMC_OK;
}

mmc_status mmc_unet_linears(mmc_unet *m, mmc_module_list *out) {
    const mmc_unet_config *c = &m->cfg;
    mmc_status st;
    char p[128];
    if ((st = mmc_module_list_add(out, &m->t1, "time_embedding.linear_1")) ||
        (st = mmc_module_list_add(out, &m->t2, "time_embedding.linear_2")))
        return st;
    if (c->text_time && ((st = mmc_module_list_add(out, &m->a1, "add_embedding.linear_1")) ||
                         (st = mmc_module_list_add(out, &m->a2, "add_embedding.linear_2"))))
        return st;
    for (int i = 0; i < c->levels; i++)
        for (int r = 0; m->down[i].attn && r < m->down[i].n; r++) {
            snprintf(p, sizeof p, "down_blocks.%d.attentions.%d.", i, r);
            if ((st = add_transformer_linears(m, &m->down[i].attn[r], p, out))) return st;
        }
    if (c->mid_cross && (st = add_transformer_linears(m, &m->mid_attn, "mid_block.attentions.0.", out))) return st;
    for (int i = 0; i < c->levels; i++)
        for (int r = 0; m->up[i].attn && r < m->up[i].n; r++) {
            snprintf(p, sizeof p, "up_blocks.%d.attentions.%d.", i, r);
            if ((st = add_transformer_linears(m, &m->up[i].attn[r], p, out))) return st;
        }
    return MMC_OK;
}

/* ------------------------------------------------------------------ forward */

static mmc_tensor *norm_silu(mmc_ctx *ctx, mmc_tensor *x, int groups, mmc_tensor *w, mmc_tensor *b, float eps) {
    return mmc_silu(ctx, mmc_groupnorm(ctx, x, groups, w, b, eps));
}

/* ResnetBlock2D: x [B, Cin, H, W], temb_act = SiLU(emb) [B, Temb] -> [B, Cout, H, W] */
static mmc_tensor *resnet_forward(mmc_ctx *ctx, const mmc_unet *m, const resnet *r, mmc_tensor *x,
                                  mmc_tensor *temb_act, double out_scale) {
    return mmc_resnet2d_forward(ctx, r, x, temb_act, (int)m->cfg.norm_num_groups, (float)m->cfg.norm_eps, out_scale);
}

/* Attention (AttnProcessor2_0): x [B, S, C] attends to kv [B, T, Ckv] -> [B, S, C] */
static mmc_tensor *attention_forward(mmc_ctx *ctx, const attention *a, mmc_tensor *x, mmc_tensor *kv, int64_t heads) {
    const int64_t B = x->shape[0], S = x->shape[1], C = x->shape[2], T = kv->shape[1], dh = C / heads;
    mmc_tensor *q = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &a->q), 4, MMC_SHAPE(B, S, heads, dh));
    mmc_tensor *k = mmc_reshape(ctx, mmc_nn_linear(ctx, kv, &a->k), 4, MMC_SHAPE(B, T, heads, dh));
    mmc_tensor *v = mmc_reshape(ctx, mmc_nn_linear(ctx, kv, &a->v), 4, MMC_SHAPE(B, T, heads, dh));
    mmc_attn_opts o = {.scale = (float)pow((double)dh, -0.5)};
    mmc_tensor *h = mmc_attention(ctx, q, k, v, &o);                                 /* [B, S, heads, dh] */
    return mmc_nn_linear(ctx, mmc_reshape(ctx, h, 3, MMC_SHAPE(B, S, C)), &a->o);
}

/* GEGLU feed-forward: ff2(hid * GELU(gate)), (hid, gate) = ff0(n).chunk(2): n [B, S, C] -> [B, S, C] */
static mmc_tensor *geglu_ff(mmc_ctx *ctx, const tblock *b, mmc_tensor *n, int64_t C) {
    mmc_tensor *p = mmc_nn_linear(ctx, n, &b->ff0);                                 /* [B, S, 8C] */
    mmc_tensor *hid = mmc_contiguous(ctx, mmc_narrow(ctx, p, 2, 0, 4 * C));
    mmc_tensor *gate = mmc_contiguous(ctx, mmc_narrow(ctx, p, 2, 4 * C, 4 * C));
    return mmc_nn_linear(ctx, mmc_mul(ctx, hid, mmc_gelu(ctx, gate)), &b->ff2);
}

/* Tokens per band of the feed-forward without a tape for S tokens: at most 1024 (MMC_UNET_FF_ROWS
 * overrides, >= 10), the bands made even, so none is short enough (<= 4 rows) for the GEMM's matvec path */
static int64_t ff_rows(int64_t S) {
    const char *e = getenv("MMC_UNET_FF_ROWS");
    const int64_t R = e && atoi(e) >= 10 ? atoi(e) : 1024, n = (S + R - 1) / R;
    return (S + n - 1) / n;
}

/* BasicTransformerBlock (layer_norm, GEGLU): h [B, S, C], enc [B, T, Ccross] */
static mmc_tensor *tblock_forward(mmc_ctx *ctx, const tblock *b, mmc_tensor *h, mmc_tensor *enc, int64_t heads) {
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    const int64_t C = h->shape[2];
    mmc_tensor *n = mmc_layernorm(ctx, h, b->n1_w, b->n1_b, LN_EPS);
    h = mw_keep(ctx, mk, mmc_add(ctx, attention_forward(ctx, &b->self, n, n, heads), h));
    mmc_arena_mark m2 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    n = mmc_layernorm(ctx, h, b->n2_w, b->n2_b, LN_EPS);
    h = mw_keep(ctx, m2, mmc_add(ctx, attention_forward(ctx, &b->cross, n, enc, heads), h));
    if (mmc_grad_enabled(ctx)) {
        n = mmc_layernorm(ctx, h, b->n3_w, b->n3_b, LN_EPS);
        return mw_keep(ctx, mk, mmc_add(ctx, geglu_ff(ctx, b, n, C), h));
    }
    /* without a tape: the feed-forward over bands of tokens, so its 8C-wide intermediates are band-sized
     * (the same values: every op here is row-wise) */
    const int64_t S = h->shape[1], R = ff_rows(S);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, h->shape);
    for (int64_t r0 = 0; r0 < S; r0 += R) {
        const int64_t nr = S - r0 < R ? S - r0 : R;
        mmc_arena_mark mb = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *hb = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, r0, nr));
        n = mmc_layernorm(ctx, hb, b->n3_w, b->n3_b, LN_EPS);
        mmc_tensor *o = mmc_add(ctx, geglu_ff(ctx, b, n, C), hb);                      /* [B, nr, C] */
        for (int64_t bi = 0; bi < h->shape[0]; bi++)
            memcpy((float *)y->data + (bi * S + r0) * C, (const float *)o->data + bi * nr * C,
                   (size_t)(nr * C) * sizeof(float));
        mmc_arena_release(mmc_ctx_arena(ctx), mb);
    }
    return mw_keep(ctx, mk, y);
}

/* Transformer2DModel (continuous input): x [B, C, H, W] -> same */
static mmc_tensor *transformer_forward(mmc_ctx *ctx, const mmc_unet *m, const transformer2d *t, mmc_tensor *x,
                                       mmc_tensor *enc) {
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    const int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const bool lin = m->cfg.use_linear_projection;
    mmc_tensor *h = mmc_groupnorm(ctx, x, (int)m->cfg.norm_num_groups, t->norm_w, t->norm_b, T2D_GN_EPS);
    if (!lin) h = mmc_conv2d(ctx, h, t->in_w, t->in_b, 1, 0);
    h = mmc_contiguous(ctx, mmc_transpose(ctx, mmc_reshape(ctx, h, 3, MMC_SHAPE(B, C, H * W)), 1, 2));  /* [B, HW, C] */
    if (lin) h = mmc_nn_linear(ctx, h, &t->in_l);
    h = mw_keep(ctx, mk, h);
    for (int k = 0; k < t->n_blocks; k++) h = tblock_forward(ctx, &t->blocks[k], h, enc, t->heads);
    if (lin) h = mmc_nn_linear(ctx, h, &t->out_l);
    h = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_transpose(ctx, h, 1, 2)), 4, MMC_SHAPE(B, C, H, W));
    if (!lin) h = mmc_conv2d(ctx, h, t->out_w, t->out_b, 1, 0);
    return mw_keep(ctx, mk, mmc_add(ctx, h, x));
}

/* TimestepEmbedding: linear_1, SiLU, linear_2 */
static mmc_tensor *mlp_embed(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l1, const mmc_linear_w *l2) {
    return mmc_nn_linear(ctx, mmc_silu(ctx, mmc_nn_linear(ctx, x, l1)), l2);
}

mmc_status mmc_unet_forward(mmc_ctx *ctx, mmc_unet *m, const mmc_unet_inputs *in, mmc_tensor **out) {
    *out = NULL;
    const mmc_unet_config *c = &m->cfg;
    const int L = c->levels;
    mmc_tensor *x = in->sample, *enc = in->encoder;
    char s[64];
    if (!x || x->dtype != MMC_F32 || x->ndim != 4 || x->shape[1] != c->in_channels)
        return mmc_error(MMC_ERR_INVALID, "UNet2DConditionModel: sample must be f32 [B, %lld, H, W], got %s",
                         (long long)c->in_channels, x ? mmc_shape_str(x, s, sizeof s) : "NULL");
    const int64_t B = x->shape[0], f = (int64_t)1 << (L - 1);
    if (x->shape[2] % f || x->shape[3] % f || x->shape[2] < 1 || x->shape[3] < 1)
        return mmc_error(MMC_ERR_INVALID, "UNet2DConditionModel: sample height and width (%lld x %lld) must be "
                         "multiples of %lld (2^(levels - 1))", (long long)x->shape[2], (long long)x->shape[3],
                         (long long)f);
    if (!enc || enc->dtype != MMC_F32 || enc->ndim != 3 || enc->shape[0] != B || enc->shape[2] != c->cross_attention_dim)
        return mmc_error(MMC_ERR_INVALID, "UNet2DConditionModel: encoder_hidden_states must be f32 [%lld, T, %lld], "
                         "got %s", (long long)B, (long long)c->cross_attention_dim,
                         enc ? mmc_shape_str(enc, s, sizeof s) : "NULL");
    if (!in->timestep) return mmc_error(MMC_ERR_INVALID, "UNet2DConditionModel: timestep is required");
    if (c->text_time) {
        const mmc_tensor *te = in->text_embeds;
        const int64_t want = te && te->ndim == 2 ? te->shape[1] + in->n_time_ids * c->addition_time_embed_dim : -1;
        if (!te || te->dtype != MMC_F32 || te->ndim != 2 || te->shape[0] != B || !in->time_ids ||
            want != c->projection_class_embeddings_input_dim)
            return mmc_error(MMC_ERR_INVALID, "UNet2DConditionModel: addition_embed_type text_time needs text_embeds "
                             "[%lld, P] and time_ids [%lld, N] with P + N * %lld = "
                             "projection_class_embeddings_input_dim %lld; got text_embeds %s, %d time ids",
                             (long long)B, (long long)B, (long long)c->addition_time_embed_dim,
                             (long long)c->projection_class_embeddings_input_dim,
                             te ? mmc_shape_str(te, s, sizeof s) : "NULL", in->n_time_ids);
    }
    x = mmc_contiguous(ctx, x);
    enc = mmc_contiguous(ctx, enc);

    /* time embedding (+ SDXL's micro-conditioning) */
    mmc_tensor *temb = mmc_timestep_embedding(ctx, in->timestep, B, (int)c->block_out_channels[0], c->flip_sin_to_cos,
                                              c->freq_shift, 1.0, 10000.0);
    mmc_tensor *emb = mlp_embed(ctx, temb, &m->t1, &m->t2);        /* [B, Temb] */
    if (c->text_time) {
        const int64_t n = in->n_time_ids, d = c->addition_time_embed_dim;
        mmc_tensor *tid = mmc_timestep_embedding(ctx, in->time_ids, B * n, (int)d, c->flip_sin_to_cos, c->freq_shift,
                                                 1.0, 10000.0);                      /* [B * n, d] */
        mmc_tensor *parts[2] = {mmc_contiguous(ctx, in->text_embeds), mmc_reshape(ctx, tid, 2, MMC_SHAPE(B, n * d))};
        mmc_tensor *cat = mmc_concat(ctx, parts, 2, 1);
        emb = mmc_add(ctx, emb, mlp_embed(ctx, cat, &m->a1, &m->a2));
    }
    mmc_tensor *temb_act = mmc_silu(ctx, emb);

    /* down */
    mmc_tensor *skips[MMC_UNET_MAX_LEVELS * 64 + 1];
    int ns = 0;
    mmc_tensor *h = mmc_conv2d(ctx, x, m->conv_in_w, m->conv_in_b, 1, 1);
    skips[ns++] = h;
    for (int i = 0; i < L; i++) {
        const level *lv = &m->down[i];
        for (int r = 0; r < lv->n; r++) {
            h = resnet_forward(ctx, m, &lv->res[r], h, temb_act, 1.0);
            if (lv->attn) h = transformer_forward(ctx, m, &lv->attn[r], h, enc);
            if (ns < (int)(sizeof skips / sizeof *skips)) skips[ns++] = h;
        }
        if (lv->sample_w) {
            h = mmc_conv2d(ctx, h, lv->sample_w, lv->sample_b, 2, 1);                 /* Downsample2D, padding 1 */
            if (ns < (int)(sizeof skips / sizeof *skips)) skips[ns++] = h;
        }
    }
    /* without a tape, the mid and up blocks keep only the running h (and the skips below, popped in turn) */
    const bool keep = !mmc_grad_enabled(ctx);
    const mmc_arena_mark m_up = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    /* mid */
    if (c->mid_cross) {
        h = resnet_forward(ctx, m, &m->mid_res[0], h, temb_act, c->mid_block_scale_factor);
        h = transformer_forward(ctx, m, &m->mid_attn, h, enc);
        h = resnet_forward(ctx, m, &m->mid_res[1], h, temb_act, c->mid_block_scale_factor);
        if (keep) h = mw_keep(ctx, m_up, h);
    }
    /* up: each resnet takes cat(h, the latest skip) on channels */
    for (int i = 0; i < L; i++) {
        const level *lv = &m->up[i];
        for (int r = 0; r < lv->n; r++) {
            MMC_CHECK(ns > 0, "UNet2DConditionModel: skip stack exhausted");
            mmc_tensor *parts[2] = {h, skips[--ns]};
            h = mmc_concat(ctx, parts, 2, 1);
            h = resnet_forward(ctx, m, &lv->res[r], h, temb_act, 1.0);
            if (lv->attn) h = transformer_forward(ctx, m, &lv->attn[r], h, enc);
            if (keep) h = mw_keep(ctx, m_up, h);
        }
        if (lv->sample_w) {   /* Upsample2D: nearest 2x, 3x3 conv (without a tape the conv reads the upsample) */
            mmc_tensor *y = keep ? mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, h->shape[1], 2 * h->shape[2], 2 * h->shape[3]))
                                 : NULL;
            const mmc_conv_input up = {.up2 = true};
            if (y && mmc_conv3x3_fused(ctx, h, &up, lv->sample_w, lv->sample_b, y->data)) h = y;
            else h = mmc_conv2d(ctx, mmc_upsample_nearest2x(ctx, h), lv->sample_w, lv->sample_b, 1, 1);
            if (keep) h = mw_keep(ctx, m_up, h);
        }
    }
    h = norm_silu(ctx, h, (int)c->norm_num_groups, m->norm_out_w, m->norm_out_b, (float)c->norm_eps);
    *out = mmc_conv2d(ctx, h, m->conv_out_w, m->conv_out_b, 1, 1);                     /* [B, Cout, H, W] */
    return MMC_OK;
}
