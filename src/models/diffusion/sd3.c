/* sd3.c — the MMDiT of Stable Diffusion 3 / 3.5, mirroring diffusers' SD3Transformer2DModel
 * (models/transformers/transformer_sd3.py, JointTransformerBlock in models/attention.py,
 * JointAttnProcessor2_0, PatchEmbed and CombinedTimestepTextProjEmbeddings in models/embeddings.py):
 *
 *   x    = conv_p(latents).flatten(2).T + crop(pos_embed)                  [B, S, C]  S = (H/p)(W/p)
 *          conv_p: Conv2d(in_channels, C, kernel p, stride p); pos_embed: the fixed 2D sin-cos table
 *          [1, M*M, C] (M = pos_embed_max_size), centre-cropped to the (H/p) x (W/p) patch grid
 *   temb = timestep_embedder(proj(t)) + text_embedder(pooled)              [B, C]
 *          proj: 256 sinusoids, cos first, shift 0, t unscaled (the pipeline passes sigma * 1000);
 *          timestep_embedder / text_embedder: Linear-SiLU-Linear
 *   ctx  = context_embedder(encoder)                                       [B, T, C]
 *   num_layers JointTransformerBlocks, with e = Linear(SiLU(temb)):
 *       (shift, scale, gate)_msa, (shift, scale, gate)_mlp [, (shift, scale, gate)_msa2] = e.chunk(6 | 9)
 *       n = LN(x); nx = n * (1 + scale_msa) + shift_msa; ctx likewise with its own 6 chunks
 *       q, k, v of both streams (per-head RMS norm on q and k with qk_norm "rms_norm"); one
 *       softmax attention over the joint sequence [x; ctx] (image first, unlike Flux)
 *       x += gate_msa * to_out(attn_x)
 *       dual-attention blocks (SD3.5-medium): x += gate_msa2 * attn2(n * (1 + scale_msa2) + shift_msa2),
 *           a self-attention on the image tokens alone (SD35AdaLayerNormZeroX: 9 chunks, one LN)
 *       x += gate_mlp * ff(LN(x) * (1 + scale_mlp) + shift_mlp)            ff = Linear-GELU(tanh)-Linear, 4C
 *       ctx += c_gate_msa * to_add_out(attn_ctx), then its own ff, except in the last block
 *       (context_pre_only): there ctx is only read, normed by AdaLayerNormContinuous (chunk(2) =
 *       scale, shift), and has no to_add_out / ff_context.
 *   out  = proj_out(LN(x) * (1 + scale) + shift)                           [B, S, p*p*Cout]
 *   unpatchify: token (i, j) channel (py*p + px)*Cout + c -> [B, Cout, i*p + py, j*p + px]
 *
 * LayerNorms carry no affine weights (eps 1e-6); RMS norms have eps 1e-6 and weights. The position
 * table is a persistent buffer in diffusers (register_buffer(persistent=True) when
 * pos_embed_max_size is set), so every SD3 checkpoint holds "pos_embed.pos_embed" and the loader
 * binds it: a bf16 checkpoint's rounded table is then exactly what diffusers adds, which a table
 * recomputed in float64 would not be. Projections are mmc_linear_w, so LoRA attaches by diffusers'
 * module names. Without grad mode each block keeps only its outputs in the activation arena. */
#include "mmc_diffusion.h"
#include "mmc_lora.h"
#include "mmc_nn.h"
#include "../model_weights.h"

#include <stdlib.h>
#include <string.h>

#define SD3_EPS 1e-6f

typedef struct {
    bool dual, pre_only;                            /* attn2 present; last block (context_pre_only) */
    mmc_linear_w norm1;                             /* AdaLayerNormZero [6C, C] (SD35AdaLayerNormZeroX [9C, C]) */
    mmc_linear_w norm1_ctx;                         /* AdaLayerNormZero [6C, C] (pre_only: Continuous [2C, C]) */
    mmc_linear_w to_q, to_k, to_v, to_out;          /* [C, C] */
    mmc_linear_w add_q, add_k, add_v, to_add_out;   /* [C, C]; no to_add_out when pre_only */
    mmc_tensor *norm_q, *norm_k, *norm_added_q, *norm_added_k;   /* [head_dim], qk_norm only */
    mmc_linear_w a2_q, a2_k, a2_v, a2_out;          /* attn2 [C, C], dual only */
    mmc_tensor *a2_norm_q, *a2_norm_k;              /* [head_dim], dual and qk_norm */
    mmc_linear_w ff_in, ff_out, ffc_in, ffc_out;    /* [4C, C], [C, 4C]; no ff_context when pre_only */
} sd3_block;

struct mmc_sd3 {
    mmc_sd3_config cfg;
    mmc_tensor *patch_w, *patch_b;                  /* pos_embed.proj: [C, Cin, p, p], [C] */
    mmc_tensor *pos_embed;                          /* [1, M*M, C] buffer (not a parameter) */
    mmc_linear_w t_lin1, t_lin2;                    /* timestep_embedder: [C, 256], [C, C] */
    mmc_linear_w p_lin1, p_lin2;                    /* text_embedder: [C, P], [C, C] */
    mmc_linear_w context_embedder;                  /* [C, joint_attention_dim] */
    sd3_block *blocks;
    mmc_linear_w norm_out;                          /* [2C, C] */
    mmc_linear_w proj_out;                          /* [p*p*Cout, C] */
    mw_set w;
    mmc_tensor **train_params;                      /* the parameters without pos_embed (mmc_sd3_param_list) */
    const char **train_names;
    int n_train;
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_sd3_config_read(const mmc_json *j, const char *what, mmc_sd3_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    int64_t out_ch = 0, pmax = 0;
    const char *qk = NULL;
    if ((st = mmc_json_int(j, "sample_size", 128, &c->sample_size)) ||
        (st = mmc_json_int(j, "patch_size", 2, &c->patch_size)) ||
        (st = mmc_json_int(j, "in_channels", 16, &c->in_channels)) ||
        (st = mmc_json_int(j, "out_channels", -1, &out_ch)) ||
        (st = mmc_json_int(j, "num_layers", 18, &c->num_layers)) ||
        (st = mmc_json_int(j, "attention_head_dim", 64, &c->attention_head_dim)) ||
        (st = mmc_json_int(j, "num_attention_heads", 18, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "joint_attention_dim", 4096, &c->joint_attention_dim)) ||
        (st = mmc_json_int(j, "caption_projection_dim", 1152, &c->caption_projection_dim)) ||
        (st = mmc_json_int(j, "pooled_projection_dim", 2048, &c->pooled_projection_dim)) ||
        (st = mmc_json_int(j, "pos_embed_max_size", -1, &pmax)) ||
        (st = mmc_json_str(j, "qk_norm", NULL, &qk)))
        return mmc_error_prefix(st, "%s: ", what);
    /* diffusers' defaults apply to absent keys; an explicit null means "as in_channels" for
     * out_channels and "no cropping table" for pos_embed_max_size */
    const bool has_out = mmc_json_get(j, "out_channels") != NULL;        /* null included */
    const bool has_pmax = mmc_json_get(j, "pos_embed_max_size") != NULL;
    c->out_channels = out_ch >= 0 ? out_ch : has_out ? c->in_channels : 16;
    c->pos_embed_max_size = pmax >= 0 ? pmax : has_pmax ? 0 : 96;
    if (c->pos_embed_max_size == 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: pos_embed_max_size null: SD3Transformer2DModel without the "
                         "cropped position table (a non-persistent one interpolated per size) is not supported",
                         what);
    if (qk && strcmp(qk, "rms_norm") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: qk_norm \"%s\": only null (SD3) and \"rms_norm\" (SD3.5) are "
                         "supported", what, qk);
    c->qk_norm = qk != NULL;
    if (c->patch_size < 1 || c->in_channels < 1 || c->out_channels < 1 || c->num_layers < 1 ||
        c->attention_head_dim < 1 || c->num_attention_heads < 1 || c->joint_attention_dim < 1 ||
        c->pooled_projection_dim < 1 || c->pos_embed_max_size < 1 || c->sample_size < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes (patch_size, in/out_channels, num_layers, attention_head_dim, "
                         "num_attention_heads, joint/pooled dims, pos_embed_max_size, sample_size) must be positive",
                         what);
    if (c->num_layers > MMC_SD3_MAX_LAYERS)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: num_layers %lld: at most %d are supported", what,
                         (long long)c->num_layers, MMC_SD3_MAX_LAYERS);
    /* context_embedder writes caption_projection_dim, but the blocks read inner_dim: diffusers
     * builds the model either way and fails at the first forward unless they agree */
    const int64_t C = c->num_attention_heads * c->attention_head_dim;
    if (c->caption_projection_dim != C)
        return mmc_error(MMC_ERR_FORMAT, "%s: caption_projection_dim %lld must equal num_attention_heads * "
                         "attention_head_dim = %lld", what, (long long)c->caption_projection_dim, (long long)C);
    int64_t dual[MMC_SD3_MAX_LAYERS * 2];
    int n_dual = MMC_SD3_MAX_LAYERS * 2;
    if ((st = mmc_json_int_array(j, "dual_attention_layers", dual, &n_dual)))
        return mmc_error_prefix(st, "%s: ", what);
    /* diffusers tests `i in dual_attention_layers` for each block: other indices are inert */
    for (int i = 0; i < n_dual; i++)
        if (dual[i] >= 0 && dual[i] < c->num_layers) c->dual_attention[dual[i]] = true;
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
void mmc_sd3_free(mmc_sd3 *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->blocks);
    free(m->train_params);
    free(m->train_names);
    free(m);
}

static void bind_qk(mw_set *w, const char *p, const char *attn, bool added, mmc_tensor **nq, mmc_tensor **nk,
                    int64_t D) {
    char a[64], b[64];
    snprintf(a, sizeof a, "%s.%s.weight", attn, added ? "norm_added_q" : "norm_q");
    snprintf(b, sizeof b, "%s.%s.weight", attn, added ? "norm_added_k" : "norm_k");
    mw_bind(w, p, a, nq, 1, MMC_SHAPE(D));
    mw_bind(w, p, b, nk, 1, MMC_SHAPE(D));
}

static void bind_all(mmc_sd3 *m) {
    const mmc_sd3_config *c = &m->cfg;
    mw_set *w = &m->w;
    const int64_t C = c->num_attention_heads * c->attention_head_dim, D = c->attention_head_dim, M = 4 * C;
    const int64_t p = c->patch_size, pm = c->pos_embed_max_size;
    mw_bind_wb(w, "pos_embed.", "proj", &m->patch_w, &m->patch_b, 4, MMC_SHAPE(C, c->in_channels, p, p));
    mw_bind(w, "pos_embed.", "pos_embed", &m->pos_embed, 3, MMC_SHAPE(1, pm * pm, C));
    mw_bind_linear(w, "time_text_embed.", "timestep_embedder.linear_1", &m->t_lin1, C, 256, true);
    mw_bind_linear(w, "time_text_embed.", "timestep_embedder.linear_2", &m->t_lin2, C, C, true);
    mw_bind_linear(w, "time_text_embed.", "text_embedder.linear_1", &m->p_lin1, C, c->pooled_projection_dim, true);
    mw_bind_linear(w, "time_text_embed.", "text_embedder.linear_2", &m->p_lin2, C, C, true);
    mw_bind_linear(w, "", "context_embedder", &m->context_embedder, C, c->joint_attention_dim, true);
    char pf[96];
    for (int64_t i = 0; i < c->num_layers; i++) {
        sd3_block *b = &m->blocks[i];
        b->dual = c->dual_attention[i];
        b->pre_only = i == c->num_layers - 1;
        snprintf(pf, sizeof pf, "transformer_blocks.%lld.", (long long)i);
        mw_bind_linear(w, pf, "norm1.linear", &b->norm1, (b->dual ? 9 : 6) * C, C, true);
        mw_bind_linear(w, pf, "norm1_context.linear", &b->norm1_ctx, (b->pre_only ? 2 : 6) * C, C, true);
        mw_bind_linear(w, pf, "attn.to_q", &b->to_q, C, C, true);
        mw_bind_linear(w, pf, "attn.to_k", &b->to_k, C, C, true);
        mw_bind_linear(w, pf, "attn.to_v", &b->to_v, C, C, true);
        mw_bind_linear(w, pf, "attn.to_out.0", &b->to_out, C, C, true);
        mw_bind_linear(w, pf, "attn.add_q_proj", &b->add_q, C, C, true);
        mw_bind_linear(w, pf, "attn.add_k_proj", &b->add_k, C, C, true);
        mw_bind_linear(w, pf, "attn.add_v_proj", &b->add_v, C, C, true);
        if (!b->pre_only) mw_bind_linear(w, pf, "attn.to_add_out", &b->to_add_out, C, C, true);
        if (c->qk_norm) {
            bind_qk(w, pf, "attn", false, &b->norm_q, &b->norm_k, D);
            bind_qk(w, pf, "attn", true, &b->norm_added_q, &b->norm_added_k, D);
        }
        if (b->dual) {
            mw_bind_linear(w, pf, "attn2.to_q", &b->a2_q, C, C, true);
            mw_bind_linear(w, pf, "attn2.to_k", &b->a2_k, C, C, true);
            mw_bind_linear(w, pf, "attn2.to_v", &b->a2_v, C, C, true);
            mw_bind_linear(w, pf, "attn2.to_out.0", &b->a2_out, C, C, true);
            if (c->qk_norm) bind_qk(w, pf, "attn2", false, &b->a2_norm_q, &b->a2_norm_k, D);
        }
        mw_bind_linear(w, pf, "ff.net.0.proj", &b->ff_in, M, C, true);
        mw_bind_linear(w, pf, "ff.net.2", &b->ff_out, C, M, true);
        if (!b->pre_only) {
            mw_bind_linear(w, pf, "ff_context.net.0.proj", &b->ffc_in, M, C, true);
            mw_bind_linear(w, pf, "ff_context.net.2", &b->ffc_out, C, M, true);
        }
    }
    mw_bind_linear(w, "", "norm_out.linear", &m->norm_out, 2 * C, C, true);
    mw_bind_linear(w, "", "proj_out", &m->proj_out, p * p * c->out_channels, C, true);
}

mmc_status mmc_sd3_load(const char *dir, bool trainable, mmc_sd3 **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_sd3 *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_sd3_config_read(j, path, &m->cfg))) goto fail;
    m->blocks = calloc((size_t)m->cfg.num_layers, sizeof *m->blocks);
    if (!m->blocks) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "diffusion_pytorch_model", &m->w))) goto fail;
    m->w.trainable = trainable;
    bind_all(m);
    if ((st = mw_status(&m->w, dir, "SD3Transformer2DModel")) ||
        (st = mw_check_unused(&m->w, dir, "SD3Transformer2DModel")))
        goto fail;
    /* a buffer, not a parameter: never trained (diffusers registers it with register_buffer) */
    m->pos_embed->flags &= ~(uint32_t)(MMC_PARAM | MMC_REQUIRES_GRAD);
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_sd3_free(m);
    return st;
}

const mmc_sd3_config *mmc_sd3_cfg(const mmc_sd3 *m) { return &m->cfg; }
int64_t mmc_sd3_param_count(const mmc_sd3 *m) { return mw_count(&m->w) - mmc_numel(m->pos_embed); }

mmc_tensor *mmc_sd3_param(const mmc_sd3 *m, const char *name) {
    for (int i = 0; i < m->w.n_params; i++)
        if (!strcmp(m->w.names[i], name)) return m->w.params[i];
    return NULL;
}

int mmc_sd3_param_list(mmc_sd3 *m, mmc_tensor ***params, const char *const **names) {
    if (!m->train_params) {
        m->train_params = calloc((size_t)m->w.n_params + 1, sizeof *m->train_params);
        m->train_names = calloc((size_t)m->w.n_params + 1, sizeof *m->train_names);
        MMC_CHECK(m->train_params && m->train_names, "out of memory");
        for (int i = 0; i < m->w.n_params; i++)
            if (m->w.params[i] != m->pos_embed) {
                m->train_params[m->n_train] = m->w.params[i];
                m->train_names[m->n_train++] = m->w.names[i];
            }
    }
    *params = m->train_params;
    *names = m->train_names;
    return m->n_train;
}

mmc_status mmc_sd3_linears(mmc_sd3 *m, mmc_module_list *out) {
    struct { mmc_linear_w *l; const char *name; } top[] = {
        {&m->t_lin1, "time_text_embed.timestep_embedder.linear_1"},
        {&m->t_lin2, "time_text_embed.timestep_embedder.linear_2"},
        {&m->p_lin1, "time_text_embed.text_embedder.linear_1"},
        {&m->p_lin2, "time_text_embed.text_embedder.linear_2"},
        {&m->context_embedder, "context_embedder"},
    };
    mmc_status st;
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if ((st = mmc_module_list_add(out, top[i].l, top[i].name))) return st;
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        sd3_block *b = &m->blocks[i];
        struct { mmc_linear_w *l; const char *name; bool on; } ls[] = {
            {&b->norm1, "norm1.linear", true},           {&b->norm1_ctx, "norm1_context.linear", true},
            {&b->to_q, "attn.to_q", true},               {&b->to_k, "attn.to_k", true},
            {&b->to_v, "attn.to_v", true},               {&b->to_out, "attn.to_out.0", true},
            {&b->add_q, "attn.add_q_proj", true},        {&b->add_k, "attn.add_k_proj", true},
            {&b->add_v, "attn.add_v_proj", true},        {&b->to_add_out, "attn.to_add_out", !b->pre_only},
            {&b->a2_q, "attn2.to_q", b->dual},           {&b->a2_k, "attn2.to_k", b->dual},
            {&b->a2_v, "attn2.to_v", b->dual},           {&b->a2_out, "attn2.to_out.0", b->dual},
            {&b->ff_in, "ff.net.0.proj", true},          {&b->ff_out, "ff.net.2", true},
            {&b->ffc_in, "ff_context.net.0.proj", !b->pre_only}, {&b->ffc_out, "ff_context.net.2", !b->pre_only},
        };
        for (size_t k = 0; k < sizeof ls / sizeof ls[0]; k++) {
            if (!ls[k].on) continue;
            char name[MMC_MODULE_NAME];
            snprintf(name, sizeof name, "transformer_blocks.%lld.%s", (long long)i, ls[k].name);
            if ((st = mmc_module_list_add(out, ls[k].l, name))) return st;
        }
    }
    if ((st = mmc_module_list_add(out, &m->norm_out, "norm_out.linear"))) return st;
    return mmc_module_list_add(out, &m->proj_out, "proj_out");
}

/* ------------------------------------------------------------------ forward */
/* TimestepEmbedding / PixArtAlphaTextProjection(act silu): linear_2(silu(linear_1(x))) */
static mmc_tensor *mlp2(mmc_ctx *ctx, const mmc_linear_w *l1, const mmc_linear_w *l2, mmc_tensor *x) {
    return mmc_nn_linear(ctx, mmc_silu(ctx, mmc_nn_linear(ctx, x, l1)), l2);
}

/* The k chunks [B, C] of a conditioning projection e [B, k*C] (views of it): torch's chunk(k, 1). */
static void chunks(mmc_ctx *ctx, mmc_tensor *e, int k, mmc_tensor **out) {
    int64_t sizes[9];
    MMC_ASSERT(k <= 9);
    for (int i = 0; i < k; i++) sizes[i] = e->shape[1] / k;
    mmc_split(ctx, e, 1, k, sizes, out);
}

static mmc_tensor *layer_norm(mmc_ctx *ctx, mmc_tensor *x) { return mmc_layernorm(ctx, x, NULL, NULL, SD3_EPS); }

/* q, k or v of one stream: x [B, L, C] -> [B, L, H, D], RMS-normed per head when norm given */
static mmc_tensor *heads(mmc_ctx *ctx, const mmc_sd3 *m, mmc_tensor *x, const mmc_linear_w *l, mmc_tensor *norm) {
    const int64_t H = m->cfg.num_attention_heads, D = m->cfg.attention_head_dim;
    mmc_tensor *y = mmc_reshape(ctx, mmc_nn_linear(ctx, x, l), 4, MMC_SHAPE(x->shape[0], x->shape[1], H, D));
    return norm ? mmc_rmsnorm(ctx, y, norm, SD3_EPS) : y;
}

/* softmax(q k^T / sqrt(D)) v over whole sequences: [B, L, H, D] each -> [B, L, C] */
static mmc_tensor *attend(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v) {
    mmc_attn_opts o = {.causal = false};
    mmc_tensor *a = mmc_attention(ctx, q, k, v, &o);
    return mmc_reshape(ctx, a, 3, MMC_SHAPE(q->shape[0], q->shape[1], q->shape[2] * q->shape[3]));
}

static mmc_tensor *feed_forward(mmc_ctx *ctx, const mmc_linear_w *in, const mmc_linear_w *out, mmc_tensor *h) {
    return mmc_nn_linear(ctx, mmc_gelu_tanh(ctx, mmc_nn_linear(ctx, h, in)), out);
}

/* JointTransformerBlock: x [B, S, C], c [B, T, C] updated in place of the pointers (c becomes NULL
 * after the context_pre_only block, whose context output diffusers discards). */
static void joint_block(mmc_ctx *ctx, const mmc_sd3 *m, const sd3_block *b, mmc_tensor **xp, mmc_tensor **cp,
                        mmc_tensor *temb_act) {
    mmc_tensor *x = *xp, *c = *cp;
    const int64_t S = x->shape[1], T = c->shape[1];
    /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp (, shift_msa2, scale_msa2, gate_msa2) */
    mmc_tensor *e[9], *ec[6];
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1), b->dual ? 9 : 6, e);
    mmc_tensor *n = layer_norm(ctx, x);
    mmc_tensor *nx = mmc_modulate(ctx, n, e[0], e[1]);                          /* [B, S, C] */
    mmc_tensor *nc;                                                              /* [B, T, C] */
    if (b->pre_only) {   /* AdaLayerNormContinuous: (scale, shift) */
        chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1_ctx), 2, ec);
        nc = mmc_modulate(ctx, layer_norm(ctx, c), ec[1], ec[0]);
    } else {
        chunks(ctx, mmc_nn_linear(ctx, temb_act, &b->norm1_ctx), 6, ec);
        nc = mmc_modulate(ctx, layer_norm(ctx, c), ec[0], ec[1]);
    }
    /* JointAttnProcessor2_0 concatenates the image stream first: [x; ctx] */
    mmc_tensor *q[2] = {heads(ctx, m, nx, &b->to_q, b->norm_q), heads(ctx, m, nc, &b->add_q, b->norm_added_q)};
    mmc_tensor *k[2] = {heads(ctx, m, nx, &b->to_k, b->norm_k), heads(ctx, m, nc, &b->add_k, b->norm_added_k)};
    mmc_tensor *v[2] = {heads(ctx, m, nx, &b->to_v, NULL), heads(ctx, m, nc, &b->add_v, NULL)};
    mmc_tensor *a = attend(ctx, mmc_concat(ctx, q, 2, 1), mmc_concat(ctx, k, 2, 1), mmc_concat(ctx, v, 2, 1));
    mmc_tensor *parts[2];                                                        /* [B, S, C], [B, T, C] */
    mmc_split(ctx, a, 1, 2, MMC_SHAPE(S, T), parts);
    x = mmc_gate_residual(ctx, x, e[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[0]), &b->to_out));
    if (b->dual) {   /* attn2 reads the first LN's output with its own modulation, not the updated x */
        mmc_tensor *nx2 = mmc_modulate(ctx, n, e[6], e[7]);
        mmc_tensor *a2 = attend(ctx, heads(ctx, m, nx2, &b->a2_q, b->a2_norm_q),
                                heads(ctx, m, nx2, &b->a2_k, b->a2_norm_k), heads(ctx, m, nx2, &b->a2_v, NULL));
        x = mmc_gate_residual(ctx, x, e[8], mmc_nn_linear(ctx, a2, &b->a2_out));
    }
    mmc_tensor *h = mmc_modulate(ctx, layer_norm(ctx, x), e[3], e[4]);
    x = mmc_gate_residual(ctx, x, e[5], feed_forward(ctx, &b->ff_in, &b->ff_out, h));
    if (b->pre_only) {
        c = NULL;
    } else {
        c = mmc_gate_residual(ctx, c, ec[2], mmc_nn_linear(ctx, mmc_contiguous(ctx, parts[1]), &b->to_add_out));
        h = mmc_modulate(ctx, layer_norm(ctx, c), ec[3], ec[4]);
        c = mmc_gate_residual(ctx, c, ec[5], feed_forward(ctx, &b->ffc_in, &b->ffc_out, h));
    }
    *xp = x, *cp = c;
}

/* PatchEmbed's cropped_pos_embed: rows top..top+h, columns left..left+w of the M x M table, centred
 * (floor), as a constant f32 [1, h*w, C] (the buffer may be stored bf16 / f16) */
static mmc_tensor *cropped_pos_embed(mmc_ctx *ctx, const mmc_sd3 *m, int64_t h, int64_t w) {
    const int64_t M = m->cfg.pos_embed_max_size, C = m->pos_embed->shape[2];
    const int64_t top = (M - h) / 2, left = (M - w) / 2;
    mmc_tensor *pe = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(1, h * w, C));
    const size_t es = mmc_dtype_size(m->pos_embed->dtype);
    for (int64_t i = 0; i < h; i++) {
        const char *src = (const char *)m->pos_embed->data + (size_t)(((top + i) * M + left) * C) * es;
        mmc_convert((float *)pe->data + i * w * C, MMC_F32, src, m->pos_embed->dtype, w * C);
    }
    return pe;
}

static mmc_status check_inputs(const mmc_sd3 *m, const mmc_sd3_inputs *in) {
    const mmc_sd3_config *c = &m->cfg;
    const mmc_tensor *x = in->hidden, *e = in->encoder, *p = in->pooled;
    const int64_t ps = c->patch_size, pm = c->pos_embed_max_size;
    char s[64];
    if (!x || x->ndim != 4 || x->dtype != MMC_F32 || x->shape[1] != c->in_channels || !mmc_is_contiguous(x) ||
        x->shape[0] < 1)
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: hidden_states must be contiguous f32 "
                         "[B, %lld, H, W] (in_channels), got %s", (long long)c->in_channels,
                         x ? mmc_shape_str(x, s, sizeof s) : "none");
    const int64_t B = x->shape[0], H = x->shape[2], W = x->shape[3];
    if (H < ps || W < ps || H % ps || W % ps)
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: hidden_states height %lld and width %lld must be "
                         "positive multiples of patch_size %lld", (long long)H, (long long)W, (long long)ps);
    if (H / ps > pm || W / ps > pm)
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: hidden_states %lldx%lld is %lldx%lld patches, beyond "
                         "pos_embed_max_size %lld (at most %lld latent pixels a side)", (long long)H, (long long)W,
                         (long long)(H / ps), (long long)(W / ps), (long long)pm, (long long)(pm * ps));
    if (!e || e->ndim != 3 || e->dtype != MMC_F32 || e->shape[0] != B || e->shape[1] < 1 ||
        e->shape[2] != c->joint_attention_dim || !mmc_is_contiguous(e))
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: encoder_hidden_states must be contiguous f32 "
                         "[%lld, T, %lld] (joint_attention_dim), got %s", (long long)B,
                         (long long)c->joint_attention_dim, e ? mmc_shape_str(e, s, sizeof s) : "none");
    if (!p || p->ndim != 2 || p->dtype != MMC_F32 || p->shape[0] != B || p->shape[1] != c->pooled_projection_dim ||
        !mmc_is_contiguous(p))
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: pooled_projections must be contiguous f32 "
                         "[%lld, %lld] (pooled_projection_dim), got %s", (long long)B,
                         (long long)c->pooled_projection_dim, p ? mmc_shape_str(p, s, sizeof s) : "none");
    if (!in->timestep) return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: timestep is required");
    if (in->n_skip_layers < 0 || (in->n_skip_layers > 0 && !in->skip_layers))
        return mmc_error(MMC_ERR_INVALID, "SD3Transformer2DModel: skip_layers: %d indices but no array",
                         in->n_skip_layers);
    return MMC_OK;
}

static bool skipped(const mmc_sd3_inputs *in, int64_t i) {
    for (int k = 0; k < in->n_skip_layers; k++)
        if (in->skip_layers[k] == i) return true;
    return false;
}

mmc_status mmc_sd3_forward(mmc_ctx *ctx, mmc_sd3 *m, const mmc_sd3_inputs *in, mmc_tensor **out) {
    *out = NULL;
    mmc_status st = check_inputs(m, in);
    if (st) return st;
    const mmc_sd3_config *c = &m->cfg;
    const int64_t B = in->hidden->shape[0], p = c->patch_size, Co = c->out_channels;
    const int64_t H = in->hidden->shape[2], W = in->hidden->shape[3], h = H / p, w = W / p;
    const int64_t C = c->num_attention_heads * c->attention_head_dim;
    const bool grad = mmc_grad_enabled(ctx);

    /* PatchEmbed: conv stride p, BCHW -> BNC, plus the cropped table */
    mmc_tensor *x = mmc_conv2d(ctx, in->hidden, m->patch_w, m->patch_b, (int)p, 0);   /* [B, C, h, w] */
    x = mmc_contiguous(ctx, mmc_transpose(ctx, mmc_reshape(ctx, x, 3, MMC_SHAPE(B, C, h * w)), 1, 2));
    x = mmc_add(ctx, x, cropped_pos_embed(ctx, m, h, w));                        /* [B, S, C] */

    /* temb [B, C]: Timesteps(256, flip_sin_to_cos, shift 0) on t as given, + pooled text */
    mmc_tensor *tp = mmc_timestep_embedding(ctx, in->timestep, B, 256, true, 0.0, 1.0, 10000.0);
    mmc_tensor *temb = mmc_add(ctx, mlp2(ctx, &m->t_lin1, &m->t_lin2, tp), mlp2(ctx, &m->p_lin1, &m->p_lin2,
                                                                              in->pooled));
    mmc_tensor *temb_act = mmc_silu(ctx, temb);      /* every adaLN linear reads SiLU(temb) */
    mmc_tensor *cx = mmc_nn_linear(ctx, in->encoder, &m->context_embedder);  /* [B, T, C] */

    for (int64_t i = 0; i < c->num_layers; i++) {
        if (skipped(in, i)) continue;   /* skip-layer guidance: both streams pass through */
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        joint_block(ctx, m, &m->blocks[i], &x, &cx, temb_act);
        if (!grad) {
            mmc_tensor *keep[2] = {x, cx};
            mw_keep_n(ctx, mk, cx ? 2 : 1, keep);
            x = keep[0], cx = keep[1];
        }
    }
    mmc_tensor *e[2];   /* norm_out, AdaLayerNormContinuous: (scale, shift) */
    chunks(ctx, mmc_nn_linear(ctx, temb_act, &m->norm_out), 2, e);
    x = mmc_modulate(ctx, layer_norm(ctx, x), e[1], e[0]);
    x = mmc_nn_linear(ctx, x, &m->proj_out);                                   /* [B, S, p*p*Co] */

    /* unpatchify "nhwpqc->nchpwq" in two <= 4-d permutes: (b i)(j)(py)(px c) -> (b i)(py)(j)(px c)
     * is the image in [B, H, W, Co] order, then channels first */
    x = mmc_reshape(ctx, x, 4, MMC_SHAPE(B * h, w, p, p * Co));
    x = mmc_contiguous(ctx, mmc_permute(ctx, x, (const int[]){0, 2, 1, 3}));
    x = mmc_reshape(ctx, x, 3, MMC_SHAPE(B, H * W, Co));
    x = mmc_contiguous(ctx, mmc_transpose(ctx, x, 1, 2));                      /* [B, Co, H*W] */
    *out = mmc_reshape(ctx, x, 4, MMC_SHAPE(B, Co, H, W));
    return MMC_OK;
}
