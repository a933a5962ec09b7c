/* intern_vit.c — InternViT, InternVL's vision tower, mirroring transformers' InternVLVisionModel
 * (models/internvl/modeling_internvl.py, 5.x):
 *
 *   patches = projection(pixels)     Conv2d(Cin, Cv, p, stride p) with bias, as a matmul over
 *             each p x p patch flattened (c, y, x)                  [N, gh*gw, Cv]
 *   x = cat(cls_token, patches) + position_embeddings              [N, 1 + gh*gw, Cv]
 *       (the patch part bicubically interpolated, align_corners=False, when the grid is not the
 *        config's image_size / patch_size square: interpolate_pos_encoding)
 *   per layer (InternVLVisionLayer; norm is LayerNorm or, norm_type "rms_norm", RMSNorm):
 *       h = projection_layer(attn(q_norm(q_proj(n1)), k_norm(k_proj(n1)), v_proj(n1)))
 *           (n1 = layernorm_before(x); q/k_norm: RMSNorm over all Cv, eps 1e-6, with use_qk_norm)
 *       x = x + lambda_1 * h
 *       x = x + lambda_2 * fc2(act(fc1(layernorm_after(x))))
 *   last_hidden_state = layernorm(x) unless use_mean_pooling (then x itself)
 * Dropouts and drop-path are off (inference). hidden_states[0] is the embeddings' output,
 * hidden_states[i] layer i's, as transformers' capture_outputs records them.
 * With its weights requiring grad (InternVL training with the tower unfrozen) the embeddings come
 * from differentiable ops and the layers keep their tape; otherwise nothing is recorded. Training
 * takes tiles of the config's image_size (the position table as stored, not interpolated).
 *
 * OpenGVLab's remote-code InternVisionModel (modeling_intern_vit.py) computes the same with other
 * names: embeddings.class_embedding / patch_embedding / position_embedding, encoder.layers.N.
 * norm1 / norm2 / attn.qkv (q, k, v stacked on the output axis) / attn.q_norm / attn.k_norm /
 * attn.proj / ls1 / ls2 / mlp.fc1 / mlp.fc2, its q/k norms with layer_norm_eps, no final norm
 * (last_hidden_state is the last layer's output), and the position table always interpolated
 * (to the same size that is the identity). */
#include "intern_vit.h"
#include "../encoders/encoder_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    mmc_tensor *n1_w, *n1_b, *n2_w, *n2_b;   /* layernorm_before / _after [Cv] (b NULL for RMSNorm) */
    mmc_linear_w q, k, v;                    /* [Cv, Cv], [Cv] (b with attention_bias); unbound (w NULL) for
                                              * OpenGVLab's layout */
    mmc_tensor *qkv_w, *qkv_b;               /* OpenGVLab's fused attn.qkv [3 Cv, Cv], [3 Cv] */
    mmc_tensor *qn_w, *kn_w;                 /* q_norm / k_norm [Cv] with use_qk_norm */
    mmc_linear_w o;                          /* projection_layer [Cv, Cv], [Cv] */
    mmc_tensor *lambda1, *lambda2;           /* layer scale [Cv] */
    mmc_linear_w fc1, fc2;                   /* [Fv, Cv], [Fv]; [Cv, Fv], [Cv] */
} vit_layer;

struct mmc_intern_vit {
    mmc_intern_vit_config cfg;
    mmc_tensor *patch_w, *patch_b;   /* embeddings.patch_embeddings.projection [Cv, Cin, p, p], [Cv] */
    mmc_tensor *cls;                 /* embeddings.cls_token [1, 1, Cv] */
    mmc_tensor *pos;                 /* embeddings.position_embeddings [1, 1 + g*g, Cv] or NULL */
    vit_layer *layers;               /* encoder.layer [num_hidden_layers] */
    mmc_tensor *ln_w, *ln_b;         /* layernorm [Cv] (without use_mean_pooling) */
};

/* an int or a square [a, a] list (image_size / patch_size) */
static mmc_status read_square(const mmc_json *j, const char *key, int64_t def, const char *what, int64_t *out) {
    int64_t v[2];
    int n = 2;
    const mmc_json *e = mmc_json_get(j, key);
    if (e && !mmc_json_is_object(e) && mmc_json_int_array(j, key, v, &n) == MMC_OK) {
        if (n != 2 || v[0] != v[1])
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_config.%s must be square (one size or [s, s])", what, key);
        *out = v[0];
        return MMC_OK;
    }
    mmc_status st = mmc_json_int(j, key, def, out);
    return st ? mmc_error_prefix(st, "%s: vision_config", what) : MMC_OK;
}

static mmc_status check(const mmc_intern_vit_config *c, const char *what);

mmc_status mmc_intern_vit_config_read(const mmc_json *j, const char *what, mmc_intern_vit_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL, *norm = NULL;
    /* InternVLVisionConfig's defaults (InternViT-300M) */
    if ((st = mmc_json_int(j, "hidden_size", 1024, &c->hidden_size)) ||
        (st = mmc_json_int(j, "intermediate_size", 4096, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 24, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 16, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "num_channels", 3, &c->num_channels)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-6, &c->layer_norm_eps)) ||
        (st = mmc_json_str(j, "hidden_act", "gelu", &act)) ||
        (st = mmc_json_str(j, "norm_type", "layer_norm", &norm)) ||
        (st = mmc_json_bool(j, "attention_bias", false, &c->attention_bias)) ||
        (st = mmc_json_bool(j, "use_qk_norm", false, &c->use_qk_norm)) ||
        (st = mmc_json_bool(j, "use_mean_pooling", true, &c->use_mean_pooling)) ||
        (st = mmc_json_bool(j, "use_absolute_position_embeddings", true, &c->abs_pos)))
        return mmc_error_prefix(st, "%s: vision_config", what);
    if ((st = read_square(j, "image_size", 448, what, &c->image_size)) ||
        (st = read_square(j, "patch_size", 14, what, &c->patch_size)))
        return st;
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    if (strcmp(norm, "layer_norm") && strcmp(norm, "rms_norm"))
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.norm_type '%s' is not layer_norm or rms_norm", what, norm);
    c->rms_norm = !strcmp(norm, "rms_norm");
    c->qk_norm_eps = 1e-6;   /* InternVLVisionRMSNorm(embed_dim): its default, not layer_norm_eps */
    return check(c, what);
}

mmc_status mmc_intern_vit_config_read_remote(const mmc_json *j, const char *what, mmc_intern_vit_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL, *norm = NULL;
    /* InternVisionConfig's defaults (InternViT-6B) */
    if ((st = mmc_json_int(j, "hidden_size", 3200, &c->hidden_size)) ||
        (st = mmc_json_int(j, "intermediate_size", 12800, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 48, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 25, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "num_channels", 3, &c->num_channels)) ||
        (st = mmc_json_int(j, "image_size", 224, &c->image_size)) ||
        (st = mmc_json_int(j, "patch_size", 14, &c->patch_size)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-6, &c->layer_norm_eps)) ||
        (st = mmc_json_str(j, "hidden_act", "gelu", &act)) ||
        (st = mmc_json_str(j, "norm_type", "rms_norm", &norm)) ||
        (st = mmc_json_bool(j, "qkv_bias", false, &c->attention_bias)) ||
        (st = mmc_json_bool(j, "qk_normalization", true, &c->use_qk_norm)))
        return mmc_error_prefix(st, "%s: vision_config", what);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    if (strcmp(norm, "layer_norm") && strcmp(norm, "rms_norm"))
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.norm_type '%s' is not layer_norm or rms_norm", what, norm);
    c->rms_norm = !strcmp(norm, "rms_norm");
    c->use_mean_pooling = true;   /* no final norm */
    c->abs_pos = true;
    c->qk_norm_eps = c->layer_norm_eps;
    c->remote = true;
    return check(c, what);
}

static mmc_status check(const mmc_intern_vit_config *c, const char *what) {
    return enc_vit_check_sizes(c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                               c->num_channels, c->image_size, c->patch_size, what);
}

static void bind_norm(mw_set *w, const char *pre, const char *name, bool rms, mmc_tensor **wt, mmc_tensor **b,
                      int64_t C) {
    if (rms) {
        char nm[96];
        snprintf(nm, sizeof nm, "%s.weight", name);
        mw_bind(w, pre, nm, wt, 1, MMC_SHAPE(C));
        *b = NULL;
    } else {
        mw_bind_wb(w, pre, name, wt, b, 1, MMC_SHAPE(C));
    }
}

mmc_intern_vit *intern_vit_bind(mw_set *w, const char *prefix, const mmc_intern_vit_config *c) {
    mmc_intern_vit *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->cfg = *c;
    v->layers = calloc((size_t)c->num_hidden_layers, sizeof *v->layers);
    if (!v->layers) { free(v); return NULL; }
    const int64_t C = c->hidden_size, F = c->intermediate_size, p = c->patch_size, g = c->image_size / p;
    char pre[256];
    snprintf(pre, sizeof pre, "%sembeddings.", prefix);
    if (c->remote) {   /* OpenGVLab's InternVisionModel */
        mw_bind_wb(w, pre, "patch_embedding", &v->patch_w, &v->patch_b, 4, MMC_SHAPE(C, c->num_channels, p, p));
        mw_bind(w, pre, "class_embedding", &v->cls, 3, MMC_SHAPE(1, 1, C));
        mw_bind(w, pre, "position_embedding", &v->pos, 3, MMC_SHAPE(1, 1 + g * g, C));
        for (int64_t i = 0; i < c->num_hidden_layers; i++) {
            vit_layer *L = &v->layers[i];
            snprintf(pre, sizeof pre, "%sencoder.layers.%lld.", prefix, (long long)i);
            bind_norm(w, pre, "norm1", c->rms_norm, &L->n1_w, &L->n1_b, C);
            bind_norm(w, pre, "norm2", c->rms_norm, &L->n2_w, &L->n2_b, C);
            if (c->attention_bias) mw_bind_wb(w, pre, "attn.qkv", &L->qkv_w, &L->qkv_b, 2, MMC_SHAPE(3 * C, C));
            else mw_bind(w, pre, "attn.qkv.weight", &L->qkv_w, 2, MMC_SHAPE(3 * C, C));
            if (c->use_qk_norm) {
                mw_bind(w, pre, "attn.q_norm.weight", &L->qn_w, 1, MMC_SHAPE(C));
                mw_bind(w, pre, "attn.k_norm.weight", &L->kn_w, 1, MMC_SHAPE(C));
            }
            mw_bind_linear(w, pre, "attn.proj", &L->o, C, C, true);
            mw_bind(w, pre, "ls1", &L->lambda1, 1, MMC_SHAPE(C));
            mw_bind(w, pre, "ls2", &L->lambda2, 1, MMC_SHAPE(C));
            mw_bind_linear(w, pre, "mlp.fc1", &L->fc1, F, C, true);
            mw_bind_linear(w, pre, "mlp.fc2", &L->fc2, C, F, true);
        }
        return v;
    }
    mw_bind_wb(w, pre, "patch_embeddings.projection", &v->patch_w, &v->patch_b, 4, MMC_SHAPE(C, c->num_channels, p, p));
    mw_bind(w, pre, "cls_token", &v->cls, 3, MMC_SHAPE(1, 1, C));
    if (c->abs_pos) mw_bind(w, pre, "position_embeddings", &v->pos, 3, MMC_SHAPE(1, 1 + g * g, C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        vit_layer *L = &v->layers[i];
        snprintf(pre, sizeof pre, "%sencoder.layer.%lld.", prefix, (long long)i);
        bind_norm(w, pre, "layernorm_before", c->rms_norm, &L->n1_w, &L->n1_b, C);
        bind_norm(w, pre, "layernorm_after", c->rms_norm, &L->n2_w, &L->n2_b, C);
        mw_bind_linear(w, pre, "attention.q_proj", &L->q, C, C, c->attention_bias);
        mw_bind_linear(w, pre, "attention.k_proj", &L->k, C, C, c->attention_bias);
        mw_bind_linear(w, pre, "attention.v_proj", &L->v, C, C, c->attention_bias);
        if (c->use_qk_norm) {
            mw_bind(w, pre, "attention.q_norm.weight", &L->qn_w, 1, MMC_SHAPE(C));
            mw_bind(w, pre, "attention.k_norm.weight", &L->kn_w, 1, MMC_SHAPE(C));
        }
        mw_bind_linear(w, pre, "attention.projection_layer", &L->o, C, C, true);
        mw_bind(w, pre, "lambda_1", &L->lambda1, 1, MMC_SHAPE(C));
        mw_bind(w, pre, "lambda_2", &L->lambda2, 1, MMC_SHAPE(C));
        mw_bind_linear(w, pre, "mlp.fc1", &L->fc1, F, C, true);
        mw_bind_linear(w, pre, "mlp.fc2", &L->fc2, C, F, true);
    }
    if (!c->use_mean_pooling) mw_bind_wb(w, prefix, "layernorm", &v->ln_w, &v->ln_b, 1, MMC_SHAPE(C));
    return v;
}

void intern_vit_free(mmc_intern_vit *v) {
    if (!v) return;
    free(v->layers);
    free(v);
}

const mmc_intern_vit_config *intern_vit_cfg(const mmc_intern_vit *v) { return &v->cfg; }

mmc_status intern_vit_linears(mmc_intern_vit *v, const char *prefix, mmc_module_list *out) {
    static const char *const nm[6] = {"attention.q_proj", "attention.k_proj", "attention.v_proj",
                                      "attention.projection_layer", "mlp.fc1", "mlp.fc2"};
    if (v->cfg.remote) return MMC_OK;   /* OpenGVLab's layout: its fused qkv is not a PEFT module here */
    for (int64_t i = 0; i < v->cfg.num_hidden_layers; i++) {
        vit_layer *L = &v->layers[i];
        mmc_linear_w *ls[6] = {&L->q, &L->k, &L->v, &L->o, &L->fc1, &L->fc2};
        for (int j = 0; j < 6; j++) {
            char name[MMC_MODULE_NAME];
            snprintf(name, sizeof name, "%sencoder.layer.%lld.%s", prefix, (long long)i, nm[j]);
            mmc_status st = mmc_module_list_add(out, ls[j], name);
            if (st) return st;
        }
    }
    return MMC_OK;
}

/* whether LoRA is on any of the tower's linears (then a tape is needed even with frozen weights) */
static bool adapted(const mmc_intern_vit *v) {
    for (int64_t i = 0; i < v->cfg.num_hidden_layers; i++) {
        const vit_layer *L = &v->layers[i];
        if (L->q.lora || L->k.lora || L->v.lora || L->o.lora || L->fc1.lora || L->fc2.lora) return true;
    }
    return false;
}

static mmc_tensor *norm(mmc_ctx *ctx, const mmc_intern_vit_config *c, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    return c->rms_norm ? mmc_rmsnorm(ctx, x, w, (float)c->layer_norm_eps)
                       : mmc_layernorm(ctx, x, w, b, (float)c->layer_norm_eps);
}

/* InternVLVisionLayer: x [N, T, Cv] -> [N, T, Cv] */
static mmc_tensor *layer_forward(mmc_ctx *ctx, const mmc_intern_vit_config *c, const vit_layer *L, mmc_tensor *x) {
    const int64_t N = x->shape[0], T = x->shape[1], C = c->hidden_size, H = c->num_attention_heads, D = C / H;
    mmc_tensor *h = norm(ctx, c, x, L->n1_w, L->n1_b);
    mmc_tensor *q, *k, *v;                                                   /* [N, T, Cv] each */
    if (L->qkv_w) {   /* OpenGVLab's fused qkv: q, k, v stacked on the output axis */
        mmc_tensor *qkv = mmc_linear(ctx, h, L->qkv_w, L->qkv_b);               /* [N, T, 3 Cv] */
        q = mmc_narrow(ctx, qkv, 2, 0, C), k = mmc_narrow(ctx, qkv, 2, C, C), v = mmc_narrow(ctx, qkv, 2, 2 * C, C);
    } else {
        q = mmc_nn_linear(ctx, h, &L->q), k = mmc_nn_linear(ctx, h, &L->k), v = mmc_nn_linear(ctx, h, &L->v);
    }
    if (c->use_qk_norm) {
        q = mmc_rmsnorm(ctx, mmc_contiguous(ctx, q), L->qn_w, (float)c->qk_norm_eps);
        k = mmc_rmsnorm(ctx, mmc_contiguous(ctx, k), L->kn_w, (float)c->qk_norm_eps);
    }
    q = mmc_reshape(ctx, mmc_contiguous(ctx, q), 4, MMC_SHAPE(N, T, H, D));
    k = mmc_reshape(ctx, mmc_contiguous(ctx, k), 4, MMC_SHAPE(N, T, H, D));
    v = mmc_reshape(ctx, mmc_contiguous(ctx, v), 4, MMC_SHAPE(N, T, H, D));
    mmc_attn_opts ao = {.causal = false, .scale = (float)(1.0 / sqrt((double)D))};
    mmc_tensor *o = mmc_reshape(ctx, mmc_attention(ctx, q, k, v, &ao), 3, MMC_SHAPE(N, T, C));
    o = mmc_nn_linear(ctx, o, &L->o);
    x = mmc_add(ctx, x, mmc_mul(ctx, o, L->lambda1));
    h = norm(ctx, c, x, L->n2_w, L->n2_b);
    h = enc_act(ctx, c->hidden_act, mmc_nn_linear(ctx, h, &L->fc1));            /* [N, T, Fv] */
    h = mmc_nn_linear(ctx, h, &L->fc2);
    return mmc_add(ctx, x, mmc_mul(ctx, h, L->lambda2));
}

/* torch's upsample_bicubic2d weights (cubic convolution, A = -0.75) for a source coordinate */
static void cubic_coeffs(float t, float w[4]) {
    const float A = -0.75f;
    float x = t + 1.0f;
    w[0] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;
    x = t;
    w[1] = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;
    x = 1.0f - t;
    w[2] = ((A + 2.0f) * x - (A + 3.0f)) * x * x + 1.0f;
    x = 2.0f - t;
    w[3] = ((A * x - 5.0f * A) * x + 8.0f * A) * x - 4.0f * A;
}

/* the patch position embeddings src [g, g, C] resized to dst [oh, ow, C] as
 * nn.functional.interpolate(mode="bicubic", align_corners=False) does (borders clamped) */
static void interp_pos(const float *src, int64_t g, int64_t C, float *dst, int64_t oh, int64_t ow) {
    const float sh = (float)g / (float)oh, sw = (float)g / (float)ow;
    for (int64_t oy = 0; oy < oh; oy++) {
        float fy = ((float)oy + 0.5f) * sh - 0.5f;
        int64_t y0 = (int64_t)floorf(fy);
        float wy[4];
        cubic_coeffs(fy - (float)y0, wy);
        for (int64_t ox = 0; ox < ow; ox++) {
            float fx = ((float)ox + 0.5f) * sw - 0.5f;
            int64_t x0 = (int64_t)floorf(fx);
            float wx[4];
            cubic_coeffs(fx - (float)x0, wx);
            float *o = dst + (oy * ow + ox) * C;
            for (int64_t ch = 0; ch < C; ch++) {
                float acc = 0.0f;
                for (int i = 0; i < 4; i++) {
                    int64_t yy = y0 - 1 + i;
                    yy = yy < 0 ? 0 : yy >= g ? g - 1 : yy;
                    float row = 0.0f;
                    for (int j = 0; j < 4; j++) {
                        int64_t xx = x0 - 1 + j;
                        xx = xx < 0 ? 0 : xx >= g ? g - 1 : xx;
                        row += src[(yy * g + xx) * C + ch] * wx[j];
                    }
                    acc += row * wy[i];
                }
                o[ch] = acc;
            }
        }
    }
}

mmc_status mmc_intern_vit_forward(mmc_ctx *ctx, mmc_intern_vit *v, mmc_tensor *pixels, int n_layers,
                                  mmc_tensor ***hs_out, mmc_tensor **last) {
    *hs_out = NULL;
    if (last) *last = NULL;
    const mmc_intern_vit_config *c = &v->cfg;
    const int64_t p = c->patch_size, Cin = c->num_channels, C = c->hidden_size, g = c->image_size / p;
    if (!pixels || pixels->ndim != 4 || pixels->dtype != MMC_F32 || pixels->shape[1] != Cin ||
        pixels->shape[2] % p || pixels->shape[3] % p || pixels->shape[2] < p || pixels->shape[3] < p)
        return mmc_error(MMC_ERR_SHAPE, "InternViT: pixel_values must be f32 [N, %lld, H, W] with H and W "
                         "multiples of patch_size %lld", (long long)Cin, (long long)p);
    if (n_layers < 0 || n_layers > c->num_hidden_layers)
        return mmc_error(MMC_ERR_INVALID, "InternViT: %d layers asked of %lld", n_layers, (long long)c->num_hidden_layers);
    const int64_t N = pixels->shape[0], Hs = pixels->shape[2], Ws = pixels->shape[3];
    const int64_t gh = Hs / p, gw = Ws / p, P = gh * gw, T = 1 + P, K = Cin * p * p;
    /* training the tower (its weights require grad, or LoRA on its linears): a tape through the
     * embeddings and layers */
    const bool grad = mmc_grad_enabled(ctx) && ((v->patch_w->flags & MMC_REQUIRES_GRAD) || adapted(v));
    if (grad && v->pos && (P != g * g || gh != gw))
        return mmc_error(MMC_ERR_UNSUPPORTED, "InternViT: training the tower on %lld x %lld tiles (image_size %lld) "
                         "would need the interpolated position table's backward, which is not implemented; give "
                         "tiles of image_size or keep vision_tower in model.freeze", (long long)Hs, (long long)Ws,
                         (long long)c->image_size);
    bool was = mmc_set_grad_enabled(ctx, grad);
    /* the stride-p convolution as a matmul over patches [N*P, Cin*p*p] in the weight's (c, y, x) order */
    mmc_tensor *px = mmc_contiguous(ctx, pixels);
    mmc_tensor *patches = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N * P, K));
    const float *src = px->data;
    float *dst = patches->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t gy = 0; gy < gh; gy++)
            for (int64_t gx = 0; gx < gw; gx++) {
                float *row = dst + ((n * gh + gy) * gw + gx) * K;
                for (int64_t ch = 0; ch < Cin; ch++)
                    for (int64_t y = 0; y < p; y++)
                        memcpy(row + (ch * p + y) * p, src + ((n * Cin + ch) * Hs + gy * p + y) * Ws + gx * p,
                               (size_t)p * sizeof(float));
            }
    mmc_tensor *w2 = mmc_reshape(ctx, v->patch_w, 2, MMC_SHAPE(C, K));
    mmc_tensor *pe = mmc_contiguous(ctx, mmc_linear(ctx, patches, w2, v->patch_b));    /* [N*P, Cv] */
    mmc_tensor *x;
    if (grad) {   /* cat(cls_token, patches) + position_embeddings as differentiable ops */
        mmc_tensor *cls = mmc_add(ctx, mmc_zeros(ctx, MMC_F32, 3, MMC_SHAPE(N, 1, C)), v->cls);      /* [N, 1, C] */
        mmc_tensor *parts[2] = {cls, mmc_reshape(ctx, pe, 3, MMC_SHAPE(N, P, C))};
        x = mmc_concat(ctx, parts, 2, 1);                                                /* [N, T, C] */
        if (v->pos) x = mmc_add(ctx, x, v->pos);
        x = mmc_contiguous(ctx, x);
    } else {   /* written directly: [N, T, C] */
        /* the position table for this grid: as stored, or interpolated (interpolate_pos_encoding) */
        mmc_tensor *pos = NULL;
        if (v->pos) {
            mmc_tensor *p0 = mmc_contiguous(ctx, mmc_cast(ctx, v->pos, MMC_F32));            /* [1, 1 + g*g, Cv] */
            if (P == g * g && gh == gw) pos = p0;
            else {
                pos = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(1, T, C));
                memcpy(pos->data, p0->data, (size_t)C * sizeof(float));
                interp_pos((const float *)p0->data + C, g, C, (float *)pos->data + C, gh, gw);
            }
        }
        x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(N, T, C));
        mmc_tensor *cls = mmc_contiguous(ctx, mmc_cast(ctx, v->cls, MMC_F32));
        float *xd = x->data;
        const float *cd = cls->data, *pd = pos ? pos->data : NULL, *ed = pe->data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t t = 0; t < T; t++) {
                const float *e = t == 0 ? cd : ed + (n * P + t - 1) * C;
                for (int64_t k = 0; k < C; k++) xd[(n * T + t) * C + k] = e[k] + (pd ? pd[t * C + k] : 0.0f);
            }
    }
    mmc_tensor **hs = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *hs * (size_t)(n_layers + 1));
    hs[0] = x;
    for (int i = 0; i < n_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        hs[i + 1] = x = mw_keep(ctx, mk, layer_forward(ctx, c, &v->layers[i], x));
    }
    if (last && n_layers == c->num_hidden_layers)
        *last = c->use_mean_pooling ? x : mmc_layernorm(ctx, x, v->ln_w, v->ln_b, (float)c->layer_norm_eps);
    mmc_set_grad_enabled(ctx, was);
    *hs_out = hs;
    return MMC_OK;
}
