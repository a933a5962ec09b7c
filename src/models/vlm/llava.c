/* llava.c — the LLaVA family, mirroring transformers' LlavaForConditionalGeneration
 * (models/llava/modeling_llava.py, 5.x), LlavaNextForConditionalGeneration (llava_next/) and
 * LlavaOnevisionForConditionalGeneration (llava_onevision/), one struct with a variant:
 *
 *   hs = vision_tower(pixel_values).hidden_states    CLIPVisionModel (clip_vision.c) or SiglipVisionModel
 *                                                    (siglip_vision.c); NeXT / OneVision: every tile
 *   f  = hs[vision_feature_layer]  (a list: cat of each layer's, on the feature axis)
 *        without the first token for "default", all tokens for "full"   [P, n_tok, Cv * n_layers]
 *   f  = linear_2(act(linear_1(f)))                         multi_modal_projector  [P * n_tok, C]
 *   NeXT / OneVision (pack_image_features), per image: the base tile's tokens, then the other tiles
 *        as one (gh*g) x (gw*g) grid (gh x gw tiles from select_best_resolution over
 *        image_grid_pinpoints), un-padded to the image's aspect ratio (unpad_image), for OneVision
 *        bilinearly downsampled when it exceeds anyres_max_N tiles' worth by 10 %, then each grid
 *        row followed by image_newline; a OneVision image in a prompt of several: its one tile and
 *        image_newline
 *   x  = embed_tokens(ids) with the rows at image_token_id replaced by f, in order
 *        (get_placeholder_mask + masked_scatter; the counts must agree)
 *   logits = lm_head(norm(decoder layers(x)))       Llama / Mistral (llama.c) or Qwen2 (qwen2.c)
 *
 * Positions are plain 1-D (0 .. T-1, then the cache's length when decoding). The config is
 * LlavaConfig / LlavaNextConfig / LlavaOnevisionConfig: text_config (a Llama or Mistral, sizes it
 * omits taking LlamaConfig's defaults as the Hub's llava configs rely on, or a Qwen2), vision_config
 * (CLIP or SigLIP), image_token_id or the 4.4x image_token_index, projector_hidden_act,
 * multimodal_projector_bias, vision_feature_layer (an int or a list), vision_feature_select_strategy,
 * and for NeXT / OneVision image_grid_pinpoints (each a multiple of the tower's image_size, as the
 * tiling needs) and OneVision's vision_aspect_ratio ("anyres_max_N"). Mistral's sliding-window
 * attention is not implemented: it equals full attention while the sequence fits in the window
 * (4096 for Mistral-7B-v0.1; llava-v1.6-mistral's v0.2 has none), and a longer sequence under a
 * window is refused (MMC_ERR_UNSUPPORTED) rather than computed differently. */
#include "mmc_llava.h"
#include "../vision/clip_vision.h"
#include "../vision/siglip_vision.h"
#include "vlm_splice.h"
#include "mmc_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mmc_llava_free(mmc_llava *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* detaches from the layers, so before they go */
    mmc_qwen2_free(m->lm);   /* its tensors view the mapping the weight set owns */
    clip_vision_free(m->vision);
    siglip_vision_free(m->siglip);
    if (m->weights) {
        mw_close(m->weights);
        free(m->weights);
    }
    free(m);
}

/* the tower's tile geometry: S (image_size), g (S / p) and whether it has a CLS token */
static void tower_geom(const mmc_llava *m, int64_t *S, int64_t *g, bool *cls) {
    if (m->siglip) {
        const mmc_siglip_vision_config *v = &m->siglip->cfg;
        *S = v->image_size, *g = v->image_size / v->patch_size, *cls = false;
    } else {
        const mmc_clip_vision_config *v = &m->vision->cfg;
        *S = v->image_size, *g = v->image_size / v->patch_size, *cls = true;
    }
}

int64_t mmc_llava_image_tokens(const mmc_llava *m) {
    int64_t S, g;
    bool cls;
    tower_geom(m, &S, &g, &cls);
    return g * g + (cls ? 1 : 0) - (m->feature_full ? 0 : 1);
}

void mmc_llava_best_resolution(const int64_t (*pins)[2], int n, int64_t h, int64_t w, int64_t *bh, int64_t *bw) {
    int64_t max_eff = 0;
    double min_waste = INFINITY;
    *bh = pins[0][0], *bw = pins[0][1];
    for (int i = 0; i < n; i++) {
        const int64_t ph = pins[i][0], pw = pins[i][1];
        const double sw = (double)pw / (double)w, sh = (double)ph / (double)h, scale = sw < sh ? sw : sh;
        const int64_t dw = (int64_t)((double)w * scale), dh = (int64_t)((double)h * scale);
        const int64_t eff = dw * dh < w * h ? dw * dh : w * h;
        const double waste = (double)(pw * ph - eff);
        if (eff > max_eff || (eff == max_eff && waste < min_waste)) {
            max_eff = eff, min_waste = waste;
            *bh = ph, *bw = pw;
        }
    }
}

/* Python's round(x, 7) then int(): the rounding only removes float noise before truncating */
static int64_t round7_int(double x) { return (int64_t)(nearbyint(x * 1e7) / 1e7); }

/* Python's float floor division a // b (CPython's float_floor_div) */
static double py_floordiv(double a, double b) {
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    double fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return fl;
}

/* How one image's features are laid out (pack_image_features). */
typedef struct {
    int64_t np;                   /* tiles (base included) */
    int64_t gh, gw;               /* the grid of tiles after the base one */
    int64_t r0, r1, c0, c1;       /* the un-padded rows / columns of the (gh*g) x (gw*g) grid */
    int64_t nh, nw;               /* after OneVision's downsampling (else r1 - r0, c1 - c0) */
    int64_t n_feat;
} img_layout;

static void image_layout(const mmc_llava *m, int64_t h, int64_t w, bool multi, img_layout *L) {
    memset(L, 0, sizeof *L);
    int64_t S, g;
    bool cls;
    tower_geom(m, &S, &g, &cls);
    const int64_t n_tok = mmc_llava_image_tokens(m);
    if (m->variant == MMC_LLAVA_15) { L->np = 1, L->n_feat = n_tok; return; }
    if (m->variant == MMC_LLAVA_ONEVISION && multi) { L->np = 1, L->n_feat = n_tok + 1; return; }
    int64_t bh, bw;
    mmc_llava_best_resolution((const int64_t (*)[2])m->pinpoints, m->n_pinpoints, h, w, &bh, &bw);
    L->gh = bh / S, L->gw = bw / S;
    L->np = 1 + L->gh * L->gw;
    const int64_t H = L->gh * g, W = L->gw * g;
    L->r0 = 0, L->r1 = H, L->c0 = 0, L->c1 = W;
    if ((double)w / (double)h > (double)W / (double)H) {
        const int64_t nh = round7_int((double)h * ((double)W / (double)w)), pad = (H - nh) / 2;
        L->r0 = pad, L->r1 = H - pad;
    } else {
        const int64_t nw = round7_int((double)w * ((double)H / (double)h)), pad = (W - nw) / 2;
        L->c0 = pad, L->c1 = W - pad;
    }
    L->nh = L->r1 - L->r0, L->nw = L->c1 - L->c0;
    if (m->variant == MMC_LLAVA_ONEVISION) {
        const double ratio = sqrt((double)(L->nh * L->nw) / (double)(m->max_num_patches * g * g));
        if (ratio > 1.1) {
            L->nh = (int64_t)py_floordiv((double)L->nh, ratio);
            L->nw = (int64_t)py_floordiv((double)L->nw, ratio);
        }
    }
    L->n_feat = n_tok + L->nh * (L->nw + 1);
}

int64_t mmc_llava_image_patches(const mmc_llava *m, int64_t h, int64_t w, bool multi) {
    img_layout L;
    image_layout(m, h, w, multi, &L);
    return L.np;
}

static const char *variant_name(mmc_llava_variant v) {
    return v == MMC_LLAVA_NEXT ? "llava_next" : v == MMC_LLAVA_ONEVISION ? "llava_onevision" : "llava";
}

/* image_grid_pinpoints: [[h, w], ...], each a positive multiple of the tile size S (or the class default) */
static mmc_status read_pinpoints(const mmc_json *cfg, const char *path, int64_t S, mmc_llava *m) {
    static const int64_t next_def[5][2] = {{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
    int64_t probe = 0;
    /* absent or null (mmc_json_int gives the default for both; a list is a type error) */
    const bool absent = !mmc_json_get(cfg, "image_grid_pinpoints") ||
                        (mmc_json_int(cfg, "image_grid_pinpoints", -7, &probe) == MMC_OK && probe == -7);
    m->n_pinpoints = 0;
    if (absent) {
        if (m->variant == MMC_LLAVA_NEXT) {
            memcpy(m->pinpoints, next_def, sizeof next_def);
            m->n_pinpoints = 5;
        } else {   /* LlavaOnevisionConfig's: every (h, w) of 384 .. 2304 in steps of 384 */
            for (int i = 1; i <= 6; i++)
                for (int j = 1; j <= 6; j++) {
                    m->pinpoints[m->n_pinpoints][0] = 384 * i, m->pinpoints[m->n_pinpoints][1] = 384 * j;
                    m->n_pinpoints++;
                }
        }
    } else {
        for (int i = 0;; i++) {
            char key[64];
            snprintf(key, sizeof key, "image_grid_pinpoints.%d", i);
            if (!mmc_json_has(cfg, key)) break;
            int64_t hw[3];
            int n = 3;
            if (i >= MMC_LLAVA_MAX_PINPOINTS || mmc_json_int_array(cfg, key, hw, &n) != MMC_OK || n != 2)
                return mmc_error(MMC_ERR_FORMAT, "%s: image_grid_pinpoints[%d] is not a [height, width] pair "
                                 "(at most %d pairs)", path, i, MMC_LLAVA_MAX_PINPOINTS);
            m->pinpoints[i][0] = hw[0], m->pinpoints[i][1] = hw[1];
            m->n_pinpoints = i + 1;
        }
        if (!m->n_pinpoints)
            return mmc_error(MMC_ERR_FORMAT, "%s: image_grid_pinpoints must be a non-empty list of [height, width] "
                             "pairs", path);
    }
    for (int i = 0; i < m->n_pinpoints; i++) {
        const int64_t ph = m->pinpoints[i][0], pw = m->pinpoints[i][1];
        if (ph < S || pw < S || ph % S || pw % S || ph > 64 * S || pw > 64 * S)
            return mmc_error(MMC_ERR_FORMAT, "%s: image_grid_pinpoints[%d] = [%lld, %lld] must be multiples of "
                             "vision_config.image_size %lld (1 to 64 tiles a side)", path, i, (long long)ph,
                             (long long)pw, (long long)S);
    }
    return MMC_OK;
}

/* Everything but the weights from config.json (`path` names it in messages). */
static mmc_status read_config(const mmc_json *cfg, const char *path, mmc_llava *m, mmc_qwen2_config *tc,
                              mmc_clip_vision_config *vc, mmc_siglip_vision_config *sc, bool *siglip,
                              bool *proj_bias) {
    mmc_status st;
    const char *s = NULL;
    if ((st = mmc_json_str(cfg, "model_type", "", &s))) return mmc_error_prefix(st, "%s", path);
    if (!strcmp(s, "llava")) m->variant = MMC_LLAVA_15;
    else if (!strcmp(s, "llava_next")) m->variant = MMC_LLAVA_NEXT;
    else if (!strcmp(s, "llava_onevision")) m->variant = MMC_LLAVA_ONEVISION;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not llava, llava_next or llava_onevision",
                          path, s);
    const bool ov = m->variant == MMC_LLAVA_ONEVISION;
    const mmc_json *t = mmc_json_get(cfg, "text_config");
    const char *lmt = ov ? "qwen2" : "llama";
    if (t && (st = mmc_json_str(t, "model_type", lmt, &lmt))) return mmc_error_prefix(st, "%s", path);
    if (!strcmp(lmt, "llama") || !strcmp(lmt, "mistral")) {
        m->lm_family = !strcmp(lmt, "llama") ? "Llama" : "Mistral";
        if ((st = mmc_llama_config_read_section(cfg, t ? t : cfg, tc))) return mmc_error_prefix(st, "%s", path);
        if (!strcmp(lmt, "mistral") &&
            (st = mmc_json_int(t ? t : cfg, "sliding_window", 0, &m->sliding_window)))   /* null: none */
            return mmc_error_prefix(st, "%s", path);
    } else if (!strcmp(lmt, "qwen2")) {
        m->lm_family = "Qwen2";
        /* Qwen2Config's defaults for what text_config omits */
        const mmc_qwen2_config defs = {.vocab_size = 151936, .hidden_size = 4096, .intermediate_size = 22016,
                                       .num_layers = 32, .num_heads = 32, .max_position_embeddings = 32768};
        if ((st = mmc_decoder_config_read(cfg, t ? t : cfg, &defs, tc))) return mmc_error_prefix(st, "%s", path);
        bool sw = false;
        if ((st = mmc_json_bool(t ? t : cfg, "use_sliding_window", false, &sw)) ||
            (sw && (st = mmc_json_int(t ? t : cfg, "sliding_window", 0, &m->sliding_window))))
            return mmc_error_prefix(st, "%s", path);
    } else {
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: text_config.model_type '%s' is not supported (llama, mistral, "
                         "qwen2)", path, lmt);
    }
    const mmc_json *v = mmc_json_get(cfg, "vision_config");
    if (!v) return mmc_error(MMC_ERR_FORMAT, "%s: 'vision_config' is missing", path);
    if ((st = mmc_json_str(v, "model_type", ov ? "siglip_vision_model" : "clip_vision_model", &s)))
        return mmc_error_prefix(st, "%s", path);
    int64_t vlayers, S;
    if (!strcmp(s, "clip_vision_model")) {
        *siglip = false;
        if ((st = mmc_clip_vision_config_read(v, path, vc))) return st;
        vlayers = vc->num_hidden_layers, S = vc->image_size;
    } else if (!strcmp(s, "siglip_vision_model")) {
        *siglip = true;
        if ((st = mmc_siglip_vision_config_read(v, path, sc))) return st;
        vlayers = sc->num_hidden_layers, S = sc->image_size;
    } else {
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: vision_config.model_type '%s' is not supported "
                         "(clip_vision_model, siglip_vision_model)", path, s);
    }
    int64_t id;
    const char *idkey = mmc_json_has(cfg, "image_token_id") ? "image_token_id" : "image_token_index";
    if ((st = mmc_json_int(cfg, idkey, ov ? 151646 : 32000, &id))) return mmc_error_prefix(st, "%s", path);
    if (id < 0 || id >= tc->vocab_size)
        return mmc_error(MMC_ERR_FORMAT, "%s: %s %lld is outside the vocabulary [0, %lld)", path, idkey,
                         (long long)id, (long long)tc->vocab_size);
    m->image_token_id = id;
    if ((st = mmc_json_int(cfg, mmc_json_has(cfg, "video_token_id") ? "video_token_id" : "video_token_index",
                           151647, &m->video_token_id)))
        return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_json_str(cfg, "projector_hidden_act", "gelu", &s))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_act_parse(s, path, &m->proj_act))) return st;
    if ((st = mmc_json_bool(cfg, "multimodal_projector_bias", true, proj_bias))) return mmc_error_prefix(st, "%s", path);
    if ((st = mmc_json_str(cfg, "vision_feature_select_strategy", ov ? "full" : "default", &s)))
        return mmc_error_prefix(st, "%s", path);
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
        if ((st = mmc_json_int(cfg, "vision_feature_layer", ov ? -1 : -2, &layers[0])))
            return mmc_error_prefix(st, "%s", path);
    }
    const int64_t L = vlayers;
    for (int i = 0; i < n; i++) {
        int64_t k = layers[i] < 0 ? L + 1 + layers[i] : layers[i];
        if (k < 0 || k > L)
            return mmc_error(MMC_ERR_FORMAT, "%s: vision_feature_layer %lld is outside the tower's %lld hidden states",
                             path, (long long)layers[i], (long long)(L + 1));
        m->feature_layers[i] = (int)k;
    }
    m->n_feature_layers = n;
    if (m->variant != MMC_LLAVA_15 && (st = read_pinpoints(cfg, path, S, m))) return st;
    if (ov) {
        if ((st = mmc_json_str(cfg, "vision_aspect_ratio", "anyres_max_9", &s))) return mmc_error_prefix(st, "%s", path);
        char *end = NULL;
        long long k = strncmp(s, "anyres_max_", 11) ? 0 : strtoll(s + 11, &end, 10);
        if (k < 1 || k > 1000000 || !end || *end)
            return mmc_error(MMC_ERR_FORMAT, "%s: vision_aspect_ratio '%s' is not anyres_max_N (N >= 1)", path, s);
        m->max_num_patches = k;
    }
    return MMC_OK;
}

/* The tower (prefix vpre), projector (ppre) and image_newline (nl, NeXT / OneVision) into w. */
static mmc_status bind_vision(mmc_llava *m, mw_set *w, const char *vpre, const char *ppre, const char *nl, bool siglip,
                              const mmc_clip_vision_config *vc, const mmc_siglip_vision_config *sc, int64_t C,
                              bool pbias) {
    int64_t Cv;
    if (siglip) {
        if (!(m->siglip = siglip_vision_bind(w, vpre, sc))) return mmc_error(MMC_ERR_OOM, "out of memory");
        Cv = sc->hidden_size;
    } else {
        if (!(m->vision = clip_vision_bind(w, vpre, vc))) return mmc_error(MMC_ERR_OOM, "out of memory");
        Cv = vc->hidden_size;
    }
    const int64_t K = Cv * m->n_feature_layers;
    mw_bind_linear(w, ppre, "linear_1", &m->proj1, C, K, pbias);
    mw_bind_linear(w, ppre, "linear_2", &m->proj2, C, C, pbias);
    if (m->variant != MMC_LLAVA_15) mw_bind(w, "", nl, &m->image_newline, 1, MMC_SHAPE(C));
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
    mmc_siglip_vision_config sc;
    bool pbias = true, siglip = false;
    if ((st = read_config(cfg, path, m, &tc, &vc, &sc, &siglip, &pbias))) goto fail;
    if ((st = mw_open(dir, "model", w))) goto fail;
    w->trainable = trainable;
    /* Three namings are about: the Hub's 4.4x (vision_tower.vision_model., multi_modal_projector.,
     * language_model.model., language_model.lm_head., image_newline), transformers 4.52-4.57's
     * (model.vision_tower.vision_model., model.multi_modal_projector., model.language_model., lm_head.,
     * model.image_newline) and what 5.x's save_pretrained writes (the 4.4x names, but the tower as
     * vision_tower. without vision_model.). Each part's prefix is found by probing. */
    static const char *const vpres[] = {"model.vision_tower.vision_model.", "vision_tower.vision_model.",
                                        "model.vision_tower.", "vision_tower."};
    const char *vpre = vpres[0], *ppre = "model.multi_modal_projector.";
    for (int i = 0; i < 4; i++) {
        char probe[160];
        snprintf(probe, sizeof probe, "%sembeddings.patch_embedding.weight", vpres[i]);
        if (mmc_st_find(w->st, probe)) { vpre = vpres[i]; break; }
    }
    if (!mmc_st_find(w->st, "model.multi_modal_projector.linear_1.weight")) ppre = "multi_modal_projector.";
    const char *nl = mmc_st_find(w->st, "model.image_newline") ? "model.image_newline" : "image_newline";
    m->hub_layout = !mmc_st_find(w->st, "model.language_model.embed_tokens.weight");
    const char *lpre = m->hub_layout ? "language_model.model." : "model.language_model.";
    const char *head = m->hub_layout ? "language_model.lm_head.weight" : "lm_head.weight";
    if ((st = bind_vision(m, w, vpre, ppre, nl, siglip, &vc, &sc, tc.hidden_size, pbias))) goto fail;
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
    mmc_siglip_vision_config sc;
    bool pbias = true, siglip = false;
    mmc_status st = read_config(cfg, what ? what : "config", m, &tc, &vc, &sc, &siglip, &pbias);
    /* separate streams for the parts, so that changing one config leaves the others' init */
    if (!st) st = mw_init_random(w, seed * 0x9E3779B97F4A7C15ull + 1, MW_INIT_HF_NORMAL);
    if (!st) st = bind_vision(m, w, "vision_tower.", "multi_modal_projector.", "image_newline", siglip, &vc, &sc,
                              tc.hidden_size, pbias);
    if (!st) st = mw_status(w, what ? what : "config", "LLaVA vision tower / projector");
    if (!st) st = mmc_qwen2_new(&tc, seed, &m->lm);
    if (st) { mmc_llava_free(m); return st; }
    *out = m;
    return MMC_OK;
}

/* Bilinear resize of a [h, w, C] grid to [nh, nw, C], as torch's interpolate(mode="bilinear",
 * align_corners=False) on [1, C, h, w] (float scale in / out, source index clamped at 0). */
static void bilinear_hwc(const float *src, int64_t h, int64_t w, int64_t C, float *dst, int64_t nh, int64_t nw) {
    const float sh = (float)h / (float)nh, sw = (float)w / (float)nw;
    for (int64_t y = 0; y < nh; y++) {
        float fy = sh * ((float)y + 0.5f) - 0.5f;
        if (fy < 0) fy = 0;
        const int64_t y0 = (int64_t)fy, y1 = y0 + (y0 < h - 1 ? 1 : 0);
        const float ly1 = fy - (float)y0, ly0 = 1.0f - ly1;
        for (int64_t x = 0; x < nw; x++) {
            float fx = sw * ((float)x + 0.5f) - 0.5f;
            if (fx < 0) fx = 0;
            const int64_t x0 = (int64_t)fx, x1 = x0 + (x0 < w - 1 ? 1 : 0);
            const float lx1 = fx - (float)x0, lx0 = 1.0f - lx1;
            const float *a = src + (y0 * w + x0) * C, *b = src + (y0 * w + x1) * C, *c = src + (y1 * w + x0) * C,
                        *d = src + (y1 * w + x1) * C;
            float *o = dst + (y * nw + x) * C;
            for (int64_t k = 0; k < C; k++) o[k] = ly0 * (lx0 * a[k] + lx1 * b[k]) + ly1 * (lx0 * c[k] + lx1 * d[k]);
        }
    }
}

/* the projected features of every tile: [P * n_tok, C] */
static mmc_status tile_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, mmc_tensor **out) {
    int need = 0;
    for (int i = 0; i < m->n_feature_layers; i++) need = m->feature_layers[i] > need ? m->feature_layers[i] : need;
    mmc_tensor **hs;
    mmc_status st = m->siglip ? mmc_siglip_vision_forward(ctx, m->siglip, pixels, need, &hs)
                              : mmc_clip_vision_forward(ctx, m->vision, pixels, need, &hs);
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

mmc_status mmc_llava_image_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, mmc_tensor **out) {
    return mmc_llava_image_features_sized(ctx, m, pixels, NULL, 0, out);
}

/* Each image's multi flag (a OneVision image in a prompt of several: one padded tile): per image
 * when given, else n > 1 as the processor decides for one prompt. */
static bool multi_of(const bool *multi, int n, int i) { return multi ? multi[i] : n > 1; }

/* the features NeXT / OneVision splice in for n images of the given sizes; 0 without sizes */
static int64_t feature_count(const mmc_llava *m, const int64_t (*sizes)[2], const bool *multi, int n,
                             int64_t *patches) {
    int64_t total = 0;
    *patches = 0;
    for (int i = 0; i < n; i++) {
        img_layout L;
        image_layout(m, sizes[i][0], sizes[i][1], multi_of(multi, n, i), &L);
        total += L.n_feat, *patches += L.np;
    }
    return total;
}

static mmc_status check_sizes(const mmc_llava *m, mmc_tensor *pixels, const int64_t (*sizes)[2], const bool *multi,
                              int n) {
    if (!pixels || pixels->ndim != 4)
        return mmc_error(MMC_ERR_SHAPE, "%s: pixel_values must be [P, 3, S, S]", variant_name(m->variant));
    if (m->variant == MMC_LLAVA_15) return MMC_OK;
    if (!sizes || n < 1)
        return mmc_error(MMC_ERR_INVALID, "%s: the images' original sizes are needed (image_sizes)",
                         variant_name(m->variant));
    for (int i = 0; i < n; i++)
        if (sizes[i][0] < 1 || sizes[i][1] < 1 || sizes[i][0] > 1 << 20 || sizes[i][1] > 1 << 20)
            return mmc_error(MMC_ERR_INVALID, "%s: image %d has size %lld x %lld", variant_name(m->variant), i,
                             (long long)sizes[i][1], (long long)sizes[i][0]);
    int64_t P;
    feature_count(m, sizes, multi, n, &P);
    if (P != pixels->shape[0])
        return mmc_error(MMC_ERR_SHAPE, "%s: pixel_values has %lld tiles but the %d image size%s call%s for %lld",
                         variant_name(m->variant), (long long)pixels->shape[0], n, n == 1 ? "" : "s",
                         n == 1 ? "s" : "", (long long)P);
    return MMC_OK;
}

/* OneVision's bilinear downsampling of the rows src[idx] of an h x w grid (row-major in idx) to
 * nh x nw, as torch's interpolate(mode="bilinear", align_corners=False) on [1, C, h, w] (float
 * scale in / out, source index clamped at 0), from differentiable ops: four row gathers of the
 * corners, weighted as ly0 * (lx0 a + lx1 b) + ly1 * (lx0 c + lx1 d). -> [nh * nw, C] */
static mmc_tensor *bilinear_rows(mmc_ctx *ctx, mmc_tensor *src, const int64_t *idx, int64_t h, int64_t w,
                                 int64_t nh, int64_t nw) {
    const int64_t M = nh * nw;
    mmc_tensor *ci[4], *wt[4];   /* corners a b c d; weights lx0 lx1 ly0 ly1, each [M, 1] */
    for (int k = 0; k < 4; k++) {
        ci[k] = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(M));
        wt[k] = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, 1));
    }
    const float sh = (float)h / (float)nh, sw = (float)w / (float)nw;
    for (int64_t y = 0; y < nh; y++) {
        float fy = sh * ((float)y + 0.5f) - 0.5f;
        if (fy < 0) fy = 0;
        const int64_t y0 = (int64_t)fy, y1 = y0 + (y0 < h - 1 ? 1 : 0);
        const float ly1 = fy - (float)y0;
        for (int64_t x = 0; x < nw; x++) {
            float fx = sw * ((float)x + 0.5f) - 0.5f;
            if (fx < 0) fx = 0;
            const int64_t x0 = (int64_t)fx, x1 = x0 + (x0 < w - 1 ? 1 : 0), r = y * nw + x;
            const float lx1 = fx - (float)x0;
            ((int64_t *)ci[0]->data)[r] = idx[y0 * w + x0], ((int64_t *)ci[1]->data)[r] = idx[y0 * w + x1];
            ((int64_t *)ci[2]->data)[r] = idx[y1 * w + x0], ((int64_t *)ci[3]->data)[r] = idx[y1 * w + x1];
            ((float *)wt[0]->data)[r] = 1.0f - lx1, ((float *)wt[1]->data)[r] = lx1;
            ((float *)wt[2]->data)[r] = 1.0f - ly1, ((float *)wt[3]->data)[r] = ly1;
        }
    }
    mmc_tensor *g[4];
    for (int k = 0; k < 4; k++) g[k] = mmc_gather_rows(ctx, src, ci[k]);                 /* [M, C] */
    mmc_tensor *top = mmc_add(ctx, mmc_mul(ctx, g[0], wt[0]), mmc_mul(ctx, g[1], wt[1]));
    mmc_tensor *bot = mmc_add(ctx, mmc_mul(ctx, g[2], wt[0]), mmc_mul(ctx, g[3], wt[1]));
    return mmc_add(ctx, mmc_mul(ctx, top, wt[2]), mmc_mul(ctx, bot, wt[3]));               /* [M, C] */
}

mmc_status mmc_llava_image_features_sized(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, const int64_t (*sizes)[2],
                                          int n_images, mmc_tensor **out) {
    return mmc_llava_image_features_multi(ctx, m, pixels, sizes, NULL, n_images, out);
}

/* pack_image_features as one row gather from [tile features; image_newline; downsampled grids], so
 * that with a tape the gradients reach the projector, image_newline (scatter-added over its rows)
 * and a trainable tower */
mmc_status mmc_llava_image_features_multi(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *pixels, const int64_t (*sizes)[2],
                                          const bool *multi, int n_images, mmc_tensor **out) {
    *out = NULL;
    mmc_status st = check_sizes(m, pixels, sizes, multi, n_images);
    if (st) return st;
    mmc_tensor *f;
    if ((st = tile_features(ctx, m, pixels, &f))) return st;                              /* [P*n_tok, C] */
    if (m->variant == MMC_LLAVA_15) { *out = f; return MMC_OK; }
    int64_t S, g;
    bool cls;
    tower_geom(m, &S, &g, &cls);
    const int64_t n_tok = mmc_llava_image_tokens(m), C = f->shape[1], NL = f->shape[0];  /* NL: image_newline's row */
    int64_t P;
    const int64_t total = feature_count(m, sizes, multi, n_images, &P);
    /* the source rows: f, image_newline, then each downsampled grid (OneVision) */
    mmc_tensor *parts[1 + 1 + 64];
    int n_parts = 0;
    parts[n_parts++] = f;
    mmc_tensor *nl = m->image_newline->dtype == MMC_F32 ? m->image_newline : mmc_cast(ctx, m->image_newline, MMC_F32);
    parts[n_parts++] = mmc_reshape(ctx, nl, 2, MMC_SHAPE(1, C));                          /* [1, C] */
    int64_t next_row = NL + 1;
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(total));
    int64_t *ix = idx->data;
    int64_t tile = 0, row = 0;
    for (int i = 0; i < n_images; i++) {
        img_layout L;
        image_layout(m, sizes[i][0], sizes[i][1], multi_of(multi, n_images, i), &L);
        for (int64_t k = 0; k < n_tok; k++) ix[row++] = tile * n_tok + k;                 /* the base tile */
        if (L.np == 1) {
            ix[row++] = NL;
            tile++;
            continue;
        }
        if (n_tok != g * g)
            return mmc_error(MMC_ERR_INVALID, "%s: a tile gives %lld features, not a %lld x %lld grid (a SigLIP tower "
                             "with vision_feature_select_strategy 'default' drops one; use 'full')",
                             variant_name(m->variant), (long long)n_tok, (long long)g, (long long)g);
        /* the un-padded window of the (gh*g) x (gw*g) grid, [h2, w2] rows of f */
        const int64_t h2 = L.r1 - L.r0, w2 = L.c1 - L.c0;
        int64_t *grid = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)(h2 * w2));
        for (int64_t y = 0; y < h2; y++)
            for (int64_t x = 0; x < w2; x++) {
                const int64_t Y = L.r0 + y, X = L.c0 + x, t = (Y / g) * L.gw + X / g, in = (Y % g) * g + X % g;
                grid[y * w2 + x] = (tile + 1 + t) * n_tok + in;
            }
        int64_t base = -1;   /* the downsampled grid's first source row */
        if (L.nh != h2 || L.nw != w2) {
            if (n_parts == (int)(sizeof parts / sizeof *parts))
                return mmc_error(MMC_ERR_UNSUPPORTED, "%s: more than 64 downsampled images in one call",
                                 variant_name(m->variant));
            parts[n_parts++] = bilinear_rows(ctx, f, grid, h2, w2, L.nh, L.nw);          /* [nh*nw, C] */
            base = next_row;
            next_row += L.nh * L.nw;
        }
        for (int64_t y = 0; y < L.nh; y++) {
            for (int64_t x = 0; x < L.nw; x++) ix[row++] = base >= 0 ? base + y * L.nw + x : grid[y * w2 + x];
            ix[row++] = NL;
        }
        tile += L.np;
    }
    MMC_ASSERT(row == total && tile == P);
    mmc_tensor *src = mmc_concat(ctx, parts, n_parts, 0);                                  /* [rows, C] */
    *out = mmc_gather_rows(ctx, src, idx);                                                 /* [total, C] */
    return MMC_OK;
}

int64_t mmc_llava_video_tokens(const mmc_llava *m, int64_t n_frames) {
    int64_t S, g;
    bool cls;
    tower_geom(m, &S, &g, &cls);
    const int64_t q = (g + 1) / 2;
    return n_frames * q * q + 1;
}

mmc_status mmc_llava_video_features(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *frames, mmc_tensor **out) {
    *out = NULL;
    if (m->variant != MMC_LLAVA_ONEVISION)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s takes images, not videos", variant_name(m->variant));
    if (!frames || frames->ndim != 4 || frames->shape[0] < 1)
        return mmc_error(MMC_ERR_SHAPE, "llava_onevision: video frames must be [F, 3, S, S]");
    int64_t S, g;
    bool cls;
    tower_geom(m, &S, &g, &cls);
    const int64_t n_tok = mmc_llava_image_tokens(m), F = frames->shape[0], q = (g + 1) / 2;
    if (n_tok != g * g)
        return mmc_error(MMC_ERR_INVALID, "llava_onevision: a frame gives %lld features, not a %lld x %lld grid "
                         "(vision_feature_select_strategy 'default' with a SigLIP tower; use 'full')", (long long)n_tok,
                         (long long)g, (long long)g);
    mmc_tensor *f;
    mmc_status st = tile_features(ctx, m, frames, &f);                      /* [F * g*g, C] */
    if (st) return st;
    const int64_t C = f->shape[1];
    mmc_tensor *o = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(F * q * q + 1, C));  /* [F * q*q + 1, C] */
    mmc_tensor *nlt = mmc_contiguous(ctx, mmc_cast(ctx, m->image_newline, MMC_F32));
    for (int64_t i = 0; i < F; i++)   /* apply_pooling: interpolate(size=ceil(g/2), bilinear) per frame */
        bilinear_hwc((const float *)f->data + i * g * g * C, g, g, C, (float *)o->data + i * q * q * C, q, q);
    memcpy((float *)o->data + F * q * q * C, nlt->data, (size_t)C * sizeof(float));
    *out = o;
    return MMC_OK;
}

mmc_status mmc_llava_forward(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                             mmc_tensor **hidden) {
    return mmc_llava_forward_media(ctx, m, ids, pixels, NULL, 0, NULL, kv, hidden);
}

mmc_status mmc_llava_forward_sized(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels,
                                   const int64_t (*sizes)[2], int n_images, mmc_kv_cache *kv, mmc_tensor **hidden) {
    return mmc_llava_forward_media(ctx, m, ids, pixels, sizes, n_images, NULL, kv, hidden);
}

mmc_status mmc_llava_forward_media(mmc_ctx *ctx, mmc_llava *m, mmc_tensor *ids, mmc_tensor *pixels,
                                   const int64_t (*sizes)[2], int n_images, mmc_tensor *video, mmc_kv_cache *kv,
                                   mmc_tensor **hidden) {
    *hidden = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    if (!ids || ids->ndim != 2 || (ids->dtype != MMC_I32 && ids->dtype != MMC_I64))
        return mmc_error(MMC_ERR_SHAPE, "llava forward: ids must be [B, T] int32/int64");
    const int64_t B = ids->shape[0], T = ids->shape[1];
    if (T <= 0 || B <= 0) return mmc_error(MMC_ERR_INVALID, "llava forward: empty input");
    if ((pixels || video) && kv && kv->len > 0)
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava forward: images after the prompt (KV cache holds %lld "
                         "positions) are not supported", (long long)kv->len);
    if (kv && (kv->batch != B || kv->n_layers != c->num_layers))
        return mmc_error(MMC_ERR_SHAPE, "llava forward: KV cache for batch %lld / %d layers, input batch %lld",
                         (long long)kv->batch, kv->n_layers, (long long)B);
    if (m->sliding_window > 0 && (kv ? kv->len : 0) + T > m->sliding_window)
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava forward: %lld positions exceed the %s language model's "
                         "sliding_window %lld (sliding-window attention is not implemented)",
                         (long long)((kv ? kv->len : 0) + T), m->lm_family, (long long)m->sliding_window);
    bool was = mmc_set_grad_enabled(ctx, false);
    mmc_status st = MMC_OK;
    mmc_tensor *idc = mmc_contiguous(ctx, ids);
    int64_t n_img = 0, P = 0;
    if ((st = vlm_check_ids(idc, c->vocab_size, m->image_token_id, &n_img))) goto done;
    /* embeddings, with the projected image features at the <image> positions */
    mmc_tensor *e = mmc_contiguous(ctx, mmc_qwen2_embed(ctx, m->lm, idc));     /* [B, T, C], ours */
    if (pixels && (st = check_sizes(m, pixels, sizes, NULL, n_images))) goto done;
    int64_t n_feat = !pixels ? 0 : m->variant == MMC_LLAVA_15 ? pixels->shape[0] * mmc_llava_image_tokens(m)
                                                              : feature_count(m, sizes, NULL, n_images, &P);
    /* a decoding step without media embeds a generated <image> / <video> id as any token, as
     * transformers does (it matches placeholders only when pixel_values come with the input) */
    const bool decode_step = !pixels && !video && kv && kv->len > 0;
    if (n_img != n_feat && !decode_step) {
        const int64_t ni = !pixels ? 0 : m->variant == MMC_LLAVA_15 ? pixels->shape[0] : n_images;
        st = mmc_error(MMC_ERR_INVALID, "image features and image tokens do not match: the prompt has %lld <image> "
                       "tokens (id %lld) but %lld image%s give%s %lld features", (long long)n_img,
                       (long long)m->image_token_id, (long long)ni, ni == 1 ? "" : "s", ni == 1 ? "s" : "",
                       (long long)n_feat);
        goto done;
    }
    if (pixels && n_feat > 0) {
        mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
        mmc_tensor *f;
        if ((st = mmc_llava_image_features_sized(ctx, m, pixels, sizes, n_images, &f))) goto done;
        vlm_splice(e, idc, m->image_token_id, f);
        mmc_arena_release(mmc_ctx_arena(ctx), mk);   /* the tower's activations */
    }
    if (m->variant == MMC_LLAVA_ONEVISION) {   /* the <video> positions */
        int64_t n_vid = 0;
        for (int64_t i = 0; i < mmc_numel(idc); i++) n_vid += enc_int_at(idc, i) == m->video_token_id;
        const int64_t want = video ? mmc_llava_video_tokens(m, video->shape[0]) : 0;
        if (video && video->ndim != 4) {
            st = mmc_error(MMC_ERR_SHAPE, "llava_onevision forward: video frames must be [F, 3, S, S]");
            goto done;
        }
        if (n_vid != want && !decode_step) {
            st = mmc_error(MMC_ERR_INVALID, "video features and video tokens do not match: the prompt has %lld <video> "
                           "tokens (id %lld) but the video gives %lld features", (long long)n_vid,
                           (long long)m->video_token_id, (long long)want);
            goto done;
        }
        if (video) {
            mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
            mmc_tensor *f;
            if ((st = mmc_llava_video_features(ctx, m, video, &f))) goto done;
            vlm_splice(e, idc, m->video_token_id, f);
            mmc_arena_release(mmc_ctx_arena(ctx), mk);
        }
    } else if (video) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s takes images, not videos", variant_name(m->variant));
        goto done;
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
static mmc_status llava_fwd(mmc_ctx *ctx, void *self, mmc_tensor *ids, mmc_tensor *pixels, mmc_kv_cache *kv,
                           mmc_tensor **h) {
    mmc_llava_request *r = self;
    const bool prefill = !kv || kv->len == 0;   /* the video goes with the prompt, as the images do */
    return mmc_llava_forward_media(ctx, r->m, ids, pixels, r->sizes, r->n_images, prefill ? r->video : NULL, kv, h);
}

static mmc_status llava_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                float **logits) {
    mmc_llava_request *r = self;
    return vlm_feed(ctx, llava_fwd, r, r->m->lm, ids, n, r->pixels, kv, logits);
}

static mmc_status llava_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    mmc_llava_request *r = self;
    return vlm_feed(ctx, llava_fwd, r, r->m->lm, &token, 1, NULL, kv, logits);
}

mmc_decoder mmc_llava_decoder(mmc_llava_request *r) {
    mmc_decoder d = mmc_qwen2_decoder(r->m->lm);
    d.self = r;
    d.prefill = llava_prefill;
    d.decode = llava_decode;
    return d;
}
