/* encoder_common.c — the loader, attention and small helpers that clip_text.c and t5.c share
 * (see encoder_common.h; the weight set is src/models/model_weights.c). The attention materialises the [T, S] scores of one (batch, head)
 * at a time: text encoders see at most a few hundred tokens, and T5 adds a bias per head
 * and position pair that the tiled mmc_attention has no slot for. */
#include "encoder_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_act_parse(const char *name, const char *what, mmc_act *out) {
    static const struct { const char *name; mmc_act act; } acts[] = {
        {"quick_gelu", MMC_ACT_QUICK_GELU}, {"gelu", MMC_ACT_GELU}, {"gelu_new", MMC_ACT_GELU_TANH},
        {"gelu_pytorch_tanh", MMC_ACT_GELU_TANH}, {"relu", MMC_ACT_RELU}, {"silu", MMC_ACT_SILU},
        {"swish", MMC_ACT_SILU},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(name, acts[i].name)) { *out = acts[i].act; return MMC_OK; }
    return mmc_error(MMC_ERR_UNSUPPORTED, "%s: activation '%s' is not supported (quick_gelu, gelu, gelu_new, "
                     "gelu_pytorch_tanh, relu, silu)", what, name);
}

mmc_tensor *enc_act(mmc_ctx *ctx, mmc_act a, mmc_tensor *x) {
    switch (a) {
    case MMC_ACT_QUICK_GELU: return mmc_quick_gelu(ctx, x);
    case MMC_ACT_GELU: return mmc_gelu(ctx, x);
    case MMC_ACT_GELU_TANH: return mmc_gelu_tanh(ctx, x);
    case MMC_ACT_SILU: return mmc_silu(ctx, x);
    case MMC_ACT_RELU: break;
    }
    MMC_ASSERT(!mmc_requires_grad(x));   /* no relu op with a backward yet: inference only */
    mmc_tensor *y = mmc_new_like(ctx, x);
    const float *xd = x->data;
    float *yd = y->data;
    for (int64_t i = 0, n = mmc_numel(x); i < n; i++) yd[i] = xd[i] < 0 ? 0.0f : xd[i];   /* NaN stays NaN, as torch.relu */
    return y;
}

int64_t enc_int_at(const mmc_tensor *t, int64_t i) {
    return t->dtype == MMC_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

mmc_status enc_check_inputs(const mmc_tensor *ids, const mmc_tensor *mask, int64_t vocab, int64_t max_t,
                            const char *what) {
    if (!ids || ids->ndim != 2 || (ids->dtype != MMC_I32 && ids->dtype != MMC_I64) || !mmc_is_contiguous(ids))
        return mmc_error(MMC_ERR_INVALID, "%s: input ids must be a contiguous [B, T] i32 / i64 tensor", what);
    if (ids->shape[0] < 1 || ids->shape[1] < 1)
        return mmc_error(MMC_ERR_INVALID, "%s: empty input ids", what);
    if (max_t > 0 && ids->shape[1] > max_t)
        return mmc_error(MMC_ERR_INVALID, "%s: sequence length %lld exceeds max_position_embeddings %lld "
                         "(truncate to it, as the pipelines' tokenizers do)", what, (long long)ids->shape[1],
                         (long long)max_t);
    for (int64_t i = 0, n = mmc_numel(ids); i < n; i++) {
        int64_t id = enc_int_at(ids, i);
        if (id < 0 || id >= vocab)
            return mmc_error(MMC_ERR_INVALID, "%s: token id %lld at [%lld, %lld] is outside the vocabulary "
                             "(vocab_size %lld)", what, (long long)id, (long long)(i / ids->shape[1]),
                             (long long)(i % ids->shape[1]), (long long)vocab);
    }
    if (mask && (mask->ndim != 2 || mask->shape[0] != ids->shape[0] || mask->shape[1] != ids->shape[1] ||
                 (mask->dtype != MMC_I32 && mask->dtype != MMC_I64) || !mmc_is_contiguous(mask)))
        return mmc_error(MMC_ERR_INVALID, "%s: attention mask must be a contiguous i32 / i64 tensor shaped "
                         "like the ids [%lld, %lld]", what, (long long)ids->shape[0], (long long)ids->shape[1]);
    return MMC_OK;
}

mmc_tensor *enc_attention(mmc_ctx *ctx, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v, float scale, bool causal,
                          const mmc_tensor *mask, const float *rel_bias) {
    MMC_ASSERT(!mmc_requires_grad(q) && !mmc_requires_grad(k) && !mmc_requires_grad(v));
    MMC_ASSERT(q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && mmc_is_contiguous(q) && mmc_is_contiguous(k) &&
               mmc_is_contiguous(v) && q->dtype == MMC_F32 && k->dtype == MMC_F32 && v->dtype == MMC_F32);
    const int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], D = q->shape[3];
    const int64_t S = k->shape[1], Dv = v->shape[3];
    MMC_ASSERT(k->shape[0] == B && k->shape[2] == H && k->shape[3] == D && v->shape[0] == B && v->shape[1] == S &&
               v->shape[2] == H);
    mmc_tensor *o = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(B, T, H, Dv));
    mmc_arena_mark sm = mmc_scratch_mark(ctx);
    float *rows = mmc_scratch_alloc(ctx, (size_t)(B * H * S) * sizeof(float));   /* one score row per (b, h) */
    const float *qd = q->data, *kd = k->data, *vd = v->data;
    float *od = o->data;
#pragma omp parallel for collapse(2) schedule(static) if (B * H * T * S * D > 65536)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            float *p = rows + (b * H + h) * S;
            for (int64_t t = 0; t < T; t++) {
                const float *qt = qd + ((b * T + t) * H + h) * D;
                float mx = -INFINITY;
                int64_t seen = 0;
                for (int64_t s = 0; s < S; s++) {
                    bool keep = !(causal && s > t + S - T) && !(mask && enc_int_at(mask, b * S + s) == 0);
                    if (!keep) { p[s] = -INFINITY; continue; }
                    const float *ks = kd + ((b * S + s) * H + h) * D;
                    float acc = 0;
                    for (int64_t d = 0; d < D; d++) acc += qt[d] * ks[d];
                    acc *= scale;
                    if (rel_bias) acc += rel_bias[h * (T + S - 1) + s - t + T - 1];
                    p[s] = acc;
                    if (acc > mx) mx = acc;
                    seen++;
                }
                float sum = 0;
                for (int64_t s = 0; s < S; s++) {
                    p[s] = seen ? (p[s] == -INFINITY ? 0.0f : expf(p[s] - mx)) : 1.0f;
                    sum += p[s];
                }
                float inv = 1.0f / sum;
                float *ot = od + ((b * T + t) * H + h) * Dv;
                for (int64_t d = 0; d < Dv; d++) ot[d] = 0;
                for (int64_t s = 0; s < S; s++) {
                    if (p[s] == 0) continue;
                    float w = p[s] * inv;
                    const float *vs = vd + ((b * S + s) * H + h) * Dv;
                    for (int64_t d = 0; d < Dv; d++) ot[d] += w * vs[d];
                }
            }
        }
    }
    mmc_scratch_release(ctx, sm);
    return o;
}

/* ------------------------------------------------------------------ CLIPEncoderLayer */
void enc_clip_layer_bind(mw_set *w, const char *p, enc_clip_layer *L, int64_t C, int64_t F) {
    mw_bind(w, p, "layer_norm1.weight", &L->ln1_w, 1, MMC_SHAPE(C));
    mw_bind(w, p, "layer_norm1.bias", &L->ln1_b, 1, MMC_SHAPE(C));
    mw_bind_linear(w, p, "self_attn.q_proj", &L->q, C, C, true);
    mw_bind_linear(w, p, "self_attn.k_proj", &L->k, C, C, true);
    mw_bind_linear(w, p, "self_attn.v_proj", &L->v, C, C, true);
    mw_bind_linear(w, p, "self_attn.out_proj", &L->o, C, C, true);
    mw_bind(w, p, "layer_norm2.weight", &L->ln2_w, 1, MMC_SHAPE(C));
    mw_bind(w, p, "layer_norm2.bias", &L->ln2_b, 1, MMC_SHAPE(C));
    mw_bind_linear(w, p, "mlp.fc1", &L->fc1, F, C, true);
    mw_bind_linear(w, p, "mlp.fc2", &L->fc2, C, F, true);
}

mmc_status enc_clip_layers_modules(enc_clip_layer *layers, int64_t n, const char *prefix, mmc_module_list *ml) {
    static const char *const names[6] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.out_proj", "mlp.fc1", "mlp.fc2"};
    mmc_status st = MMC_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        enc_clip_layer *L = &layers[i];
        mmc_linear_w *mods[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
        for (int k = 0; k < 6 && !st; k++) {
            char nm[MMC_MODULE_NAME];
            snprintf(nm, sizeof nm, "%sencoder.layers.%lld.%s", prefix, (long long)i, names[k]);
            st = mmc_module_list_add(ml, mods[k], nm);
        }
    }
    return st;
}

bool enc_clip_layer_trainable(const enc_clip_layer *L) {
    const mmc_linear_w *mods[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
    for (int i = 0; i < 6; i++)
        if (mods[i]->lora || (mods[i]->w && mmc_requires_grad(mods[i]->w))) return true;
    return false;
}

/* CLIPAttention: x [B, T, C] -> [B, T, C] */
static mmc_tensor *clip_attention(mmc_ctx *ctx, const enc_clip_layer *L, mmc_tensor *x, int64_t H, bool causal,
                                  const mmc_tensor *mask) {
    const int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2] / H;
    mmc_tensor *q = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &L->q), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *k = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &L->k), 4, MMC_SHAPE(B, T, H, D));
    mmc_tensor *v = mmc_reshape(ctx, mmc_nn_linear(ctx, x, &L->v), 4, MMC_SHAPE(B, T, H, D));
    const float scale = (float)(1.0 / sqrt((double)D));                     /* head_dim ** -0.5 */
    mmc_tensor *o;
    if (mask) {
        o = enc_attention(ctx, q, k, v, scale, causal, mask, NULL);         /* [B, T, H, D] */
    } else {
        mmc_attn_opts opts = {.causal = causal, .scale = scale};
        o = mmc_attention(ctx, q, k, v, &opts);
    }
    return mmc_nn_linear(ctx, mmc_reshape(ctx, o, 3, MMC_SHAPE(B, T, H * D)), &L->o);
}

mmc_tensor *enc_clip_layer_forward(mmc_ctx *ctx, const enc_clip_layer *L, mmc_tensor *x, int64_t H, float eps,
                                   mmc_act act, bool causal, const mmc_tensor *mask) {
    mmc_tensor *h = mmc_layernorm(ctx, x, L->ln1_w, L->ln1_b, eps);
    x = mmc_add(ctx, x, clip_attention(ctx, L, h, H, causal, mask));
    h = mmc_layernorm(ctx, x, L->ln2_w, L->ln2_b, eps);
    h = enc_act(ctx, act, mmc_nn_linear(ctx, h, &L->fc1));                  /* [B, T, F] */
    return mmc_add(ctx, x, mmc_nn_linear(ctx, h, &L->fc2));
}

mmc_status enc_vit_check_sizes(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t channels,
                               int64_t image, int64_t patch, const char *what) {
    const int64_t v[] = {hidden, intermediate, layers, heads, channels, image, patch};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] < 1 || v[i] > MMC_CONFIG_MAX_DIM)
            return mmc_error(MMC_ERR_FORMAT, "%s: vision_config sizes must be from 1 to %lld", what,
                             (long long)MMC_CONFIG_MAX_DIM);
    if (hidden % heads)
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.hidden_size %lld is not a multiple of "
                         "num_attention_heads %lld", what, (long long)hidden, (long long)heads);
    if (image % patch)
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.image_size %lld is not a multiple of patch_size %lld",
                         what, (long long)image, (long long)patch);
    return MMC_OK;
}
