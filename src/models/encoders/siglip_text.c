/* siglip_text.c — SigLIP's text tower, mirroring transformers' SiglipTextTransformer
 * (models/siglip/modeling_siglip.py: SiglipTextEmbeddings, SiglipEncoder, final_layer_norm, head):
 *
 *   x = token_embedding(ids) + position_embedding(0 .. T-1)              [B, T, C]
 *   per layer (SiglipEncoderLayer = CLIP's layer, encoder_common.c), NO causal mask: the
 *       attention_mask only hides padded keys (create_bidirectional_mask), none when absent
 *   last_hidden_state = final_layer_norm(x)
 *   pooler_output = head(last_hidden_state[:, -1])   the LAST position, whatever it holds: SigLIP
 *       was trained on texts padded to 64 tokens, so that is a pad (= </s>) token        [B, P]
 * Inference only (grad off inside). */
#include "siglip_text.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

mmc_status siglip_text_config_read(const mmc_json *j, const char *what, siglip_text_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL;
    /* SiglipTextConfig's defaults */
    if ((st = mmc_json_int(j, "vocab_size", 32000, &c->vocab_size)) ||
        (st = mmc_json_int(j, "hidden_size", 768, &c->hidden_size)) ||
        (st = mmc_json_int(j, "intermediate_size", 3072, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 12, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 12, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "max_position_embeddings", 64, &c->max_position_embeddings)) ||
        (st = mmc_json_int(j, "projection_size", 0, &c->projection_size)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-6, &c->layer_norm_eps)) ||
        (st = mmc_json_str(j, "hidden_act", "gelu_pytorch_tanh", &act)))
        return mmc_error_prefix(st, "%s: text_config", what);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    if (c->projection_size == 0) c->projection_size = c->hidden_size;   /* None: hidden_size */
    const int64_t v[] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
                         c->num_attention_heads, c->max_position_embeddings, c->projection_size};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i] < 1 || v[i] > MMC_CONFIG_MAX_DIM)
            return mmc_error(MMC_ERR_FORMAT, "%s: text_config sizes must be from 1 to %lld", what,
                             (long long)MMC_CONFIG_MAX_DIM);
    if (c->hidden_size % c->num_attention_heads)
        return mmc_error(MMC_ERR_FORMAT, "%s: text_config.hidden_size %lld is not a multiple of num_attention_heads "
                         "%lld", what, (long long)c->hidden_size, (long long)c->num_attention_heads);
    return MMC_OK;
}

siglip_text *siglip_text_bind(mw_set *w, const char *prefix, const siglip_text_config *c) {
    siglip_text *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->cfg = *c;
    t->layers = calloc((size_t)c->num_hidden_layers, sizeof *t->layers);
    if (!t->layers) { free(t); return NULL; }
    const int64_t C = c->hidden_size, F = c->intermediate_size;
    char pre[256];
    snprintf(pre, sizeof pre, "%sembeddings.", prefix);
    mw_bind(w, pre, "token_embedding.weight", &t->tok_emb, 2, MMC_SHAPE(c->vocab_size, C));
    mw_bind(w, pre, "position_embedding.weight", &t->pos_emb, 2, MMC_SHAPE(c->max_position_embeddings, C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        snprintf(pre, sizeof pre, "%sencoder.layers.%lld.", prefix, (long long)i);
        enc_clip_layer_bind(w, pre, &t->layers[i], C, F);
    }
    mw_bind_wb(w, prefix, "final_layer_norm", &t->ln_f_w, &t->ln_f_b, 1, MMC_SHAPE(C));
    mw_bind_linear(w, prefix, "head", &t->head, c->projection_size, C, true);
    return t;
}

void siglip_text_free(siglip_text *t) {
    if (!t) return;
    free(t->layers);
    free(t);
}

/* SiglipEncoderLayer with the padding mask, differentiable (training): each row's queries attend to its
 * unmasked keys (a prefix of n_real ids, as padding="max_length" makes), one mmc_attention per row.
 * Same math as enc_clip_layer_forward(causal false, mask), whose masked kernel has no backward. */
static mmc_tensor *layer_masked_grad(mmc_ctx *ctx, const enc_clip_layer *L, mmc_tensor *x, int64_t H, float eps,
                                     mmc_act act, const mmc_tensor *mask) {
    const int64_t B = x->shape[0], T = x->shape[1], C = x->shape[2], D = C / H;
    mmc_tensor *h = mmc_layernorm(ctx, x, L->ln1_w, L->ln1_b, eps);
    mmc_tensor *q = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->q), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *k = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->k), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *v = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->v), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor **rows = mmc_arena_alloc(mmc_ctx_arena(ctx), (size_t)B * sizeof *rows);
    mmc_attn_opts opts = {.causal = false, .scale = (float)(1.0 / sqrt((double)D))};
    for (int64_t b = 0; b < B; b++) {
        int64_t n = 0;
        for (int64_t t = 0; t < T; t++) n = enc_int_at(mask, b * T + t) ? t + 1 : n;
        if (n == 0) n = T;   /* an all-masked row: the kernel's uniform weights over every key */
        mmc_tensor *qb = mmc_contiguous(ctx, mmc_narrow(ctx, q, 0, b, 1));                      /* [1, T, H, D] */
        mmc_tensor *kb = mmc_contiguous(ctx, mmc_narrow(ctx, mmc_narrow(ctx, k, 0, b, 1), 1, 0, n));   /* [1, n, H, D] */
        mmc_tensor *vb = mmc_contiguous(ctx, mmc_narrow(ctx, mmc_narrow(ctx, v, 0, b, 1), 1, 0, n));
        rows[b] = mmc_attention(ctx, qb, kb, vb, &opts);                                         /* [1, T, H, D] */
    }
    mmc_tensor *o = B == 1 ? rows[0] : mmc_concat(ctx, rows, (int)B, 0);                        /* [B, T, H, D] */
    x = mmc_add(ctx, x, mmc_nn_linear(ctx, mmc_reshape(ctx, o, 3, MMC_SHAPE(B, T, C)), &L->o));
    h = mmc_layernorm(ctx, x, L->ln2_w, L->ln2_b, eps);
    h = enc_act(ctx, act, mmc_nn_linear(ctx, h, &L->fc1));                                      /* [B, T, F] */
    return mmc_add(ctx, x, mmc_nn_linear(ctx, h, &L->fc2));
}

mmc_status siglip_text_forward(mmc_ctx *ctx, const siglip_text *t, const mmc_tensor *ids, const mmc_tensor *mask,
                               mmc_tensor **pooled) {
    *pooled = NULL;
    const siglip_text_config *c = &t->cfg;
    mmc_status st = enc_check_inputs(ids, mask, c->vocab_size, c->max_position_embeddings, "SiglipTextModel");
    if (st) return st;
    const int64_t B = ids->shape[0], T = ids->shape[1], C = c->hidden_size;
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t i = 0; i < T; i++) ((int64_t *)pos->data)[i] = i;
    mmc_tensor *x = mmc_add(ctx, mmc_embedding(ctx, t->tok_emb, (mmc_tensor *)ids),
                            mmc_embedding(ctx, t->pos_emb, pos));                        /* [B, T, C] */
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        const enc_clip_layer *L = &t->layers[i];
        x = mask && mmc_grad_enabled(ctx) && (enc_clip_layer_trainable(L) || mmc_requires_grad(x))
                ? layer_masked_grad(ctx, L, x, c->num_attention_heads, (float)c->layer_norm_eps, c->hidden_act, mask)
                : mw_keep(ctx, mk, enc_clip_layer_forward(ctx, L, x, c->num_attention_heads, (float)c->layer_norm_eps,
                                                          c->hidden_act, false, mask));
    }
    /* the last position of each row, then the final LayerNorm (per token, so the order does not matter) */
    mmc_tensor *last = mmc_contiguous(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, x, 1, T - 1, 1)), 2,
                                                       MMC_SHAPE(B, C)));                /* [B, C] */
    last = mmc_layernorm(ctx, last, t->ln_f_w, t->ln_f_b, (float)c->layer_norm_eps);
    *pooled = mmc_contiguous(ctx, mmc_nn_linear(ctx, last, &t->head));          /* [B, P] */
    return MMC_OK;
}
