/* internvl.c — InternVL 2.5 / 3, mirroring transformers' InternVLForConditionalGeneration
 * (models/internvl/modeling_internvl.py, 5.x):
 *
 *   f = vision_tower(tiles)   InternVLVisionModel (vision/intern_vit.c): last_hidden_state for
 *       vision_feature_layer -1, else hidden_states[vision_feature_layer]     [N, 1 + g*g, Cv]
 *   f = f[:, 1:]  (strategy "default": without the CLS token), reshaped [N, g, g, Cv]
 *   f = pixel_shuffle(f, downsample_ratio r):  view [N, g, g r, Cv / r], permute(0, 2, 1, 3),
 *       view [N, g r, g r, Cv / r^2], permute(0, 2, 1, 3) -> [N, (g r)^2, Cv / r^2]; with s = 1/r,
 *       token (a, b) channel (i s + j) Cv + c is grid cell (s a + i, s b + j) channel c
 *   f = linear_2(act(linear_1(layer_norm(f))))            multi_modal_projector  [N * (g r)^2, C]
 *   x = embed_tokens(ids) with the rows at image_token_id (<IMG_CONTEXT>) replaced by f in order
 *   logits = lm_head(norm(Qwen2 layers(x)))               qwen2.c, through its public API
 *
 * Positions are plain 1-D. The config is InternVLConfig: text_config (Qwen2), vision_config
 * (InternVLVisionConfig), image_token_id, downsample_ratio, projector_hidden_act,
 * vision_feature_layer (an int) and vision_feature_select_strategy ("default"; "full" leaves a
 * non-square grid that transformers cannot reshape either).
 *
 * OpenGVLab's remote-code layout (InternVLChatModel, model_type "internvl_chat", what most
 * InternVL checkpoints on the Hub are) is the same computation under other names, read onto the
 * same structs: vision_model.* (InternVisionModel, intern_vit.c's remote names), mlp1.0 / mlp1.1 /
 * mlp1.3 (LayerNorm, Linear, GELU, Linear), language_model.model.* / language_model.lm_head.*; the
 * config's llm_config (Qwen2ForCausalLM, or InternLM2ForCausalLM: text/internlm2.c reads its
 * packed wqkv / w1 w3 w2 names onto the same Llama decoder), vision_config
 * (intern_vit_6b), select_layer, downsample_ratio and ps_version ("v1" leaves the shuffled grid
 * transposed: token (a, b) at b * g r + a). The <IMG_CONTEXT> id is not in that config: it is
 * read from the directory's tokenizer, as InternVLChatModel.chat() does. With `packed`
 * (mmc_internvl_load_opts: training, or a PEFT adapter at inference) its InternLM2 is loaded in its
 * own layout instead, one attention.wqkv linear per layer (mmc_internlm2_load_packed), the layout
 * internvl_train.c trains and PEFT's wqkv adapters sit on; its Qwen2 trains and takes adapters as
 * loaded (language_model.model.* / language_model.lm_head.weight). */
#include "mmc_internvl.h"
#include "mmc_lora.h"
#include "../vision/intern_vit.h"
#include "vlm_splice.h"
#include "../encoders/encoder_common.h"
#include "mmc_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_internvl_free(mmc_internvl *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* detaches from the layers, so before they go */
    mmc_qwen2_free(m->lm);
    free(m->lm_repack);   /* after the model that views it */
    intern_vit_free(m->vision);
    if (m->weights) {
        mw_close(m->weights);
        free(m->weights);
    }
    free(m);
}

int64_t mmc_internvl_tile_tokens(const mmc_internvl *m, int64_t s) {
    const mmc_intern_vit_config *v = intern_vit_cfg(m->vision);
    int64_t g = s / v->patch_size / m->shuffle;
    return g * g;
}

static mmc_status downsample_read(const mmc_json *cfg, const char *path, const mmc_intern_vit_config *vc,
                                  mmc_internvl *m) {
    double r;
    mmc_status st;
    if ((st = mmc_json_num(cfg, "downsample_ratio", 0.5, &r))) return mmc_error_prefix(st, "%s", path);
    double inv = r > 0 ? 1.0 / r : 0;
    if (!(inv >= 1 && inv <= 16 && fabs(inv - floor(inv + 0.5)) < 1e-9))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: downsample_ratio %g is not 1/k for an integer k", path, r);
    m->shuffle = (int)floor(inv + 0.5);
    if ((vc->image_size / vc->patch_size) % m->shuffle)
        return mmc_error(MMC_ERR_FORMAT, "%s: the tower's %lld x %lld patch grid does not divide by 1/downsample_ratio "
                         "%d", path, (long long)(vc->image_size / vc->patch_size),
                         (long long)(vc->image_size / vc->patch_size), m->shuffle);
    return MMC_OK;
}

static mmc_status feature_layer_read(const mmc_json *cfg, const char *path, const char *key,
                                     const mmc_intern_vit_config *vc, mmc_internvl *m) {
    int64_t fl;
    mmc_status st = mmc_json_int(cfg, key, -1, &fl);
    if (st) return mmc_error_prefix(st, "%s: %s (an int; lists are not supported)", path, key);
    const int64_t L = vc->num_hidden_layers;
    int64_t k = fl == -1 ? L + 1 : fl < 0 ? L + 1 + fl : fl;
    if (k < 0 || k > L + 1 || (fl >= 0 && fl > L))
        return mmc_error(MMC_ERR_FORMAT, "%s: %s %lld is outside the tower's %lld hidden states", path, key,
                         (long long)fl, (long long)(L + 1));
    m->feature_layer = (int)k;
    return MMC_OK;
}

/* OpenGVLab's InternVLChatConfig */
static mmc_status read_config_remote(const mmc_json *cfg, const char *path, mmc_internvl *m, mmc_qwen2_config *tc,
                                     mmc_intern_vit_config *vc) {
    mmc_status st;
    const char *s = NULL;
    m->remote_layout = true;
    const mmc_json *t = mmc_json_get(cfg, "llm_config");
    if (!t) return mmc_error(MMC_ERR_FORMAT, "%s: 'llm_config' is missing", path);
    if ((st = mmc_json_str(t, "model_type", "qwen2", &s))) return mmc_error_prefix(st, "%s", path);
    m->lm_internlm2 = !strcmp(s, "internlm2");
    if (strcmp(s, "qwen2") && !m->lm_internlm2)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: llm_config.model_type '%s' is not supported (qwen2, internlm2)",
                         path, s);
    st = m->lm_internlm2 ? mmc_internlm2_config_read_section(t, t, tc) : mmc_decoder_config_read(t, t, NULL, tc);
    if (st) return mmc_error_prefix(st, "%s: llm_config", path);
    const mmc_json *v = mmc_json_get(cfg, "vision_config");
    if (!v) return mmc_error(MMC_ERR_FORMAT, "%s: 'vision_config' is missing", path);
    if ((st = mmc_json_str(v, "model_type", "intern_vit_6b", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "intern_vit_6b"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_config.model_type '%s' is not supported (intern_vit_6b)",
                         path, s);
    if ((st = mmc_intern_vit_config_read_remote(v, path, vc))) return st;
    int64_t id = -1;
    if (mmc_json_has(cfg, "img_context_token_id") && mmc_json_int(cfg, "img_context_token_id", -1, &id) != MMC_OK)
        id = -1;   /* null: set by chat() from the tokenizer */
    m->image_token_id = id;
    m->proj_act = MMC_ACT_GELU;   /* nn.GELU() */
    if ((st = downsample_read(cfg, path, vc, m))) return st;
    if ((st = mmc_json_str(cfg, "ps_version", "v1", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "v1") && strcmp(s, "v2"))
        return mmc_error(MMC_ERR_FORMAT, "%s: ps_version '%s' is not v1 or v2", path, s);
    m->ps_v1 = !strcmp(s, "v1");
    return feature_layer_read(cfg, path, "select_layer", vc, m);
}

static mmc_status read_config(const mmc_json *cfg, const char *path, mmc_internvl *m, mmc_qwen2_config *tc,
                              mmc_intern_vit_config *vc) {
    mmc_status st;
    const char *s = NULL;
    if ((st = mmc_json_str(cfg, "model_type", "", &s))) return mmc_error_prefix(st, "%s", path);
    if (!strcmp(s, "internvl_chat")) return read_config_remote(cfg, path, m, tc, vc);
    if (strcmp(s, "internvl"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not internvl or internvl_chat", path, s);
    const mmc_json *t = mmc_json_get(cfg, "text_config");
    if (!t) return mmc_error(MMC_ERR_FORMAT, "%s: 'text_config' is missing", path);
    if ((st = mmc_json_str(t, "model_type", "qwen2", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "qwen2"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: text_config.model_type '%s' is not supported (qwen2)", path, s);
    if ((st = mmc_qwen2_config_read(cfg, tc))) return mmc_error_prefix(st, "%s: text_config", path);
    const mmc_json *v = mmc_json_get(cfg, "vision_config");
    if (!v) return mmc_error(MMC_ERR_FORMAT, "%s: 'vision_config' is missing", path);
    if ((st = mmc_json_str(v, "model_type", "internvl_vision", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "internvl_vision"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_config.model_type '%s' is not supported (internvl_vision)",
                         path, s);
    if ((st = mmc_intern_vit_config_read(v, path, vc))) return st;
    int64_t id;
    if ((st = mmc_json_int(cfg, "image_token_id", 151667, &id))) return mmc_error_prefix(st, "%s", path);
    if (id < 0 || id >= tc->vocab_size)
        return mmc_error(MMC_ERR_FORMAT, "%s: image_token_id %lld is outside the vocabulary [0, %lld)", path,
                         (long long)id, (long long)tc->vocab_size);
    m->image_token_id = id;
    if ((st = mmc_json_str(cfg, "projector_hidden_act", "gelu", &s))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_act_parse(s, path, &m->proj_act))) return st;
    if ((st = downsample_read(cfg, path, vc, m))) return st;
    if ((st = mmc_json_str(cfg, "vision_feature_select_strategy", "default", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "default"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_feature_select_strategy '%s' (only default: the CLS token "
                         "leaves a non-square grid for the pixel shuffle)", path, s);
    return feature_layer_read(cfg, path, "vision_feature_layer", vc, m);
}

static void bind_projector(mw_set *w, const char *ppre, mmc_internvl *m, int64_t Cv, int64_t C) {
    const int64_t K = Cv * m->shuffle * m->shuffle;
    bool r = m->remote_layout;   /* mlp1 = Sequential(LayerNorm, Linear, GELU, Linear) */
    mw_bind_wb(w, ppre, r ? "0" : "layer_norm", &m->proj_ln_w, &m->proj_ln_b, 1, MMC_SHAPE(K));
    mw_bind_linear(w, ppre, r ? "1" : "linear_1", &m->proj1, C, K, true);
    mw_bind_linear(w, ppre, r ? "3" : "linear_2", &m->proj2, C, C, true);
}

mmc_status mmc_internvl_load(const char *dir, mmc_internvl **out) { return mmc_internvl_load_opts(dir, false, false, out); }

mmc_status mmc_internvl_load_ex(const char *dir, bool trainable, mmc_internvl **out) {
    return mmc_internvl_load_opts(dir, trainable, trainable, out);
}

mmc_status mmc_internvl_load_opts(const char *dir, bool trainable, bool packed, mmc_internvl **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return st;
    mmc_internvl *m = calloc(1, sizeof *m);
    mw_set *w = calloc(1, sizeof *w);
    char *verr = NULL;
    if (!m || !w) { free(w); st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    m->weights = w;
    mmc_qwen2_config tc;
    mmc_intern_vit_config vc;
    if ((st = read_config(cfg, path, m, &tc, &vc))) goto fail;
    if ((st = mw_open(dir, "model", w))) goto fail;
    w->trainable = trainable;   /* f32 copies flagged as parameters (internvl_train.c) */
    /* 5.x save_pretrained: vision_tower., multi_modal_projector., language_model.model.,
     * language_model.lm_head.; 4.52-4.57: model.vision_tower., model.multi_modal_projector.,
     * model.language_model., lm_head. Each part's prefix is probed. */
    const char *vpre = mmc_st_find(w->st, "model.vision_tower.embeddings.cls_token") ? "model.vision_tower." : "vision_tower.";
    const char *ppre = mmc_st_find(w->st, "model.multi_modal_projector.linear_1.weight") ? "model.multi_modal_projector."
                                                                                          : "multi_modal_projector.";
    if (m->remote_layout) vpre = "vision_model.", ppre = "mlp1.";
    m->hub_layout = m->remote_layout || !mmc_st_find(w->st, "model.language_model.embed_tokens.weight");
    const char *lpre = m->hub_layout ? "language_model.model." : "model.language_model.";
    const char *head = m->hub_layout ? "language_model.lm_head.weight" : "lm_head.weight";
    if (!(m->vision = intern_vit_bind(w, vpre, &vc))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    bind_projector(w, ppre, m, vc.hidden_size, tc.hidden_size);
    mmc_status vst = mw_status(w, dir, "InternVL vision tower / projector");
    if (vst) verr = strdup(mmc_last_error());
    mmc_status lst;
    if (m->lm_internlm2 && packed) {   /* InternLM2's own layout: one packed wqkv linear per layer (internlm2.c) */
        lst = mmc_internlm2_load_packed(dir, cfg, "language_model.", trainable, &m->lm);
        if (lst) mmc_error_prefix(lst, ": InternLM2 language model");
    } else if (m->lm_internlm2) {   /* InternLM2's names and packed wqkv seen under Llama's names */
        mmc_st *view = NULL;
        lst = mmc_internlm2_llama_view(w->st, "language_model.", &tc, "language_model.", &view, &m->lm_repack);
        if (!lst) lst = mmc_qwen2_load_from(view, &tc, lpre, head, trainable, &m->lm);
        if (lst) mmc_error_prefix(lst, ": InternLM2 language model (its tensors named as Llama's below: tok_embeddings -> "
                                  "embed_tokens, attention.wqkv -> q/k/v_proj, attention.wo -> o_proj, feed_forward."
                                  "w1/w3/w2 -> mlp.gate/up/down_proj, attention_norm / ffn_norm -> input_layernorm / "
                                  "post_attention_layernorm, output -> lm_head)");
        mmc_st_close(view);
    } else {
        lst = mmc_qwen2_load_from(w->st, &tc, lpre, head, trainable, &m->lm);
    }
    if (vst || lst) {
        st = vst ? vst : lst;
        char *lerr = lst ? strdup(mmc_last_error()) : NULL;
        mmc_error(st, "%s%s%s%s", vst && verr ? verr : "", vst && lst ? "\n" : "", lst ? dir : "", lerr ? lerr : "");
        free(lerr);
        goto fail;
    }
    if (m->image_token_id < 0) {   /* InternVLChatModel: chat() takes <IMG_CONTEXT>'s id from the tokenizer */
        mmc_tokenizer *tok = NULL;
        if ((st = mmc_tokenizer_load(dir, &tok))) { mmc_error_prefix(st, "%s: the <IMG_CONTEXT> id", dir); goto fail; }
        int32_t id = mmc_tokenizer_token_to_id(tok, "<IMG_CONTEXT>");
        mmc_tokenizer_free(tok);
        if (id < 0 || id >= tc.vocab_size) {
            st = mmc_error(MMC_ERR_FORMAT, "%s: the tokenizer has no <IMG_CONTEXT> token inside the vocabulary", dir);
            goto fail;
        }
        m->image_token_id = id;
    }
    free(verr);
    mmc_json_free(cfg);
    *out = m;
    return MMC_OK;
fail:
    free(verr);
    mmc_json_free(cfg);
    mmc_internvl_free(m);
    return st;
}

mmc_status mmc_internvl_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_internvl **out) {
    *out = NULL;
    mmc_internvl *m = calloc(1, sizeof *m);
    mw_set *w = calloc(1, sizeof *w);
    if (!m || !w) { free(m); free(w); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    m->weights = w;
    mmc_qwen2_config tc;
    mmc_intern_vit_config vc;
    mmc_status st = read_config(cfg, what ? what : "config", m, &tc, &vc);
    if (!st) st = mw_init_random(w, seed * 0x9E3779B97F4A7C15ull + 1, MW_INIT_HF_NORMAL);
    if (!st && !(m->vision = intern_vit_bind(w, "vision_tower.", &vc))) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) {
        bind_projector(w, "multi_modal_projector.", m, vc.hidden_size, tc.hidden_size);
        st = mw_status(w, what ? what : "config", "InternVL vision tower / projector");
    }
    if (!st) st = mmc_qwen2_new(&tc, seed, &m->lm);
    if (st) { mmc_internvl_free(m); return st; }
    *out = m;
    return MMC_OK;
}

mmc_status mmc_internvl_image_features(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *pixels, mmc_tensor **out) {
    *out = NULL;
    const mmc_intern_vit_config *vc = intern_vit_cfg(m->vision);
    const int64_t L = vc->num_hidden_layers;
    if (!pixels || pixels->ndim != 4 || pixels->shape[2] != pixels->shape[3])
        return mmc_error(MMC_ERR_SHAPE, "InternVL: pixel_values must be square tiles [N, 3, s, s]");
    const int64_t g = pixels->shape[2] / vc->patch_size, s = m->shuffle;
    if (pixels->shape[2] % vc->patch_size || g % s)
        return mmc_error(MMC_ERR_SHAPE, "InternVL: tiles of %lld pixels do not make a patch grid divisible by %lld "
                         "(patch_size %lld)", (long long)pixels->shape[2], (long long)s, (long long)vc->patch_size);
    mmc_tensor **hs, *last;
    int need = m->feature_layer > L ? (int)L : m->feature_layer;
    mmc_status st = mmc_intern_vit_forward(ctx, m->vision, pixels, need, &hs, &last);
    if (st) return st;
    mmc_tensor *f = mmc_contiguous(ctx, m->feature_layer > L ? last : hs[m->feature_layer]);   /* [N, 1 + g*g, Cv] */
    const int64_t N = pixels->shape[0], Cv = vc->hidden_size, gs = g / s, K = Cv * s * s;
    /* drop CLS, then the pixel shuffle as one row gather (the view / permute chain of the header;
     * differentiable, so that a trained tower gets its gradient) */
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(N * gs * gs * s * s));
    int64_t *ix = idx->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t a = 0; a < gs; a++)
            for (int64_t b = 0; b < gs; b++)
                for (int64_t i = 0; i < s; i++)
                    for (int64_t j = 0; j < s; j++) {
                        int64_t cell = (s * a + i) * g + (s * b + j);
                        if (m->ps_v1) cell = (s * b + i) * g + (s * a + j);   /* the output grid transposed */
                        *ix++ = n * (1 + g * g) + 1 + cell;
                    }
    f = mmc_reshape(ctx, f, 2, MMC_SHAPE(N * (1 + g * g), Cv));                           /* [N*(1+g*g), Cv] */
    mmc_tensor *sh = mmc_reshape(ctx, mmc_gather_rows(ctx, f, idx), 2, MMC_SHAPE(N * gs * gs, K));  /* [N*gs*gs, K] */
    mmc_tensor *h = mmc_layernorm(ctx, sh, m->proj_ln_w, m->proj_ln_b, 1e-5f);   /* nn.LayerNorm's default eps */
    h = enc_act(ctx, m->proj_act, mmc_nn_linear(ctx, h, &m->proj1));              /* [N*gs*gs, C] */
    *out = mmc_contiguous(ctx, mmc_nn_linear(ctx, h, &m->proj2));
    return MMC_OK;
}


mmc_status mmc_internvl_forward(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *ids, mmc_tensor *pixels,
                                mmc_kv_cache *kv, mmc_tensor **hidden) {
    *hidden = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    if (!ids || ids->ndim != 2 || (ids->dtype != MMC_I32 && ids->dtype != MMC_I64))
        return mmc_error(MMC_ERR_SHAPE, "internvl forward: ids must be [B, T] int32/int64");
    const int64_t B = ids->shape[0], T = ids->shape[1];
    if (T <= 0 || B <= 0) return mmc_error(MMC_ERR_INVALID, "internvl forward: empty input");
    if (pixels && kv && kv->len > 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "internvl forward: images after the prompt (KV cache holds %lld "
                         "positions) are not supported", (long long)kv->len);
    if (kv && (kv->batch != B || kv->n_layers != c->num_layers))
        return mmc_error(MMC_ERR_SHAPE, "internvl forward: KV cache for batch %lld / %d layers, input batch %lld",
                         (long long)kv->batch, kv->n_layers, (long long)B);
    if (pixels && (pixels->ndim != 4 || pixels->shape[2] != pixels->shape[3]))
        return mmc_error(MMC_ERR_SHAPE, "internvl forward: pixel_values must be square tiles [N, 3, s, s]");
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_status st = MMC_OK;
    mmc_tensor *idc = mmc_contiguous(ctx, ids);
    int64_t n_img = 0;
    if ((st = vlm_check_ids(idc, c->vocab_size, m->image_token_id, &n_img))) goto done;
    mmc_tensor *e = mmc_contiguous(ctx, mmc_qwen2_embed(ctx, m->lm, idc));     /* [B, T, C], ours */
    int64_t n_feat = pixels ? pixels->shape[0] * mmc_internvl_tile_tokens(m, pixels->shape[2]) : 0;
    if (n_img != n_feat) {
        st = mmc_error(MMC_ERR_INVALID, "image features and image tokens do not match: the prompt has %lld "
                       "<IMG_CONTEXT> tokens (id %lld) but %lld tile%s give %lld features", (long long)n_img,
                       (long long)m->image_token_id, pixels ? (long long)pixels->shape[0] : 0LL,
                       pixels && pixels->shape[0] == 1 ? "" : "s", (long long)n_feat);
        goto done;
    }
    if (pixels && n_feat > 0) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *f;
        if ((st = mmc_internvl_image_features(ctx, m, pixels, &f))) goto done;
        vlm_splice(e, idc, m->image_token_id, f);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);   /* the tower's activations */
    }
    st = mmc_qwen2_forward_embeds(ctx, m->lm, e, kv, hidden);
done:
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_tensor *mmc_internvl_logits(mmc_ctx *ctx, mmc_internvl *m, mmc_tensor *hidden) {
    return mmc_qwen2_logits(ctx, m->lm, hidden);
}

/* ------------------------------------------------------------------ decoder interface */
static mmc_status internvl_fwd(mmc_ctx *ctx, void *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                              mmc_tensor **h) {
    return mmc_internvl_forward(ctx, m, ids, pixels, kv, h);
}

static mmc_status dec_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                              float **logits) {
    mmc_internvl_request *r = self;
    return vlm_feed(ctx, internvl_fwd, r->m, r->m->lm, ids, n, r->pixels, kv, logits);
}

static mmc_status dec_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    mmc_internvl_request *r = self;
    return vlm_feed(ctx, internvl_fwd, r->m, r->m->lm, &token, 1, NULL, kv, logits);
}

mmc_decoder mmc_internvl_decoder(mmc_internvl_request *r) {
    mmc_decoder d = mmc_qwen2_decoder(r->m->lm);
    d.self = r;
    d.prefill = dec_prefill;
    d.decode = dec_decode;
    return d;
}
