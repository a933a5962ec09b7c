/* clip_text.c — CLIP's text transformer, mirroring transformers' CLIPTextModel and
 * CLIPTextModelWithProjection (models/clip/modeling_clip.py):
 *
 *   x = token_embedding(ids) + position_embedding(0..T-1)             [B, T, C]
 *   per layer (CLIPEncoderLayer, pre-LN):
 *       x = x + out_proj(attn(layer_norm1(x)))    causal, scale head_dim^-0.5, padding mask if given
 *       x = x + fc2(act(fc1(layer_norm2(x))))     act = hidden_act (quick_gelu for OpenAI's CLIP)
 *   last_hidden_state = final_layer_norm(x)
 *   pooled = last_hidden_state[b, eos position]: argmax(ids) when eos_token_id == 2 (configs
 *            saved before transformers PR #24773, where the EOS is the largest id), else the
 *            first position whose id is eos_token_id
 *   text_embeds = text_projection(pooled)                              [B, P] (WithProjection)
 *
 * hidden_states[-2] (what SDXL and SD3 feed their UNet / transformer) is the last layer's
 * input, before the final LayerNorm. Weight names: "text_model." + the module path (4.x and
 * WithProjection), or without the prefix (a CLIPTextModel saved by transformers 5). */
#include "encoder_common.h"
#include "mmc_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enc_clip_layer clip_layer;

struct mmc_clip_text {
    mmc_clip_text_config cfg;
    mmc_tensor *tok_emb;          /* [V, C] */
    mmc_tensor *pos_emb;          /* [P, C] */
    clip_layer *layers;           /* [num_hidden_layers] */
    mmc_tensor *ln_f_w, *ln_f_b;  /* [C] */
    mmc_linear_w proj;            /* text_projection [projection_dim, C], no bias; w NULL without projection */
    mw_set w;
};

mmc_status mmc_clip_text_config_read(const mmc_json *j, const char *what, mmc_clip_text_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL, *mt = NULL, *arch = NULL;
    /* a full CLIPModel config keeps the text tower under text_config */
    const mmc_json *t = mmc_json_get(j, "text_config");
    if ((st = mmc_json_str(j, "model_type", "clip_text_model", &mt))) return mmc_error_prefix(st, "%s: ", what);
    if (!t || strcmp(mt, "clip") != 0) t = j;
    if ((st = mmc_json_int(t, "vocab_size", 49408, &c->vocab_size)) ||
        (st = mmc_json_int(t, "hidden_size", 512, &c->hidden_size)) ||
        (st = mmc_json_int(t, "intermediate_size", 2048, &c->intermediate_size)) ||
        (st = mmc_json_int(t, "num_hidden_layers", 12, &c->num_hidden_layers)) ||
        (st = mmc_json_int(t, "num_attention_heads", 8, &c->num_attention_heads)) ||
        (st = mmc_json_int(t, "max_position_embeddings", 77, &c->max_position_embeddings)) ||
        (st = mmc_json_int(j, "projection_dim", 512, &c->projection_dim)) ||
        (st = mmc_json_num(t, "layer_norm_eps", 1e-5, &c->layer_norm_eps)) ||
        (st = mmc_json_int(t, "eos_token_id", 2, &c->eos_token_id)) ||
        (st = mmc_json_str(t, "hidden_act", "quick_gelu", &act)) ||
        (st = mmc_json_str(j, "architectures.0", "CLIPTextModel", &arch)))
        return mmc_error_prefix(st, "%s: ", what);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    c->with_projection = strstr(arch, "WithProjection") != NULL;
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->intermediate_size < 1 || c->num_hidden_layers < 1 ||
        c->num_attention_heads < 1 || c->max_position_embeddings < 1 || c->projection_dim < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive", what);
    if (c->hidden_size % c->num_attention_heads)
        return mmc_error(MMC_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", what,
                         (long long)c->hidden_size, (long long)c->num_attention_heads);
    return MMC_OK;
}

void mmc_clip_text_free(mmc_clip_text *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->layers);
    free(m);
}

/* dir holds config.json; the weights are its model.safetensors, or `from` (taken) */
static mmc_status clip_text_load(const char *dir, mmc_st *from, const char *what, bool trainable, mmc_clip_text **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_clip_text *m = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) goto fail;
    m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_clip_text_config_read(j, path, &m->cfg))) goto fail;
    mmc_clip_text_config *c = &m->cfg;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    st = from ? mw_adopt(from, &m->w) : mw_open(dir, "model", &m->w);
    from = NULL;
    if (st) goto fail;
    mw_set *w = &m->w;
    w->trainable = trainable;   /* f32 copies with gradients (contrastive training) */
    const char *pre = mmc_st_find(w->st, "text_model.embeddings.token_embedding.weight") ? "text_model." : "";
    /* the projection is bound where the class says so or the checkpoint has one */
    c->with_projection = c->with_projection || mmc_st_find(w->st, "text_projection.weight");
    const int64_t C = c->hidden_size, F = c->intermediate_size;
    char p[160];
    snprintf(p, sizeof p, "%sembeddings.", pre);
    mw_bind(w, p, "token_embedding.weight", &m->tok_emb, 2, MMC_SHAPE(c->vocab_size, C));
    mw_bind(w, p, "position_embedding.weight", &m->pos_emb, 2, MMC_SHAPE(c->max_position_embeddings, C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        clip_layer *L = &m->layers[i];
        snprintf(p, sizeof p, "%sencoder.layers.%lld.", pre, (long long)i);
        enc_clip_layer_bind(w, p, L, C, F);
    }
    mw_bind(w, pre, "final_layer_norm.weight", &m->ln_f_w, 1, MMC_SHAPE(C));
    mw_bind(w, pre, "final_layer_norm.bias", &m->ln_f_b, 1, MMC_SHAPE(C));
    if (c->with_projection) mw_bind_linear(w, "", "text_projection", &m->proj, c->projection_dim, C, false);
    if ((st = mw_status(w, what, c->with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel")))
        goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    if (from) mmc_st_close(from);
    mmc_json_free(j);
    mmc_clip_text_free(m);
    return st;
}

mmc_status mmc_clip_text_load(const char *dir, mmc_clip_text **out) { return clip_text_load(dir, NULL, dir, false, out); }
mmc_status mmc_clip_text_load_trainable(const char *dir, mmc_clip_text **out) {
    return clip_text_load(dir, NULL, dir, true, out);
}
int mmc_clip_text_params(mmc_clip_text *m, mmc_tensor **params, const char **names, int cap) {
    for (int i = 0; i < m->w.n_params && i < cap; i++) params[i] = m->w.params[i], names[i] = m->w.names[i];
    return m->w.n_params;
}

mmc_status mmc_clip_text_load_st(const char *config_dir, mmc_st *weights, const char *what, mmc_clip_text **out) {
    return clip_text_load(config_dir, weights, what, false, out);
}

mmc_status mmc_clip_text_merge_lora(mmc_clip_text *m, const char *module, const mmc_tensor *A, const mmc_tensor *B,
                                    float scale) {
    const char *bare = strncmp(module, "text_model.", 11) ? module : module + 11;
    mmc_tensor *t = NULL;
    for (int i = 0; i < m->w.n_params && !t; i++) {
        const char *n = m->w.names[i];
        if (!strncmp(n, "text_model.", 11)) n += 11;
        size_t lb = strlen(bare);
        if (!strncmp(n, bare, lb) && !strcmp(n + lb, ".weight")) t = m->w.params[i];
    }
    if (!t || t->ndim != 2)
        return mmc_error(MMC_ERR_NOT_FOUND, "LoRA: '%s' is not a linear of this CLIP text model", module);
    return mmc_lora_merge_tensor(t, A, B, scale, module);
}

mmc_status clip_text_modules(mmc_clip_text *m, const char *prefix, mmc_module_list *ml) {
    mmc_status st = enc_clip_layers_modules(m->layers, m->cfg.num_hidden_layers, prefix, ml);
    return st || !m->proj.w ? st : mmc_module_list_add(ml, &m->proj, "text_projection");
}

const mmc_clip_text_config *mmc_clip_text_cfg(const mmc_clip_text *m) { return &m->cfg; }
int64_t mmc_clip_text_param_count(const mmc_clip_text *m) { return mw_count(&m->w); }

/* CLIPEncoderLayer with the causal mask: x [B, T, C] -> [B, T, C] */
static mmc_tensor *layer_forward(mmc_ctx *ctx, const mmc_clip_text *m, const clip_layer *L, mmc_tensor *x,
                                 const mmc_tensor *mask) {
    return enc_clip_layer_forward(ctx, L, x, m->cfg.num_attention_heads, (float)m->cfg.layer_norm_eps,
                                  m->cfg.hidden_act, true, mask);
}

/* The pooled token's position in row b of ids [B, T] (transformers' two rules). */
static int64_t eos_position(const mmc_clip_text *m, const mmc_tensor *ids, int64_t b) {
    const int64_t T = ids->shape[1];
    int64_t best = 0;
    for (int64_t t = 0; t < T; t++) {
        int64_t id = enc_int_at(ids, b * T + t);
        if (m->cfg.eos_token_id == 2) {
            if (id > enc_int_at(ids, b * T + best)) best = t;      /* argmax: the first maximum */
        } else if (id == m->cfg.eos_token_id) {
            return t;
        }
    }
    return best;   /* no EOS: argmax of an all-zero row is 0 */
}

mmc_status mmc_clip_text_forward(mmc_ctx *ctx, mmc_clip_text *m, const mmc_tensor *ids, const mmc_tensor *mask,
                                 mmc_clip_text_out *out) {
    memset(out, 0, sizeof *out);
    const mmc_clip_text_config *c = &m->cfg;
    mmc_status st = enc_check_inputs(ids, mask, c->vocab_size, c->max_position_embeddings, "CLIPTextModel");
    if (st) return st;
    const int64_t B = ids->shape[0], T = ids->shape[1], C = c->hidden_size;
    /* grad stays as the caller set it: frozen weights record nothing, trainable ones (contrastive
     * training) backpropagate through the tower */
    /* CLIPTextEmbeddings: token + position (position_ids = arange(T)) */
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *x = mmc_add(ctx, mmc_embedding(ctx, m->tok_emb, (mmc_tensor *)ids),
                            mmc_embedding(ctx, m->pos_emb, pos));                        /* [B, T, C] */
    const int L = (int)c->num_hidden_layers;
    /* every layer's output stays: mw_keep drops only what a layer allocates after its mark */
    mmc_tensor **hs = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)(L + 1) * sizeof *hs);
    hs[0] = x;
    for (int i = 0; i < L; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        hs[i + 1] = x = mw_keep(ctx, mk, layer_forward(ctx, m, &m->layers[i], x, mask));
    }
    mmc_tensor *last = mmc_layernorm(ctx, x, m->ln_f_w, m->ln_f_b, (float)c->layer_norm_eps);
    mmc_tensor *eos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(B));
    for (int64_t b = 0; b < B; b++) ((int64_t *)eos->data)[b] = b * T + eos_position(m, ids, b);
    mmc_tensor *pooled = mmc_gather_rows(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, last), 2, MMC_SHAPE(B * T, C)),
                                         eos);                                          /* [B, C] */
    out->last_hidden_state = last;
    out->penultimate = hs[L - 1];
    out->hidden_states = hs;
    out->n_hidden = L + 1;
    out->pooled = pooled;
    out->text_embeds = m->proj.w ? mmc_nn_linear(ctx, pooled, &m->proj) : NULL;       /* [B, P] */
    return MMC_OK;
}
