/* t5.c — T5's encoder, mirroring transformers' T5EncoderModel (models/t5/modeling_t5.py:
 * shared embedding + T5Stack of T5Block with T5LayerSelfAttention and T5LayerFF):
 *
 *   x = shared(ids)                                                    [B, T, d_model]
 *   position_bias [H, T, T] = relative_attention_bias(bucket(k - q))  first block's table,
 *                             shared by every block (has_relative_attention_bias on block 0)
 *   per block:
 *       x = x + o(attn(layer_norm(x)))   scores q k^T + position_bias (NOT scaled by 1/sqrt(d_kv):
 *                                        T5 folds that into its init), padding mask if given
 *       x = x + wo(ffn(layer_norm(x)))   v1.0 "relu": relu(wi x); v1.1 "gated-gelu":
 *                                        gelu_new(wi_0 x) * wi_1 x
 *   last_hidden_state = final_layer_norm(x)
 *
 * UMT5EncoderModel (config model_type "umt5") differs only in the bias: every block has its own
 * relative_attention_bias table and computes its own position bias.
 *
 * T5LayerNorm is an RMS norm: no mean subtraction, no bias, the variance in f32 (mmc_rmsnorm).
 * Heads have d_kv each, so inner_dim = H * d_kv need not equal d_model. Buckets are
 * bidirectional: half the buckets for keys after the query, half of each half exact, the rest
 * logarithmic up to max_distance, computed in f32 as torch does so the boundaries agree.
 * hidden_states[-2] is the last block's input. The fp16 clamping transformers applies to
 * half-precision activations has no counterpart: mmc computes in f32. */
#include "encoder_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_tensor *ln1;                      /* [d_model] layer.0.layer_norm */
    mmc_tensor *q, *k, *v;                /* [H*d_kv, d_model] */
    mmc_tensor *o;                        /* [d_model, H*d_kv] */
    mmc_tensor *ln2;                      /* [d_model] layer.1.layer_norm */
    mmc_tensor *wi, *wi1;                 /* [d_ff, d_model]: wi (relu) or wi_0 (gate), wi_1 */
    mmc_tensor *wo;                       /* [d_model, d_ff] */
} t5_block;

struct mmc_t5_encoder {
    mmc_t5_config cfg;
    mmc_tensor *embed;                    /* [V, d_model] shared (or encoder.embed_tokens) */
    mmc_tensor **rel_bias_w;              /* [n_bias] x [num_buckets, H]: block 0's relative_attention_bias
                                             (T5), or every block's (UMT5) */
    float *rel_bias;                      /* the same tables in f32, [n_bias, num_buckets, H] */
    int64_t n_bias;                       /* 1, or num_layers for UMT5 */
    t5_block *blocks;                     /* [num_layers] */
    mmc_tensor *ln_f;                     /* [d_model] */
    mw_set w;
};

mmc_status mmc_t5_config_read(const mmc_json *j, const char *what, mmc_t5_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *ffp = NULL, *mt = NULL;
    if ((st = mmc_json_str(j, "model_type", "t5", &mt)) ||
        (st = mmc_json_int(j, "vocab_size", 32128, &c->vocab_size)) ||
        (st = mmc_json_int(j, "d_model", 512, &c->d_model)) ||
        (st = mmc_json_int(j, "d_kv", 64, &c->d_kv)) ||
        (st = mmc_json_int(j, "d_ff", 2048, &c->d_ff)) ||
        (st = mmc_json_int(j, "num_layers", 6, &c->num_layers)) ||
        (st = mmc_json_int(j, "num_heads", 8, &c->num_heads)) ||
        (st = mmc_json_int(j, "relative_attention_num_buckets", 32, &c->num_buckets)) ||
        (st = mmc_json_int(j, "relative_attention_max_distance", 128, &c->max_distance)) ||
        (st = mmc_json_num(j, "layer_norm_epsilon", 1e-6, &c->layer_norm_epsilon)) ||
        (st = mmc_json_str(j, "feed_forward_proj", "relu", &ffp)))
        return mmc_error_prefix(st, "%s: ", what);
    c->per_layer_bias = !strcmp(mt, "umt5");
    /* T5Config: "gated-<act>" or "<act>"; "gated-gelu" means gelu_new (backwards compatibility) */
    const char *act = ffp;
    c->gated = strncmp(ffp, "gated-", 6) == 0;
    if (c->gated) act = ffp + 6;
    if (c->gated && !strcmp(act, "gelu")) act = "gelu_new";
    if (!*act || strchr(act, '-'))
        return mmc_error(MMC_ERR_FORMAT, "%s: feed_forward_proj '%s' is not `{ACT_FN}` or `gated-{ACT_FN}`", what, ffp);
    if ((st = mmc_act_parse(act, what, &c->act))) return st;
    if (c->vocab_size < 1 || c->d_model < 1 || c->d_kv < 1 || c->d_ff < 1 || c->num_layers < 1 ||
        c->num_heads < 1 || c->num_buckets < 2 || c->max_distance < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive (relative_attention_num_buckets >= 2)", what);
    return MMC_OK;
}

int mmc_t5_relative_position_bucket(int64_t rel, bool bidirectional, int num_buckets, int max_distance) {
    int bucket = 0;
    if (bidirectional) {
        num_buckets /= 2;
        if (rel > 0) bucket += num_buckets;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int max_exact = num_buckets / 2;
    if (rel < max_exact) return bucket + (int)rel;
    /* torch: log(rel.float() / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact),
     * each step in f32 (the Python scalars are cast to the tensor's dtype), truncated */
    float r = (float)rel / (float)max_exact;
    float v = logf(r) / (float)log((double)max_distance / max_exact) * (float)(num_buckets - max_exact);
    int64_t large = max_exact + (int64_t)v;
    if (large > num_buckets - 1) large = num_buckets - 1;
    return bucket + (int)large;
}

void mmc_t5_encoder_free(mmc_t5_encoder *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->rel_bias);
    free(m->rel_bias_w);
    free(m->blocks);
    free(m);
}

mmc_status mmc_t5_encoder_load(const char *dir, mmc_t5_encoder **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_t5_encoder *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mmc_t5_config_read(j, path, &m->cfg))) goto fail;
    const mmc_t5_config *c = &m->cfg;
    m->n_bias = c->per_layer_bias ? c->num_layers : 1;
    m->blocks = calloc((size_t)c->num_layers, sizeof *m->blocks);
    m->rel_bias = malloc((size_t)(m->n_bias * c->num_buckets * c->num_heads) * sizeof(float));
    m->rel_bias_w = calloc((size_t)m->n_bias, sizeof *m->rel_bias_w);
    if (!m->blocks || !m->rel_bias || !m->rel_bias_w) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "model", &m->w))) goto fail;
    mw_set *w = &m->w;
    const int64_t C = c->d_model, I = c->num_heads * c->d_kv, F = c->d_ff;
    /* T5EncoderModel saves the tied table as shared.weight; some checkpoints only as
     * encoder.embed_tokens.weight */
    bool shared = mmc_st_find(w->st, "shared.weight") || !mmc_st_find(w->st, "encoder.embed_tokens.weight");
    mw_bind(w, "", shared ? "shared.weight" : "encoder.embed_tokens.weight", &m->embed, 2,
             MMC_SHAPE(c->vocab_size, C));
    char p[160];
    for (int64_t i = 0; i < c->num_layers; i++) {
        t5_block *Bk = &m->blocks[i];
        snprintf(p, sizeof p, "encoder.block.%lld.layer.0.", (long long)i);
        mw_bind(w, p, "layer_norm.weight", &Bk->ln1, 1, MMC_SHAPE(C));
        mw_bind(w, p, "SelfAttention.q.weight", &Bk->q, 2, MMC_SHAPE(I, C));
        mw_bind(w, p, "SelfAttention.k.weight", &Bk->k, 2, MMC_SHAPE(I, C));
        mw_bind(w, p, "SelfAttention.v.weight", &Bk->v, 2, MMC_SHAPE(I, C));
        mw_bind(w, p, "SelfAttention.o.weight", &Bk->o, 2, MMC_SHAPE(C, I));
        if (i < m->n_bias)
            mw_bind(w, p, "SelfAttention.relative_attention_bias.weight", &m->rel_bias_w[i], 2,
                     MMC_SHAPE(c->num_buckets, c->num_heads));
        snprintf(p, sizeof p, "encoder.block.%lld.layer.1.", (long long)i);
        mw_bind(w, p, "layer_norm.weight", &Bk->ln2, 1, MMC_SHAPE(C));
        if (c->gated) {
            mw_bind(w, p, "DenseReluDense.wi_0.weight", &Bk->wi, 2, MMC_SHAPE(F, C));
            mw_bind(w, p, "DenseReluDense.wi_1.weight", &Bk->wi1, 2, MMC_SHAPE(F, C));
        } else {
            mw_bind(w, p, "DenseReluDense.wi.weight", &Bk->wi, 2, MMC_SHAPE(F, C));
        }
        mw_bind(w, p, "DenseReluDense.wo.weight", &Bk->wo, 2, MMC_SHAPE(C, F));
    }
    mw_bind(w, "", "encoder.final_layer_norm.weight", &m->ln_f, 1, MMC_SHAPE(C));
    if ((st = mw_status(w, dir, c->per_layer_bias ? "UMT5EncoderModel" : "T5EncoderModel"))) goto fail;
    for (int64_t l = 0, nb = c->num_buckets * c->num_heads; l < m->n_bias; l++)
        for (int64_t i = 0; i < nb; i++) m->rel_bias[l * nb + i] = (float)mmc_get_flat(m->rel_bias_w[l], i);
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_t5_encoder_free(m);
    return st;
}

const mmc_t5_config *mmc_t5_encoder_cfg(const mmc_t5_encoder *m) { return &m->cfg; }
int64_t mmc_t5_encoder_param_count(const mmc_t5_encoder *m) { return mw_count(&m->w); }

/* T5Attention.compute_bias of table l: values_{h, t, s} depend on s - t only -> [H, 2T - 1] f32
 * with entry (h, s - t + T - 1) (scratch owned by the caller's mark) */
static float *compute_bias(mmc_ctx *ctx, const mmc_t5_encoder *m, int64_t T, int64_t l) {
    const int64_t H = m->cfg.num_heads, R = 2 * T - 1;
    const float *table = m->rel_bias + l * m->cfg.num_buckets * H;
    float *bias = mmc_scratch_alloc(ctx, (size_t)(H * R) * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        int bk = mmc_t5_relative_position_bucket(r - (T - 1), true, (int)m->cfg.num_buckets, (int)m->cfg.max_distance);
        for (int64_t h = 0; h < H; h++) bias[h * R + r] = table[bk * H + h];
    }
    return bias;
}

/* T5LayerSelfAttention: x [B, T, d_model] -> x + o(attn(layer_norm(x))) */
static mmc_tensor *self_attention(mmc_ctx *ctx, const mmc_t5_encoder *m, const t5_block *Bk, mmc_tensor *x,
                                  const mmc_tensor *mask, const float *bias) {
    const mmc_t5_config *c = &m->cfg;
    const int64_t B = x->shape[0], T = x->shape[1], H = c->num_heads, D = c->d_kv;
    mmc_tensor *h = mmc_rmsnorm(ctx, x, Bk->ln1, (float)c->layer_norm_epsilon);
    mmc_tensor *q = mmc_reshape(ctx, mmc_linear(ctx, h, Bk->q, NULL), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *k = mmc_reshape(ctx, mmc_linear(ctx, h, Bk->k, NULL), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *v = mmc_reshape(ctx, mmc_linear(ctx, h, Bk->v, NULL), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *o = enc_attention(ctx, q, k, v, 1.0f, false, mask, bias);               /* [B, T, H, D] */
    o = mmc_linear(ctx, mmc_reshape(ctx, o, 3, MMC_SHAPE(B, T, H * D)), Bk->o, NULL);
    return mmc_add(ctx, x, o);
}

/* T5LayerFF: x + wo(DenseActDense / DenseGatedActDense(layer_norm(x))) */
static mmc_tensor *feed_forward(mmc_ctx *ctx, const mmc_t5_encoder *m, const t5_block *Bk, mmc_tensor *x) {
    const mmc_t5_config *c = &m->cfg;
    mmc_tensor *h = mmc_rmsnorm(ctx, x, Bk->ln2, (float)c->layer_norm_epsilon);
    mmc_tensor *a = enc_act(ctx, c->act, mmc_linear(ctx, h, Bk->wi, NULL));             /* [B, T, d_ff] */
    if (c->gated) a = mmc_mul(ctx, a, mmc_linear(ctx, h, Bk->wi1, NULL));
    return mmc_add(ctx, x, mmc_linear(ctx, a, Bk->wo, NULL));
}

mmc_status mmc_t5_encoder_forward(mmc_ctx *ctx, mmc_t5_encoder *m, const mmc_tensor *ids, const mmc_tensor *mask,
                                  mmc_tensor **last_hidden_state, mmc_tensor **penultimate) {
    *last_hidden_state = NULL;
    if (penultimate) *penultimate = NULL;
    const mmc_t5_config *c = &m->cfg;
    mmc_status st = enc_check_inputs(ids, mask, c->vocab_size, 0, "T5EncoderModel");
    if (st) return st;
    const int64_t T = ids->shape[1];
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_arena_mark sm = mmc_scratch_mark(ctx);
    const float *bias = compute_bias(ctx, m, T, 0);                                      /* [H, 2T - 1] */
    mmc_tensor *x = mmc_embedding(ctx, m->embed, (mmc_tensor *)ids);                     /* [B, T, d_model] */
    mmc_tensor *pen = x;
    for (int64_t i = 0; i < c->num_layers; i++) {
        pen = x;
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        if (i > 0 && i < m->n_bias) bias = compute_bias(ctx, m, T, i);                  /* UMT5: this block's */
        mmc_tensor *y = self_attention(ctx, m, &m->blocks[i], x, mask, bias);
        x = mw_keep(ctx, mk, feed_forward(ctx, m, &m->blocks[i], y));
    }
    *last_hidden_state = mmc_rmsnorm(ctx, x, m->ln_f, (float)c->layer_norm_epsilon);
    if (penultimate) *penultimate = pen;
    mmc_scratch_release(ctx, sm);
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}
