/* whisper.c — Whisper's encoder-decoder, mirroring transformers' WhisperForConditionalGeneration
 * (models/whisper/modeling_whisper.py: WhisperEncoder, WhisperDecoder, WhisperAttention), for
 * inference on CPU:
 *
 *   encoder, over one window of features [n_mels, F] (F = 2 * max_source_positions):
 *     x = gelu(conv1(feats))          Conv1d(n_mels, C, k=3, pad=1)            [F, C]
 *     x = gelu(conv2(x))              Conv1d(C, C, k=3, stride=2, pad=1)       [P, C]
 *     x = x + embed_positions         the stored table (sinusoids in released checkpoints)
 *     per layer (pre-LN): x += out_proj(attn(self_attn_layer_norm(x)))
 *                         x += fc2(act(fc1(final_layer_norm(x))))
 *     last_hidden_state = layer_norm(x)                                        [P, C]
 *   decoder, over tokens after `past` cached ones:
 *     x = embed_tokens(ids) * embed_scale + embed_positions[past .. past + n]  [n, C]
 *     per layer: x += self_attn(self_attn_layer_norm(x))        causal, KV cache
 *                x += encoder_attn(encoder_attn_layer_norm(x))  keys/values from the encoder
 *                                                               output, computed once per window
 *                x += fc2(act(fc1(final_layer_norm(x))))
 *     logits = proj_out(layer_norm(x))        proj_out tied to embed_tokens unless stored
 *   attention: q = q_proj(x) * head_dim^-0.5 (scaled before the product, as WhisperAttention
 *   does), k_proj has no bias, softmax(q k^T) v over heads of head_dim = C / heads.
 *
 * The convolutions are im2col + one GEMM each (mmc_linear): with the time axis outermost the
 * result is already the [P, C] layout the transformer wants (HF transposes after conv2). */
#include "mmc_whisper.h"

#include "../encoders/encoder_common.h"
#include "../model_weights.h"
#include "mmc_encoders.h"
#include "mmc_io.h"
#include "mmc_models.h"
#include "mmc_nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_tensor *ln_w, *ln_b;           /* [C] */
    mmc_linear_w q, k, v, o;           /* [C, C]; k without bias */
} wh_attn;

typedef struct {
    wh_attn self;
    wh_attn cross;                     /* decoder only */
    mmc_tensor *ffn_ln_w, *ffn_ln_b;   /* [C] final_layer_norm */
    mmc_linear_w fc1, fc2;             /* [Fd, C], [C, Fd] */
} wh_layer;

struct mmc_whisper {
    mmc_whisper_config cfg;
    mmc_tensor *conv1_w, *conv1_b;     /* [C, n_mels, 3], [C] */
    mmc_tensor *conv2_w, *conv2_b;     /* [C, C, 3], [C] */
    mmc_tensor *enc_pos;               /* [P, C] */
    wh_layer *enc;                     /* [encoder_layers] */
    mmc_tensor *enc_ln_w, *enc_ln_b;   /* [C] */
    mmc_tensor *tok_emb;               /* [V, C] */
    mmc_tensor *dec_pos;               /* [max_target_positions, C] */
    wh_layer *dec;                     /* [decoder_layers] */
    mmc_tensor *dec_ln_w, *dec_ln_b;   /* [C] */
    mmc_tensor *proj;                  /* [V, C]: proj_out.weight, or tok_emb (tied) */
    mw_set w;
};

static mmc_status config_read(const mmc_json *j, const char *what, mmc_whisper_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL;
    if ((st = mmc_json_int(j, "vocab_size", 51865, &c->vocab_size)) ||
        (st = mmc_json_int(j, "num_mel_bins", 80, &c->num_mel_bins)) ||
        (st = mmc_json_int(j, "d_model", 384, &c->d_model)) ||
        (st = mmc_json_int(j, "encoder_layers", 4, &c->encoder_layers)) ||
        (st = mmc_json_int(j, "encoder_attention_heads", 6, &c->encoder_attention_heads)) ||
        (st = mmc_json_int(j, "encoder_ffn_dim", 1536, &c->encoder_ffn_dim)) ||
        (st = mmc_json_int(j, "decoder_layers", 4, &c->decoder_layers)) ||
        (st = mmc_json_int(j, "decoder_attention_heads", 6, &c->decoder_attention_heads)) ||
        (st = mmc_json_int(j, "decoder_ffn_dim", 1536, &c->decoder_ffn_dim)) ||
        (st = mmc_json_int(j, "max_source_positions", 1500, &c->max_source_positions)) ||
        (st = mmc_json_int(j, "max_target_positions", 448, &c->max_target_positions)) ||
        (st = mmc_json_int(j, "decoder_start_token_id", 50257, &c->decoder_start_token_id)) ||
        (st = mmc_json_bool(j, "scale_embedding", false, &c->scale_embedding)) ||
        (st = mmc_json_str(j, "activation_function", "gelu", &act)))
        return mmc_error_prefix(st, "%s: ", what);
    if ((st = mmc_act_parse(act, what, &c->activation_function))) return st;
    if (c->vocab_size < 1 || c->num_mel_bins < 1 || c->d_model < 1 || c->encoder_layers < 0 || c->decoder_layers < 0 ||
        c->encoder_attention_heads < 1 || c->decoder_attention_heads < 1 || c->encoder_ffn_dim < 1 ||
        c->decoder_ffn_dim < 1 || c->max_source_positions < 1 || c->max_target_positions < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: sizes must be positive", what);
    if (c->d_model % c->encoder_attention_heads || c->d_model % c->decoder_attention_heads)
        return mmc_error(MMC_ERR_FORMAT, "%s: d_model %lld is not a multiple of the attention heads (%lld, %lld)", what,
                         (long long)c->d_model, (long long)c->encoder_attention_heads,
                         (long long)c->decoder_attention_heads);
    return MMC_OK;
}

static void bind_attn(mw_set *w, const char *pre, const char *name, const char *ln, wh_attn *a, int64_t C) {
    char p[256];
    snprintf(p, sizeof p, "%s%s.", pre, name);
    mw_bind_linear(w, p, "q_proj", &a->q, C, C, true);
    mw_bind_linear(w, p, "k_proj", &a->k, C, C, false);
    mw_bind_linear(w, p, "v_proj", &a->v, C, C, true);
    mw_bind_linear(w, p, "out_proj", &a->o, C, C, true);
    mw_bind_wb(w, pre, ln, &a->ln_w, &a->ln_b, 1, MMC_SHAPE(C));
}

static void bind_layer(mw_set *w, const char *pre, wh_layer *L, int64_t C, int64_t F, bool cross) {
    bind_attn(w, pre, "self_attn", "self_attn_layer_norm", &L->self, C);
    if (cross) bind_attn(w, pre, "encoder_attn", "encoder_attn_layer_norm", &L->cross, C);
    mw_bind_wb(w, pre, "final_layer_norm", &L->ffn_ln_w, &L->ffn_ln_b, 1, MMC_SHAPE(C));
    mw_bind_linear(w, pre, "fc1", &L->fc1, F, C, true);
    mw_bind_linear(w, pre, "fc2", &L->fc2, C, F, true);
}

void mmc_whisper_free(mmc_whisper *m) {
    if (!m) return;
    mw_close(&m->w);
    free(m->enc);
    free(m->dec);
    free(m);
}

mmc_status mmc_whisper_load(const char *dir, mmc_whisper **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_load(path, &j);
    if (st) return st;
    mmc_whisper *m = calloc(1, sizeof *m);
    if (!m) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    const char *mt = NULL;
    if ((st = mmc_json_str(j, "model_type", "", &mt))) goto fail;
    if (strcmp(mt, "whisper") != 0) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not whisper", path, mt);
        goto fail;
    }
    if ((st = config_read(j, path, &m->cfg))) goto fail;
    const mmc_whisper_config *c = &m->cfg;
    m->enc = calloc((size_t)c->encoder_layers + 1, sizeof *m->enc);
    m->dec = calloc((size_t)c->decoder_layers + 1, sizeof *m->dec);
    if (!m->enc || !m->dec) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_open(dir, "model", &m->w))) goto fail;
    mw_set *w = &m->w;
    /* WhisperForConditionalGeneration: "model." + the WhisperModel's names; a bare WhisperModel
     * saves them without the prefix */
    const char *pre = mmc_st_find(w->st, "model.encoder.conv1.weight") ? "model." : "";
    const int64_t C = c->d_model, M = c->num_mel_bins;
    char p[256];
    snprintf(p, sizeof p, "%sencoder.", pre);
    mw_bind_wb(w, p, "conv1", &m->conv1_w, &m->conv1_b, 3, MMC_SHAPE(C, M, 3));
    mw_bind_wb(w, p, "conv2", &m->conv2_w, &m->conv2_b, 3, MMC_SHAPE(C, C, 3));
    mw_bind(w, p, "embed_positions.weight", &m->enc_pos, 2, MMC_SHAPE(c->max_source_positions, C));
    mw_bind_wb(w, p, "layer_norm", &m->enc_ln_w, &m->enc_ln_b, 1, MMC_SHAPE(C));
    for (int64_t i = 0; i < c->encoder_layers; i++) {
        snprintf(p, sizeof p, "%sencoder.layers.%lld.", pre, (long long)i);
        bind_layer(w, p, &m->enc[i], C, c->encoder_ffn_dim, false);
    }
    snprintf(p, sizeof p, "%sdecoder.", pre);
    mw_bind(w, p, "embed_tokens.weight", &m->tok_emb, 2, MMC_SHAPE(c->vocab_size, C));
    mw_bind(w, p, "embed_positions.weight", &m->dec_pos, 2, MMC_SHAPE(c->max_target_positions, C));
    mw_bind_wb(w, p, "layer_norm", &m->dec_ln_w, &m->dec_ln_b, 1, MMC_SHAPE(C));
    for (int64_t i = 0; i < c->decoder_layers; i++) {
        snprintf(p, sizeof p, "%sdecoder.layers.%lld.", pre, (long long)i);
        bind_layer(w, p, &m->dec[i], C, c->decoder_ffn_dim, true);
    }
    if (mmc_st_find(w->st, "proj_out.weight")) mw_bind(w, "", "proj_out.weight", &m->proj, 2, MMC_SHAPE(c->vocab_size, C));
    else m->proj = m->tok_emb;
    if ((st = mw_status(w, dir, "WhisperForConditionalGeneration"))) goto fail;
    mmc_json_free(j);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(j);
    mmc_whisper_free(m);
    return st;
}

const mmc_whisper_config *mmc_whisper_cfg(const mmc_whisper *m) { return &m->cfg; }
int64_t mmc_whisper_param_count(const mmc_whisper *m) { return mw_count(&m->w); }

/* ------------------------------------------------------------------ encoder */

/* Conv1d(k=3, padding=1, stride s) as im2col + GEMM. x is time-major when tmajor ([Tin, Cin]),
 * else channel-major ([Cin, Tin], the features' layout); w [Cout, Cin, 3] -> y [Tout, Cout]. */
static mmc_tensor *conv1d_k3(mmc_ctx *ctx, const float *x, bool tmajor, int64_t Cin, int64_t Tin, int stride,
                             mmc_tensor *w, mmc_tensor *b) {
    const int64_t Tout = (Tin + 2 - 3) / stride + 1, K = Cin * 3;
    mmc_tensor *col = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(Tout, K));        /* [Tout, Cin * 3] */
    float *cd = col->data;
#pragma omp parallel for schedule(static) if (Tout * K > 65536)
    for (int64_t t = 0; t < Tout; t++) {
        float *row = cd + t * K;
        for (int j = 0; j < 3; j++) {
            int64_t s = t * stride + j - 1;
            bool in = s >= 0 && s < Tin;
            for (int64_t c = 0; c < Cin; c++)
                row[c * 3 + j] = !in ? 0.0f : tmajor ? x[s * Cin + c] : x[c * Tin + s];
        }
    }
    mmc_tensor *w2 = mmc_reshape(ctx, w, 2, MMC_SHAPE(w->shape[0], K));    /* [Cout, Cin * 3] */
    return mmc_linear(ctx, col, w2, b);                                     /* [Tout, Cout] */
}

/* Attention of x [1, T, C] (normed) over keys/values k, v [1, S, H, D] (NULL: x's own). */
static mmc_tensor *attn_out(mmc_ctx *ctx, const wh_attn *a, mmc_tensor *h, mmc_tensor *k, mmc_tensor *v, int64_t H,
                            bool causal) {
    const int64_t T = h->shape[1], C = h->shape[2], D = C / H;
    mmc_tensor *q = mmc_scale(ctx, mmc_nn_linear(ctx, h, &a->q), 1.0f / sqrtf((float)D));
    q = mmc_reshape(ctx, q, 4, MMC_SHAPE(1, T, H, D));                      /* [1, T, H, D] */
    if (!k) {
        k = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &a->k), 4, MMC_SHAPE(1, T, H, D));
        v = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &a->v), 4, MMC_SHAPE(1, T, H, D));
    }
    mmc_attn_opts o = {.causal = causal, .scale = 1.0f};
    mmc_tensor *y = mmc_attention(ctx, q, k, v, &o);                        /* [1, T, H, D] */
    return mmc_nn_linear(ctx, mmc_reshape(ctx, y, 3, MMC_SHAPE(1, T, C)), &a->o);
}

static mmc_tensor *ffn(mmc_ctx *ctx, const mmc_whisper *m, const wh_layer *L, mmc_tensor *x) {
    mmc_tensor *h = mmc_layernorm(ctx, x, L->ffn_ln_w, L->ffn_ln_b, 1e-5f);
    h = enc_act(ctx, m->cfg.activation_function, mmc_nn_linear(ctx, h, &L->fc1));
    return mmc_add(ctx, x, mmc_nn_linear(ctx, h, &L->fc2));
}

mmc_status mmc_whisper_encode(mmc_ctx *ctx, const mmc_whisper *m, const float *feats, int64_t frames,
                              mmc_tensor **out) {
    *out = NULL;
    const mmc_whisper_config *c = &m->cfg;
    const int64_t P = c->max_source_positions, C = c->d_model, H = c->encoder_attention_heads;
    if (frames != 2 * P)
        return mmc_error(MMC_ERR_SHAPE, "Whisper encoder: %lld feature frames given, the model takes %lld "
                         "(2 * max_source_positions; pad or split the features into 30 s windows)",
                         (long long)frames, (long long)(2 * P));
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *x = enc_act(ctx, MMC_ACT_GELU,
                            conv1d_k3(ctx, feats, false, c->num_mel_bins, frames, 1, m->conv1_w, m->conv1_b));
    x = enc_act(ctx, MMC_ACT_GELU, conv1d_k3(ctx, x->data, true, C, frames, 2, m->conv2_w, m->conv2_b)); /* [P, C] */
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(P));
    for (int64_t t = 0; t < P; t++) ((int64_t *)pos->data)[t] = t;
    x = mmc_reshape(ctx, mmc_add(ctx, x, mmc_embedding(ctx, m->enc_pos, pos)), 3, MMC_SHAPE(1, P, C));
    for (int64_t i = 0; i < c->encoder_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        const wh_layer *L = &m->enc[i];
        mmc_tensor *h = mmc_layernorm(ctx, x, L->self.ln_w, L->self.ln_b, 1e-5f);
        x = mmc_add(ctx, x, attn_out(ctx, &L->self, h, NULL, NULL, H, false));
        x = mw_keep(ctx, mk, ffn(ctx, m, L, x));
    }
    x = mmc_layernorm(ctx, x, m->enc_ln_w, m->enc_ln_b, 1e-5f);
    *out = mmc_reshape(ctx, x, 2, MMC_SHAPE(P, C));
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}

/* ------------------------------------------------------------------ decoder */

struct mmc_whisper_dec {
    const mmc_whisper *m;
    int64_t len;                       /* tokens in the self-attention cache */
    float *buf;                        /* every cache below, one allocation */
    /* Views [1, positions, H, D] of head-major storage [H, positions, D] (head_major below) */
    mmc_tensor **self_k, **self_v;     /* [1, max_target_positions, H, D] per layer */
    mmc_tensor **cross_k, **cross_v;   /* [1, P, H, D] per layer */
};

/* The caches are stored head by head ([H, cap, D]) and seen as [1, cap, H, D] through strides:
 * a one-token query then reads each head's keys and values as one contiguous stream instead of
 * 256-byte rows 3 KB apart (Whisper-small's cross-attention over 1500 positions, two layers:
 * 1.30-1.45 -> 0.83-0.91 ms, medians at 2 threads on the loaded Intel host, bench_whisper's
 * whisper_cross_attn_* cases; the same bits, as mmc_attention sums in key order either way). */
static void head_major(mmc_tensor *t) {
    const int64_t cap = t->shape[1], H = t->shape[2], D = t->shape[3];
    t->stride[3] = 1, t->stride[2] = cap * D, t->stride[1] = D, t->stride[0] = H * cap * D;
}

/* positions [s0, s0 + n) of the head-major cache t from src [n, H, D] (row-major) */
static void cache_put(mmc_tensor *t, int64_t s0, const float *src, int64_t n) {
    const int64_t H = t->shape[2], D = t->shape[3];
    float *dst = t->data;
#pragma omp parallel for schedule(static) if (n * H * D > (1 << 18))
    for (int64_t h = 0; h < H; h++)
        for (int64_t s = 0; s < n; s++)
            memcpy(dst + h * t->stride[2] + (s0 + s) * D, src + (s * H + h) * D, (size_t)D * sizeof(float));
}

void mmc_whisper_dec_free(mmc_whisper_dec *d) {
    if (!d) return;
    int64_t L = d->m->cfg.decoder_layers;
    for (int64_t i = 0; i < L; i++) {
        mmc_tensor_free(d->self_k[i]), mmc_tensor_free(d->self_v[i]);
        mmc_tensor_free(d->cross_k[i]), mmc_tensor_free(d->cross_v[i]);
    }
    free(d->self_k);
    free(d->buf);
    free(d);
}

void mmc_whisper_dec_reset(mmc_whisper_dec *d) { d->len = 0; }
int64_t mmc_whisper_dec_len(const mmc_whisper_dec *d) { return d->len; }

mmc_status mmc_whisper_dec_new(mmc_ctx *ctx, const mmc_whisper *m, const mmc_tensor *enc, mmc_whisper_dec **out) {
    *out = NULL;
    const mmc_whisper_config *c = &m->cfg;
    const int64_t L = c->decoder_layers, C = c->d_model, H = c->decoder_attention_heads, D = C / H;
    const int64_t Tm = c->max_target_positions;
    if (enc->ndim != 2 || enc->shape[1] != C || enc->dtype != MMC_F32)
        return mmc_error(MMC_ERR_SHAPE, "Whisper decoder: encoder states must be f32 [S, %lld]", (long long)C);
    const int64_t S = enc->shape[0];
    mmc_whisper_dec *d = calloc(1, sizeof *d);
    if (!d) return mmc_error(MMC_ERR_OOM, "out of memory");
    d->m = m;
    d->self_k = calloc((size_t)(4 * L + 4), sizeof(mmc_tensor *));
    d->buf = malloc((size_t)(L * (2 * Tm + 2 * S) * C) * sizeof(float) + 64);
    if (!d->self_k || !d->buf) { free(d->self_k); free(d->buf); free(d); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    d->self_v = d->self_k + L, d->cross_k = d->self_k + 2 * L, d->cross_v = d->self_k + 3 * L;
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_tensor *e3 = mmc_reshape(ctx, mmc_contiguous(ctx, (mmc_tensor *)enc), 3, MMC_SHAPE(1, S, C));
    float *p = d->buf;
    mmc_status st = MMC_OK;
    for (int64_t i = 0; i < L; i++) {
        const wh_layer *Ly = &m->dec[i];
        d->self_k[i] = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(1, Tm, H, D), p), p += Tm * C;
        d->self_v[i] = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(1, Tm, H, D), p), p += Tm * C;
        d->cross_k[i] = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(1, S, H, D), p), p += S * C;
        d->cross_v[i] = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(1, S, H, D), p), p += S * C;
        if (!d->self_k[i] || !d->self_v[i] || !d->cross_k[i] || !d->cross_v[i]) {
            st = mmc_error(MMC_ERR_OOM, "out of memory");
            break;
        }
        head_major(d->self_k[i]), head_major(d->self_v[i]), head_major(d->cross_k[i]), head_major(d->cross_v[i]);
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *k = mmc_nn_linear(ctx, e3, &Ly->cross.k), *v = mmc_nn_linear(ctx, e3, &Ly->cross.v);
        cache_put(d->cross_k[i], 0, k->data, S);
        cache_put(d->cross_v[i], 0, v->data, S);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);
    }
    mmc_set_grad_enabled(ctx, was);
    if (st) { mmc_whisper_dec_free(d); return st; }
    *out = d;
    return MMC_OK;
}

/* The cache's first n positions as a [1, n, H, D] tensor (an arena alias of the full one, its
 * head-major strides kept). */
static mmc_tensor *cache_view(mmc_ctx *ctx, const mmc_tensor *full, int64_t n) {
    mmc_tensor *t = mmc_alias(ctx, full);
    t->shape[1] = n;
    return t;
}

mmc_status mmc_whisper_dec_step(mmc_ctx *ctx, mmc_whisper_dec *d, const int32_t *ids, int64_t n, bool all_logits,
                                float *logits) {
    const mmc_whisper *m = d->m;
    const mmc_whisper_config *c = &m->cfg;
    const int64_t C = c->d_model, H = c->decoder_attention_heads, V = c->vocab_size, past = d->len;
    if (n < 1) return mmc_error(MMC_ERR_INVALID, "Whisper decoder: no tokens given");
    if (past + n > c->max_target_positions)
        return mmc_error(MMC_ERR_INVALID, "Whisper decoder: %lld tokens exceed max_target_positions %lld",
                         (long long)(past + n), (long long)c->max_target_positions);
    for (int64_t t = 0; t < n; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return mmc_error(MMC_ERR_INVALID, "Whisper decoder: token id %d outside the vocabulary [0, %lld)", ids[t],
                             (long long)V);
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_arena_mark mk0 = mmc_arena_get_mark(mmc_ctx_arena(ctx));
    mmc_tensor *tid = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n)), *pid = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, n));
    for (int64_t t = 0; t < n; t++) ((int32_t *)tid->data)[t] = ids[t], ((int64_t *)pid->data)[t] = past + t;
    mmc_tensor *x = mmc_embedding(ctx, m->tok_emb, tid);                    /* [1, n, C] */
    if (c->scale_embedding) x = mmc_scale(ctx, x, sqrtf((float)C));
    x = mmc_add(ctx, x, mmc_embedding(ctx, m->dec_pos, pid));
    for (int64_t i = 0; i < c->decoder_layers; i++) {
        const wh_layer *L = &m->dec[i];
        /* self-attention: this step's keys/values go into the cache, the queries see all of it */
        mmc_tensor *h = mmc_layernorm(ctx, x, L->self.ln_w, L->self.ln_b, 1e-5f);
        mmc_tensor *k = mmc_nn_linear(ctx, h, &L->self.k), *v = mmc_nn_linear(ctx, h, &L->self.v);  /* [1, n, C] */
        cache_put(d->self_k[i], past, k->data, n);
        cache_put(d->self_v[i], past, v->data, n);
        mmc_tensor *K = cache_view(ctx, d->self_k[i], past + n), *Vv = cache_view(ctx, d->self_v[i], past + n);
        x = mmc_add(ctx, x, attn_out(ctx, &L->self, h, K, Vv, H, true));
        /* cross-attention to the encoder states */
        h = mmc_layernorm(ctx, x, L->cross.ln_w, L->cross.ln_b, 1e-5f);
        x = mmc_add(ctx, x, attn_out(ctx, &L->cross, h, d->cross_k[i], d->cross_v[i], H, false));
        x = ffn(ctx, m, L, x);
    }
    mmc_tensor *last = all_logits ? x : mmc_narrow(ctx, x, 1, n - 1, 1);
    last = mmc_layernorm(ctx, mmc_contiguous(ctx, last), m->dec_ln_w, m->dec_ln_b, 1e-5f);
    mmc_tensor *lg = mmc_linear(ctx, last, m->proj, NULL);                  /* [1, n or 1, V] */
    memcpy(logits, lg->data, (size_t)mmc_numel(lg) * sizeof(float));
    d->len = past + n;
    mmc_arena_release(mmc_ctx_arena(ctx), mk0);
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}
