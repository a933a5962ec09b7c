/* flux.c — the Flux diffusion transformer, mirroring diffusers' FluxTransformer2DModel
 * (models/transformers/transformer_flux.py):
 *
 *   x    = x_embedder(latents)                                          [B, S, C]  C = heads * head_dim
 *   temb = timestep_embedder(proj(1000 t)) [+ guidance_embedder(proj(1000 g))] + text_embedder(pooled)
 *          proj: 256 sinusoids, cos first (flip_sin_to_cos), shift 0; embedders Linear-SiLU-Linear [B, C]
 *   ctx  = context_embedder(t5_hidden)                                  [B, T, C]
 *   rope = FluxPosEmbed(cat(txt_ids, img_ids)): per axis (16/56/56 dims for the released
 *          models) angles pos / 10000^(2j/d) in float64, each repeated twice       [T+S, head_dim]
 *   num_layers double-stream blocks (FluxTransformerBlock), each stream with its own weights:
 *       (shift, scale, gate)_msa, (shift, scale, gate)_mlp = Linear(SiLU(temb)).chunk(6)
 *       q, k, v of both streams; RMS-norm on q and k per head; joint attention over [ctx; x]
 *       with interleaved rope; x += gate_msa * to_out(attn_x); ctx += c_gate_msa * to_add_out(attn_ctx)
 *       x += gate_mlp * ff(LN(x) * (1 + scale_mlp) + shift_mlp)    ff = Linear-GELU(tanh)-Linear, 4C
 *   num_single_layers single-stream blocks on h = [ctx; x] (FluxSingleTransformerBlock):
 *       (shift, scale, gate) = Linear(SiLU(temb)).chunk(3); n = LN(h) * (1 + scale) + shift
 *       h += gate * proj_out(cat(attn(n), GELU_tanh(proj_mlp(n))))   attention without out-projection
 *   out  = proj_out(LN(x) * (1 + scale) + shift)   AdaLayerNormContinuous: chunk(2) is (scale, shift)
 *
 * LayerNorms carry no affine weights (eps 1e-6); the q/k RMS norms have eps 1e-6. Projections are
 * mmc_linear_w, so LoRA adapters attach by diffusers' module names. Without grad mode each block
 * keeps only its outputs in the activation arena, so memory is one block's working set, and within a
 * block the attention's q / k / v, rope and concat copies are dropped once its output exists, and the
 * MLPs run over bands of tokens (mlp_rows) so their 4C-wide intermediates are band-sized: the same
 * values (every op is row-wise there), a 1024² step's peak 0.7x what it was. */
#include "mmc_diffusion.h"
#include "mmc_lora.h"
#include "mmc_nn.h"
#include "../model_weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FLUX_EPS 1e-6f

typedef struct {
    mmc_linear_w norm1, norm1_ctx;                  /* AdaLayerNormZero: [6C, C] */
    mmc_linear_w to_q, to_k, to_v, to_out;          /* [C, C] */
    mmc_linear_w add_q, add_k, add_v, to_add_out;   /* [C, C] */
    mmc_tensor *norm_q, *norm_k, *norm_added_q, *norm_added_k;   /* [head_dim] */
    mmc_linear_w ff_in, ff_out, ffc_in, ffc_out;    /* [4C, C], [C, 4C] */
} flux_block;

typedef struct {
    mmc_linear_w norm;                              /* AdaLayerNormZeroSingle: [3C, C] */
    mmc_linear_w to_q, to_k, to_v;                  /* [C, C] */
    mmc_tensor *norm_q, *norm_k;                    /* [head_dim] */
    mmc_linear_w proj_mlp;                          /* [M, C], M = 4C */
    mmc_linear_w proj_out;                          /* [C, C + M] */
} flux_single;

struct mmc_flux {
    mmc_flux_config cfg;
    mmc_linear_w x_embedder, context_embedder;
    mmc_linear_w t_lin1, t_lin2;                    /* timestep_embedder: [C, 256], [C, C] */
    mmc_linear_w g_lin1, g_lin2;                    /* guidance_embedder (guidance_embeds only) */
    mmc_linear_w p_lin1, p_lin2;                    /* text_embedder: [C, P], [C, C] */
    flux_block *blocks;
    flux_single *singles;
    mmc_linear_w norm_out;                          /* [2C, C] */
    mmc_linear_w proj_out;                          /* [patch^2 * out_channels, C] */
    mw_set w;
    const char **name_ptrs;                         /* w.names as a string list (mmc_flux_param_list) */
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_flux_config_read(const mmc_json *j, const char *what, mmc_flux_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    int64_t out_ch = 0;
    bool guidance = false;
    if ((st = mmc_json_int(j, "patch_size", 1, &c->patch_size)) ||
        (st = mmc_json_int(j, "in_channels", 64, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", 0, &out_ch)) ||
        (st = mmc_json_int(j, "num_layers", 19, &c->num_layers)) ||
        (st = mmc_json_int(j, "num_single_layers", 38, &c->num_single_layers)) ||
        (st = mmc_json_int(j, "attention_head_dim", 128, &c->attention_head_dim)) ||
        (st = mmc_json_int(j, "num_attention_heads", 24, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "joint_attention_dim", 4096, &c->joint_attention_dim)) ||
        (st = mmc_json_int(j, "pooled_projection_dim", 768, &c->pooled_projection_dim)) ||
        (st = mmc_json_bool(j, "guidance_embeds", false, &guidance)))
        return mmc_error_prefix(st, "%s: ", what);
    c->out_channels = out_ch > 0 ? out_ch : c->in_channels;    /* null -> in_channels */
    c->guidance_embeds = guidance;
    int64_t ax[4] = {16, 56, 56};
    int n_ax = 4;
    if (mmc_json_has(j, "axes_dims_rope") && (st = mmc_json_int_array(j, "axes_dims_rope", ax, &n_ax)))
        return mmc_error_prefix(st, "%s: ", what);
    if (mmc_json_has(j, "axes_dims_rope") && n_ax != 3)
        return mmc_error(MMC_ERR_FORMAT, "%s: axes_dims_rope must list 3 sizes (one per id axis), got %d", what, n_ax);
    for (int a = 0; a < 3; a++) {
        if (ax[a] < 2 || ax[a] > 65536 || ax[a] % 2)
            return mmc_error(MMC_ERR_FORMAT, "%s: axes_dims_rope[%d] = %lld must be a positive even size", what, a,
                             (long long)ax[a]);
        c->axes_dims_rope[a] = (int)ax[a];
    }
    if (c->patch_size != 1)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: patch_size %lld: FluxTransformer2DModel is used with patch_size 1 "
                         "(the pipeline packs 2x2 latent patches itself); other sizes are not supported", what,
                         (long long)c->patch_size);
    if (c->in_channels < 1 || c->num_layers < 0 || c->num_single_layers < 0 || c->attention_head_dim < 2 ||
        c->num_attention_heads < 1 || c->joint_attention_dim < 1 || c->pooled_projection_dim < 1 ||
        c->num_layers + c->num_single_layers < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive (and at least one block)", what);
    if (c->axes_dims_rope[0] + c->axes_dims_rope[1] + c->axes_dims_rope[2] != c->attention_head_dim)
        return mmc_error(MMC_ERR_FORMAT, "%s: axes_dims_rope [%d, %d, %d] must sum to attention_head_dim %lld", what,
                         c->axes_dims_rope[0], c->axes_dims_rope[1], c->axes_dims_rope[2],
                         (long long)c->attention_head_dim);
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
void mmc_flux_free(mmc_flux *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->name_ptrs);
    free(m->blocks);
    free(m->singles);
    free(m);
}

static void bind_attn_norms(mw_set *w, const char *p, mmc_tensor **nq, mmc_tensor **nk, int64_t D, bool added) {
    mw_bind(w, p, added ? "attn.norm_added_q.weight" : "attn.norm_q.weight", nq, 1, MMC_SHAPE(D));
    mw_bind(w, p, added ? "attn.norm_added_k.weight" : "attn.norm_k.weight", nk, 1, MMC_SHAPE(D));
}

static void bind_all(mmc_flux *m) {
    const mmc_flux_config *c = &m->cfg;
    mw_set *w = &m->w;
    const int64_t C = c->num_attention_heads * c->attention_head_dim, D = c->attention_head_dim, M = 4 * C;
    mw_bind_linear(w, "", "x_embedder", &m->x_embedder, C, c->in_channels, true);
    mw_bind_linear(w, "", "context_embedder", &m->context_embedder, C, c->joint_attention_dim, true);
    mw_bind_linear(w, "time_text_embed.", "timestep_embedder.linear_1", &m->t_lin1, C, 256, true);
    mw_bind_linear(w, "time_text_embed.", "timestep_embedder.linear_2", &m->t_lin2, C, C, true);
    if (c->guidance_embeds) {
        mw_bind_linear(w, "time_text_embed.", "guidance_embedder.linear_1", &m->g_lin1, C, 256, true);
        mw_bind_linear(w, "time_text_embed.", "guidance_embedder.linear_2", &m->g_lin2, C, C, true);
    }
    mw_bind_linear(w, "time_text_embed.", "text_embedder.linear_1", &m->p_lin1, C, c->pooled_projection_dim, true);
    mw_bind_linear(w, "time_text_embed.", "text_embedder.linear_2", &m->p_lin2, C, C, true);
    char p[96];
    for (int64_t i = 0; i < c->num_layers; i++) {
        flux_block *b = &m->blocks[i];
        snprintf(p, sizeof p, "transformer_blocks.%lld.", (long long)i);
        mw_bind_linear(w, p, "norm1.linear", &b->norm1, 6 * C, C, true);
        mw_bind_linear(w, p, "norm1_context.linear", &b->norm1_ctx, 6 * C, C, true);
        mw_bind_linear(w, p, "attn.to_q", &b->to_q, C, C, true);
        mw_bind_linear(w, p, "attn.to_k", &b->to_k, C, C, true);
        mw_bind_linear(w, p, "attn.to_v", &b->to_v, C, C, true);
        mw_bind_linear(w, p, "attn.to_out.0", &b->to_out, C, C, true);
        mw_bind_linear(w, p, "attn.add_q_proj", &b->add_q, C, C, true);
        mw_bind_linear(w, p, "attn.add_k_proj", &b->add_k, C, C, true);
        mw_bind_linear(w, p, "attn.add_v_proj", &b->add_v, C, C, true);
        mw_bind_linear(w, p, "attn.to_add_out", &b->to_add_out, C, C, true);
        bind_attn_norms(w, p, &b->norm_q, &b->norm_k, D, false);
        bind_attn_norms(w, p, &b->norm_added_q, &b->norm_added_k, D, true);
        mw_bind_linear(w, p, "ff.net.0.proj", &b->ff_in, M, C, true);
        mw_bind_linear(w, p, "ff.net.2", &b->ff_out, C, M, true);
        mw_bind_linear(w, p, "ff_context.net.0.proj", &b->ffc_in, M, C, true);
        mw_bind_linear(w, p, "ff_context.net.2", &b->ffc_out, C, M, true);
    }
    for (int64_t i = 0; i < c->num_single_layers; i++) {
        flux_single *s = &m->singles[i];
        snprintf(p, sizeof p, "single_transformer_blocks.%lld.", (long long)i);
        mw_bind_linear(w, p, "norm.linear", &s->norm, 3 * C, C, true);
        mw_bind_linear(w, p, "attn.to_q", &s->to_q, C, C, true);
        mw_bind_linear(w, p, "attn.to_k", &s->to_k, C, C, true);
        mw_bind_linear(w, p, "attn.to_v", &s->to_v, C, C, true);
        bind_attn_norms(w, p, &s->norm_q, &s->norm_k, D, false);
        mw_bind_linear(w, p, "proj_mlp", &s->proj_mlp, M, C, true);
        mw_bind_linear(w, p, "proj_out", &s->proj_out, C, C + M, true);
    }
    mw_bind_linear(w, "", "norm_out.linear", &m->norm_out, 2 * C, C, true);
    mw_bind_linear(w, "", "proj_out", &m->proj_out, c->patch_size * c->patch_size * c->out_channels, C, true);
}

mmc_status mmc_flux_load(const char *dir, bool trainable, mmc_flux **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_flux *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_flux_config_read(j, path, &m->cfg))) goto fail;
    m->blocks = calloc((size_t)m->cfg.num_layers + 1, sizeof *m->blocks);
    m->singles = calloc((size_t)m->cfg.num_single_layers + 1, sizeof *m->singles);
    if (!m->blocks || !m->singles) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "diffusion_pytorch_model", &m->w))) goto fail;
    m->w.trainable = trainable;
    bind_all(m);
    if ((st = mw_status(&m->w, dir, "FluxTransformer2DModel")) ||
        (st = mw_check_unused(&m->w, dir, "FluxTransformer2DModel")))
        goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_flux_free(m);
    return st;
}

mmc_status mmc_flux_new(const mmc_flux_config *cfg, uint64_t seed, mmc_flux **out) {
    *out = NULL;
    mmc_flux *m = calloc(1, sizeof *m);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory");
    m->cfg = *cfg;
    mmc_status st;
    m->blocks = calloc((size_t)cfg->num_layers + 1, sizeof *m->blocks);
    m->singles = calloc((size_t)cfg->num_single_layers + 1, sizeof *m->singles);
    if (!m->blocks || !m->singles) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_init_random(&m->w, seed, MW_INIT_TORCH_LINEAR))) goto fail;   /* diffusers keeps torch's init */
    m->w.trainable = true;
    bind_all(m);
    if ((st = mw_status(&m->w, "random init", "FluxTransformer2DModel"))) goto fail;
    *out = m;
    return MMC_OK;
fail:
    mmc_flux_free(m);
    return st;
}

const mmc_flux_config *mmc_flux_cfg(const mmc_flux *m) { return &m->cfg; }

int mmc_flux_param_list(mmc_flux *m, mmc_tensor ***params, const char *const **names) {
    if (!m->name_ptrs) {
        m->name_ptrs = calloc((size_t)m->w.n_params + 1, sizeof *m->name_ptrs);
        MMC_CHECK(m->name_ptrs, "out of memory");
        for (int i = 0; i < m->w.n_params; i++) m->name_ptrs[i] = m->w.names[i];
    }
    *params = m->w.params;
    *names = m->name_ptrs;
    return m->w.n_params;
}
int64_t mmc_flux_param_count(const mmc_flux *m) { return mw_count(&m->w); }

/* Every projection under diffusers' module name ("transformer_blocks.0.attn.to_q", ...), the
 * names LoRA targets and diffusers' adapter files use. */
mmc_status mmc_flux_linears(mmc_flux *m, mmc_module_list *ml) {
    const mmc_flux_config *c = &m->cfg;
    mmc_status st = MMC_OK;
    char nm[MMC_MODULE_NAME];
#define ADD(l, ...) do { snprintf(nm, sizeof nm, __VA_ARGS__); if (!st) st = mmc_module_list_add(ml, (l), nm); } while (0)
    ADD(&m->x_embedder, "x_embedder");
    ADD(&m->context_embedder, "context_embedder");
    ADD(&m->t_lin1, "time_text_embed.timestep_embedder.linear_1");
    ADD(&m->t_lin2, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        ADD(&m->g_lin1, "time_text_embed.guidance_embedder.linear_1");
        ADD(&m->g_lin2, "time_text_embed.guidance_embedder.linear_2");
    }
    ADD(&m->p_lin1, "time_text_embed.text_embedder.linear_1");
    ADD(&m->p_lin2, "time_text_embed.text_embedder.linear_2");
    for (int64_t i = 0; i < c->num_layers; i++) {
        flux_block *b = &m->blocks[i];
        const long long k = (long long)i;
        ADD(&b->norm1, "transformer_blocks.%lld.norm1.linear", k);
        ADD(&b->norm1_ctx, "transformer_blocks.%lld.norm1_context.linear", k);
        ADD(&b->to_q, "transformer_blocks.%lld.attn.to_q", k);
        ADD(&b->to_k, "transformer_blocks.%lld.attn.to_k", k);
        ADD(&b->to_v, "transformer_blocks.%lld.attn.to_v", k);
        ADD(&b->to_out, "transformer_blocks.%lld.attn.to_out.0", k);
        ADD(&b->add_q, "transformer_blocks.%lld.attn.add_q_proj", k);
        ADD(&b->add_k, "transformer_blocks.%lld.attn.add_k_proj", k);
        ADD(&b->add_v, "transformer_blocks.%lld.attn.add_v_proj", k);
        ADD(&b->to_add_out, "transformer_blocks.%lld.attn.to_add_out", k);
        ADD(&b->ff_in, "transformer_blocks.%lld.ff.net.0.proj", k);
        ADD(&b->ff_out, "transformer_blocks.%lld.ff.net.2", k);
        ADD(&b->ffc_in, "transformer_blocks.%lld.ff_context.net.0.proj", k);
        ADD(&b->ffc_out, "transformer_blocks.%lld.ff_context.net.2", k);
    }
    for (int64_t i = 0; i < c->num_single_layers; i++) {
        flux_single *sb = &m->singles[i];
        const long long k = (long long)i;
        ADD(&sb->norm, "single_transformer_blocks.%lld.norm.linear", k);
        ADD(&sb->to_q, "single_transformer_blocks.%lld.attn.to_q", k);
        ADD(&sb->to_k, "single_transformer_blocks.%lld.attn.to_k", k);
        ADD(&sb->to_v, "single_transformer_blocks.%lld.attn.to_v", k);
        ADD(&sb->proj_mlp, "single_transformer_blocks.%lld.proj_mlp", k);
        ADD(&sb->proj_out, "single_transformer_blocks.%lld.proj_out", k);
    }
    ADD(&m->norm_out, "norm_out.linear");
    ADD(&m->proj_out, "proj_out");
#undef ADD
    return st;
}

/* ------------------------------------------------------------------ latent layout */
/* The one index map of _pack_latents / _unpack_latents: latent z[b, c, 2i + dy, 2j + dx] is token
 * (i, j)'s channel c*4 + dy*2 + dx. pack copies z into x, unpack x into z. */
static void pack_map(float *z, float *x, int64_t B, int64_t C, int64_t H, int64_t W, bool pack) {
    const int64_t h = H / 2, w = W / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < w; j++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t dy = 0; dy < 2; dy++)
                        for (int64_t dx = 0; dx < 2; dx++) {
                            float *zp = z + ((b * C + c) * H + 2 * i + dy) * W + 2 * j + dx;
                            float *xp = x + ((b * h + i) * w + j) * 4 * C + c * 4 + dy * 2 + dx;
                            if (pack) *xp = *zp;
                            else *zp = *xp;
                        }
}

mmc_tensor *mmc_flux_pack_latents(mmc_ctx *ctx, const mmc_tensor *z) {
    MMC_CHECK(z->ndim == 4 && z->dtype == MMC_F32 && mmc_is_contiguous(z) && z->shape[2] % 2 == 0 &&
                  z->shape[3] % 2 == 0, "mmc_flux_pack_latents: z must be contiguous f32 [B, C, H, W], H and W even");
    const int64_t B = z->shape[0], C = z->shape[1], H = z->shape[2], W = z->shape[3];
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, (H / 2) * (W / 2), 4 * C));     /* [B, h*w, 4C] */
    pack_map(z->data, x->data, B, C, H, W, true);
    return x;
}

mmc_tensor *mmc_flux_unpack_latents(mmc_ctx *ctx, const mmc_tensor *x, int64_t H, int64_t W) {
    MMC_CHECK(x->ndim == 3 && x->dtype == MMC_F32 && mmc_is_contiguous(x) && H % 2 == 0 && W % 2 == 0 &&
                  x->shape[1] == (H / 2) * (W / 2) && x->shape[2] % 4 == 0,
              "mmc_flux_unpack_latents: x must be contiguous f32 [B, (H/2)(W/2), 4C] for H = %lld, W = %lld",
              (long long)H, (long long)W);
    const int64_t B = x->shape[0], C = x->shape[2] / 4;
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, C, H, W));
    pack_map(z->data, x->data, B, C, H, W, false);
    return z;
}

void mmc_flux_latent_ids(int64_t H, int64_t W, float *ids) {
    const int64_t h = H / 2, w = W / 2;
    for (int64_t i = 0; i < h; i++)
        for (int64_t j = 0; j < w; j++) {
            float *r = ids + (i * w + j) * 3;
            r[0] = 0.0f, r[1] = (float)i, r[2] = (float)j;
        }
}

/* ------------------------------------------------------------------ forward */
/* Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) */
static mmc_tensor *timestep_proj(mmc_ctx *ctx, const float *t, int64_t B) {
    return mmc_timestep_embedding(ctx, t, B, 256, true, 0.0, 1.0, 10000.0);
}

/* TimestepEmbedding / PixArtAlphaTextProjection(act silu): linear_2(silu(linear_1(x))) */
static mmc_tensor *mlp2(mmc_ctx *ctx, const mmc_linear_w *l1, const mmc_linear_w *l2, mmc_tensor *x) {
    return mmc_nn_linear(ctx, mmc_silu(ctx, mmc_nn_linear(ctx, x, l1)), l2);
}

/* The k chunks [B, C] of a conditioning projection [B, k*C] (views of it). */
static void chunks(mmc_ctx *ctx, mmc_tensor *e, int k, mmc_tensor **out) {
    int64_t sizes[6];
    for (int i = 0; i < k; i++) sizes[i] = e->shape[1] / k;
    mmc_split(ctx, e, 1, k, sizes, out);
}

/* q, k or v of one stream: x [B, L, C] -> [B, L, H, D], RMS-normed per head when norm given */
static mmc_tensor *heads(mmc_ctx *ctx, const mmc_flux *m, mmc_tensor *x, const mmc_linear_w *l, mmc_tensor *norm) {
    const int64_t H = m->cfg.num_attention_heads, D = m->cfg.attention_head_dim;
    mmc_tensor *y = mmc_reshape(ctx, mmc_nn_linear(ctx, x, l), 4, MMC_SHAPE(x->shape[0], x->shape[1], H, D));
    return norm ? mmc_rmsnorm(ctx, y, norm, FLUX_EPS) : y;
}

/* Attention over the joint sequence: q, k, v [B, L, H, D] -> [B, L, C], rope applied to q, k. */
static mmc_tensor *joint_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v, mmc_tensor *cos,
                                   mmc_tensor *sin) {
    q = mmc_rope_interleaved(ctx, q, cos, sin);
    k = mmc_rope_interleaved(ctx, k, cos, sin);
    mmc_attn_opts o = {.causal = false};    /* scale 1/sqrt(D) */
    mmc_tensor *a = mmc_attention(ctx, q, k, v, &o);                             /* [B, L, H, D] */
    return mmc_reshape(ctx, a, 3, MMC_SHAPE(q->shape[0], q->shape[1], q->shape[2] * q->shape[3]));
}

static mmc_tensor *layer_norm(mmc_ctx *ctx, mmc_tensor *x) { return mmc_layernorm(ctx, x, NULL, NULL, FLUX_EPS); }

/* FluxTransformerBlock: x [B, S, C], c [B, T, C] updated in place of the pointers. */
static void double_block(mmc_ctx *ctx, const mmc_flux *m, const flux_block *b, mmc_tensor **xp, mmc_tensor **cp,
                         mmc_tensor *temb_act, mmc_tensor *cos, mmc_tensor *sin) {
    mmc_tensor *x = *xp, *c = *cp;
    const int64_t T = c->shape[1], S = x->shape[1];
    mmc_tensor *e[6], *ec[6];   /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp */
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1), 6, e);
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1_ctx), 6, ec);
    mmc_tensor *nx = mmc_modulate(ctx, layer_norm(ctx, x), e[0], e[1]);         /* [B, S, C] */
    mmc_tensor *nc = mmc_modulate(ctx, layer_norm(ctx, c), ec[0], ec[1]);       /* [B, T, C] */
    mmc_tensor *q[2] = {heads(ctx, m, nc, &b->add_q, b->norm_added_q), heads(ctx, m, nx, &b->to_q, b->norm_q)};
    mmc_tensor *k[2] = {heads(ctx, m, nc, &b->add_k, b->norm_added_k), heads(ctx, m, nx, &b->to_k, b->norm_k)};
    mmc_tensor *v[2] = {heads(ctx, m, nc, &b->add_v, NULL), heads(ctx, m, nx, &b->to_v, NULL)};
    mmc_tensor *a = joint_attention(ctx, mmc_concat(ctx, q, 2, 1), mmc_concat(ctx, k, 2, 1),
                                    mmc_concat(ctx, v, 2, 1), cos, sin);       /* [B, T+S, C] */
    mmc_tensor *parts[2];
    mmc_split(ctx, a, 1, 2, MMC_SHAPE(T, S), parts);
    x = mmc_gate_residual(ctx, x, e[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[1]), &b->to_out));
    mmc_tensor *h = mmc_modulate(ctx, layer_norm(ctx, x), e[3], e[4]);
    h = mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, h, &b->ff_in)), &b->ff_out);
    x = mmc_gate_residual(ctx, x, e[5], h);
    c = mmc_gate_residual(ctx, c, ec[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[0]), &b->to_add_out));
    h = mmc_modulate(ctx, layer_norm(ctx, c), ec[3], ec[4]);
    h = mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, h, &b->ffc_in)), &b->ffc_out);
    c = mmc_gate_residual(ctx, c, ec[5], h);
    *xp = x, *cp = c;
}

/* Tokens per band of the MLPs without a tape for L tokens: at most 1024 (MMC_FLUX_MLP_ROWS overrides,
 * >= 10), the bands made even, so none is so short (<= 4 rows) that the GEMM would take its matvec path
 * (other roundings) — with 1024, a band's 4C-wide intermediates are 48 MiB at Flux's C = 3072 */
static int64_t mlp_rows(int64_t L) {
    const char *e = getenv("MMC_FLUX_MLP_ROWS");
    const int64_t R = e && atoi(e) >= 10 ? atoi(e) : 1024, n = (L + R - 1) / R;
    return (L + n - 1) / n;
}

/* rows [r0, r0 + n) of x [B, L, C] as a contiguous [B, n, C] */
static mmc_tensor *rows(mmc_ctx *ctx, mmc_tensor *x, int64_t r0, int64_t n) {
    return mmc_contiguous(ctx, mmc_narrow(ctx, x, 1, r0, n));
}
/* y[:, r0 : r0 + n] = band [B, n, C] (y contiguous [B, L, C]) */
static void put_rows(mmc_tensor *y, int64_t r0, const mmc_tensor *band) {
    const int64_t B = y->shape[0], L = y->shape[1], C = y->shape[2], n = band->shape[1];
    for (int64_t b = 0; b < B; b++)
        memcpy((float *)y->data + (b * L + r0) * C, (const float *)band->data + b * n * C, (size_t)(n * C) * sizeof(float));
}

/* x + gate * ff(modulate(LN(x), shift, scale)) without a tape, over bands of tokens: x [B, L, C] -> new [B, L, C] */
static mmc_tensor *ff_banded(mmc_ctx *ctx, mmc_tensor *x, mmc_tensor *shift, mmc_tensor *scale, mmc_tensor *gate,
                             const mmc_linear_w *l1, const mmc_linear_w *l2) {
    const int64_t L = x->shape[1], R = mlp_rows(L);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, x->shape);
    for (int64_t r0 = 0; r0 < L; r0 += R) {
        const int64_t n = L - r0 < R ? L - r0 : R;
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *xb = rows(ctx, x, r0, n);
        mmc_tensor *h = mmc_modulate(ctx, layer_norm(ctx, xb), shift, scale);
        h = mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, h, l1)), l2);
        put_rows(y, r0, mmc_gate_residual(ctx, xb, gate, h));
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
    }
    return y;
}

/* FluxTransformerBlock without a tape: the same values as double_block, the attention's temporaries
 * released as soon as its output exists and the MLPs over bands of tokens */
static void double_block_infer(mmc_ctx *ctx, const mmc_flux *m, const flux_block *b, mmc_tensor **xp, mmc_tensor **cp,
                               mmc_tensor *temb_act, mmc_tensor *cos, mmc_tensor *sin) {
    mmc_tensor *x = *xp, *c = *cp;
    const int64_t T = c->shape[1], S = x->shape[1];
    mmc_tensor *e[6], *ec[6];
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1), 6, e);
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1_ctx), 6, ec);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *nx = mmc_modulate(ctx, layer_norm(ctx, x), e[0], e[1]);         /* [B, S, C] */
    mmc_tensor *nc = mmc_modulate(ctx, layer_norm(ctx, c), ec[0], ec[1]);       /* [B, T, C] */
    mmc_tensor *q[2] = {heads(ctx, m, nc, &b->add_q, b->norm_added_q), heads(ctx, m, nx, &b->to_q, b->norm_q)};
    mmc_tensor *k[2] = {heads(ctx, m, nc, &b->add_k, b->norm_added_k), heads(ctx, m, nx, &b->to_k, b->norm_k)};
    mmc_tensor *v[2] = {heads(ctx, m, nc, &b->add_v, NULL), heads(ctx, m, nx, &b->to_v, NULL)};
    mmc_tensor *a = joint_attention(ctx, mmc_concat(ctx, q, 2, 1), mmc_concat(ctx, k, 2, 1),
                                    mmc_concat(ctx, v, 2, 1), cos, sin);       /* [B, T+S, C] */
    a = mw_keep(ctx, mk, a);                                                   /* q, k, v, ... dropped */
    mmc_tensor *parts[2];
    mmc_split(ctx, a, 1, 2, MMC_SHAPE(T, S), parts);
    mmc_arena_mark mk2 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    x = mmc_gate_residual(ctx, x, e[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[1]), &b->to_out));
    x = mw_keep(ctx, mk2, x);
    x = ff_banded(ctx, x, e[3], e[4], e[5], &b->ff_in, &b->ff_out);
    c = mmc_gate_residual(ctx, c, ec[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[0]), &b->to_add_out));
    c = ff_banded(ctx, c, ec[3], ec[4], ec[5], &b->ffc_in, &b->ffc_out);
    *xp = x, *cp = c;
}

/* FluxSingleTransformerBlock on the joint sequence h [B, T+S, C]. */
static mmc_tensor *single_block(mmc_ctx *ctx, const mmc_flux *m, const flux_single *s, mmc_tensor *h,
                                mmc_tensor *temb_act, mmc_tensor *cos, mmc_tensor *sin) {
    mmc_tensor *e[3];   /* shift, scale, gate */
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &s->norm), 3, e);
    mmc_tensor *n = mmc_modulate(ctx, layer_norm(ctx, h), e[0], e[1]);
    mmc_tensor *mlp = mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, n, &s->proj_mlp));   /* [B, L, M] */
    mmc_tensor *a = joint_attention(ctx, heads(ctx, m, n, &s->to_q, s->norm_q), heads(ctx, m, n, &s->to_k, s->norm_k),
                                    heads(ctx, m, n, &s->to_v, NULL), cos, sin);   /* [B, L, C] */
    mmc_tensor *cat[2] = {a, mlp};
    return mmc_gate_residual(ctx, h, e[2], mmc_nn_linear(ctx, mmc_concat(ctx, cat, 2, 2), &s->proj_out));
}

/* FluxSingleTransformerBlock without a tape: the same values as single_block; the attention's temporaries
 * released once its output exists, then the MLP, concat and proj_out over bands of tokens */
static mmc_tensor *single_block_infer(mmc_ctx *ctx, const mmc_flux *m, const flux_single *s, mmc_tensor *h,
                                      mmc_tensor *temb_act, mmc_tensor *cos, mmc_tensor *sin) {
    mmc_tensor *e[3];   /* shift, scale, gate */
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &s->norm), 3, e);
    mmc_tensor *n = mmc_modulate(ctx, layer_norm(ctx, h), e[0], e[1]);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *a = joint_attention(ctx, heads(ctx, m, n, &s->to_q, s->norm_q), heads(ctx, m, n, &s->to_k, s->norm_k),
                                    heads(ctx, m, n, &s->to_v, NULL), cos, sin);   /* [B, L, C] */
    a = mw_keep(ctx, mk, a);
    const int64_t L = h->shape[1], R = mlp_rows(L);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 3, h->shape);
    for (int64_t r0 = 0; r0 < L; r0 += R) {
        const int64_t nr = L - r0 < R ? L - r0 : R;
        mmc_arena_mark mb = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *mlp = mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, rows(ctx, n, r0, nr), &s->proj_mlp));   /* [B, nr, M] */
        mmc_tensor *cat[2] = {rows(ctx, a, r0, nr), mlp};
        put_rows(y, r0, mmc_gate_residual(ctx, rows(ctx, h, r0, nr), e[2],
                                          mmc_nn_linear(ctx, mmc_concat(ctx, cat, 2, 2), &s->proj_out)));
        mmc_arena_release(mmc_ctx_arena(ctx), mb);
    }
    return y;
}

static mmc_status check_inputs(const mmc_flux *m, const mmc_flux_inputs *in) {
    const mmc_flux_config *c = &m->cfg;
    const mmc_tensor *x = in->hidden, *e = in->encoder, *p = in->pooled;
    if (!x || x->ndim != 3 || x->dtype != MMC_F32 || x->shape[2] != c->in_channels || !mmc_is_contiguous(x))
        return mmc_error(MMC_ERR_INVALID, "FluxTransformer2DModel: hidden_states must be contiguous f32 [B, S, %lld]",
                         (long long)c->in_channels);
    const int64_t B = x->shape[0];
    if (!e || e->ndim != 3 || e->dtype != MMC_F32 || e->shape[0] != B || e->shape[2] != c->joint_attention_dim ||
        !mmc_is_contiguous(e))
        return mmc_error(MMC_ERR_INVALID, "FluxTransformer2DModel: encoder_hidden_states must be contiguous f32 "
                         "[%lld, T, %lld] (joint_attention_dim)", (long long)B, (long long)c->joint_attention_dim);
    if (!p || p->ndim != 2 || p->dtype != MMC_F32 || p->shape[0] != B || p->shape[1] != c->pooled_projection_dim ||
        !mmc_is_contiguous(p))
        return mmc_error(MMC_ERR_INVALID, "FluxTransformer2DModel: pooled_projections must be contiguous f32 "
                         "[%lld, %lld]", (long long)B, (long long)c->pooled_projection_dim);
    if (!in->timestep || !in->img_ids || !in->txt_ids)
        return mmc_error(MMC_ERR_INVALID, "FluxTransformer2DModel: timestep, img_ids and txt_ids are required");
    if (c->guidance_embeds != (in->guidance != NULL))
        return mmc_error(MMC_ERR_INVALID, c->guidance_embeds
                         ? "FluxTransformer2DModel: this checkpoint is guidance-distilled (guidance_embeds): "
                           "a guidance value is required"
                         : "FluxTransformer2DModel: guidance given, but the checkpoint has no guidance embedder "
                           "(guidance_embeds false: use true CFG instead)");
    return MMC_OK;
}

mmc_status mmc_flux_forward(mmc_ctx *ctx, mmc_flux *m, const mmc_flux_inputs *in, mmc_tensor **out) {
    *out = NULL;
    mmc_status st = check_inputs(m, in);
    if (st) return st;
    const mmc_flux_config *c = &m->cfg;
    const int64_t B = in->hidden->shape[0], S = in->hidden->shape[1], T = in->encoder->shape[1];
    const bool grad = mmc_grad_enabled(ctx);

    /* temb [B, C]: time (+ guidance) + pooled text; the timestep scaled by 1000 in float32 */
    float *tt = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * 2 * sizeof *tt), *gg = tt + B;
    for (int64_t b = 0; b < B; b++) tt[b] = in->timestep[b] * 1000.0f;
    mmc_tensor *temb = mlp2(ctx, &m->t_lin1, &m->t_lin2, timestep_proj(ctx, tt, B));
    if (c->guidance_embeds) {
        for (int64_t b = 0; b < B; b++) gg[b] = in->guidance[b] * 1000.0f;
        temb = mmc_add(ctx, temb, mlp2(ctx, &m->g_lin1, &m->g_lin2, timestep_proj(ctx, gg, B)));
    }
    temb = mmc_add(ctx, temb, mlp2(ctx, &m->p_lin1, &m->p_lin2, in->pooled));
    mmc_tensor *temb_act = mmc_silu(ctx, temb);      /* every adaLN linear reads SiLU(temb) */

    mmc_tensor *x = mmc_nn_linear(ctx, in->hidden, &m->x_embedder);          /* [B, S, C] */
    mmc_tensor *cx = mmc_nn_linear(ctx, in->encoder, &m->context_embedder);  /* [B, T, C] */

    /* rope over [txt; img] ids */
    float *ids = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)(T + S) * 3 * sizeof *ids);
    memcpy(ids, in->txt_ids, (size_t)T * 3 * sizeof *ids);
    memcpy(ids + T * 3, in->img_ids, (size_t)S * 3 * sizeof *ids);
    mmc_tensor *cos, *sin;
    mmc_rope_table_axes(ctx, ids, T + S, 3, c->axes_dims_rope, 10000.0, &cos, &sin);

    for (int64_t i = 0; i < c->num_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        if (grad) double_block(ctx, m, &m->blocks[i], &x, &cx, temb_act, cos, sin);
        else double_block_infer(ctx, m, &m->blocks[i], &x, &cx, temb_act, cos, sin);
        if (!grad) {
            mmc_tensor *keep[2] = {x, cx};
            mw_keep_n(ctx, mk, 2, keep);
            x = keep[0], cx = keep[1];
        }
    }
    mmc_tensor *cat[2] = {cx, x};
    mmc_tensor *h = mmc_concat(ctx, cat, 2, 1);                                /* [B, T+S, C] */
    for (int64_t i = 0; i < c->num_single_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        h = grad ? single_block(ctx, m, &m->singles[i], h, temb_act, cos, sin)
                 : single_block_infer(ctx, m, &m->singles[i], h, temb_act, cos, sin);
        if (!grad) h = mw_keep(ctx, mk, h);
    }
    x = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, T, S));                      /* [B, S, C] */
    mmc_tensor *e[2];   /* AdaLayerNormContinuous: (scale, shift) */
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &m->norm_out), 2, e);
    x = mmc_modulate(ctx, layer_norm(ctx, x), e[1], e[0]);
    *out = mmc_nn_linear(ctx, x, &m->proj_out);                                /* [B, S, p*p*Cout] */
    return MMC_OK;
}
