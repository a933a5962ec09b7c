/* wan.c — the Wan2.1 video diffusion transformer, mirroring diffusers' WanTransformer3DModel
 * (models/transformers/transformer_wan.py), text-to-video form:
 *
 *   x    = patch_embedding(latents)  Conv3d(kernel = stride = patch): a linear map of each
 *          (pt, ph, pw) patch, channel-major; tokens in (frame, row, column) order      [B, S, C]
 *   rope = WanRotaryPosEmbed: head_dim split t / h / w = D - 4(D/6), 2(D/6), 2(D/6); per axis
 *          angles pos / 10000^(2j/d) in float64 (pos = the patch's frame, row or column), each
 *          repeated twice; applied to interleaved pairs                           [S, head_dim]
 *   temb = time_embedder(Timesteps(freq_dim, flip_sin_to_cos, shift 0)(t))  Linear-SiLU-Linear [B, C]
 *   e    = time_proj(SiLU(temb)) as [B, 6, C]
 *   ctx  = text_embedder(umt5_states)   Linear-GELU(tanh)-Linear                     [B, T, C]
 *   num_layers WanTransformerBlocks:
 *       (shift, scale, gate, c_shift, c_scale, c_gate) = scale_shift_table [1, 6, C] + e
 *       x += gate * attn1(LN(x) * (1 + scale) + shift)       self-attention with rope
 *       x += attn2(norm2(x), ctx)                            cross-attention (norm2: affine LN
 *                                                            with cross_attn_norm, else identity)
 *       x += c_gate * ffn(LN(x) * (1 + c_scale) + c_shift)   Linear-GELU(tanh)-Linear
 *     attention: q, k, v projections with bias; RMSNorm over all heads' channels on q and on k
 *     (rms_norm_across_heads, weights [C]), then split into heads; scale 1/sqrt(head_dim); to_out
 *   (shift, scale) = scale_shift_table [1, 2, C] + temb; out = proj_out(LN(x) * (1 + scale) + shift)
 *   unpatchify: token (f, i, j) channel ((dt * ph + dy) * pw + dx) * Cout + c ->
 *               [B, Cout, f * pt + dt, i * ph + dy, j * pw + dx]
 *   image-to-video (Wan2.1 I2V: image_dim, added_kv_proj_dim): img = image_embedder(clip_states)
 *       = LN(Linear(GELU(Linear(LN(x))))) with affine FP32LayerNorms (eps 1e-5), exact GELU     [B, S_img, C]
 *       and attn2 adds attention of the same query to k = RMSNorm(add_k_proj(img)), v = add_v_proj(img)
 *       (diffusers concatenates [img; text] and splits it back assuming 512 text tokens; here the two
 *       stay apart, which is the same whenever the text has its 512 tokens)
 *   first-last-frame (FLF2V: pos_embed_seq_len = 2 S_img): the image states are the two frames'
 *       [B, 2 S_img, image_dim] (diffusers' view of encode_image([first, last])), plus pos_embed
 *       [1, 2 S_img, image_dim] before the embedder
 *
 * LayerNorms without affine weights use eps from config (1e-6). Every projection is an
 * mmc_linear_w, so LoRA adapters attach by diffusers' module names; the patch embedding is a
 * convolution in diffusers (no LoRA there either). FLF2V's image position table and Wan2.2's
 * per-token timesteps are not implemented (refused by name). Without grad mode each block keeps
 * only its output in the arena. */
#include "mmc_wan_t2v.h"
#include "mmc_nn.h"
#include "../model_weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_linear_w to_q, to_k, to_v, to_out;          /* [C, C] each, with bias */
    mmc_tensor *norm_q, *norm_k;                    /* [C] RMSNorm across heads */
    mmc_linear_w add_k, add_v;                      /* I2V attn2 only: [C, added_kv_proj_dim] */
    mmc_tensor *norm_added_k;                       /* I2V attn2 only: [C] */
} wan_attn;

typedef struct {
    wan_attn attn1, attn2;
    mmc_tensor *norm2_w, *norm2_b;                  /* [C] (cross_attn_norm only) */
    mmc_linear_w ff_in, ff_out;                     /* [F, C], [C, F] */
    mmc_tensor *sst;                                /* scale_shift_table [1, 6, C] */
} wan_block;

struct mmc_wan {
    mmc_wan_config cfg;
    mmc_tensor *patch_w, *patch_b;                  /* [C, Cin, pt, ph, pw], [C] */
    mmc_linear_w t_lin1, t_lin2;                    /* time_embedder: [C, freq_dim], [C, C] */
    mmc_linear_w t_proj;                            /* time_proj: [6C, C] */
    mmc_linear_w txt_lin1, txt_lin2;                /* text_embedder: [C, text_dim], [C, C] */
    mmc_tensor *img_n1_w, *img_n1_b;                /* I2V image_embedder.norm1 [image_dim] */
    mmc_linear_w img_ff1, img_ff2;                  /* image_embedder.ff: [I, I], [C, I] */
    mmc_tensor *img_n2_w, *img_n2_b;                /* image_embedder.norm2 [C] */
    mmc_tensor *img_pos;                            /* FLF2V: image_embedder.pos_embed [1, P, image_dim] */
    wan_block *blocks;
    mmc_tensor *sst;                                /* scale_shift_table [1, 2, C] */
    mmc_linear_w proj_out;                          /* [pt*ph*pw*Cout, C] */
    mw_set w;
    const char **name_ptrs;
    bool recompute;                                 /* training: checkpoint each block (mmc_checkpoint) */
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_wan_config_read(const mmc_json *j, const char *what, mmc_wan_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    int64_t out_ch = 0;
    if ((st = mmc_json_int(j, "num_attention_heads", 40, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "attention_head_dim", 128, &c->attention_head_dim)) ||
        (st = mmc_json_int(j, "in_channels", 16, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", 16, &out_ch)) ||
        (st = mmc_json_int(j, "text_dim", 4096, &c->text_dim)) ||
        (st = mmc_json_int(j, "freq_dim", 256, &c->freq_dim)) ||
        (st = mmc_json_int(j, "ffn_dim", 13824, &c->ffn_dim)) ||
        (st = mmc_json_int(j, "num_layers", 40, &c->num_layers)) ||
        (st = mmc_json_bool(j, "cross_attn_norm", true, &c->cross_attn_norm)) ||
        (st = mmc_json_num(j, "eps", 1e-6, &c->eps)) ||
        (st = mmc_json_int(j, "rope_max_seq_len", 1024, &c->rope_max_seq_len)))
        return mmc_error_prefix(st, "%s: ", what);
    c->out_channels = out_ch > 0 ? out_ch : c->in_channels;   /* out_channels or in_channels */
    int n = 3;
    c->patch_size[0] = 1, c->patch_size[1] = 2, c->patch_size[2] = 2;
    if (mmc_json_has(j, "patch_size")) {
        int64_t ps[3];
        if ((st = mmc_json_int_array(j, "patch_size", ps, &n)))
            return mmc_error_prefix(st, "%s: patch_size must be [t, h, w]: ", what);
        if (n != 3)
            return mmc_error(MMC_ERR_FORMAT, "%s: patch_size must list 3 sizes (t, h, w), got %d", what, n);
        for (int a = 0; a < 3; a++) {
            if (ps[a] < 1 || ps[a] > 64)
                return mmc_error(MMC_ERR_FORMAT, "%s: patch_size[%d] = %lld must be in [1, 64]", what, a,
                                 (long long)ps[a]);
            c->patch_size[a] = ps[a];
        }
    }
    if ((st = mmc_json_int(j, "image_dim", 0, &c->image_dim)) ||
        (st = mmc_json_int(j, "added_kv_proj_dim", 0, &c->added_kv_proj_dim)) ||
        (st = mmc_json_int(j, "pos_embed_seq_len", 0, &c->pos_embed_seq_len)))
        return mmc_error_prefix(st, "%s: ", what);
    if (c->pos_embed_seq_len && (c->pos_embed_seq_len < 2 || c->pos_embed_seq_len % 2 || !c->image_dim))
        return mmc_error(MMC_ERR_FORMAT, "%s: pos_embed_seq_len %lld (first-last-frame: two images' states) must be "
                         "even, positive and come with image_dim", what, (long long)c->pos_embed_seq_len);
    if ((c->image_dim != 0) != (c->added_kv_proj_dim != 0) || c->image_dim < 0 ||
        (c->added_kv_proj_dim && c->added_kv_proj_dim != c->num_attention_heads * c->attention_head_dim))
        return mmc_error(MMC_ERR_FORMAT, "%s: image_dim and added_kv_proj_dim come together (image-to-video), "
                         "added_kv_proj_dim equal to num_attention_heads * attention_head_dim; got %lld and %lld", what,
                         (long long)c->image_dim, (long long)c->added_kv_proj_dim);
    const int64_t D = c->attention_head_dim;
    if (c->num_attention_heads < 1 || D < 6 || D % 2 || c->in_channels < 1 || c->out_channels < 1 ||
        c->text_dim < 1 || c->freq_dim < 2 || c->freq_dim % 2 || c->ffn_dim < 1 || c->num_layers < 1 ||
        c->rope_max_seq_len < 1 || !(c->eps > 0))
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive (attention_head_dim even and >= 6, freq_dim "
                         "even, eps > 0, at least one layer)", what);
    c->rope_dims[1] = c->rope_dims[2] = (int)(2 * (D / 6));
    c->rope_dims[0] = (int)(D - 4 * (D / 6));
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
void mmc_wan_free(mmc_wan *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->name_ptrs);
    free(m->blocks);
    free(m);
}

static void bind_attn(mw_set *w, const char *p, const char *a, wan_attn *at, int64_t C) {
    char q[128];
    snprintf(q, sizeof q, "%s%s.", p, a);
    mw_bind_linear(w, q, "to_q", &at->to_q, C, C, true);
    mw_bind_linear(w, q, "to_k", &at->to_k, C, C, true);
    mw_bind_linear(w, q, "to_v", &at->to_v, C, C, true);
    mw_bind_linear(w, q, "to_out.0", &at->to_out, C, C, true);
    mw_bind(w, q, "norm_q.weight", &at->norm_q, 1, MMC_SHAPE(C));
    mw_bind(w, q, "norm_k.weight", &at->norm_k, 1, MMC_SHAPE(C));
}

static void bind_all(mmc_wan *m) {
    const mmc_wan_config *c = &m->cfg;
    mw_set *w = &m->w;
    const int64_t C = c->num_attention_heads * c->attention_head_dim;
    const int64_t *ps = c->patch_size;
    mw_bind_wb(w, "", "patch_embedding", &m->patch_w, &m->patch_b, 5, MMC_SHAPE(C, c->in_channels, ps[0], ps[1], ps[2]));
    mw_bind_linear(w, "condition_embedder.", "time_embedder.linear_1", &m->t_lin1, C, c->freq_dim, true);
    mw_bind_linear(w, "condition_embedder.", "time_embedder.linear_2", &m->t_lin2, C, C, true);
    mw_bind_linear(w, "condition_embedder.", "time_proj", &m->t_proj, 6 * C, C, true);
    mw_bind_linear(w, "condition_embedder.", "text_embedder.linear_1", &m->txt_lin1, C, c->text_dim, true);
    mw_bind_linear(w, "condition_embedder.", "text_embedder.linear_2", &m->txt_lin2, C, C, true);
    if (c->image_dim) {
        const int64_t I = c->image_dim;
        mw_bind_wb(w, "condition_embedder.image_embedder.", "norm1", &m->img_n1_w, &m->img_n1_b, 1, MMC_SHAPE(I));
        mw_bind_linear(w, "condition_embedder.image_embedder.", "ff.net.0.proj", &m->img_ff1, I, I, true);
        mw_bind_linear(w, "condition_embedder.image_embedder.", "ff.net.2", &m->img_ff2, C, I, true);
        mw_bind_wb(w, "condition_embedder.image_embedder.", "norm2", &m->img_n2_w, &m->img_n2_b, 1, MMC_SHAPE(C));
        if (c->pos_embed_seq_len)
            mw_bind(w, "condition_embedder.image_embedder.", "pos_embed", &m->img_pos, 3,
                    MMC_SHAPE(1, c->pos_embed_seq_len, I));
    }
    char p[64];
    for (int64_t i = 0; i < c->num_layers; i++) {
        wan_block *b = &m->blocks[i];
        snprintf(p, sizeof p, "blocks.%lld.", (long long)i);
        bind_attn(w, p, "attn1", &b->attn1, C);
        bind_attn(w, p, "attn2", &b->attn2, C);
        if (c->added_kv_proj_dim) {
            char q[96];
            snprintf(q, sizeof q, "%sattn2.", p);
            mw_bind_linear(w, q, "add_k_proj", &b->attn2.add_k, C, c->added_kv_proj_dim, true);
            mw_bind_linear(w, q, "add_v_proj", &b->attn2.add_v, C, c->added_kv_proj_dim, true);
            mw_bind(w, q, "norm_added_k.weight", &b->attn2.norm_added_k, 1, MMC_SHAPE(C));
        }
        if (c->cross_attn_norm) mw_bind_wb(w, p, "norm2", &b->norm2_w, &b->norm2_b, 1, MMC_SHAPE(C));
        mw_bind_linear(w, p, "ffn.net.0.proj", &b->ff_in, c->ffn_dim, C, true);
        mw_bind_linear(w, p, "ffn.net.2", &b->ff_out, C, c->ffn_dim, true);
        mw_bind(w, p, "scale_shift_table", &b->sst, 3, MMC_SHAPE(1, 6, C));
    }
    mw_bind(w, "", "scale_shift_table", &m->sst, 3, MMC_SHAPE(1, 2, C));
    mw_bind_linear(w, "", "proj_out", &m->proj_out, ps[0] * ps[1] * ps[2] * c->out_channels, C, true);
}

mmc_status mmc_wan_load(const char *dir, bool trainable, mmc_wan **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_wan *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_wan_config_read(j, path, &m->cfg))) goto fail;
    if (!(m->blocks = calloc((size_t)m->cfg.num_layers, sizeof *m->blocks))) {
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto fail;
    }
    if ((st = mw_open(dir, "diffusion_pytorch_model", &m->w))) goto fail;
    m->w.trainable = trainable;
    bind_all(m);
    if ((st = mw_status(&m->w, dir, "WanTransformer3DModel")) ||
        (st = mw_check_unused(&m->w, dir, "WanTransformer3DModel")))
        goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_wan_free(m);
    return st;
}

mmc_status mmc_wan_new(const mmc_wan_config *cfg, uint64_t seed, mmc_wan **out) {
    *out = NULL;
    mmc_wan *m = calloc(1, sizeof *m);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory");
    m->cfg = *cfg;
    mmc_status st;
    if (!(m->blocks = calloc((size_t)cfg->num_layers + 1, sizeof *m->blocks))) {
        st = mmc_error(MMC_ERR_OOM, "out of memory");
        goto fail;
    }
    if ((st = mw_init_random(&m->w, seed, MW_INIT_TORCH_LINEAR))) goto fail;
    m->w.trainable = true;
    bind_all(m);
    if ((st = mw_status(&m->w, "random init", "WanTransformer3DModel"))) goto fail;
    *out = m;
    return MMC_OK;
fail:
    mmc_wan_free(m);
    return st;
}

const mmc_wan_config *mmc_wan_cfg(const mmc_wan *m) { return &m->cfg; }
int64_t mmc_wan_param_count(const mmc_wan *m) { return mw_count(&m->w); }

int mmc_wan_param_list(mmc_wan *m, mmc_tensor ***params, const char *const **names) {
    if (!m->name_ptrs) {
        m->name_ptrs = calloc((size_t)m->w.n_params + 1, sizeof *m->name_ptrs);
        MMC_CHECK(m->name_ptrs, "out of memory");
        for (int i = 0; i < m->w.n_params; i++) m->name_ptrs[i] = m->w.names[i];
    }
    *params = m->w.params;
    *names = m->name_ptrs;
    return m->w.n_params;
}

mmc_status mmc_wan_linears(mmc_wan *m, mmc_module_list *ml) {
    mmc_status st = MMC_OK;
    char nm[MMC_MODULE_NAME];
#define ADD(l, ...) do { snprintf(nm, sizeof nm, __VA_ARGS__); if (!st) st = mmc_module_list_add(ml, (l), nm); } while (0)
    ADD(&m->t_lin1, "condition_embedder.time_embedder.linear_1");
    ADD(&m->t_lin2, "condition_embedder.time_embedder.linear_2");
    ADD(&m->t_proj, "condition_embedder.time_proj");
    ADD(&m->txt_lin1, "condition_embedder.text_embedder.linear_1");
    ADD(&m->txt_lin2, "condition_embedder.text_embedder.linear_2");
    if (m->cfg.image_dim) {
        ADD(&m->img_ff1, "condition_embedder.image_embedder.ff.net.0.proj");
        ADD(&m->img_ff2, "condition_embedder.image_embedder.ff.net.2");
    }
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        wan_block *b = &m->blocks[i];
        const long long k = (long long)i;
        wan_attn *a[2] = {&b->attn1, &b->attn2};
        for (int n = 0; n < 2; n++) {
            ADD(&a[n]->to_q, "blocks.%lld.attn%d.to_q", k, n + 1);
            ADD(&a[n]->to_k, "blocks.%lld.attn%d.to_k", k, n + 1);
            ADD(&a[n]->to_v, "blocks.%lld.attn%d.to_v", k, n + 1);
            ADD(&a[n]->to_out, "blocks.%lld.attn%d.to_out.0", k, n + 1);
        }
        if (m->cfg.added_kv_proj_dim) {
            ADD(&b->attn2.add_k, "blocks.%lld.attn2.add_k_proj", k);
            ADD(&b->attn2.add_v, "blocks.%lld.attn2.add_v_proj", k);
        }
        ADD(&b->ff_in, "blocks.%lld.ffn.net.0.proj", k);
        ADD(&b->ff_out, "blocks.%lld.ffn.net.2", k);
    }
    ADD(&m->proj_out, "proj_out");
#undef ADD
    return st;
}

/* ------------------------------------------------------------------ forward */
/* The k chunks [B, C] of a conditioning tensor [B, k*C] (views). */
static void chunks(mmc_ctx *ctx, mmc_tensor *e, int k, mmc_tensor **out) {
    int64_t sizes[6];
    for (int i = 0; i < k; i++) sizes[i] = e->shape[1] / k;
    mmc_split(ctx, e, 1, k, sizes, out);
}

/* scale_shift_table [1, k, C] + e, e [B, k*C] (the block's six) or [B, C] (broadcast: the output's
 * two) -> [B, k*C], in f32 as diffusers upcasts */
static mmc_tensor *add_table(mmc_ctx *ctx, mmc_tensor *table, mmc_tensor *e, int k) {
    const int64_t B = e->shape[0], C = table->shape[2];
    mmc_tensor *t = table->dtype == MMC_F32 ? table : mmc_cast(ctx, table, MMC_F32);
    mmc_tensor *s = mmc_add(ctx, mmc_reshape(ctx, e, 3, MMC_SHAPE(B, e->shape[1] / C, C)), t);   /* [B, k, C] */
    return mmc_reshape(ctx, mmc_contiguous(ctx, s), 2, MMC_SHAPE(B, k * C));
}

static mmc_tensor *layer_norm(mmc_ctx *ctx, const mmc_wan *m, mmc_tensor *x) {
    return mmc_layernorm(ctx, x, NULL, NULL, (float)m->cfg.eps);
}

/* WanAttention (processor WanAttnProcessor): x [B, L, C] attends to kv [B, S, C] (x itself for
 * self-attention, with rope), plus, for I2V's attn2, to the image states img [B, S_img, C] -> [B, L, C] */
static mmc_tensor *attention(mmc_ctx *ctx, const mmc_wan *m, const wan_attn *a, mmc_tensor *x, mmc_tensor *kv,
                             mmc_tensor *img, mmc_tensor *cos, mmc_tensor *sin) {
    const int64_t H = m->cfg.num_attention_heads, D = m->cfg.attention_head_dim;
    const int64_t B = x->shape[0], L = x->shape[1], S = kv->shape[1];
    const float eps = (float)m->cfg.eps;
    mmc_tensor *q = mmc_rmsnorm(ctx, mmc_nn_linear(ctx, x, &a->to_q), a->norm_q, eps);      /* [B, L, C] */
    mmc_tensor *k = mmc_rmsnorm(ctx, mmc_nn_linear(ctx, kv, &a->to_k), a->norm_k, eps);     /* [B, S, C] */
    mmc_tensor *v = mmc_nn_linear(ctx, kv, &a->to_v);
    q = mmc_reshape(ctx, q, 4, MMC_SHAPE(B, L, H, D));
    k = mmc_reshape(ctx, k, 4, MMC_SHAPE(B, S, H, D));
    v = mmc_reshape(ctx, v, 4, MMC_SHAPE(B, S, H, D));
    if (cos) {
        q = mmc_rope_interleaved(ctx, q, cos, sin);
        k = mmc_rope_interleaved(ctx, k, cos, sin);
    }
    mmc_attn_opts o = {.causal = false};
    mmc_tensor *h = mmc_attention(ctx, q, k, v, &o);                                          /* [B, L, H, D] */
    if (img) {   /* hidden_states + hidden_states_img */
        const int64_t Si = img->shape[1];
        mmc_tensor *ki = mmc_rmsnorm(ctx, mmc_nn_linear(ctx, img, &a->add_k), a->norm_added_k, eps);
        mmc_tensor *vi = mmc_nn_linear(ctx, img, &a->add_v);
        h = mmc_add(ctx, h, mmc_attention(ctx, q, mmc_reshape(ctx, ki, 4, MMC_SHAPE(B, Si, H, D)),
                                          mmc_reshape(ctx, vi, 4, MMC_SHAPE(B, Si, H, D)), &o));
    }
    return mmc_nn_linear(ctx, mmc_reshape(ctx, h, 3, MMC_SHAPE(B, L, H * D)), &a->to_out);
}

/* WanTransformerBlock (temb of shape [B, 6, C], Wan2.1) */
static mmc_tensor *block(mmc_ctx *ctx, const mmc_wan *m, const wan_block *b, mmc_tensor *x, mmc_tensor *cx,
                         mmc_tensor *img, mmc_tensor *e6, mmc_tensor *cos, mmc_tensor *sin) {
    mmc_tensor *e[6];   /* shift, scale, gate, c_shift, c_scale, c_gate */
    chunks(ctx, add_table(ctx, b->sst, e6, 6), 6, e);
    /* without a tape, each of the three parts' intermediates go as soon as its residual exists */
    const bool trim = !mmc_grad_enabled(ctx);
    mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *n = mmc_modulate(ctx, layer_norm(ctx, m, x), e[0], e[1]);
    x = mmc_gate_residual(ctx, x, e[2], attention(ctx, m, &b->attn1, n, n, NULL, cos, sin));
    if (trim) x = mw_keep(ctx, mk, x);
    n = b->norm2_w ? mmc_layernorm(ctx, x, b->norm2_w, b->norm2_b, (float)m->cfg.eps) : x;
    x = mmc_add(ctx, x, attention(ctx, m, &b->attn2, n, cx, img, NULL, NULL));
    if (trim) x = mw_keep(ctx, mk, x);
    n = mmc_modulate(ctx, layer_norm(ctx, m, x), e[3], e[4]);
    mmc_tensor *f = mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, n, &b->ff_in)), &b->ff_out);
    return mmc_gate_residual(ctx, x, e[5], f);
}

static mmc_status check_inputs(const mmc_wan *m, const mmc_wan_inputs *in) {
    const mmc_wan_config *c = &m->cfg;
    const mmc_tensor *x = in->hidden, *e = in->encoder;
    if (!x || x->ndim != 5 || x->dtype != MMC_F32 || x->shape[1] != c->in_channels || !mmc_is_contiguous(x))
        return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: hidden_states must be contiguous f32 "
                         "[B, %lld, F, H, W]", (long long)c->in_channels);
    for (int a = 0; a < 3; a++) {
        const int64_t n = x->shape[2 + a], p = c->patch_size[a];
        if (n < p || n % p)
            return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: hidden_states %s %lld is not a positive multiple "
                             "of patch_size[%d] = %lld", a == 0 ? "frames" : a == 1 ? "height" : "width",
                             (long long)n, a, (long long)p);
        if (n / p > c->rope_max_seq_len)
            return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: %lld patches along the %s exceed rope_max_seq_len "
                             "%lld (the rotary table's length)", (long long)(n / p),
                             a == 0 ? "frames" : a == 1 ? "height" : "width", (long long)c->rope_max_seq_len);
    }
    if (!e || e->ndim != 3 || e->dtype != MMC_F32 || e->shape[0] != x->shape[0] || e->shape[2] != c->text_dim ||
        e->shape[1] < 1 || !mmc_is_contiguous(e))
        return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: encoder_hidden_states must be contiguous f32 "
                         "[%lld, T, %lld] (text_dim)", (long long)x->shape[0], (long long)c->text_dim);
    if (!in->timestep) return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: a timestep is required");
    const mmc_tensor *im = in->image;
    if (c->image_dim && (!im || im->ndim != 3 || im->dtype != MMC_F32 || im->shape[0] != x->shape[0] ||
                         im->shape[2] != c->image_dim || im->shape[1] < 1 || !mmc_is_contiguous(im)))
        return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: this image-to-video checkpoint needs "
                         "encoder_hidden_states_image, contiguous f32 [%lld, S, %lld] (image_dim)", (long long)x->shape[0],
                         (long long)c->image_dim);
    if (!c->image_dim && im)
        return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: image states given, but this checkpoint has no image "
                         "branch (image_dim null: text-to-video)");
    if (c->pos_embed_seq_len && im->shape[1] != c->pos_embed_seq_len)
        return mmc_error(MMC_ERR_INVALID, "WanTransformer3DModel: this first-last-frame checkpoint takes the two images' "
                         "states [B, %lld, %lld] (first then last, pos_embed_seq_len), got %lld states",
                         (long long)c->pos_embed_seq_len, (long long)c->image_dim, (long long)im->shape[1]);
    return MMC_OK;
}

/* patch_embedding's input: latents [B, Cin, F, H, W] -> patches [B, S, Cin*pt*ph*pw], channel-major
 * within a patch (the Conv3d weight's layout), tokens (f, i, j) row-major. */
static mmc_tensor *patchify(mmc_ctx *ctx, const mmc_wan *m, const mmc_tensor *z) {
    const int64_t *ps = m->cfg.patch_size;
    const int64_t B = z->shape[0], Ci = z->shape[1], F = z->shape[2], H = z->shape[3], W = z->shape[4];
    const int64_t f = F / ps[0], h = H / ps[1], w = W / ps[2], K = Ci * ps[0] * ps[1] * ps[2];
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, f * h * w, K));
    const float *src = z->data;
    float *dst = x->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < f; t++)
            for (int64_t i = 0; i < h; i++)
                for (int64_t j = 0; j < w; j++) {
                    float *row = dst + ((b * f + t) * h * w + i * w + j) * K;
                    for (int64_t c = 0; c < Ci; c++)
                        for (int64_t dt = 0; dt < ps[0]; dt++)
                            for (int64_t dy = 0; dy < ps[1]; dy++)
                                for (int64_t dx = 0; dx < ps[2]; dx++)
                                    *row++ = src[(((b * Ci + c) * F + t * ps[0] + dt) * H + i * ps[1] + dy) * W +
                                                 j * ps[2] + dx];
                }
    return x;
}

/* unpatchify as differentiable reshapes and <= 4-d permutes:
 * y [B, f, h, w, pt, ph, pw, Co] -> [B, Co, f*pt, h*ph, w*pw] */
static mmc_tensor *unpatchify(mmc_ctx *ctx, const mmc_wan *m, mmc_tensor *y, int64_t B, int64_t f, int64_t h,
                              int64_t w) {
    const int64_t pt = m->cfg.patch_size[0], ph = m->cfg.patch_size[1], pw = m->cfg.patch_size[2];
    const int64_t Co = m->cfg.out_channels;
    static const int sw12[4] = {0, 2, 1, 3};
    /* (B f h) w (pt ph) (pw Co) -> (B f h) (pt ph) w (pw Co) */
    y = mmc_contiguous(ctx, mmc_permute(ctx, mmc_reshape(ctx, y, 4, MMC_SHAPE(B * f * h, w, pt * ph, pw * Co)), sw12));
    /* (B f) h pt (ph w pw Co) -> (B f) pt h (ph w pw Co) */
    y = mmc_contiguous(ctx, mmc_permute(ctx, mmc_reshape(ctx, y, 4, MMC_SHAPE(B * f, h, pt, ph * w * pw * Co)), sw12));
    /* B (f pt h ph w pw) Co -> B Co (f pt h ph w pw) */
    y = mmc_contiguous(ctx, mmc_transpose(ctx, mmc_reshape(ctx, y, 3, MMC_SHAPE(B, f * pt * h * ph * w * pw, Co)), 1, 2));
    return mmc_reshape(ctx, y, 5, MMC_SHAPE(B, Co, f * pt, h * ph, w * pw));
}

void mmc_wan_set_recompute(mmc_wan *m, bool on) { m->recompute = on; }

/* a checkpointed block: in = {x, cx, e6[, img]}; rope tables through the args */
typedef struct { const mmc_wan *m; const wan_block *b; mmc_tensor *cos, *sin; } wan_block_args;
static mmc_tensor *block_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    const wan_block_args *a = user;
    return block(ctx, a->m, a->b, in[0], in[1], n_in > 3 ? in[3] : NULL, in[2], a->cos, a->sin);
}

mmc_status mmc_wan_forward(mmc_ctx *ctx, mmc_wan *m, const mmc_wan_inputs *in, mmc_tensor **out) {
    *out = NULL;
    mmc_status st = check_inputs(m, in);
    if (st) return st;
    const mmc_wan_config *c = &m->cfg;
    const int64_t B = in->hidden->shape[0], C = c->num_attention_heads * c->attention_head_dim;
    const int64_t f = in->hidden->shape[2] / c->patch_size[0], h = in->hidden->shape[3] / c->patch_size[1],
                  w = in->hidden->shape[4] / c->patch_size[2], S = f * h * w;
    const bool grad = mmc_grad_enabled(ctx);

    /* rope over the (frame, row, column) of each patch */
    float *ids = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)S * 3 * sizeof *ids);
    for (int64_t t = 0, s = 0; t < f; t++)
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < w; j++, s++) ids[s * 3] = (float)t, ids[s * 3 + 1] = (float)i, ids[s * 3 + 2] = (float)j;
    mmc_tensor *cos, *sin;
    mmc_rope_table_axes(ctx, ids, S, 3, c->rope_dims, 10000.0, &cos, &sin);

    /* patch embedding: the Conv3d as a linear map of flattened patches */
    const int64_t K = c->in_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    mmc_tensor *x = mmc_linear(ctx, patchify(ctx, m, in->hidden), mmc_reshape(ctx, m->patch_w, 2, MMC_SHAPE(C, K)),
                               m->patch_b);                                                     /* [B, S, C] */

    /* condition embedder */
    mmc_tensor *tp = mmc_timestep_embedding(ctx, in->timestep, B, (int)c->freq_dim, true, 0.0, 1.0, 10000.0);
    mmc_tensor *temb = mmc_nn_linear(ctx, mmc_silu(ctx, mmc_nn_linear(ctx, tp, &m->t_lin1)), &m->t_lin2);   /* [B, C] */
    mmc_tensor *e6 = mmc_nn_linear(ctx, mmc_silu(ctx, temb), &m->t_proj);                       /* [B, 6C] */
    mmc_tensor *cx = mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, in->encoder, &m->txt_lin1)),
                                   &m->txt_lin2);                                               /* [B, T, C] */

    mmc_tensor *img = NULL;   /* WanImageEmbedding: FP32LayerNorm (eps 1e-5), FeedForward(gelu), FP32LayerNorm */
    if (in->image) {
        img = in->image;
        if (m->img_pos) img = mmc_add(ctx, img, m->img_pos);   /* FLF2V: the position table of the two images */
        img = mmc_layernorm(ctx, img, m->img_n1_w, m->img_n1_b, 1e-5f);
        img = mmc_nn_linear(ctx, mmc_gelu(ctx, mmc_nn_linear(ctx, img, &m->img_ff1)), &m->img_ff2);
        img = mmc_layernorm(ctx, img, m->img_n2_w, m->img_n2_b, 1e-5f);                       /* [B, S_img, C] */
    }
    wan_block_args *args = grad && m->recompute ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *args * (size_t)c->num_layers)
                                                : NULL;
    for (int64_t i = 0; i < c->num_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        if (args) {   /* activation recompute: the block's intermediates are rebuilt in backward */
            args[i] = (wan_block_args){m, &m->blocks[i], cos, sin};
            mmc_tensor *bin[4] = {x, cx, e6, img};
            x = mmc_checkpoint(ctx, block_fn, &args[i], bin, img ? 4 : 3);
            continue;
        }
        x = block(ctx, m, &m->blocks[i], x, cx, img, e6, cos, sin);
        if (!grad) x = mw_keep(ctx, mk, x);
    }
    mmc_tensor *e[2];   /* shift, scale = table + temb */
    chunks(ctx, add_table(ctx, m->sst, temb, 2), 2, e);
    x = mmc_modulate(ctx, layer_norm(ctx, m, x), e[0], e[1]);
    mmc_tensor *y = mmc_nn_linear(ctx, x, &m->proj_out);                                       /* [B, S, p*Co] */
    *out = unpatchify(ctx, m, y, B, f, h, w);
    return MMC_OK;
}
