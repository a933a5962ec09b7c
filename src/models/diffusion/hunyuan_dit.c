/* hunyuan_dit.c — the DiT of HunyuanDiT, mirroring diffusers' HunyuanDiT2DModel
 * (models/transformers/hunyuan_transformer_2d.py: HunyuanDiTBlock, AdaLayerNormShift;
 * HunyuanAttnProcessor2_0 in attention_processor.py; PatchEmbed, HunyuanDiTAttentionPool,
 * HunyuanCombinedTimestepTextSizeStyleEmbedding, get_2d_rotary_pos_embed in embeddings.py):
 *
 *   x    = conv_p(latents).flatten(2).T                                   [B, S, C]  S = (H/p)(W/p), no table
 *   temb = timestep_embedder(proj(t)) + extra_embedder(cond)               [B, C]
 *          proj: 256 sinusoids, cos first, shift 0; timestep_embedder / extra_embedder Linear-SiLU-Linear
 *          cond = pooled                                    (v1.2: use_style_cond_and_image_meta_size false)
 *               = [pooled; proj(image_meta_size) as 6*256; style_embedder(style)]   (v1.1)
 *          pooled = HunyuanDiTAttentionPool(T5 states): one query, the mean token, over [mean; tokens]
 *          + positional_embedding [L5+1, E5], 8 heads, q/k/v_proj then c_proj -> [B, pooled_projection_dim]
 *          (all T5 positions, padding included: the pooler takes no mask)
 *   ctx  = where(mask, [bert; text_embedder(t5)], text_embedding_padding)  [B, L + L5, cross]
 *          text_embedder: Linear(E5, 4 E5)-SiLU-Linear(4 E5, cross)
 *   num_layers HunyuanDiTBlocks; block i > num_layers/2 first takes the output of block
 *   num_layers - 1 - i as its skip (a stack: blocks 0 .. num_layers/2 - 2 push, the skip blocks pop):
 *       x = skip_linear(LN_affine(cat(x, skip)))                           LN over 2C
 *       x += attn1(LN_affine(x) + Linear(SiLU(temb)))                      AdaLayerNormShift
 *       x += attn2(LN_affine(x), ctx)                                      cross, no mask
 *       x += ff(LN_affine(x))                                              Linear-GELU(tanh)-Linear
 *     attention: q, k, v with biases, per-head LayerNorm (affine, eps 1e-6) on q and k, the
 *     interleaved 2-D RoPE on q (both attentions) and on k (self-attention only), to_out with bias
 *   out  = proj_out(LN(x) * (1 + scale) + shift), (scale, shift) = Linear(SiLU(temb)).chunk(2)
 *   unpatchify as sd3.c: token (i, j) channel (py*p + px)*Cout + c -> [B, Cout, i*p + py, j*p + px]
 *
 * LayerNorms have eps 1e-6. bf16 matrices stay mapped (the two tables added elementwise, the
 * padding rows and the pooler's positions, are widened per forward); f16 ones are widened at load.
 * Without grad mode each block's intermediates are released as soon as its output exists (the skip
 * stack is kept); in grad mode every op records the tape (training: trainer_flux.c), the long skips
 * included, and with recompute each block runs under mmc_checkpoint (its skip one of its inputs).
 * mmc_hunyuan_dit_linears names every nn.Linear as diffusers does, for LoRA (PEFT's target_modules). */
#include "mmc_diffusion.h"
#include "mmc_nn.h"
#include "../model_weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HY_EPS 1e-6f
#define HY_POOL_HEADS 8   /* HunyuanCombinedTimestepTextSizeStyleEmbedding builds its pooler with 8 heads */

typedef struct {
    bool skip;
    mmc_tensor *skip_norm_w, *skip_norm_b;          /* [2C] */
    mmc_linear_w skip_linear;                       /* [C, 2C] */
    mmc_linear_w norm1_lin;                         /* AdaLayerNormShift [C, C] */
    mmc_tensor *norm1_w, *norm1_b, *norm2_w, *norm2_b, *norm3_w, *norm3_b;   /* [C] */
    mmc_linear_w q1, k1, v1, o1;                    /* [C, C] */
    mmc_tensor *nq1_w, *nq1_b, *nk1_w, *nk1_b;      /* [D] */
    mmc_linear_w q2, k2, v2, o2;                    /* [C, C], [C, cross] x2, [C, C] */
    mmc_tensor *nq2_w, *nq2_b, *nk2_w, *nk2_b;      /* [D] */
    mmc_linear_w ff_in, ff_out;                     /* [F, C], [C, F] */
} hy_block;

struct mmc_hunyuan_dit {
    mmc_hunyuan_dit_config cfg;
    mmc_tensor *patch_w, *patch_b;                  /* pos_embed.proj: [C, Cin, p, p], [C] */
    mmc_linear_w te_lin1, te_lin2;                  /* text_embedder: [4 E5, E5], [cross, 4 E5] */
    mmc_tensor *text_pad;                           /* text_embedding_padding [L + L5, cross] */
    mmc_linear_w t_lin1, t_lin2;                    /* time_extra_emb.timestep_embedder: [C, 256], [C, C] */
    mmc_tensor *pool_pos;                           /* pooler.positional_embedding [L5 + 1, E5] */
    mmc_linear_w pool_q, pool_k, pool_v, pool_c;    /* [E5, E5] x3, [P, E5] */
    mmc_tensor *style_table;                        /* style_embedder.weight [1, C] (v1.1) */
    mmc_linear_w x_lin1, x_lin2;                    /* extra_embedder: [4C, extra_in], [C, 4C] */
    hy_block *blocks;
    mmc_linear_w norm_out;                          /* [2C, C] */
    mmc_linear_w proj_out;                          /* [p*p*Cout, C] */
    mw_set w;
    const char **name_ptrs;                         /* mmc_hunyuan_dit_param_list's names (views of w.names) */
    bool recompute;                                 /* training: checkpoint each block (mmc_checkpoint) */
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_hunyuan_dit_config_read(const mmc_json *j, const char *what, mmc_hunyuan_dit_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    double mlp_ratio = 4.0;
    const char *act = NULL, *norm = NULL;
    int64_t in_ch = -1, patch = -1;
    if ((st = mmc_json_int(j, "num_attention_heads", 16, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "attention_head_dim", 88, &c->attention_head_dim)) ||
        (st = mmc_json_int(j, "in_channels", -1, &in_ch)) ||
        (st = mmc_json_int(j, "patch_size", -1, &patch)) ||
        (st = mmc_json_str(j, "activation_fn", "gelu-approximate", &act)) ||
        (st = mmc_json_int(j, "sample_size", 32, &c->sample_size)) ||
        (st = mmc_json_int(j, "hidden_size", 1152, &c->hidden_size)) ||
        (st = mmc_json_int(j, "num_layers", 28, &c->num_layers)) ||
        (st = mmc_json_num(j, "mlp_ratio", 4.0, &mlp_ratio)) ||
        (st = mmc_json_bool(j, "learn_sigma", true, &c->learn_sigma)) ||
        (st = mmc_json_int(j, "cross_attention_dim", 1024, &c->cross_attention_dim)) ||
        (st = mmc_json_str(j, "norm_type", "layer_norm", &norm)) ||
        (st = mmc_json_int(j, "cross_attention_dim_t5", 2048, &c->cross_attention_dim_t5)) ||
        (st = mmc_json_int(j, "pooled_projection_dim", 1024, &c->pooled_projection_dim)) ||
        (st = mmc_json_int(j, "text_len", 77, &c->text_len)) ||
        (st = mmc_json_int(j, "text_len_t5", 256, &c->text_len_t5)) ||
        (st = mmc_json_bool(j, "use_style_cond_and_image_meta_size", true, &c->use_style_cond_and_image_meta_size)))
        return mmc_error_prefix(st, "%s: ", what);
    if (in_ch < 1 || patch < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: in_channels and patch_size must be given as positive integers "
                         "(diffusers has no default for them)", what);
    c->in_channels = in_ch, c->patch_size = patch;
    if (strcmp(act, "gelu-approximate") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: activation_fn \"%s\": only \"gelu-approximate\" (every released "
                         "HunyuanDiT) is supported", what, act);
    (void)norm;   /* stored in the config, unused by HunyuanDiT2DModel's layers */
    c->out_channels = c->learn_sigma ? 2 * c->in_channels : c->in_channels;
    if (c->num_attention_heads < 1 || c->attention_head_dim < 1 || c->num_layers < 1 || c->hidden_size < 1 ||
        c->cross_attention_dim < 1 || c->cross_attention_dim_t5 < 1 || c->pooled_projection_dim < 1 ||
        c->text_len < 1 || c->text_len_t5 < 1 || !(mlp_ratio > 0))
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes (num_attention_heads, attention_head_dim, num_layers, "
                         "hidden_size, cross_attention_dim(_t5), pooled_projection_dim, text_len(_t5), mlp_ratio) "
                         "must be positive", what);
    const int64_t C = c->num_attention_heads * c->attention_head_dim;
    if (c->hidden_size != C)
        return mmc_error(MMC_ERR_FORMAT, "%s: hidden_size %lld must equal num_attention_heads * attention_head_dim "
                         "= %lld (the patch embedding writes hidden_size, the blocks read the inner dim)", what,
                         (long long)c->hidden_size, (long long)C);
    if (c->attention_head_dim % 4)
        return mmc_error(MMC_ERR_FORMAT, "%s: attention_head_dim %lld must be a multiple of 4 (the 2-D rotary "
                         "embedding)", what, (long long)c->attention_head_dim);
    if (c->cross_attention_dim_t5 % HY_POOL_HEADS)
        return mmc_error(MMC_ERR_FORMAT, "%s: cross_attention_dim_t5 %lld must be a multiple of %d (the attention "
                         "pooler's heads)", what, (long long)c->cross_attention_dim_t5, HY_POOL_HEADS);
    /* diffusers pops one skip per block past num_layers/2 and pushes one per block before
     * num_layers/2 - 1: an odd count pops an empty list */
    if (c->num_layers % 2)
        return mmc_error(MMC_ERR_FORMAT, "%s: num_layers %lld must be even (the long skips pair block i with block "
                         "num_layers - 1 - i)", what, (long long)c->num_layers);
    if (c->num_layers > MMC_HUNYUAN_MAX_LAYERS)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: num_layers %lld: at most %d are supported", what,
                         (long long)c->num_layers, MMC_HUNYUAN_MAX_LAYERS);
    c->ff_inner = (int64_t)((double)C * mlp_ratio);   /* python int() truncates */
    if (c->ff_inner < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: mlp_ratio %g gives an empty feed-forward", what, mlp_ratio);
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
void mmc_hunyuan_dit_free(mmc_hunyuan_dit *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->name_ptrs);
    free(m->blocks);
    free(m);
}

static void bind_ln(mw_set *w, const char *p, const char *name, mmc_tensor **wt, mmc_tensor **b, int64_t n) {
    mw_bind_wb(w, p, name, wt, b, 1, MMC_SHAPE(n));
}

static void bind_all(mmc_hunyuan_dit *m) {
    const mmc_hunyuan_dit_config *c = &m->cfg;
    mw_set *w = &m->w;
    const int64_t C = c->hidden_size, D = c->attention_head_dim, F = c->ff_inner, p = c->patch_size;
    const int64_t E5 = c->cross_attention_dim_t5, X = c->cross_attention_dim, P = c->pooled_projection_dim;
    mw_bind_wb(w, "pos_embed.", "proj", &m->patch_w, &m->patch_b, 4, MMC_SHAPE(C, c->in_channels, p, p));
    mw_bind_linear(w, "text_embedder.", "linear_1", &m->te_lin1, 4 * E5, E5, true);
    mw_bind_linear(w, "text_embedder.", "linear_2", &m->te_lin2, X, 4 * E5, true);
    mw_bind(w, "", "text_embedding_padding", &m->text_pad, 2, MMC_SHAPE(c->text_len + c->text_len_t5, X));
    const char *te = "time_extra_emb.";
    mw_bind_linear(w, te, "timestep_embedder.linear_1", &m->t_lin1, C, 256, true);
    mw_bind_linear(w, te, "timestep_embedder.linear_2", &m->t_lin2, C, C, true);
    mw_bind(w, te, "pooler.positional_embedding", &m->pool_pos, 2, MMC_SHAPE(c->text_len_t5 + 1, E5));
    mw_bind_linear(w, te, "pooler.q_proj", &m->pool_q, E5, E5, true);
    mw_bind_linear(w, te, "pooler.k_proj", &m->pool_k, E5, E5, true);
    mw_bind_linear(w, te, "pooler.v_proj", &m->pool_v, E5, E5, true);
    mw_bind_linear(w, te, "pooler.c_proj", &m->pool_c, P, E5, true);
    const int64_t extra_in = c->use_style_cond_and_image_meta_size ? 256 * 6 + C + P : P;
    if (c->use_style_cond_and_image_meta_size)
        mw_bind(w, te, "style_embedder.weight", &m->style_table, 2, MMC_SHAPE(1, C));
    mw_bind_linear(w, te, "extra_embedder.linear_1", &m->x_lin1, 4 * C, extra_in, true);
    mw_bind_linear(w, te, "extra_embedder.linear_2", &m->x_lin2, C, 4 * C, true);
    char pf[96];
    for (int64_t i = 0; i < c->num_layers; i++) {
        hy_block *b = &m->blocks[i];
        b->skip = i > c->num_layers / 2;
        snprintf(pf, sizeof pf, "blocks.%lld.", (long long)i);
        if (b->skip) {
            bind_ln(w, pf, "skip_norm", &b->skip_norm_w, &b->skip_norm_b, 2 * C);
            mw_bind_linear(w, pf, "skip_linear", &b->skip_linear, C, 2 * C, true);
        }
        mw_bind_linear(w, pf, "norm1.linear", &b->norm1_lin, C, C, true);
        bind_ln(w, pf, "norm1.norm", &b->norm1_w, &b->norm1_b, C);
        bind_ln(w, pf, "norm2", &b->norm2_w, &b->norm2_b, C);
        bind_ln(w, pf, "norm3", &b->norm3_w, &b->norm3_b, C);
        mw_bind_linear(w, pf, "attn1.to_q", &b->q1, C, C, true);
        mw_bind_linear(w, pf, "attn1.to_k", &b->k1, C, C, true);
        mw_bind_linear(w, pf, "attn1.to_v", &b->v1, C, C, true);
        mw_bind_linear(w, pf, "attn1.to_out.0", &b->o1, C, C, true);
        bind_ln(w, pf, "attn1.norm_q", &b->nq1_w, &b->nq1_b, D);
        bind_ln(w, pf, "attn1.norm_k", &b->nk1_w, &b->nk1_b, D);
        mw_bind_linear(w, pf, "attn2.to_q", &b->q2, C, C, true);
        mw_bind_linear(w, pf, "attn2.to_k", &b->k2, C, X, true);
        mw_bind_linear(w, pf, "attn2.to_v", &b->v2, C, X, true);
        mw_bind_linear(w, pf, "attn2.to_out.0", &b->o2, C, C, true);
        bind_ln(w, pf, "attn2.norm_q", &b->nq2_w, &b->nq2_b, D);
        bind_ln(w, pf, "attn2.norm_k", &b->nk2_w, &b->nk2_b, D);
        mw_bind_linear(w, pf, "ff.net.0.proj", &b->ff_in, F, C, true);
        mw_bind_linear(w, pf, "ff.net.2", &b->ff_out, C, F, true);
    }
    mw_bind_linear(w, "", "norm_out.linear", &m->norm_out, 2 * C, C, true);
    mw_bind_linear(w, "", "proj_out", &m->proj_out, p * p * c->out_channels, C, true);
}

mmc_status mmc_hunyuan_dit_load(const char *dir, bool trainable, mmc_hunyuan_dit **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_hunyuan_dit *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_hunyuan_dit_config_read(j, path, &m->cfg))) goto fail;
    m->blocks = calloc((size_t)m->cfg.num_layers, sizeof *m->blocks);
    if (!m->blocks) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "diffusion_pytorch_model", &m->w))) goto fail;
    m->w.trainable = trainable;
    bind_all(m);
    if ((st = mw_status(&m->w, dir, "HunyuanDiT2DModel")) ||
        (st = mw_check_unused(&m->w, dir, "HunyuanDiT2DModel")))
        goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_hunyuan_dit_free(m);
    return st;
}

const mmc_hunyuan_dit_config *mmc_hunyuan_dit_cfg(const mmc_hunyuan_dit *m) { return &m->cfg; }
int64_t mmc_hunyuan_dit_param_count(const mmc_hunyuan_dit *m) { return mw_count(&m->w); }
void mmc_hunyuan_dit_set_recompute(mmc_hunyuan_dit *m, bool on) { m->recompute = on; }

int mmc_hunyuan_dit_param_list(mmc_hunyuan_dit *m, mmc_tensor ***params, const char *const **names) {
    if (!m->name_ptrs) {
        m->name_ptrs = calloc((size_t)m->w.n_params + 1, sizeof *m->name_ptrs);
        MMC_CHECK(m->name_ptrs, "out of memory");
        for (int i = 0; i < m->w.n_params; i++) m->name_ptrs[i] = m->w.names[i];
    }
    *params = m->w.params;
    *names = m->name_ptrs;
    return m->w.n_params;
}

const mmc_tensor *mmc_hunyuan_dit_param(const mmc_hunyuan_dit *m, const char *name) {
    for (int i = 0; i < m->w.n_params; i++)
        if (!strcmp(m->w.names[i], name)) return m->w.params[i];
    return NULL;
}

/* Every nn.Linear under its diffusers module name (what PEFT's target_modules select). */
mmc_status mmc_hunyuan_dit_linears(mmc_hunyuan_dit *m, mmc_module_list *ml) {
    mmc_status st = MMC_OK;
    char nm[MMC_MODULE_NAME];
#define ADD(l, ...) do { snprintf(nm, sizeof nm, __VA_ARGS__); if (!st) st = mmc_module_list_add(ml, (l), nm); } while (0)
    ADD(&m->te_lin1, "text_embedder.linear_1");
    ADD(&m->te_lin2, "text_embedder.linear_2");
    ADD(&m->t_lin1, "time_extra_emb.timestep_embedder.linear_1");
    ADD(&m->t_lin2, "time_extra_emb.timestep_embedder.linear_2");
    ADD(&m->pool_q, "time_extra_emb.pooler.q_proj");
    ADD(&m->pool_k, "time_extra_emb.pooler.k_proj");
    ADD(&m->pool_v, "time_extra_emb.pooler.v_proj");
    ADD(&m->pool_c, "time_extra_emb.pooler.c_proj");
    ADD(&m->x_lin1, "time_extra_emb.extra_embedder.linear_1");
    ADD(&m->x_lin2, "time_extra_emb.extra_embedder.linear_2");
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        hy_block *b = &m->blocks[i];
        const long long k = (long long)i;
        if (b->skip) ADD(&b->skip_linear, "blocks.%lld.skip_linear", k);
        ADD(&b->norm1_lin, "blocks.%lld.norm1.linear", k);
        mmc_linear_w *a[2][4] = {{&b->q1, &b->k1, &b->v1, &b->o1}, {&b->q2, &b->k2, &b->v2, &b->o2}};
        static const char *const an[4] = {"to_q", "to_k", "to_v", "to_out.0"};
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++) ADD(a[n][j], "blocks.%lld.attn%d.%s", k, n + 1, an[j]);
        ADD(&b->ff_in, "blocks.%lld.ff.net.0.proj", k);
        ADD(&b->ff_out, "blocks.%lld.ff.net.2", k);
    }
    ADD(&m->norm_out, "norm_out.linear");
    ADD(&m->proj_out, "proj_out");
#undef ADD
    return st;
}

/* ------------------------------------------------------------------ rotary table */
/* get_1d_rotary_pos_embed(dim, pos, use_real, repeat_interleave_real) in f32 as diffusers computes
 * it: freqs = 1 / 10000^(arange(0, dim, 2) / dim), angle = pos * freq, each cos / sin repeated
 * twice, written to row[0 .. dim) of a [.., D] table. */
static void rope_1d(float pos, int64_t dim, float *cos_row, float *sin_row) {
    for (int64_t k = 0; k < dim / 2; k++) {
        const float e = (float)(2 * k) / (float)dim;
        const float freq = 1.0f / powf(10000.0f, e);
        const float a = pos * freq;
        cos_row[2 * k] = cos_row[2 * k + 1] = cosf(a);
        sin_row[2 * k] = sin_row[2 * k + 1] = sinf(a);
    }
}

/* torch.linspace(start, end, n) in f32: the first half counts up from start, the rest down from end */
static float linspace_at(float start, float end, int64_t n, int64_t i) {
    if (n == 1) return start;
    const float step = (end - start) / (float)(n - 1);
    return i < n / 2 ? start + step * (float)i : end - step * (float)(n - 1 - i);
}

void mmc_hunyuan_rope(mmc_ctx *ctx, int64_t D, int64_t gh, int64_t gw, int64_t base, mmc_tensor **cos,
                      mmc_tensor **sin) {
    /* get_resize_crop_region_for_grid: fit the grid's longer side to base, centre it (python round(): half to even) */
    const double r = (double)gh / (double)gw;
    int64_t rh, rw;
    if (r > 1) rh = base, rw = (int64_t)rint((double)base / (double)gh * (double)gw);
    else rw = base, rh = (int64_t)rint((double)base / (double)gw * (double)gh);
    const int64_t top = (int64_t)rint((double)(base - rh) / 2.0), left = (int64_t)rint((double)(base - rw) / 2.0);
    const float stop_h = (float)(top + rh), stop_w = (float)(left + rw);
    /* get_2d_rotary_pos_embed: linspace(start, stop * (n - 1) / n, n) per axis (endpoint=False) */
    const float end_h = (float)((double)stop_h * (double)(gh - 1) / (double)gh);
    const float end_w = (float)((double)stop_w * (double)(gw - 1) / (double)gw);
    *cos = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(gh * gw, D));
    *sin = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(gh * gw, D));
    float *co = (*cos)->data, *si = (*sin)->data;
    for (int64_t i = 0; i < gh; i++)
        for (int64_t jx = 0; jx < gw; jx++) {
            float *cr = co + (i * gw + jx) * D, *sr = si + (i * gw + jx) * D;
            /* meshgrid(grid_w, grid_h, "xy"): grid[0] (the first D/2 dims) is the column coordinate */
            rope_1d(linspace_at((float)left, end_w, gw, jx), D / 2, cr, sr);
            rope_1d(linspace_at((float)top, end_h, gh, i), D / 2, cr + D / 2, sr + D / 2);
        }
}

/* ------------------------------------------------------------------ forward */
static mmc_tensor *mlp2(mmc_ctx *ctx, const mmc_linear_w *l1, const mmc_linear_w *l2, mmc_tensor *x) {
    return mmc_nn_linear(ctx, mmc_silu(ctx, mmc_nn_linear(ctx, x, l1)), l2);
}

/* x [B, L, C] -> [B, L, H, D] through l, then the per-head LayerNorm */
static mmc_tensor *heads(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *l, int64_t H, int64_t D, mmc_tensor *nw,
                         mmc_tensor *nb) {
    mmc_tensor *y = mmc_reshape(ctx, mmc_nn_linear(ctx, x, l), 4, MMC_SHAPE(x->shape[0], x->shape[1], H, D));
    return nw ? mmc_layernorm(ctx, y, nw, nb, HY_EPS) : y;
}

/* HunyuanAttnProcessor2_0: self-attention when kv is NULL (rope on q and k), else cross (rope on q only) */
static mmc_tensor *attention(mmc_ctx *ctx, const mmc_hunyuan_dit *m, mmc_tensor *x, mmc_tensor *kv,
                             const mmc_linear_w *lq, const mmc_linear_w *lk, const mmc_linear_w *lv,
                             const mmc_linear_w *lo, mmc_tensor *nqw, mmc_tensor *nqb, mmc_tensor *nkw,
                             mmc_tensor *nkb, mmc_tensor *cos, mmc_tensor *sin) {
    const int64_t H = m->cfg.num_attention_heads, D = m->cfg.attention_head_dim;
    const bool cross = kv != NULL;
    if (!kv) kv = x;
    mmc_tensor *q = mmc_rope_interleaved(ctx, heads(ctx, x, lq, H, D, nqw, nqb), cos, sin);
    mmc_tensor *k = heads(ctx, kv, lk, H, D, nkw, nkb);
    if (!cross) k = mmc_rope_interleaved(ctx, k, cos, sin);
    mmc_tensor *v = heads(ctx, kv, lv, H, D, NULL, NULL);
    mmc_attn_opts o = {.causal = false};
    mmc_tensor *a = mmc_attention(ctx, q, k, v, &o);                             /* [B, S, H, D] */
    a = mmc_reshape(ctx, a, 3, MMC_SHAPE(x->shape[0], x->shape[1], H * D));
    return mmc_nn_linear(ctx, a, lo);
}

static mmc_tensor *dit_block(mmc_ctx *ctx, const mmc_hunyuan_dit *m, const hy_block *b, mmc_tensor *x,
                             mmc_tensor *skip, mmc_tensor *ctxs, mmc_tensor *temb_act, mmc_tensor *cos,
                             mmc_tensor *sin) {
    if (b->skip) {
        mmc_tensor *cat[2] = {x, skip};
        x = mmc_concat(ctx, cat, 2, 2);                                          /* [B, S, 2C] */
        x = mmc_nn_linear(ctx, mmc_layernorm(ctx, x, b->skip_norm_w, b->skip_norm_b, HY_EPS), &b->skip_linear);
    }
    const int64_t B = x->shape[0], C = x->shape[2];
    /* AdaLayerNormShift: LN(x) + Linear(SiLU(temb)) */
    mmc_tensor *shift = mmc_reshape(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1_lin), 3, MMC_SHAPE(B, 1, C));
    mmc_tensor *n = mmc_add(ctx, mmc_layernorm(ctx, x, b->norm1_w, b->norm1_b, HY_EPS), shift);
    x = mmc_add(ctx, x, attention(ctx, m, n, NULL, &b->q1, &b->k1, &b->v1, &b->o1, b->nq1_w, b->nq1_b, b->nk1_w,
                                  b->nk1_b, cos, sin));
    n = mmc_layernorm(ctx, x, b->norm2_w, b->norm2_b, HY_EPS);
    x = mmc_add(ctx, x, attention(ctx, m, n, ctxs, &b->q2, &b->k2, &b->v2, &b->o2, b->nq2_w, b->nq2_b, b->nk2_w,
                                  b->nk2_b, cos, sin));
    n = mmc_layernorm(ctx, x, b->norm3_w, b->norm3_b, HY_EPS);
    return mmc_add(ctx, x, mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, n, &b->ff_in)), &b->ff_out));
}

/* a checkpointed block: in = {x, ctx, SiLU(temb)[, skip]}; the rotary tables through the args */
typedef struct { const mmc_hunyuan_dit *m; const hy_block *b; mmc_tensor *cos, *sin; } hy_block_args;
static mmc_tensor *block_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    const hy_block_args *a = user;
    return dit_block(ctx, a->m, a->b, in[0], n_in > 3 ? in[3] : NULL, in[1], in[2], a->cos, a->sin);
}

/* HunyuanDiTAttentionPool: t5 [B, L5, E] -> [B, P] */
static mmc_tensor *attention_pool(mmc_ctx *ctx, const mmc_hunyuan_dit *m, mmc_tensor *t5) {
    const int64_t B = t5->shape[0], L = t5->shape[1], E = t5->shape[2], Hd = E / HY_POOL_HEADS;
    /* the mean token as a matmul with a constant 1/L row: [B, E, L] x [1, L]^T */
    mmc_tensor *avg = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(1, L));
    for (int64_t i = 0; i < L; i++) ((float *)avg->data)[i] = 1.0f / (float)L;
    mmc_tensor *tt = mmc_contiguous(ctx, mmc_transpose(ctx, t5, 1, 2));
    mmc_tensor *mean = mmc_reshape(ctx, mmc_linear(ctx, tt, avg, NULL), 3, MMC_SHAPE(B, 1, E));
    mmc_tensor *cat[2] = {mean, t5};
    mmc_tensor *pos = m->pool_pos->dtype == MMC_F32 ? m->pool_pos : mmc_cast(ctx, m->pool_pos, MMC_F32);
    mmc_tensor *x = mmc_add(ctx, mmc_concat(ctx, cat, 2, 1), pos);              /* [B, L+1, E] */
    mmc_tensor *x0 = mmc_contiguous(ctx, mmc_narrow(ctx, x, 1, 0, 1));          /* [B, 1, E] */
    mmc_tensor *q = mmc_reshape(ctx, mmc_nn_linear(ctx, x0, &m->pool_q), 4, MMC_SHAPE(B, 1, HY_POOL_HEADS, Hd));
    mmc_tensor *k = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &m->pool_k), 4, MMC_SHAPE(B, L + 1, HY_POOL_HEADS, Hd));
    mmc_tensor *v = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &m->pool_v), 4, MMC_SHAPE(B, L + 1, HY_POOL_HEADS, Hd));
    mmc_attn_opts o = {.causal = false};
    mmc_tensor *a = mmc_reshape(ctx, mmc_attention(ctx, q, k, v, &o), 2, MMC_SHAPE(B, E));
    return mmc_nn_linear(ctx, a, &m->pool_c);
}

static mmc_status check_inputs(const mmc_hunyuan_dit *m, const mmc_hunyuan_dit_inputs *in) {
    const mmc_hunyuan_dit_config *c = &m->cfg;
    const mmc_tensor *x = in->hidden, *e = in->encoder, *e5 = in->encoder_t5;
    const int64_t ps = c->patch_size;
    char s[64];
    if (!x || x->ndim != 4 || x->dtype != MMC_F32 || x->shape[1] != c->in_channels || !mmc_is_contiguous(x) ||
        x->shape[0] < 1)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: hidden_states must be contiguous f32 [B, %lld, H, W] "
                         "(in_channels), got %s", (long long)c->in_channels,
                         x ? mmc_shape_str(x, s, sizeof s) : "none");
    const int64_t B = x->shape[0], H = x->shape[2], W = x->shape[3];
    if (H < ps || W < ps || H % ps || W % ps)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: hidden_states height %lld and width %lld must be "
                         "positive multiples of patch_size %lld", (long long)H, (long long)W, (long long)ps);
    if (!e || e->ndim != 3 || e->dtype != MMC_F32 || e->shape[0] != B || e->shape[1] != c->text_len ||
        e->shape[2] != c->cross_attention_dim || !mmc_is_contiguous(e))
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: encoder_hidden_states must be contiguous f32 "
                         "[%lld, %lld, %lld] (text_len, cross_attention_dim), got %s", (long long)B,
                         (long long)c->text_len, (long long)c->cross_attention_dim,
                         e ? mmc_shape_str(e, s, sizeof s) : "none");
    if (!e5 || e5->ndim != 3 || e5->dtype != MMC_F32 || e5->shape[0] != B || e5->shape[1] != c->text_len_t5 ||
        e5->shape[2] != c->cross_attention_dim_t5 || !mmc_is_contiguous(e5))
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: encoder_hidden_states_t5 must be contiguous f32 "
                         "[%lld, %lld, %lld] (text_len_t5, cross_attention_dim_t5), got %s", (long long)B,
                         (long long)c->text_len_t5, (long long)c->cross_attention_dim_t5,
                         e5 ? mmc_shape_str(e5, s, sizeof s) : "none");
    if (!in->timestep || !in->mask || !in->mask_t5)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: timestep, text_embedding_mask and "
                         "text_embedding_mask_t5 are required");
    if (c->use_style_cond_and_image_meta_size) {
        if (!in->image_meta_size || !in->style)
            return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: image_meta_size and style are required with "
                             "use_style_cond_and_image_meta_size (HunyuanDiT <= 1.1)");
        for (int64_t b = 0; b < B; b++)
            if (in->style[b] != 0)
                return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: style[%lld] = %lld: style_embedder has one "
                                 "row (style 0)", (long long)b, (long long)in->style[b]);
    }
    const int64_t S = (H / ps) * (W / ps), D = c->attention_head_dim;
    const mmc_tensor *rc = in->rope_cos, *rs = in->rope_sin;
    if (!rc || !rs || rc->ndim != 2 || rs->ndim != 2 || rc->shape[0] != S || rc->shape[1] != D ||
        rs->shape[0] != S || rs->shape[1] != D || rc->dtype != MMC_F32 || rs->dtype != MMC_F32)
        return mmc_error(MMC_ERR_INVALID, "HunyuanDiT2DModel: image_rotary_emb must be f32 cos, sin [%lld, %lld] "
                         "(patches, attention_head_dim): build them with mmc_hunyuan_rope", (long long)S, (long long)D);
    return MMC_OK;
}

mmc_status mmc_hunyuan_dit_forward(mmc_ctx *ctx, mmc_hunyuan_dit *m, const mmc_hunyuan_dit_inputs *in,
                                   mmc_tensor **out) {
    *out = NULL;
    mmc_status st = check_inputs(m, in);
    if (st) return st;
    const mmc_hunyuan_dit_config *c = &m->cfg;
    const int64_t B = in->hidden->shape[0], p = c->patch_size, Co = c->out_channels;
    const int64_t H = in->hidden->shape[2], W = in->hidden->shape[3], h = H / p, w = W / p;
    const int64_t C = c->hidden_size, L = c->text_len, L5 = c->text_len_t5, X = c->cross_attention_dim;
    const bool grad = mmc_grad_enabled(ctx);

    /* PatchEmbed without a position table: conv stride p, BCHW -> BNC */
    mmc_tensor *x = mmc_conv2d(ctx, in->hidden, m->patch_w, m->patch_b, (int)p, 0);   /* [B, C, h, w] */
    x = mmc_contiguous(ctx, mmc_transpose(ctx, mmc_reshape(ctx, x, 3, MMC_SHAPE(B, C, h * w)), 1, 2));

    /* temb [B, C] */
    mmc_tensor *tp = mmc_timestep_embedding(ctx, in->timestep, B, 256, true, 0.0, 1.0, 10000.0);
    mmc_tensor *temb = mlp2(ctx, &m->t_lin1, &m->t_lin2, tp);
    mmc_tensor *cond = attention_pool(ctx, m, in->encoder_t5);                   /* [B, P] */
    if (c->use_style_cond_and_image_meta_size) {
        mmc_tensor *ms = mmc_timestep_embedding(ctx, in->image_meta_size, B * 6, 256, true, 0.0, 1.0, 10000.0);
        mmc_tensor *ids = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(B));
        memcpy(ids->data, in->style, (size_t)B * sizeof(int64_t));
        mmc_tensor *parts[3] = {cond, mmc_reshape(ctx, ms, 2, MMC_SHAPE(B, 6 * 256)),
                                mmc_embedding(ctx, m->style_table, ids)};
        cond = mmc_concat(ctx, parts, 3, 1);                                     /* [B, P + 1536 + C] */
    }
    temb = mmc_add(ctx, temb, mlp2(ctx, &m->x_lin1, &m->x_lin2, cond));
    mmc_tensor *temb_act = mmc_silu(ctx, temb);

    /* text: [bert; text_embedder(t5)], masked positions replaced by the learned padding rows */
    mmc_tensor *t5p = mlp2(ctx, &m->te_lin1, &m->te_lin2, in->encoder_t5);      /* [B, L5, X] */
    mmc_tensor *tcat[2] = {in->encoder, t5p};
    mmc_tensor *txt = mmc_concat(ctx, tcat, 2, 1);                               /* [B, L + L5, X] */
    mmc_tensor *keep = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, L + L5, 1));
    mmc_tensor *drop = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, L + L5, 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L + L5; t++) {
            const bool on = t < L ? in->mask[b * L + t] != 0 : in->mask_t5[b * L5 + t - L] != 0;
            ((float *)keep->data)[b * (L + L5) + t] = on ? 1.0f : 0.0f;
            ((float *)drop->data)[b * (L + L5) + t] = on ? 0.0f : 1.0f;
        }
    (void)X;
    mmc_tensor *pad = m->text_pad->dtype == MMC_F32 ? m->text_pad : mmc_cast(ctx, m->text_pad, MMC_F32);
    mmc_tensor *ctxs = mmc_add(ctx, mmc_mul(ctx, txt, keep), mmc_mul(ctx, pad, drop));

    mmc_tensor *skips[MMC_HUNYUAN_MAX_LAYERS];
    int n_skips = 0;
    const int64_t NL = c->num_layers;
    hy_block_args *args = grad && m->recompute ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *args * (size_t)NL) : NULL;
    for (int64_t i = 0; i < NL; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *skip = m->blocks[i].skip ? skips[--n_skips] : NULL;
        if (args) {   /* activation recompute: the block's intermediates are rebuilt in backward */
            args[i] = (hy_block_args){m, &m->blocks[i], in->rope_cos, in->rope_sin};
            mmc_tensor *bin[4] = {x, ctxs, temb_act, skip};
            x = mmc_checkpoint(ctx, block_fn, &args[i], bin, skip ? 4 : 3);
        } else {
            x = dit_block(ctx, m, &m->blocks[i], x, skip, ctxs, temb_act, in->rope_cos, in->rope_sin);
            if (!grad) x = mw_keep(ctx, mk, x);   /* earlier skips sit below the mark: kept */
        }
        if (i < NL / 2 - 1) skips[n_skips++] = x;
    }
    mmc_tensor *e[2];   /* norm_out, AdaLayerNormContinuous: (scale, shift) */
    mmc_split(ctx, mmc_nn_linear(ctx, temb_act, &m->norm_out), 1, 2, MMC_SHAPE(C, C), e);
    x = mmc_modulate(ctx, mmc_layernorm(ctx, x, NULL, NULL, HY_EPS), e[1], e[0]);
    x = mmc_nn_linear(ctx, x, &m->proj_out);                                   /* [B, S, p*p*Co] */

    /* unpatchify "nhwpqc->nchpwq" as in sd3.c */
    x = mmc_reshape(ctx, x, 4, MMC_SHAPE(B * h, w, p, p * Co));
    x = mmc_contiguous(ctx, mmc_permute(ctx, x, (const int[]){0, 2, 1, 3}));
    x = mmc_reshape(ctx, x, 3, MMC_SHAPE(B, H * W, Co));
    x = mmc_contiguous(ctx, mmc_transpose(ctx, x, 1, 2));                      /* [B, Co, H*W] */
    *out = mmc_reshape(ctx, x, 4, MMC_SHAPE(B, Co, H, W));
    return MMC_OK;
}
