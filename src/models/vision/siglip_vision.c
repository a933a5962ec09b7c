/* siglip_vision.c — SigLIP's vision tower, mirroring transformers' SiglipVisionModel
 * (models/siglip/modeling_siglip.py: SiglipVisionEmbeddings, SiglipEncoder, post_layernorm and
 * SiglipMultiheadAttentionPoolingHead), the image encoder of LLaVA-OneVision:
 *
 *   x = patch_embedding(pixels)   Conv2d(Cin, Cv, p, stride p) with bias, as a matmul over each
 *       p x p patch flattened (c, y, x)                               [N, (S/p)^2, Cv]
 *   x = x + position_embedding(0 .. (S/p)^2)      no class token, no pre-norm: hidden_states[0]
 *   per layer (SiglipEncoderLayer = CLIP's layer, encoder_common.c, gelu_pytorch_tanh):
 *       x = x + attn(ln1(x)); x = x + mlp(ln2(x))                      hidden_states[i]
 *   last_hidden_state = post_layernorm(x)
 *   pooler_output = head(last_hidden_state)  (vision_use_head): nn.MultiheadAttention of the
 *       learned probe [1, 1, Cv] over the tokens, then h + mlp(layernorm(h)), token 0   [N, Cv]
 * hidden_states[L] is the last layer's output before post_layernorm (transformers captures it with
 * tie_last_hidden_states=False), which is what LLaVA-OneVision's vision_feature_layer -1 selects.
 * g = S // p: S need not be a multiple of p (384 px in 14-px patches: the convolution ignores the
 * last S % p rows and columns). The input must be S x S: LLaVA never passes interpolate_pos_encoding, so the bicubic
 * interpolation of the position table is not implemented (a different size is an error). */
#include "siglip_vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_siglip_vision_config_read(const mmc_json *j, const char *what, mmc_siglip_vision_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL;
    /* SiglipVisionConfig's defaults */
    if ((st = mmc_json_int(j, "hidden_size", 768, &c->hidden_size)) ||
        (st = mmc_json_int(j, "intermediate_size", 3072, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 12, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 12, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "num_channels", 3, &c->num_channels)) ||
        (st = mmc_json_int(j, "image_size", 224, &c->image_size)) ||
        (st = mmc_json_int(j, "patch_size", 16, &c->patch_size)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-6, &c->layer_norm_eps)) ||
        (st = mmc_json_bool(j, "vision_use_head", true, &c->use_head)) ||
        (st = mmc_json_str(j, "hidden_act", "gelu_pytorch_tanh", &act)))
        return mmc_error_prefix(st, "%s: vision_config", what);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    if (c->patch_size > c->image_size || c->patch_size < 1)
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.patch_size %lld is not from 1 to image_size %lld", what,
                         (long long)c->patch_size, (long long)c->image_size);
    /* image_size need not be a multiple of patch_size: siglip-so400m-patch14-384 (LLaVA-OneVision's
     * tower) sees 384 px in 27 patches of 14, the valid convolution dropping the last 6 rows / columns */
    return enc_vit_check_sizes(c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                               c->num_channels, c->image_size - c->image_size % c->patch_size, c->patch_size, what);
}

const mmc_siglip_vision_config *mmc_siglip_vision_cfg(const mmc_siglip_vision *v) { return &v->cfg; }

mmc_siglip_vision *siglip_vision_bind(mw_set *w, const char *prefix, const mmc_siglip_vision_config *c) {
    mmc_siglip_vision *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->cfg = *c;
    v->layers = calloc((size_t)c->num_hidden_layers, sizeof *v->layers);
    if (!v->layers) { free(v); return NULL; }
    const int64_t C = c->hidden_size, F = c->intermediate_size, p = c->patch_size, g = c->image_size / p;
    char pre[256];
    snprintf(pre, sizeof pre, "%sembeddings.", prefix);
    mw_bind_wb(w, pre, "patch_embedding", &v->patch_w, &v->patch_b, 4, MMC_SHAPE(C, c->num_channels, p, p));
    mw_bind(w, pre, "position_embedding.weight", &v->pos_emb, 2, MMC_SHAPE(g * g, C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        snprintf(pre, sizeof pre, "%sencoder.layers.%lld.", prefix, (long long)i);
        enc_clip_layer_bind(w, pre, &v->layers[i], C, F);
    }
    mw_bind_wb(w, prefix, "post_layernorm", &v->post_ln_w, &v->post_ln_b, 1, MMC_SHAPE(C));
    if (c->use_head) {
        snprintf(pre, sizeof pre, "%shead.", prefix);
        mw_bind(w, pre, "probe", &v->probe, 3, MMC_SHAPE(1, 1, C));
        mw_bind(w, pre, "attention.in_proj_weight", &v->in_w, 2, MMC_SHAPE(3 * C, C));
        mw_bind(w, pre, "attention.in_proj_bias", &v->in_b, 1, MMC_SHAPE(3 * C));
        mw_bind_wb(w, pre, "attention.out_proj", &v->out_w, &v->out_b, 2, MMC_SHAPE(C, C));
        mw_bind_wb(w, pre, "layernorm", &v->head_ln_w, &v->head_ln_b, 1, MMC_SHAPE(C));
        mw_bind_linear(w, pre, "mlp.fc1", &v->fc1, F, C, true);
        mw_bind_linear(w, pre, "mlp.fc2", &v->fc2, C, F, true);
    }
    return v;
}

mmc_status mmc_siglip_vision_linears(mmc_siglip_vision *v, const char *prefix, mmc_module_list *ml) {
    return enc_clip_layers_modules(v->layers, v->cfg.num_hidden_layers, prefix, ml);
}

void siglip_vision_free(mmc_siglip_vision *v) {
    if (!v) return;
    free(v->layers);
    free(v);
}

mmc_status mmc_siglip_vision_forward(mmc_ctx *ctx, mmc_siglip_vision *v, mmc_tensor *pixels, int n_layers,
                                     mmc_tensor ***hs_out) {
    *hs_out = NULL;
    const mmc_siglip_vision_config *c = &v->cfg;
    const int64_t S = c->image_size, p = c->patch_size, g = S / p, Cin = c->num_channels, C = c->hidden_size;
    if (!pixels || pixels->ndim != 4 || pixels->dtype != MMC_F32 || pixels->shape[1] != Cin ||
        pixels->shape[2] != S || pixels->shape[3] != S)
        return mmc_error(MMC_ERR_SHAPE, "SigLIP vision tower: pixel_values must be f32 [N, %lld, %lld, %lld] "
                         "(image_size %lld; position interpolation is not supported)", (long long)Cin, (long long)S,
                         (long long)S, (long long)S);
    if (n_layers < 0 || n_layers > c->num_hidden_layers)
        return mmc_error(MMC_ERR_INVALID, "SigLIP vision tower: %d layers asked of %lld", n_layers,
                         (long long)c->num_hidden_layers);
    const int64_t N = pixels->shape[0], T = g * g, K = Cin * p * p;
    /* grad as the caller set it (frozen weights record nothing); the stride-p convolution as a matmul: patches [N*g*g, Cin*p*p] in the weight's (c, y, x) order */
    mmc_tensor *px = mmc_contiguous(ctx, pixels);
    mmc_tensor *patches = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N * T, K));
    const float *src = px->data;
    float *dst = patches->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t gy = 0; gy < g; gy++)
            for (int64_t gx = 0; gx < g; gx++) {
                float *row = dst + ((n * g + gy) * g + gx) * K;
                for (int64_t ch = 0; ch < Cin; ch++)
                    for (int64_t y = 0; y < p; y++)
                        memcpy(row + (ch * p + y) * p, src + ((n * Cin + ch) * S + gy * p + y) * S + gx * p,
                               (size_t)p * sizeof(float));
            }
    mmc_tensor *w2 = mmc_reshape(ctx, v->patch_w, 2, MMC_SHAPE(C, K));
    mmc_tensor *pe = mmc_reshape(ctx, mmc_linear(ctx, patches, w2, v->patch_b), 3, MMC_SHAPE(N, T, C));
    mmc_tensor *x = mmc_contiguous(ctx, mmc_add(ctx, pe, mmc_reshape(ctx, v->pos_emb, 3, MMC_SHAPE(1, T, C))));
    mmc_tensor **hs = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *hs * (size_t)(n_layers + 1));
    hs[0] = x;                                                                    /* [N, T, Cv] */
    for (int i = 0; i < n_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        hs[i + 1] = x = mw_keep(ctx, mk, enc_clip_layer_forward(ctx, &v->layers[i], x, c->num_attention_heads,
                                                                (float)c->layer_norm_eps, c->hidden_act, false, NULL));
    }
    *hs_out = hs;
    return MMC_OK;
}

mmc_status mmc_siglip_vision_pool(mmc_ctx *ctx, mmc_siglip_vision *v, mmc_tensor *pixels, mmc_tensor **out) {
    *out = NULL;
    const mmc_siglip_vision_config *c = &v->cfg;
    if (!c->use_head)
        return mmc_error(MMC_ERR_UNSUPPORTED, "SigLIP vision tower: vision_use_head is false (no pooling head)");
    mmc_tensor **hs;
    mmc_status st = mmc_siglip_vision_forward(ctx, v, pixels, (int)c->num_hidden_layers, &hs);
    if (st) return st;
    /* grad as the caller set it: frozen weights record nothing, trainable ones (contrastive training) do */
    const int64_t N = pixels->shape[0], C = c->hidden_size, H = c->num_attention_heads, D = C / H;
    const int64_t T = hs[0]->shape[1];
    const float eps = (float)c->layer_norm_eps;
    mmc_tensor *last = mmc_layernorm(ctx, hs[c->num_hidden_layers], v->post_ln_w, v->post_ln_b, eps); /* [N, T, C] */
    /* nn.MultiheadAttention(probe, last, last): in_proj rows [q; k; v], scaled dot product per head */
    mmc_tensor *wq = mmc_narrow(ctx, v->in_w, 0, 0, C), *wk = mmc_narrow(ctx, v->in_w, 0, C, C),
               *wv = mmc_narrow(ctx, v->in_w, 0, 2 * C, C);
    mmc_tensor *bq = mmc_narrow(ctx, v->in_b, 0, 0, C), *bk = mmc_narrow(ctx, v->in_b, 0, C, C),
               *bv = mmc_narrow(ctx, v->in_b, 0, 2 * C, C);
    mmc_tensor *probe = mmc_contiguous(ctx, mmc_add(ctx, mmc_zeros(ctx, MMC_F32, 3, MMC_SHAPE(N, 1, C)),
                                                    mmc_cast(ctx, v->probe, MMC_F32)));      /* [N, 1, C] */
    mmc_tensor *q = mmc_reshape(ctx, mmc_linear(ctx, probe, mmc_contiguous(ctx, wq), mmc_contiguous(ctx, bq)), 4,
                                MMC_SHAPE(N, 1, H, D));
    mmc_tensor *k = mmc_reshape(ctx, mmc_linear(ctx, last, mmc_contiguous(ctx, wk), mmc_contiguous(ctx, bk)), 4,
                                MMC_SHAPE(N, T, H, D));
    mmc_tensor *vv = mmc_reshape(ctx, mmc_linear(ctx, last, mmc_contiguous(ctx, wv), mmc_contiguous(ctx, bv)), 4,
                                 MMC_SHAPE(N, T, H, D));
    mmc_attn_opts opts = {.causal = false, .scale = (float)(1.0 / sqrt((double)D))};
    mmc_tensor *o = mmc_reshape(ctx, mmc_attention(ctx, q, k, vv, &opts), 3, MMC_SHAPE(N, 1, C));  /* [N, 1, C] */
    mmc_tensor *h = mmc_linear(ctx, o, v->out_w, v->out_b);
    mmc_tensor *m = mmc_layernorm(ctx, h, v->head_ln_w, v->head_ln_b, eps);
    m = enc_act(ctx, c->hidden_act, mmc_nn_linear(ctx, m, &v->fc1));
    h = mmc_add(ctx, h, mmc_nn_linear(ctx, m, &v->fc2));
    *out = mmc_contiguous(ctx, mmc_reshape(ctx, h, 2, MMC_SHAPE(N, C)));                    /* [N, C] */
    return MMC_OK;
}
