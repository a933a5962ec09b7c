/* clip_vision.c — CLIP's vision tower, mirroring transformers' CLIPVisionModel
 * (models/clip/modeling_clip.py: CLIPVisionEmbeddings + CLIPVisionTransformer), the image
 * encoder of LLaVA:
 *
 *   patches = patch_embedding(pixels)   Conv2d(Cin, Cv, p, stride p, bias=False): each p x p
 *             patch flattened (c, y, x) times w [Cv, Cin*p*p]      [N, (S/p)^2, Cv]
 *   x = cat(class_embedding, patches) + position_embedding(0 .. (S/p)^2)   [N, 1 + (S/p)^2, Cv]
 *   x = pre_layrnorm(x)                                 hidden_states[0]
 *   per layer (CLIPEncoderLayer, encoder_common.c, no mask): x = x + attn(ln1(x)); x = x + mlp(ln2(x))
 *                                                       hidden_states[i]
 * With its weights requiring grad (LLaVA training with the tower unfrozen) the embeddings come
 * from differentiable ops and the layers keep their tape. post_layernorm acts on the pooled
 * CLS token only, which LLaVA does not use. The input must be S x S (no
 * interpolate_pos_encoding), as transformers requires. */
#include "clip_vision.h"

#include <stdlib.h>
#include <string.h>

mmc_status mmc_clip_vision_config_read(const mmc_json *j, const char *what, mmc_clip_vision_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    const char *act = NULL;
    /* CLIPVisionConfig's defaults */
    if ((st = mmc_json_int(j, "hidden_size", 768, &c->hidden_size)) ||
        (st = mmc_json_int(j, "intermediate_size", 3072, &c->intermediate_size)) ||
        (st = mmc_json_int(j, "num_hidden_layers", 12, &c->num_hidden_layers)) ||
        (st = mmc_json_int(j, "num_attention_heads", 12, &c->num_attention_heads)) ||
        (st = mmc_json_int(j, "num_channels", 3, &c->num_channels)) ||
        (st = mmc_json_int(j, "image_size", 224, &c->image_size)) ||
        (st = mmc_json_int(j, "patch_size", 32, &c->patch_size)) ||
        (st = mmc_json_num(j, "layer_norm_eps", 1e-5, &c->layer_norm_eps)) ||
        (st = mmc_json_str(j, "hidden_act", "quick_gelu", &act)))
        return mmc_error_prefix(st, "%s: vision_config", what);
    if ((st = mmc_act_parse(act, what, &c->hidden_act))) return st;
    return enc_vit_check_sizes(c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                               c->num_channels, c->image_size, c->patch_size, what);
}

const mmc_clip_vision_config *mmc_clip_vision_cfg(const mmc_clip_vision *v) { return &v->cfg; }

mmc_clip_vision *clip_vision_bind(mw_set *w, const char *prefix, const mmc_clip_vision_config *c) {
    mmc_clip_vision *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->cfg = *c;
    v->layers = calloc((size_t)c->num_hidden_layers, sizeof *v->layers);
    if (!v->layers) { free(v); return NULL; }
    const int64_t C = c->hidden_size, p = c->patch_size, g = c->image_size / p;
    char pre[256];
    snprintf(pre, sizeof pre, "%sembeddings.", prefix);
    mw_bind(w, pre, "patch_embedding.weight", &v->patch_w, 4, MMC_SHAPE(C, c->num_channels, p, p));
    mw_bind(w, pre, "class_embedding", &v->class_emb, 1, MMC_SHAPE(C));
    mw_bind(w, pre, "position_embedding.weight", &v->pos_emb, 2, MMC_SHAPE(1 + g * g, C));
    mw_bind_wb(w, prefix, "pre_layrnorm", &v->pre_ln_w, &v->pre_ln_b, 1, MMC_SHAPE(C));
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        snprintf(pre, sizeof pre, "%sencoder.layers.%lld.", prefix, (long long)i);
        enc_clip_layer_bind(w, pre, &v->layers[i], C, c->intermediate_size);
    }
    mw_bind_wb(w, prefix, "post_layernorm", &v->post_ln_w, &v->post_ln_b, 1, MMC_SHAPE(C));
    return v;
}

mmc_status mmc_clip_vision_linears(mmc_clip_vision *v, const char *prefix, mmc_module_list *ml) {
    return enc_clip_layers_modules(v->layers, v->cfg.num_hidden_layers, prefix, ml);
}

void clip_vision_free(mmc_clip_vision *v) {
    if (!v) return;
    free(v->layers);
    free(v);
}

/* ------------------------------------------------------------------ CLIPVisionModel folders */
struct mmc_clip_vision_model {
    mw_set w;
    mmc_clip_vision *v;
};

mmc_status mmc_clip_vision_model_load(const char *dir, mmc_clip_vision_model **out) {
    *out = NULL;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return st;
    mmc_clip_vision_model *m = calloc(1, sizeof *m);
    if (!m) { mmc_json_free(cfg); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    const char *mt = NULL;
    const mmc_json *vj = mmc_json_get(cfg, "vision_config");
    if ((st = mmc_json_str(cfg, "model_type", "", &mt))) goto fail;
    if (!vj && strcmp(mt, "clip_vision_model")) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: model_type '%s' is not a CLIP vision model (clip_vision_model)", path, mt);
        goto fail;
    }
    mmc_clip_vision_config vc;
    if ((st = mmc_clip_vision_config_read(vj ? vj : cfg, path, &vc))) goto fail;
    if ((st = mw_open(dir, "model", &m->w))) goto fail;
    /* transformers 4.x saved the tower under vision_model.; 5.x saves CLIPVisionModel's names bare */
    const char *prefix = mmc_st_find(m->w.st, "vision_model.embeddings.class_embedding") ? "vision_model." : "";
    if (!(m->v = clip_vision_bind(&m->w, prefix, &vc))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    if ((st = mw_status(&m->w, dir, "CLIPVisionModel")) || (st = mw_check_unused(&m->w, dir, "CLIPVisionModel")))
        goto fail;
    mmc_json_free(cfg);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(cfg);
    mmc_clip_vision_model_free(m);
    return st;
}

mmc_clip_vision *mmc_clip_vision_model_tower(mmc_clip_vision_model *m) { return m->v; }

void mmc_clip_vision_model_free(mmc_clip_vision_model *m) {
    if (!m) return;
    clip_vision_free(m->v);
    mw_close(&m->w);
    free(m);
}

mmc_status mmc_clip_vision_forward(mmc_ctx *ctx, mmc_clip_vision *v, mmc_tensor *pixels, int n_layers,
                                   mmc_tensor ***hs_out) {
    *hs_out = NULL;
    const mmc_clip_vision_config *c = &v->cfg;
    const int64_t S = c->image_size, p = c->patch_size, g = S / p, Cin = c->num_channels, C = c->hidden_size;
    if (!pixels || pixels->ndim != 4 || pixels->dtype != MMC_F32 || pixels->shape[1] != Cin ||
        pixels->shape[2] != S || pixels->shape[3] != S)
        return mmc_error(MMC_ERR_SHAPE, "CLIP vision tower: pixel_values must be f32 [N, %lld, %lld, %lld] "
                         "(image_size %lld)", (long long)Cin, (long long)S, (long long)S, (long long)S);
    if (n_layers < 0 || n_layers > c->num_hidden_layers)
        return mmc_error(MMC_ERR_INVALID, "CLIP vision tower: %d layers asked of %lld", n_layers,
                         (long long)c->num_hidden_layers);
    const int64_t N = pixels->shape[0], T = 1 + g * g, K = Cin * p * p;
    /* training the tower (its weights require grad): the embeddings from differentiable ops;
     * otherwise no tape at all */
    bool trainable = v->patch_w->flags & MMC_REQUIRES_GRAD;   /* or a LoRA adapter in a layer */
    for (int i = 0; i < n_layers && !trainable; i++) trainable = enc_clip_layer_trainable(&v->layers[i]);
    const bool grad = mmc_grad_enabled(ctx) && trainable;
    bool was = mmc_set_grad_enabled(ctx, grad);
    /* the stride-p convolution as a matmul: patches [N*g*g, Cin*p*p] in the weight's (c, y, x) order */
    mmc_tensor *px = mmc_contiguous(ctx, pixels);
    mmc_tensor *patches = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(N * g * g, K));
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
    mmc_tensor *pe = mmc_contiguous(ctx, mmc_linear(ctx, patches, w2, NULL));          /* [N*g*g, Cv] */
    /* cat(class_embedding, patches) + position_embedding */
    mmc_tensor *x;
    if (grad) {
        mmc_tensor *cls = mmc_add(ctx, mmc_zeros(ctx, MMC_F32, 3, MMC_SHAPE(N, 1, C)),
                                  mmc_reshape(ctx, v->class_emb, 3, MMC_SHAPE(1, 1, C)));        /* [N, 1, C] */
        mmc_tensor *parts[2] = {cls, mmc_reshape(ctx, pe, 3, MMC_SHAPE(N, g * g, C))};
        x = mmc_add(ctx, mmc_concat(ctx, parts, 2, 1), mmc_reshape(ctx, v->pos_emb, 3, MMC_SHAPE(1, T, C)));
    } else {   /* written directly: [N, T, C] */
        x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(N, T, C));
        mmc_tensor *cls = mmc_contiguous(ctx, mmc_cast(ctx, v->class_emb, MMC_F32));
        mmc_tensor *pos = mmc_contiguous(ctx, mmc_cast(ctx, v->pos_emb, MMC_F32));
        float *xd = x->data;
        const float *cd = cls->data, *pd = pos->data, *ed = pe->data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t t = 0; t < T; t++) {
                const float *e = t == 0 ? cd : ed + (n * g * g + t - 1) * C;
                for (int64_t k = 0; k < C; k++) xd[(n * T + t) * C + k] = e[k] + pd[t * C + k];
            }
    }
    mmc_tensor **hs = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *hs * (size_t)(n_layers + 1));
    hs[0] = x = mmc_layernorm(ctx, x, v->pre_ln_w, v->pre_ln_b, (float)c->layer_norm_eps);   /* [N, T, Cv] */
    for (int i = 0; i < n_layers; i++) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        hs[i + 1] = x = mw_keep(ctx, mk, enc_clip_layer_forward(ctx, &v->layers[i], x, c->num_attention_heads,
                                                                (float)c->layer_norm_eps, c->hidden_act, false, NULL));
    }
    mmc_set_grad_enabled(ctx, was);
    *hs_out = hs;
    return MMC_OK;
}
