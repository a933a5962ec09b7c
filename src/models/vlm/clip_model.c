/* clip_model.c — CLIP as a dual encoder, mirroring transformers' CLIPModel
 * (models/clip/modeling_clip.py: get_image_features, get_text_features, forward):
 *
 *   hs = vision_model(pixel_values)                       CLIPVisionTransformer (clip_vision.c)
 *   pooled_img = post_layernorm(hs[-1][:, 0])             the class token            [N, Cv]
 *   image_embeds = visual_projection(pooled_img)          no bias                    [N, D]
 *   pooled_txt = text_model(ids).pooler_output            final LN at the EOS (clip_text.c) [M, Ct]
 *   text_embeds = text_projection(pooled_txt)             no bias                    [M, D]
 *   both / their L2 norm;  logits_per_image = exp(logit_scale) image_embeds @ text_embeds^T
 *
 * Weights: text_model.*, vision_model.*, visual_projection.weight [D, Cv], text_projection.weight
 * [D, Ct], logit_scale [] — the names CLIPModel.save_pretrained writes (4.x and 5.x alike). The
 * processor: CLIPImageProcessor from processor_config.json / preprocessor_config.json and the CLIP
 * BPE tokenizer of tokenizer.json, truncated to model_max_length as CLIPProcessor(truncation=True)
 * does. The retrieval evaluation over these embeddings is src/train/eval_retrieval.c. */
#include "mmc_embed.h"
#include "mmc_lora.h"

#include "../model_weights.h"
#include "../vision/clip_vision.h"
#include "../vision/siglip_vision.h"
#include "../encoders/siglip_text.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { IMAGE_BATCH = 16 };

typedef enum { FAM_CLIP, FAM_SIGLIP } family;

struct mmc_dual_encoder {
    family fam;
    mmc_clip_text *text;            /* text_model.* + text_projection (its own weight set) */
    mw_set w;                       /* the vision half */
    mmc_clip_vision *vision;
    mmc_linear_w visual_proj;       /* visual_projection [D, Cv], no bias */
    mmc_tensor *logit_scale;        /* [] */
    mmc_clip_vision_config vc;
    int64_t dim;
    mmc_clip_tokenizer *tok;
    int max_length;
    mmc_clip_proc proc;
    mmc_ctx *ctx;
    /* SigLIP: both towers and the scalars in w */
    siglip_text *stext;
    mmc_siglip_vision *svision;
    mmc_siglip_vision_config svc;
    siglip_text_config stc;
    mmc_tensor *logit_bias;         /* [1] (SigLIP; NULL for CLIP) */
    mmc_siglip_tokenizer *stok;
    mmc_lora_set *adapter;          /* a PEFT adapter folder given as the model (mmc_dual_encoder_load) */
};

void mmc_dual_encoder_free(mmc_dual_encoder *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* (first: it detaches from the towers' linears) */
    mmc_clip_text_free(m->text);
    clip_vision_free(m->vision);
    siglip_text_free(m->stext);
    siglip_vision_free(m->svision);
    mmc_siglip_tokenizer_free(m->stok);
    mw_close(&m->w);
    mmc_clip_tokenizer_free(m->tok);
    mmc_ctx_free(m->ctx);
    free(m);
}

/* SiglipModel: text_model.* (siglip_text.c), vision_model.* (vision/siglip_vision.c, with its pooling
 * head), logit_scale [1], logit_bias [1] in one weight file; SiglipImageProcessor's settings over its
 * defaults; the tokenizer of spiece.model. */
static mmc_status siglip_load(mmc_dual_encoder *m, const char *dir, const char *path, const mmc_json *cfg,
                              bool trainable) {
    const mmc_json *vj = mmc_json_get(cfg, "vision_config"), *tj = mmc_json_get(cfg, "text_config");
    if (!vj || !tj)
        return mmc_error(MMC_ERR_FORMAT, "%s: a SiglipModel config needs text_config and vision_config", path);
    mmc_status st;
    if ((st = mmc_siglip_vision_config_read(vj, path, &m->svc))) return st;
    if (!m->svc.use_head)
        return mmc_error(MMC_ERR_FORMAT, "%s: vision_config.vision_use_head is false: SiglipModel pools images with "
                         "the attention head; this folder has none to embed with", path);
    if ((st = siglip_text_config_read(tj, path, &m->stc))) return st;
    if (m->stc.projection_size != m->svc.hidden_size)
        return mmc_error(MMC_ERR_FORMAT, "%s: text_config.projection_size %lld differs from vision_config.hidden_size "
                         "%lld: the two embeddings must share one space", path, (long long)m->stc.projection_size,
                         (long long)m->svc.hidden_size);
    m->dim = m->stc.projection_size;
    if ((st = mw_open(dir, "model", &m->w))) return st;
    m->w.trainable = trainable;
    m->svision = siglip_vision_bind(&m->w, "vision_model.", &m->svc);
    m->stext = siglip_text_bind(&m->w, "text_model.", &m->stc);
    if (!m->svision || !m->stext) return mmc_error(MMC_ERR_OOM, "out of memory");
    mw_bind(&m->w, "", "logit_scale", &m->logit_scale, 1, MMC_SHAPE(1));
    mw_bind(&m->w, "", "logit_bias", &m->logit_bias, 1, MMC_SHAPE(1));
    if ((st = mw_status(&m->w, dir, "SiglipModel"))) return st;
    m->max_length = (int)m->stc.max_position_embeddings;
    if ((st = mmc_siglip_tokenizer_load(dir, &m->stok))) return st;
    /* padding="max_length" pads to the tokenizer's model_max_length (64), within the position table */
    if (mmc_siglip_tokenizer_model_max_length(m->stok) < m->max_length)
        m->max_length = mmc_siglip_tokenizer_model_max_length(m->stok);
    mmc_siglip_proc_default(&m->proc);
    if ((st = mmc_clip_proc_load_dir(dir, &m->proc, NULL, 0))) return st;
    const int64_t S = m->svc.image_size;
    if (m->proc.do_center_crop ? (m->proc.crop_h != S || m->proc.crop_w != S)
                               : (m->proc.shortest_edge || m->proc.size_h != S || m->proc.size_w != S))
        return mmc_error(MMC_ERR_FORMAT, "%s: the image processor's output size differs from the vision tower's "
                         "image_size %lld (SiglipImageProcessor's size must be {\"height\": %lld, \"width\": %lld})",
                         dir, (long long)S, (long long)S, (long long)S);
    return MMC_OK;
}

static mmc_status dual_load(const char *dir, bool trainable, mmc_dual_encoder **out) {
    *out = NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmc_json *cfg = NULL;
    mmc_status st = mmc_json_load(path, &cfg);
    if (st) return st;
    mmc_dual_encoder *m = calloc(1, sizeof *m);
    if (!m || !(m->ctx = mmc_ctx_new())) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    const char *mt = NULL;
    if ((st = mmc_json_str(cfg, "model_type", "", &mt))) goto fail;
    if (strcmp(mt, "siglip") == 0) {
        m->fam = FAM_SIGLIP;
        if ((st = siglip_load(m, dir, path, cfg, trainable))) goto fail;
        mmc_json_free(cfg);
        *out = m;
        return MMC_OK;
    }
    if (strcmp(mt, "clip") != 0) {
        st = mmc_error(MMC_ERR_UNSUPPORTED, "%s: model_type '%s' is not a dual encoder mmc embeds with; "
                       "give a CLIPModel folder (model_type \"clip\") or a SiglipModel one (\"siglip\")", path, mt);
        goto fail;
    }
    const mmc_json *vj = mmc_json_get(cfg, "vision_config");
    if (!vj || !mmc_json_get(cfg, "text_config")) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: a CLIPModel config needs text_config and vision_config", path);
        goto fail;
    }
    if ((st = mmc_clip_vision_config_read(vj, path, &m->vc))) goto fail;
    if ((st = (trainable ? mmc_clip_text_load_trainable : mmc_clip_text_load)(dir, &m->text))) goto fail;
    const mmc_clip_text_config *tc = mmc_clip_text_cfg(m->text);
    if (!tc->with_projection) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: no text_projection.weight: this is a CLIP text tower alone, not a "
                       "CLIPModel", dir);
        goto fail;
    }
    m->dim = tc->projection_dim;
    if ((st = mw_open(dir, "model", &m->w))) goto fail;
    m->w.trainable = trainable;
    m->vision = clip_vision_bind(&m->w, "vision_model.", &m->vc);
    if (!m->vision) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    mw_bind_linear(&m->w, "", "visual_projection", &m->visual_proj, m->dim, m->vc.hidden_size, false);
    mw_bind(&m->w, "", "logit_scale", &m->logit_scale, 0, NULL);
    if ((st = mw_status(&m->w, dir, "CLIPModel vision tower / projections"))) goto fail;
    if ((st = mmc_clip_tokenizer_load(dir, &m->tok))) goto fail;
    m->max_length = mmc_clip_tokenizer_model_max_length(m->tok);
    if (m->max_length > tc->max_position_embeddings) m->max_length = (int)tc->max_position_embeddings;
    mmc_clip_proc_default(&m->proc);
    if ((st = mmc_clip_proc_load_dir(dir, &m->proc, NULL, 0))) goto fail;
    if (m->proc.crop_h != m->vc.image_size || m->proc.crop_w != m->vc.image_size) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the image processor's crop_size %lldx%lld differs from the vision "
                       "tower's image_size %lld", dir, (long long)m->proc.crop_h, (long long)m->proc.crop_w,
                       (long long)m->vc.image_size);
        goto fail;
    }
    mmc_json_free(cfg);
    *out = m;
    return MMC_OK;
fail:
    mmc_json_free(cfg);
    mmc_dual_encoder_free(m);
    return st;
}

/* a LoRA checkpoint of contrastive training (a PEFT adapter folder): its base_model_name_or_path with the
 * adapter attached, as PeftModel.from_pretrained gives it; a model folder as it is */
mmc_status mmc_dual_encoder_load(const char *dir, mmc_dual_encoder **out) {
    if (!mmc_lora_is_adapter_dir(dir)) return dual_load(dir, false, out);
    char base[1024], adir[1024];
    mmc_status st = mmc_lora_resolve(dir, NULL, base, sizeof base, adir, sizeof adir);
    if (st || (st = dual_load(base, false, out))) return st;
    mmc_module_list ml = {0};
    if (!(st = mmc_dual_encoder_linears(*out, &ml))) st = mmc_lora_load(adir, &ml, false, &(*out)->adapter);
    mmc_module_list_free(&ml);
    if (st) {
        mmc_dual_encoder_free(*out);
        *out = NULL;
    }
    return st;
}
mmc_status mmc_dual_encoder_load_trainable(const char *dir, mmc_dual_encoder **out) { return dual_load(dir, true, out); }

const char *mmc_dual_encoder_family(const mmc_dual_encoder *m) { return m->fam == FAM_SIGLIP ? "siglip" : "clip"; }
int64_t mmc_dual_encoder_dim(const mmc_dual_encoder *m) { return m->dim; }
mmc_clip_proc *mmc_dual_encoder_image_proc(mmc_dual_encoder *m) { return &m->proc; }
int64_t mmc_dual_encoder_param_count(const mmc_dual_encoder *m) {
    return (m->text ? mmc_clip_text_param_count(m->text) : 0) + mw_count(&m->w);
}

double mmc_dual_encoder_logit_bias(const mmc_dual_encoder *m) {
    if (!m->logit_bias) return 0.0;
    mmc_tensor *s = mmc_cast(m->ctx, m->logit_bias, MMC_F32);
    double v = (double)((const float *)s->data)[0];
    mmc_ctx_reset(m->ctx);
    return v;
}

bool mmc_dual_encoder_sigmoid(const mmc_dual_encoder *m) { return m->fam == FAM_SIGLIP; }

void mmc_dual_encoder_logits(const mmc_dual_encoder *m, const float *img, int64_t n, const float *txt, int64_t k,
                             float *logits) {
    const double scale = mmc_dual_encoder_logit_scale(m), bias = mmc_dual_encoder_logit_bias(m);
    const int64_t D = m->dim;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            float dot = 0;
            for (int64_t d = 0; d < D; d++) dot += img[i * D + d] * txt[j * D + d];
            logits[i * k + j] = (float)(dot * scale + bias);
        }
}

double mmc_dual_encoder_logit_scale(const mmc_dual_encoder *m) {
    mmc_tensor *s = mmc_cast(m->ctx, m->logit_scale, MMC_F32);
    double v = exp((double)((const float *)s->data)[0]);
    mmc_ctx_reset(m->ctx);
    return v;
}

/* rows [n, D] / their L2 norms (torch: x / x.norm(p=2, dim=-1, keepdim=True)), into out */
static void normalize_rows(const mmc_tensor *x, int64_t n, int64_t D, float *out) {
    mmc_tensor *c = (mmc_tensor *)x;
    const float *src = c->data;
    for (int64_t i = 0; i < n; i++) {
        double ss = 0;
        for (int64_t k = 0; k < D; k++) ss += (double)src[i * D + k] * src[i * D + k];
        const float inv = (float)sqrt(ss);
        for (int64_t k = 0; k < D; k++) out[i * D + k] = src[i * D + k] / inv;
    }
}

mmc_status mmc_dual_encoder_embed_pixels(mmc_dual_encoder *m, const mmc_tensor *pixel_values, float *out) {
    const int64_t N = pixel_values->shape[0], Cv = m->vc.hidden_size, D = m->dim;
    mmc_status st = MMC_OK;
    for (int64_t b0 = 0; b0 < N && !st; b0 += IMAGE_BATCH) {
        const int64_t nb = N - b0 < IMAGE_BATCH ? N - b0 : IMAGE_BATCH;
        mmc_ctx *ctx = m->ctx;
        mmc_tensor *px = mmc_narrow(ctx, (mmc_tensor *)pixel_values, 0, b0, nb);      /* [nb, 3, S, S] */
        if (m->fam == FAM_SIGLIP) {
            mmc_tensor *pooled = NULL;                                                      /* [nb, D] */
            if (!(st = mmc_siglip_vision_pool(ctx, m->svision, px, &pooled)))
                normalize_rows(pooled, nb, D, out + b0 * D);
            mmc_ctx_reset(ctx);
            continue;
        }
        mmc_tensor **hs;
        bool was = mmc_set_grad_enabled(ctx, false);
        if (!(st = mmc_clip_vision_forward(ctx, m->vision, px, (int)m->vc.num_hidden_layers, &hs))) {
            mmc_tensor *last = hs[m->vc.num_hidden_layers];                                  /* [nb, T, Cv] */
            mmc_tensor *cls = mmc_contiguous(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, last, 1, 0, 1)),
                                                              2, MMC_SHAPE(nb, Cv)));        /* [nb, Cv] */
            mmc_tensor *pooled = mmc_layernorm(ctx, cls, m->vision->post_ln_w, m->vision->post_ln_b,
                                               (float)m->vc.layer_norm_eps);
            mmc_tensor *emb = mmc_contiguous(ctx, mmc_nn_linear(ctx, pooled, &m->visual_proj));      /* [nb, D] */
            normalize_rows(emb, nb, D, out + b0 * D);
        }
        mmc_set_grad_enabled(ctx, was);
        mmc_ctx_reset(ctx);
    }
    return st;
}

mmc_status mmc_dual_encoder_embed_images(mmc_dual_encoder *m, const mmc_image *imgs, int n, float *out) {
    for (int b0 = 0; b0 < n; b0 += IMAGE_BATCH) {
        const int nb = n - b0 < IMAGE_BATCH ? n - b0 : IMAGE_BATCH;
        mmc_tensor *pv = NULL;
        mmc_status st = mmc_clip_preprocess(&m->proc, imgs + b0, nb, &pv);
        if (!st) st = mmc_dual_encoder_embed_pixels(m, pv, out + (int64_t)b0 * m->dim);
        mmc_tensor_free(pv);
        if (st) return st;
    }
    return MMC_OK;
}

mmc_status mmc_dual_encoder_embed_ids(mmc_dual_encoder *m, const mmc_tensor *ids, const mmc_tensor *mask, float *out) {
    mmc_ctx *ctx = m->ctx;
    mmc_status st;
    if (m->fam == FAM_SIGLIP) {
        mmc_tensor *pooled = NULL;                                                          /* [B, D] */
        if (!(st = siglip_text_forward(ctx, m->stext, ids, mask, &pooled)))
            normalize_rows(pooled, ids->shape[0], m->dim, out);
    } else {
        mmc_clip_text_out o;
        if (!(st = mmc_clip_text_forward(ctx, m->text, ids, mask, &o)))
            normalize_rows(mmc_contiguous(ctx, o.text_embeds), ids->shape[0], m->dim, out);
    }
    mmc_ctx_reset(ctx);
    return st;
}

/* SiglipProcessor(text=texts, padding="max_length"): every text L ids with its mask, 16 at a time */
static mmc_status siglip_embed_texts(mmc_dual_encoder *m, const char *const *texts, int n, float *out) {
    const int L = m->max_length;
    mmc_status st = MMC_OK;
    for (int b0 = 0; b0 < n && !st; b0 += IMAGE_BATCH) {
        const int nb = n - b0 < IMAGE_BATCH ? n - b0 : IMAGE_BATCH;
        mmc_tensor *ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(nb, L)), *mask = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(nb, L));
        if (!ids || !mask) st = mmc_error(MMC_ERR_OOM, "out of memory");
        for (int i = 0; i < nb && !st; i++)
            st = mmc_siglip_tokenizer_encode_padded(m->stok, texts[b0 + i], L, (int32_t *)ids->data + (int64_t)i * L,
                                                     (int32_t *)mask->data + (int64_t)i * L, NULL);
        if (!st) st = mmc_dual_encoder_embed_ids(m, ids, mask, out + (int64_t)b0 * m->dim);
        mmc_tensor_free(ids);
        mmc_tensor_free(mask);
    }
    return st;
}

mmc_status mmc_dual_encoder_embed_texts(mmc_dual_encoder *m, const char *const *texts, int n, float *out) {
    const int L = m->max_length;
    if (m->fam == FAM_SIGLIP) return siglip_embed_texts(m, texts, n, out);
    /* CLIPProcessor(text, padding=True, truncation=True): each row bos, at most L - 2 tokens, eos,
     * padded to the batch's longest with the pad id and masked; the causal tower pools the first
     * EOS, which no padding precedes. TEXT_BATCH rows through the tower at a time. */
    enum { TEXT_BATCH = 32 };
    int32_t pad = 0, bos, eos;
    mmc_clip_tokenizer_special_ids(m->tok, &bos, &eos, &pad);
    if (pad < 0) pad = eos;
    int32_t *ids = malloc((size_t)TEXT_BATCH * L * sizeof *ids);
    int *lens = malloc(TEXT_BATCH * sizeof *lens);
    if (!ids || !lens) { free(ids); free(lens); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    mmc_status st = MMC_OK;
    for (int b0 = 0; b0 < n && !st; b0 += TEXT_BATCH) {
        const int nb = n - b0 < TEXT_BATCH ? n - b0 : TEXT_BATCH;
        int T = 1;
        for (int i = 0; i < nb && !st; i++) {
            st = mmc_clip_tokenizer_encode_padded(m->tok, texts[b0 + i], L, ids + (size_t)i * L, NULL, &lens[i]);
            if (lens[i] > T) T = lens[i];
        }
        if (st) break;
        mmc_ctx *ctx = m->ctx;
        mmc_tensor *t = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(nb, T));                          /* [nb, T] */
        mmc_tensor *mask = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(nb, T));
        int32_t *td = t->data, *md = mask->data;
        for (int i = 0; i < nb; i++)
            for (int k = 0; k < T; k++) {
                td[i * T + k] = k < lens[i] ? ids[(size_t)i * L + k] : pad;
                md[i * T + k] = k < lens[i];
            }
        mmc_clip_text_out o;
        if (!(st = mmc_clip_text_forward(ctx, m->text, t, mask, &o)))
            normalize_rows(mmc_contiguous(ctx, o.text_embeds), nb, m->dim, out + (int64_t)b0 * m->dim);
        mmc_ctx_reset(ctx);
    }
    free(lens);
    free(ids);
    return st;
}

/* ---------------------------------------------------------------- training (src/train/trainer_contrastive.c) */

int mmc_dual_encoder_params(mmc_dual_encoder *m, mmc_tensor **params, const char **names, int cap) {
    int n = 0;
    if (m->text) n = mmc_clip_text_params(m->text, params, names, cap);
    for (int i = 0; i < m->w.n_params; i++, n++)
        if (n < cap) params[n] = m->w.params[i], names[n] = m->w.names[i];
    return n;
}

mmc_status mmc_dual_encoder_linears(mmc_dual_encoder *m, mmc_module_list *ml) {
    mmc_status st;
    if (m->fam == FAM_SIGLIP) {
        if ((st = enc_clip_layers_modules(m->stext->layers, m->stc.num_hidden_layers, "text_model.", ml)) ||
            (st = mmc_module_list_add(ml, &m->stext->head, "text_model.head")) ||
            (st = enc_clip_layers_modules(m->svision->layers, m->svc.num_hidden_layers, "vision_model.", ml)) ||
            (st = mmc_module_list_add(ml, &m->svision->fc1, "vision_model.head.mlp.fc1")))
            return st;
        return mmc_module_list_add(ml, &m->svision->fc2, "vision_model.head.mlp.fc2");
    }
    if ((st = clip_text_modules(m->text, "text_model.", ml)) ||
        (st = enc_clip_layers_modules(m->vision->layers, m->vc.num_hidden_layers, "vision_model.", ml)))
        return st;
    return mmc_module_list_add(ml, &m->visual_proj, "visual_projection");
}

mmc_tensor *mmc_dual_encoder_logit_scale_param(mmc_dual_encoder *m) { return m->logit_scale; }
mmc_tensor *mmc_dual_encoder_logit_bias_param(mmc_dual_encoder *m) { return m->logit_bias; }

/* forward's pooled projections before the normalisation, with the graph kept (grad on): CLIP
 * image_embeds = visual_projection(post_layernorm(vision(px)[:, 0])), text_embeds = text_projection(
 * final_layer_norm(text(ids))[eos]); SigLIP the vision attention-pooling head and the text head at
 * the last position; both [n, D] in ctx. */
mmc_status mmc_dual_encoder_project(mmc_ctx *ctx, mmc_dual_encoder *m, const mmc_tensor *pixel_values,
                                    const mmc_tensor *ids, const mmc_tensor *mask, mmc_tensor **img, mmc_tensor **txt) {
    mmc_status st;
    if (m->fam == FAM_SIGLIP) {   /* the attention-pooling head, the text head at the last position */
        if ((st = mmc_siglip_vision_pool(ctx, m->svision, (mmc_tensor *)pixel_values, img))) return st;
        return siglip_text_forward(ctx, m->stext, ids, mask, txt);
    }
    const int64_t nb = pixel_values->shape[0], Cv = m->vc.hidden_size;
    mmc_tensor **hs;
    st = mmc_clip_vision_forward(ctx, m->vision, (mmc_tensor *)pixel_values, (int)m->vc.num_hidden_layers, &hs);
    if (st) return st;
    mmc_tensor *last = hs[m->vc.num_hidden_layers];                                         /* [nb, T, Cv] */
    mmc_tensor *cls = mmc_contiguous(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, last, 1, 0, 1)),
                                                      2, MMC_SHAPE(nb, Cv)));               /* [nb, Cv] */
    mmc_tensor *pooled = mmc_layernorm(ctx, cls, m->vision->post_ln_w, m->vision->post_ln_b, (float)m->vc.layer_norm_eps);
    *img = mmc_contiguous(ctx, mmc_nn_linear(ctx, pooled, &m->visual_proj));                 /* [nb, D] */
    mmc_clip_text_out o;
    /* the causal tower's EOS never attends to the padding after it and the pooled row is all the loss
     * reads, so the mask changes nothing here: without it the attention is the differentiable kernel */
    (void)mask;
    if ((st = mmc_clip_text_forward(ctx, m->text, ids, NULL, &o))) return st;
    *txt = mmc_contiguous(ctx, o.text_embeds);                                              /* [n, D] */
    return MMC_OK;
}

/* CLIPProcessor(text=texts, padding=True, truncation=True): ids / mask [n, Lmax] padded to the longest */
mmc_status mmc_dual_encoder_tokenize(mmc_dual_encoder *m, const char *const *texts, int n, mmc_tensor **ids_out,
                                     mmc_tensor **mask_out) {
    *ids_out = *mask_out = NULL;
    const int L = m->max_length;
    if (m->fam == FAM_SIGLIP) {   /* SiglipProcessor(padding="max_length"): ids and mask [n, L] */
        mmc_tensor *a = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(n, L)), *b = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(n, L));
        mmc_status st = a && b ? MMC_OK : mmc_error(MMC_ERR_OOM, "out of memory");
        for (int i = 0; i < n && !st; i++)
            st = mmc_siglip_tokenizer_encode_padded(m->stok, texts[i], L, (int32_t *)a->data + (int64_t)i * L,
                                                     (int32_t *)b->data + (int64_t)i * L, NULL);
        if (st) { mmc_tensor_free(a), mmc_tensor_free(b); return st; }
        *ids_out = a, *mask_out = b;
        return MMC_OK;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(2 * n * L)), *mask = ids ? ids + n * L : NULL;
    if (!ids) return mmc_error(MMC_ERR_OOM, "out of memory");
    int longest = 1;
    mmc_status st = MMC_OK;
    for (int i = 0; i < n && !st; i++) {
        int len = 0;
        st = mmc_clip_tokenizer_encode_padded(m->tok, texts[i], L, ids + (int64_t)i * L, mask + (int64_t)i * L, &len);
        if (len > longest) longest = len;
    }
    if (!st) {
        mmc_tensor *a = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(n, longest)), *b = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(n, longest));
        if (!a || !b) {
            mmc_tensor_free(a), mmc_tensor_free(b);
            st = mmc_error(MMC_ERR_OOM, "out of memory");
        } else {
            for (int i = 0; i < n; i++) {
                memcpy((int32_t *)a->data + (int64_t)i * longest, ids + (int64_t)i * L, sizeof(int32_t) * (size_t)longest);
                memcpy((int32_t *)b->data + (int64_t)i * longest, mask + (int64_t)i * L, sizeof(int32_t) * (size_t)longest);
            }
            *ids_out = a, *mask_out = b;
        }
    }
    free(ids);
    return st;
}
