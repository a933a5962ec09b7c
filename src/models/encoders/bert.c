/* bert.c — BERT's encoder, mirroring transformers' BertModel (models/bert/modeling_bert.py:
 * BertEmbeddings, BertLayer = BertAttention + BertIntermediate + BertOutput), the first text
 * encoder of HunyuanDiT (a Chinese BERT / RoBERTa-wwm in BERT layout):
 *
 *   x = LN(word_embeddings(ids) + position_embeddings(0..T-1) + token_type_embeddings(0))   [B, T, C]
 *   per layer (post-LN):
 *       x = LN(x + dense(attn(x)))            q, k, v with biases, scale head_dim^-0.5, key padding mask
 *       x = LN(x + dense(act(dense(x))))      act = hidden_act ("gelu": the erf form)
 *   last_hidden_state = x
 *
 * token_type_ids are all 0 (the buffer transformers uses when none are passed, as
 * HunyuanDiTPipeline does); position_embedding_type "absolute" only. The pooler (dense + tanh
 * on the first token) is bound, as the checkpoint holds it, but not computed: the pipeline reads
 * last_hidden_state. Inference only. */
#include "encoder_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b;   /* [C, C], [C] */
    mmc_tensor *ao_w, *ao_b, *ln1_w, *ln1_b;         /* attention.output.dense, .LayerNorm */
    mmc_tensor *i_w, *i_b;                           /* intermediate.dense [F, C] */
    mmc_tensor *o_w, *o_b, *ln2_w, *ln2_b;           /* output.dense [C, F], .LayerNorm */
} bert_layer;

struct mmc_bert {
    mmc_bert_config cfg;
    mmc_tensor *word, *pos, *type;                   /* [V, C], [P, C], [types, C] */
    mmc_tensor *ln_w, *ln_b;                         /* embeddings.LayerNorm */
    bert_layer *layers;
    mmc_tensor *pool_w, *pool_b;                     /* pooler.dense, bound only */
    mw_set w;
};

mmc_status mmc_bert_config_read(const mmc_json *j, const char *what, mmc_bert_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL, *pet = NULL;
    if ((st = mmc_json_int(j, "vocab_size", 30522, &c->vocab_size)) ||
        (st = mmc_json_int(j, "hidden_size", 768, &c->hidden_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 12, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 12, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "intermediate_size", 3072, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "max_position_embeddings", 512, &c->max_position_embeddings)) ||
        (st = mmc_json_int(j, "type_vocab_size", 2, &c->type_vocab_size)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-12, &c->layer_norm_eps)) ||
        (st = mmc_json_str(j, "hidden_act", "gelu", &act)) ||
        (st = mmc_json_str(j, "position_embedding_type", "absolute", &pet)))
        return mmc_error_prefix(st, "%s: ", what);
    if (strcmp(pet, "absolute") != 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: position_embedding_type \"%s\": only \"absolute\" is supported",
                         what, pet);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->num_hidden_layers < 1 || c->num_attention_heads < 1 ||
        c->intermediate_size < 1 || c->max_position_embeddings < 1 || c->type_vocab_size < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive", what);
    if (c->hidden_size % c->num_attention_heads)
        return mmc_error(MMC_ERR_FORMAT, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld", what,
                         (long long)c->hidden_size, (long long)c->num_attention_heads);
    return MMC_OK;
}

void mmc_bert_free(mmc_bert *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->layers);
    free(m);
}

mmc_status mmc_bert_load(const char *dir, mmc_bert **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_bert *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_bert_config_read(j, path, &m->cfg))) goto fail;
    const mmc_bert_config *c = &m->cfg;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "model", &m->w))) goto fail;
    mw_set *w = &m->w;
    const int64_t C = c->hidden_size, F = c->intermediate_size;
    /* BertModel saves without a prefix; a checkpoint of a task head (BertForMaskedLM...) under "bert." */
    const char *root = mmc_st_find(w->st, "bert.embeddings.word_embeddings.weight") ? "bert." : "";
    char p[160];
    snprintf(p, sizeof p, "%sembeddings.", root);
    mw_bind(w, p, "word_embeddings.weight", &m->word, 2, MMC_SHAPE(c->vocab_size, C));
    mw_bind(w, p, "position_embeddings.weight", &m->pos, 2, MMC_SHAPE(c->max_position_embeddings, C));
    mw_bind(w, p, "token_type_embeddings.weight", &m->type, 2, MMC_SHAPE(c->type_vocab_size, C));
    mw_bind_wb(w, p, "LayerNorm", &m->ln_w, &m->ln_b, 1, MMC_SHAPE(C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        bert_layer *L = &m->layers[i];
        snprintf(p, sizeof p, "%sencoder.layer.%lld.", root, (long long)i);
        mw_bind_wb(w, p, "attention.self.query", &L->q_w, &L->q_b, 2, MMC_SHAPE(C, C));
        mw_bind_wb(w, p, "attention.self.key", &L->k_w, &L->k_b, 2, MMC_SHAPE(C, C));
        mw_bind_wb(w, p, "attention.self.value", &L->v_w, &L->v_b, 2, MMC_SHAPE(C, C));
        mw_bind_wb(w, p, "attention.output.dense", &L->ao_w, &L->ao_b, 2, MMC_SHAPE(C, C));
        mw_bind_wb(w, p, "attention.output.LayerNorm", &L->ln1_w, &L->ln1_b, 1, MMC_SHAPE(C));
        mw_bind_wb(w, p, "intermediate.dense", &L->i_w, &L->i_b, 2, MMC_SHAPE(F, C));
        mw_bind_wb(w, p, "output.dense", &L->o_w, &L->o_b, 2, MMC_SHAPE(C, F));
        mw_bind_wb(w, p, "output.LayerNorm", &L->ln2_w, &L->ln2_b, 1, MMC_SHAPE(C));
    }
    snprintf(p, sizeof p, "%spooler.", root);
    if (mmc_st_find(w->st, "pooler.dense.weight") || mmc_st_find(w->st, "bert.pooler.dense.weight"))
        mw_bind_wb(w, p, "dense", &m->pool_w, &m->pool_b, 2, MMC_SHAPE(C, C));
    if ((st = mw_status(w, dir, "BertModel"))) goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_bert_free(m);
    return st;
}

const mmc_bert_config *mmc_bert_cfg(const mmc_bert *m) { return &m->cfg; }
int64_t mmc_bert_param_count(const mmc_bert *m) { return mw_count(&m->w); }

static mmc_tensor *bert_layer_forward(mmc_ctx *ctx, const mmc_bert *m, const bert_layer *L, mmc_tensor *x,
                                      const mmc_tensor *mask) {
    const mmc_bert_config *c = &m->cfg;
    const int64_t B = x->shape[0], T = x->shape[1], H = c->num_attention_heads, D = c->hidden_size / H;
    const float eps = (float)c->layer_norm_eps;
    mmc_tensor *q = mmc_reshape(ctx, mmc_linear(ctx, x, L->q_w, L->q_b), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *k = mmc_reshape(ctx, mmc_linear(ctx, x, L->k_w, L->k_b), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *v = mmc_reshape(ctx, mmc_linear(ctx, x, L->v_w, L->v_b), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *a = enc_attention(ctx, q, k, v, 1.0f / sqrtf((float)D), false, mask, NULL);   /* [B, T, H, D] */
    a = mmc_linear(ctx, mmc_reshape(ctx, a, 3, MMC_SHAPE(B, T, H * D)), L->ao_w, L->ao_b);
    x = mmc_layernorm(ctx, mmc_add(ctx, x, a), L->ln1_w, L->ln1_b, eps);
    mmc_tensor *h = enc_act(ctx, c->hidden_act, mmc_linear(ctx, x, L->i_w, L->i_b));       /* [B, T, F] */
    h = mmc_linear(ctx, h, L->o_w, L->o_b);
    return mmc_layernorm(ctx, mmc_add(ctx, x, h), L->ln2_w, L->ln2_b, eps);
}

mmc_status mmc_bert_forward(mmc_ctx *ctx, mmc_bert *m, const mmc_tensor *ids, const mmc_tensor *mask,
                            mmc_tensor **last_hidden_state) {
    *last_hidden_state = NULL;
    const mmc_bert_config *c = &m->cfg;
    mmc_status st = enc_check_inputs(ids, mask, c->vocab_size, c->max_position_embeddings, "BertModel");
    if (st) return st;
    const int64_t B = ids->shape[0], T = ids->shape[1], C = c->hidden_size;
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *x = mmc_embedding(ctx, m->word, (mmc_tensor *)ids);                     /* [B, T, C] */
    mmc_tensor *pos = mmc_narrow(ctx, m->pos, 0, 0, T);                                 /* [T, C] */
    x = mmc_add(ctx, x, pos);
    mmc_tensor *type0 = mmc_reshape(ctx, mmc_narrow(ctx, m->type, 0, 0, 1), 2, MMC_SHAPE(1, C));
    x = mmc_add(ctx, x, type0);
    x = mmc_layernorm(ctx, x, m->ln_w, m->ln_b, (float)c->layer_norm_eps);
    (void)B;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        x = mw_keep(ctx, mk, bert_layer_forward(ctx, m, &m->layers[i], x, mask));
    }
    *last_hidden_state = x;
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}
