/* llava.c — LLaVA-1.5, mirroring transformers' LlavaForConditionalGeneration
 * (models/llava/modeling_llava.py, 5.x):
 *
 *   hs = vision_tower(pixel_values).hidden_states           CLIPVisionModel (clip_vision.c)
 *   f  = hs[vision_feature_layer]  (a list: cat of each layer's, on the feature axis)
 *        without the CLS token for "default", all tokens for "full"      [N, n_tok, Cv * n_layers]
 *   f  = linear_2(act(linear_1(f)))                         multi_modal_projector  [N * n_tok, C]
 *   x  = embed_tokens(ids) with the rows at image_token_id replaced by f, in order
 *        (get_placeholder_mask + masked_scatter; the counts must agree)
 *   logits = lm_head(norm(Llama layers(x)))                 the Llama decoder (qwen2.c / llama.c)
 *
 * Positions are plain 1-D (0 .. T-1, then the cache's length when decoding). The config is
 * LlavaConfig: text_config (a Llama; sizes it omits take LlamaConfig's defaults, as the Hub's
 * llava-1.5 configs rely on), vision_config (CLIP), image_token_id or the 4.4x
 * image_token_index, projector_hidden_act, multimodal_projector_bias, vision_feature_layer (an
 * int or a list) and vision_feature_select_strategy. */
#include "mmc_llava.h"
#include "../vision/clip_vision.h"
#include "vlm_splice.h"
#include "mmc_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_llava_free(mmc_llava *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* detaches from the layers, so before they go */
    mmc_qwen2_free(m->lm);   /* its tensors view the mapping the weight set owns */
    clip_vision_free(m->vision);
    if (m->weights) {
        mw_close(m->weights);
        free(m->weights);
    }
    free(m);
}

int64_t mmc_llava_image_tokens(const mmc_llava *m) {
    const mmc_clip_vision_config *v = &m->vision->cfg;
    int64_t g = v->image_size / v->patch_size;
    return g * g + (m->feature_full ? 1 : 0);
}

/* Everything but the weights from config.json (`path` names it in messages). */
static mmc_status read_config(const mmc_json *cfg, const char *path, mmc_llava *m, mmc_qwen2_config *tc,
                              mmc_clip_vision_config *vc, bool *proj_bias) {
    mmc_status st;
    const char *s = NULL;
    if ((st = mmc_json_str(cfg, "model_type", "", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "llava"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not llava", path, s);
    const mmc_json *t = mmc_json_get(cfg, "text_config");
    if (t && (st = mmc_json_str(t, "model_type", "llama", &s))) return mmc_error_prefix(st, "%s", path);
    if (t && strcmp(s, "llama"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: text_config.model_type '%s' is not supported (llama)", path, s);
    if ((st = mmc_llama_config_read_section(cfg, t ? t : cfg, tc))) return mmc_error_prefix(st, "%s", path);
    const mmc_json *v = mmc_json_get(cfg, "vision_config");
    if (!v) return mmc_error(MMC_ERR_FORMAT, "%s: 'vision_config' is missing", path);
    if ((st = mmc_json_str(v, "model_type", "clip_vision_model", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "clip_vision_model"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_config.model_type '%s' is not supported "
                         "(clip_vision_model)", path, s);
    if ((st = mmc_clip_vision_config_read(v, path, vc))) return st;
    int64_t id;
    const char *idkey = mmc_json_has(cfg, "image_token_id") ? "image_token_id" : "image_token_index";
    if ((st = mmc_json_int(cfg, idkey, 32000, &id))) return mmc_error_prefix(st, "%s", path);
    if (id < 0 || id >= tc->vocab_size)
        return mmc_error(MMC_ERR_FORMAT, "%s: %s %lld is outside the vocabulary [0, %lld)", path, idkey,
                         (long long)id, (long long)tc->vocab_size);
    m->image_token_id = id;
    if ((st = mmc_json_str(cfg, "projector_hidden_act", "gelu", &s))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_act_parse(s, path, &m->proj_act))) return st;
    if ((st = mmc_json_bool(cfg, "multimodal_projector_bias", true, proj_bias))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_json_str(cfg, "vision_feature_select_strategy", "default", &s))) return mmc_error_prefix(st, "%s", path);
    if (strcmp(s, "default") && strcmp(s, "full"))
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_feature_select_strategy '%s' is not default or full", path, s);
    m->feature_full = !strcmp(s, "full");
    /* vision_feature_layer: an int or a list of ints, Python indices into hidden_states[0 .. L] */
    int64_t layers[MMC_LLAVA_MAX_FEATURE_LAYERS];
    int n = MMC_LLAVA_MAX_FEATURE_LAYERS;
    const mmc_json *fl = mmc_json_get(cfg, "vision_feature_layer");
    if (fl && !mmc_json_is_object(fl) && mmc_json_int_array(cfg, "vision_feature_layer", layers, &n) == MMC_OK) {
        if (n < 1) return mmc_error(MMC_ERR_FORMAT, "%s: vision_feature_layer is an empty list", path);
    } else {
        n = 1;
        if ((st = mmc_json_int(cfg, "vision_feature_layer", -2, &layers[0]))) return mmc_error_prefix(st, "%s", path);
    }
    const int64_t L = vc->num_hidden_layers;
    for (int i = 0; i < n; i++) {
        int64_t k = layers[i] < 0 ? L + 1 + layers[i] : layers[i];
        if (k < 0 || k > L)
            return mmc_error(MMC_ERR_FORMAT, "%s: vision_feature_layer %lld is outside the tower's %lld hidden states",
                             path, (long long)layers[i], (long long)(L + 1));
        m->feature_layers[i] = (int)k;
    }
    m->n_feature_layers = n;
    return MMC_OK;
}

mmc_status mmc_llava_load(const char *dir, mmc_llava **out) { return mmc_llava_load_ex(dir, false, out); }

mmc_status mmc_llava_load_ex(const char *dir, bool trainable, mmc_llava **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return st;
    mmc_llava *m = calloc(1, sizeof *m);
    mw_set *w = calloc(1, sizeof *w);
    char *verr = NULL;
    if (!m || !w) { free(w); st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    m->weights = w;
    mmc_qwen2_config tc;
    mmc_clip_vision_config vc;
    bool pbias = true;
    if ((st = read_config(cfg, path, m, &tc, &vc, &pbias))) goto fail;
    if ((st = mw_open(dir, "model", w))) goto fail;
    w->trainable = trainable;
    /* Three namings are about: the Hub's 4.4x (vision_tower.vision_model., multi_modal_projector.,
     * language_model.model., language_model.lm_head.), transformers 4.52-4.57's (model.vision_tower.vision_model.,
     * model.multi_modal_projector., model.language_model., lm_head.) and what 5.x's save_pretrained
     * writes (the 4.4x names, but the tower as vision_tower. without vision_model.). Each part's
     * prefix is found by probing. */
    static const char *const vpres[] = {"model.vision_tower.vision_model.", "vision_tower.vision_model.",
                                        "model.vision_tower.", "vision_tower."};
    const char *vpre = vpres[0], *ppre = "model.multi_modal_projector.";
    for (int i = 0; i < 4; i++) {
        char probe[160];
        snprintf(probe, sizeof probe, "%sembeddings.class_embedding", vpres[i]);
        if (mmc_st_find(w->st, probe)) { vpre = vpres[i]; break; }
    }
    if (!mmc_st_find(w->st, "model.multi_modal_projector.linear_1.weight")) ppre = "multi_modal_projector.";
    m->hub_layout = !mmc_st_find(w->st, "model.language_model.embed_tokens.weight");
    const char *lpre = m->hub_layout ? "language_model.model." : "model.language_model.";
    const char *head = m->hub_layout ? "language_model.lm_head.weight" : "lm_head.weight";
    m->vision = clip_vision_bind(w, vpre, &vc);
    if (!m->vision) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    const int64_t C = tc.hidden_size, K = vc.hidden_size * m->n_feature_layers;
    mw_bind_linear(w, ppre, "linear_1", &m->proj1, C, K, pbias);
    mw_bind_linear(w, ppre, "linear_2", &m->proj2, C, C, pbias);
    /* load both parts even if the first fails, so that every problem is reported at once */
    mmc_status vst = mw_status(w, dir, "LLaVA vision tower / projector");
    if (vst) verr = strdup(mmc_last_error());
    mmc_status lst = mmc_qwen2_load_from(w->st, &tc, lpre, head, trainable, &m->lm);
    if (vst || lst) {
        st = vst ? vst : lst;
        char *lerr = lst ? strdup(mmc_last_error()) : NULL;
        mmc_error(st, "%s%s%s%s", vst && verr ? verr : "", vst && lst ? "\n" : "", lst ? dir : "",
                  lerr ? lerr : "");
        free(lerr);
        goto fail;
    }
    free(verr);
    mmc_json_free(cfg);
    *out = m;
    return MMC_OK;
fail:
    free(verr);
    mmc_json_free(cfg);
    mmc_llava_free(m);
    return st;
}

mmc_status mmc_llava_new(const mmc_json *cfg, const char *what, uint64_t seed, mmc_llava **out) {
    *out = NULL;
    mmc_llava *m = calloc(1, sizeof *m);
    mw_set *w = calloc(1, sizeof *w);
    if (!m || !w) { free(m); free(w); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    m->weights = w;
    mmc_qwen2_config tc;
    mmc_clip_vision_config vc;
    bool pbias = true;
    mmc_status st = read_config(cfg, what ? what : "config", m, &tc, &vc, &pbias);
    /* separate streams for the parts, so that changing one config leaves the others' init */
    if (!st) st = mw_init_random(w, seed * 0x9E3779B97F4A7C15ull + 1, MW_INIT_HF_NORMAL);
    if (!st && !(m->vision = clip_vision_bind(w, "vision_tower.", &vc))) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st) {
        const int64_t C = tc.hidden_size, K = vc.hidden_size * m->n_feature_layers;
        mw_bind_linear(w, "multi_modal_projector.", "linear_1", &m->proj1, C, K, pbias);
        mw_bind_linear(w, "multi_modal_projector.", "linear_2", &m->proj2, C, C, pbias);
        st = mw_status(w, what ? what : "config", "LLaVA vision tower / projector");
    }
    if (!st) st = mmc_qwen2_new(&tc, seed, &m->lm);
    if (st) { mmc_llava_free(m); return st; }
    *out = m;
    return MMC_OK;
}

mmc_status mmc_llava_image_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, mmc_tensor **out) {
    *out = NULL;
    int need = 0;
    for (int i = 0; i < m->n_feature_layers; i++) need = m->feature_layers[i] > need ? m->feature_layers[i] : need;
    mmc_tensor **hs;
    mmc_status st = mmc_clip_vision_forward(ctx, m->vision, pixels, need, &hs);
    if (st) return st;
    const int64_t N = pixels->shape[0], T = hs[0]->shape[1], n_tok = mmc_llava_image_tokens(m);
    mmc_tensor *sel[MMC_LLAVA_MAX_FEATURE_LAYERS];
    for (int i = 0; i < m->n_feature_layers; i++)
        sel[i] = mmc_narrow(ctx, hs[m->feature_layers[i]], 1, T - n_tok, n_tok);     /* [N, n_tok, Cv] */
    mmc_tensor *f = m->n_feature_layers == 1 ? sel[0] : mmc_concat(ctx, sel, m->n_feature_layers, 2);
    f = mmc_reshape(ctx, mmc_contiguous(ctx, f), 2, MMC_SHAPE(N * n_tok, f->shape[2]));  /* [N*n_tok, Cv*nl] */
    f = enc_act(ctx, m->proj_act, mmc_nn_linear(ctx, f, &m->proj1));                     /* [N*n_tok, C] */
    *out = mmc_contiguous(ctx, mmc_nn_linear(ctx, f, &m->proj2));                        /* [N*n_tok, C] */
    return MMC_OK;
}

mmc_status mmc_llava_forward(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                             mmc_tensor **hidden) {
    *hidden = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    if (!ids || ids->ndim != 2 || (ids->dtype != MMC_I32 && ids->dtype != MMC_I64))
        return mmc_error(MMC_ERR_SHAPE, "llava forward: ids must be [B, T] int32/int64");
    const int64_t B = ids->shape[0], T = ids->shape[1];
    if (T <= 0 || B <= 0) return mmc_error(MMC_ERR_INVALID, "llava forward: empty input");
    if (pixels && kv && kv->len > 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava forward: images after the prompt (KV cache holds %lld "
                         "positions) are not supported", (long long)kv->len);
    if (kv && (kv->batch != B || kv->n_layers != c->num_layers))
        return mmc_error(MMC_ERR_SHAPE, "llava forward: KV cache for batch %lld / %d layers, input batch %lld",
                         (long long)kv->batch, kv->n_layers, (long long)B);
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_status st = MMC_OK;
    mmc_tensor *idc = mmc_contiguous(ctx, ids);
    int64_t n_img = 0;
    if ((st = vlm_check_ids(idc, c->vocab_size, m->image_token_id, &n_img))) goto done;
    /* embeddings, with the projected image features at the <image> positions */
    mmc_tensor *e = mmc_contiguous(ctx, mmc_qwen2_embed(ctx, m->lm, idc));     /* [B, T, C], ours */
    int64_t n_feat = pixels ? pixels->shape[0] * mmc_llava_image_tokens(m) : 0;
    if (pixels && pixels->ndim != 4) {
        st = mmc_error(MMC_ERR_SHAPE, "llava forward: pixel_values must be [N, 3, S, S]");
        goto done;
    }
    if (n_img != n_feat) {
        st = mmc_error(MMC_ERR_INVALID, "image features and image tokens do not match: the prompt has %lld <image> "
                       "tokens (id %lld) but %lld image%s give%s %lld features", (long long)n_img,
                       (long long)m->image_token_id, pixels ? (long long)pixels->shape[0] : 0LL,
                       pixels && pixels->shape[0] == 1 ? "" : "s", pixels && pixels->shape[0] == 1 ? "s" : "",
                       (long long)n_feat);
        goto done;
    }
    if (pixels && n_feat > 0) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *f;
        if ((st = mmc_llava_image_features(ctx, m, pixels, &f))) goto done;
        vlm_splice(e, idc, m->image_token_id, f);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);   /* the tower's activations */
    }
    st = mmc_qwen2_forward_embeds(ctx, m->lm, e, kv, hidden);
done:
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_tensor *mmc_llava_logits(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *hidden) {
    return mmc_qwen2_logits(ctx, m->lm, hidden);
}

/* ------------------------------------------------------------------ decoder interface */
static mmc_status llava_fwd(mmc_ctx *ctx, void *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                           mmc_tensor **h) {
    return mmc_llava_forward(ctx, m, ids, pixels, kv, h);
}

static mmc_status llava_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                float **logits) {
    mmc_llava_request *r = self;
    return vlm_feed(ctx, llava_fwd, r->m, r->m->lm, ids, n, r->pixels, kv, logits);
}

static mmc_status llava_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    mmc_llava_request *r = self;
    return vlm_feed(ctx, llava_fwd, r->m, r->m->lm, &token, 1, NULL, kv, logits);
}

mmc_decoder mmc_llava_decoder(mmc_llava_request *r) {
    mmc_decoder d = mmc_qwen2_decoder(r->m->lm);
    d.self = r;
    d.prefill = llava_prefill;
    d.decode = llava_decode;
    return d;
}
