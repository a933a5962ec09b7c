/* omni_audio.c — Qwen2.5-Omni's audio encoder, mirroring transformers' Qwen2_5OmniAudioEncoder
 * (models/qwen2_5_omni/modeling_qwen2_5_omni.py, 5.23) for one audio at a time:
 *
 *   the L real feature frames [n_mels, L] are split into chunks of 2 * n_window frames (the last
 *   one shorter); per chunk, with zeros outside it (HF pads the chunks and masks conv1's output):
 *     x = gelu(conv1(chunk))                  Conv1d(n_mels, C, k=3, pad=1)       [l, C]
 *     x = gelu(conv2(x))                      Conv1d(C, C, k=3, stride=2, pad=1)  [(l-1)/2+1, C]
 *     x = x + sinusoids[0 .. (l-1)/2]         SinusoidsPositionEmbedding, restarting per chunk
 *   the chunks' rows are concatenated; per layer (pre-LN, as Whisper's encoder, attention only
 *   inside each chunk: cu_seqlens):
 *     x += out_proj(attn(self_attn_layer_norm(x)));  x += fc2(gelu(fc1(final_layer_norm(x))))
 *   then rows (2i, 2i+1) are averaged (AvgPool1d(2), an odd last row dropped), and
 *   out = proj(ln_post(x))                                                          [n, output_dim]
 * Every step is a tape op (the convolutions as im2col + GEMM, conv2's im2col a row gather), so the
 * same forward trains the encoder (`mmc train` with model.freeze leaving out `audio`: 8 full steps
 * within 1.3e-6 of transformers' losses, test_omni_train) and runs inference without a tape.
 */
#include "mmc_omni.h"

#include "../encoders/encoder_common.h"
#include "../model_weights.h"
#include "mmc_lora.h"
#include "mmc_nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_tensor *ln1_w, *ln1_b, *ln2_w, *ln2_b;   /* [C] */
    mmc_linear_w q, k, v, o, fc1, fc2;           /* k without bias */
} oa_layer;

struct mmc_omni_audio {
    mmc_omni_audio_config cfg;
    mmc_tensor *conv1_w, *conv1_b;   /* [C, n_mels, 3], [C] */
    mmc_tensor *conv2_w, *conv2_b;   /* [C, C, 3], [C] */
    oa_layer *layers;
    mmc_tensor *ln_post_w, *ln_post_b;
    mmc_linear_w proj;               /* [output_dim, C] */
    float *pos;                      /* [max_source_positions, C] sinusoids */
    uint64_t seed;                   /* a fresh encoder's init stream */
    mw_set w;
};

mmc_status mmc_omni_audio_config_read(const mmc_json *tc, const char *what, mmc_omni_audio_config *c) {
    memset(c, 0, sizeof *c);
    const mmc_json *j = mmc_json_get(tc, "audio_config");
    if (!j) return mmc_error(MMC_ERR_FORMAT, "%s: no audio_config", what);
    const char *act = NULL;
    mmc_status st;
    if ((st = mmc_json_int(j, "num_mel_bins", 128, &c->num_mel_bins)) ||
        (st = mmc_json_int(j, "d_model", 1280, &c->d_model)) ||
        (st = mmc_json_int(j, "encoder_layers", 32, &c->encoder_layers)) ||
        (st = mmc_json_int(j, "encoder_attention_heads", 20, &c->encoder_attention_heads)) ||
        (st = mmc_json_int(j, "encoder_ffn_dim", 5120, &c->encoder_ffn_dim)) ||
        (st = mmc_json_int(j, "max_source_positions", 1500, &c->max_source_positions)) ||
        (st = mmc_json_int(j, "n_window", 100, &c->n_window)) ||
        (st = mmc_json_int(j, "output_dim", 3584, &c->output_dim)) ||
        (st = mmc_json_str(j, "activation_function", "gelu", &act)))
        return mmc_error_prefix(st, "%s: audio_config: ", what);
    if ((st = mmc_act_parse(act, what, &c->act))) return st;
    if (c->num_mel_bins < 1 || c->d_model < 2 || c->d_model % 2 || c->encoder_layers < 0 ||
        c->encoder_attention_heads < 1 || c->d_model % c->encoder_attention_heads || c->encoder_ffn_dim < 1 ||
        c->max_source_positions < 1 || c->n_window < 1 || c->output_dim < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: audio_config: sizes must be positive, d_model even and a multiple of "
                         "encoder_attention_heads", what);
    return MMC_OK;
}

void mmc_omni_audio_free(mmc_omni_audio *a) {
    if (!a) return;
    a->w.st = NULL;   /* borrowed from the thinker */
    mw_close(&a->w);
    free(a->layers);
    free(a->pos);
    free(a);
}

static mmc_status audio_build(mmc_st *st, const mmc_omni_audio_config *c, const char *prefix, uint64_t seed,
                              bool trainable, mmc_omni_audio **out) {
    *out = NULL;
    mmc_omni_audio *a = calloc(1, sizeof *a);
    if (!a) return mmc_error(MMC_ERR_OOM, "out of memory");
    a->cfg = *c;
    a->seed = seed;
    const int64_t C = c->d_model, M = c->num_mel_bins, P = c->max_source_positions;
    a->layers = calloc((size_t)c->encoder_layers + 1, sizeof *a->layers);
    a->pos = malloc(sizeof(float) * (size_t)(P * C));
    if (!a->layers || !a->pos) { mmc_omni_audio_free(a); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    if (!st) {   /* a fresh encoder (mmc_omni_audio_new): transformers' init, N(0, 0.02), biases 0 */
        mmc_status s = mw_init_random(&a->w, a->seed, MW_INIT_HF_NORMAL);
        if (s) { mmc_omni_audio_free(a); return s; }
        a->w.trainable = true;
    } else {
        a->w.st = st;   /* borrowed: the thinker owns the mapping */
        a->w.trainable = trainable;   /* f32 copies the optimiser may update, not the read-only mapping */
        a->w.errcap = 16384;
        a->w.errs = calloc(1, a->w.errcap);
        if (!a->w.errs) { mmc_omni_audio_free(a); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    }
    mw_set *w = &a->w;
    char p[256];
    snprintf(p, sizeof p, "%saudio_tower.", prefix);
    mw_bind_wb(w, p, "conv1", &a->conv1_w, &a->conv1_b, 3, MMC_SHAPE(C, M, 3));
    mw_bind_wb(w, p, "conv2", &a->conv2_w, &a->conv2_b, 3, MMC_SHAPE(C, C, 3));
    mw_bind_wb(w, p, "ln_post", &a->ln_post_w, &a->ln_post_b, 1, MMC_SHAPE(C));
    mw_bind_linear(w, p, "proj", &a->proj, c->output_dim, C, true);
    for (int64_t i = 0; i < c->encoder_layers; i++) {
        oa_layer *L = &a->layers[i];
        snprintf(p, sizeof p, "%saudio_tower.layers.%lld.", prefix, (long long)i);
        mw_bind_linear(w, p, "self_attn.q_proj", &L->q, C, C, true);
        mw_bind_linear(w, p, "self_attn.k_proj", &L->k, C, C, false);
        mw_bind_linear(w, p, "self_attn.v_proj", &L->v, C, C, true);
        mw_bind_linear(w, p, "self_attn.out_proj", &L->o, C, C, true);
        mw_bind_wb(w, p, "self_attn_layer_norm", &L->ln1_w, &L->ln1_b, 1, MMC_SHAPE(C));
        mw_bind_wb(w, p, "final_layer_norm", &L->ln2_w, &L->ln2_b, 1, MMC_SHAPE(C));
        mw_bind_linear(w, p, "fc1", &L->fc1, c->encoder_ffn_dim, C, true);
        mw_bind_linear(w, p, "fc2", &L->fc2, C, c->encoder_ffn_dim, true);
    }
    mmc_status s = mw_status(w, "checkpoint", "Qwen2_5OmniAudioEncoder");
    if (s) { mmc_omni_audio_free(a); return s; }
    if (!st) {   /* ln_post is a LayerNorm (weight 1, bias 0) though its name lacks "norm" */
        for (int64_t i = 0; i < C; i++) ((float *)a->ln_post_w->data)[i] = 1.0f, ((float *)a->ln_post_b->data)[i] = 0.0f;
    }
    /* SinusoidsPositionEmbedding: inv = exp(-log(10000) / (C/2 - 1) * i) in float32, sin | cos */
    const int64_t H = C / 2;
    const double inc = log(10000.0) / (double)(H - 1);
    for (int64_t t = 0; t < P; t++)
        for (int64_t i = 0; i < H; i++) {
            float inv = expf((float)(-inc) * (float)i);
            float x = (float)t * inv;
            a->pos[t * C + i] = sinf(x);
            a->pos[t * C + H + i] = cosf(x);
        }
    *out = a;
    return MMC_OK;
}

mmc_status mmc_omni_audio_load_from(mmc_st *st, const mmc_omni_audio_config *c, const char *prefix,
                                    bool trainable, mmc_omni_audio **out) {
    return audio_build(st, c, prefix, 0, trainable, out);
}

void mmc_omni_audio_params(const mmc_omni_audio *a, mmc_tensor ***params, char (**names)[256], int *n) {
    *params = a->w.params;
    *names = a->w.names;
    *n = a->w.n_params;
}

int64_t mmc_omni_audio_mels(const mmc_omni_audio *a) { return a->cfg.num_mel_bins; }

mmc_status mmc_omni_audio_new(const mmc_omni_audio_config *c, uint64_t seed, mmc_omni_audio **out) {
    return audio_build(NULL, c, "", seed, true, out);
}

int64_t mmc_omni_audio_tokens(int64_t frames) {
    int64_t a = (frames - 1) / 2 + 1;
    return (a - 2) / 2 + 1;
}

/* conv1 (Conv1d(n_mels, C, k=3, pad=1)) over the feature columns [c0, c0 + Tin) of feats [n_mels, ld]
 * (channel-major, never needing a gradient): im2col [Tin, n_mels * 3] in the weight's (c, j) order,
 * then one GEMM; w [C, n_mels, 3] -> [Tin, C] (the weight's gradient through the tape when it has one). */
static mmc_tensor *conv1_k3(mmc_ctx *ctx, const float *x, int64_t Cin, int64_t ld, int64_t c0, int64_t Tin,
                            mmc_tensor *w, mmc_tensor *b) {
    const int64_t K = Cin * 3;
    mmc_tensor *col = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(Tin, K));
    float *cd = col->data;
    for (int64_t t = 0; t < Tin; t++) {
        float *row = cd + t * K;
        for (int j = 0; j < 3; j++) {
            int64_t s = t + j - 1;
            bool in = s >= 0 && s < Tin;
            for (int64_t c = 0; c < Cin; c++) row[c * 3 + j] = in ? x[c * ld + c0 + s] : 0.0f;
        }
    }
    return mmc_linear(ctx, col, mmc_reshape(ctx, w, 2, MMC_SHAPE(w->shape[0], K)), b);
}

/* conv2 (Conv1d(C, C, k=3, stride=2, pad=1)) on h [Tin, C] (time-major, on the tape when the encoder
 * trains): the im2col is a row gather of h padded with a zero row on each side ([Tout * 3] rows: input
 * row 2t + j - 1), regrouped to the weight's (c, j) order; the same GEMM operands as a plain im2col,
 * so training and inference give the same numbers. -> [Tout, C] */
static mmc_tensor *conv2_k3(mmc_ctx *ctx, mmc_tensor *h, mmc_tensor *w, mmc_tensor *b) {
    const int64_t Tin = h->shape[0], C = h->shape[1], Tout = (Tin - 1) / 2 + 1;
    mmc_tensor *zero = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(1, C));
    memset(zero->data, 0, mmc_nbytes(zero));
    mmc_tensor *parts[3] = {zero, h, zero};
    mmc_tensor *hp = mmc_concat(ctx, parts, 3, 0);                                   /* [Tin + 2, C] */
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(Tout * 3));
    int64_t *id = idx->data;
    for (int64_t t = 0; t < Tout; t++)
        for (int j = 0; j < 3; j++) id[t * 3 + j] = 2 * t + j;   /* padded row of input row 2t + j - 1 */
    mmc_tensor *col = mmc_reshape(ctx, mmc_gather_rows(ctx, hp, idx), 3, MMC_SHAPE(Tout, 3, C));
    col = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_transpose(ctx, col, 1, 2)), 2, MMC_SHAPE(Tout, C * 3));
    return mmc_linear(ctx, col, mmc_reshape(ctx, w, 2, MMC_SHAPE(w->shape[0], C * 3)), b);
}

static bool lora_trainable(const mmc_linear_w *l) {
    return l->lora && (mmc_requires_grad(l->lora->A) || mmc_requires_grad(l->lora->B));
}

mmc_tensor *mmc_omni_cat_rows(mmc_ctx *ctx, mmc_tensor **xs, int n) {
    if (n == 1) return xs[0];
    if (n <= 8) return mmc_concat(ctx, xs, n, 0);
    mmc_tensor *parts[8];   /* mmc_concat takes up to 8 inputs: groups of ceil(n / 8), then those */
    const int g = (n + 7) / 8;
    int k = 0;
    for (int i = 0; i < n; i += g, k++) parts[k] = mmc_omni_cat_rows(ctx, xs + i, n - i < g ? n - i : g);
    return mmc_omni_cat_rows(ctx, parts, k);
}

bool mmc_omni_audio_trainable(const mmc_omni_audio *a) {
    for (int i = 0; i < a->w.n_params; i++)
        if (mmc_requires_grad(a->w.params[i])) return true;
    if (lora_trainable(&a->proj)) return true;
    for (int64_t i = 0; i < a->cfg.encoder_layers; i++) {
        const oa_layer *L = &a->layers[i];
        const mmc_linear_w *ls[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
        for (int j = 0; j < 6; j++)
            if (lora_trainable(ls[j])) return true;
    }
    return false;
}

mmc_status mmc_omni_audio_linears(mmc_omni_audio *a, const char *prefix, mmc_module_list *out) {
    static const char *const nm[6] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                      "self_attn.out_proj", "fc1", "fc2"};
    char name[MMC_MODULE_NAME];
    for (int64_t i = 0; i < a->cfg.encoder_layers; i++) {
        oa_layer *L = &a->layers[i];
        mmc_linear_w *ls[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
        for (int j = 0; j < 6; j++) {
            snprintf(name, sizeof name, "%slayers.%lld.%s", prefix, (long long)i, nm[j]);
            mmc_status st = mmc_module_list_add(out, ls[j], name);
            if (st) return st;
        }
    }
    snprintf(name, sizeof name, "%sproj", prefix);
    return mmc_module_list_add(out, &a->proj, name);
}

/* With grad mode on and a trainable encoder (model.freeze without `audio`) every step below is a tape
 * op, so the loss reaches the encoder's weights; otherwise it runs without a tape, releasing each
 * chunk's and layer's temporaries as it goes. */
mmc_status mmc_omni_audio_forward(mmc_ctx *ctx, const mmc_omni_audio *a, const float *feats, int64_t stride,
                                  int64_t frames, mmc_tensor **out) {
    *out = NULL;
    const mmc_omni_audio_config *c = &a->cfg;
    const int64_t C = c->d_model, H = c->encoder_attention_heads, D = C / H, W = 2 * c->n_window;
    if (frames < 1 || frames > stride)
        return mmc_error(MMC_ERR_INVALID, "omni audio encoder: %lld real frames of %lld", (long long)frames,
                         (long long)stride);
    if (W / 2 > c->max_source_positions)
        return mmc_error(MMC_ERR_FORMAT, "omni audio encoder: n_window %lld exceeds max_source_positions %lld",
                         (long long)c->n_window, (long long)c->max_source_positions);
    const int n_chunks = (int)((frames + W - 1) / W);
    const int64_t N = (frames - 1) / 2 + 1;   /* rows after conv2, all chunks */
    const bool tape = mmc_grad_enabled(ctx) && mmc_omni_audio_trainable(a);
    bool was = mmc_set_grad_enabled(ctx, tape);
    int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(n_chunks + 1));
    mmc_tensor **chunks = tape ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *chunks * (size_t)n_chunks) : NULL;
    mmc_tensor *x = tape ? NULL : mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N, C));   /* [N, C] */
    cu[0] = 0;
    for (int k = 0; k < n_chunks; k++) {
        int64_t c0 = (int64_t)k * W, l = frames - c0 < W ? frames - c0 : W;
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *h = enc_act(ctx, MMC_ACT_GELU, conv1_k3(ctx, feats, c->num_mel_bins, stride, c0, l, a->conv1_w,
                                                            a->conv1_b));                       /* [l, C] */
        h = enc_act(ctx, MMC_ACT_GELU, conv2_k3(ctx, mmc_contiguous(ctx, h), a->conv2_w, a->conv2_b)); /* [n, C] */
        int64_t n = (l - 1) / 2 + 1;
        mmc_tensor *pe = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(n, C));   /* sinusoids[0 .. n), per chunk */
        memcpy(pe->data, a->pos, sizeof(float) * (size_t)(n * C));
        h = mmc_contiguous(ctx, mmc_add(ctx, h, pe));
        cu[k + 1] = cu[k] + (int32_t)n;
        if (tape) {
            chunks[k] = h;
        } else {
            memcpy((float *)x->data + (int64_t)cu[k] * C, h->data, sizeof(float) * (size_t)(n * C));
            mmc_arena_release(mmc_ctx_arena(ctx), mk);
        }
    }
    MMC_CHECK(cu[n_chunks] == N, "chunk rows %d vs %lld", cu[n_chunks], (long long)N);
    if (tape) x = mmc_omni_cat_rows(ctx, chunks, n_chunks);
    x = mmc_reshape(ctx, x, 3, MMC_SHAPE(1, N, C));
    mmc_attn_opts ao = {.causal = false, .cu_seqlens = cu, .n_seqs = n_chunks};
    for (int64_t i = 0; i < c->encoder_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        const oa_layer *L = &a->layers[i];
        mmc_tensor *h = mmc_layernorm(ctx, x, L->ln1_w, L->ln1_b, 1e-5f);
        mmc_tensor *q = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->q), 4, MMC_SHAPE(1, N, H, D));
        mmc_tensor *k = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->k), 4, MMC_SHAPE(1, N, H, D));
        mmc_tensor *v = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->v), 4, MMC_SHAPE(1, N, H, D));
        mmc_tensor *y = mmc_attention(ctx, q, k, v, &ao);
        x = mmc_add(ctx, x, mmc_nn_linear(ctx, mmc_reshape(ctx, y, 3, MMC_SHAPE(1, N, C)), &L->o));
        h = mmc_layernorm(ctx, x, L->ln2_w, L->ln2_b, 1e-5f);
        h = enc_act(ctx, c->act, mmc_nn_linear(ctx, h, &L->fc1));
        x = mw_keep(ctx, mk, mmc_add(ctx, x, mmc_nn_linear(ctx, h, &L->fc2)));   /* (keeps all on a tape) */
    }
    /* AvgPool1d(2): rows (2i, 2i+1) averaged, an odd last row dropped; (a + b) * 0.5 == (a + b) / 2 */
    const int64_t n_out = mmc_omni_audio_tokens(frames);
    x = mmc_reshape(ctx, mmc_narrow(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(N, C)), 0, 0,
                                    2 * n_out), 3, MMC_SHAPE(n_out, 2, C));
    mmc_tensor *even = mmc_contiguous(ctx, mmc_narrow(ctx, x, 1, 0, 1));
    mmc_tensor *odd = mmc_contiguous(ctx, mmc_narrow(ctx, x, 1, 1, 1));
    mmc_tensor *pooled = mmc_reshape(ctx, mmc_scale(ctx, mmc_add(ctx, even, odd), 0.5f), 2, MMC_SHAPE(n_out, C));
    mmc_tensor *y = mmc_layernorm(ctx, pooled, a->ln_post_w, a->ln_post_b, 1e-5f);
    *out = mmc_contiguous(ctx, mmc_nn_linear(ctx, y, &a->proj));
    mmc_set_grad_enabled(ctx, was);
    return MMC_OK;
}
