/* qwen2_vl_train.c — training-side helpers of the Qwen2 family: the causal-LM loss as
 * transformers' ForCausalLMLoss computes it (labels shifted left by one, -100 ignored,
 * token losses summed and divided by the global batch's label count), the text Qwen2
 * and Qwen2-VL forward-to-loss for one micro-batch (padded or packed rows, images and videos), and saving weights under the HF names
 * (Qwen2ForCausalLM: model.* + lm_head.weight) so transformers loads the directory. */
#include "mmc_trainer.h"
#include "mmc_vl.h"
#include "mmc_io.h"
#include "mmc_ops.h"
#include "mmc_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t mmc_count_label_tokens(const int32_t *labels, int64_t B, int64_t T) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 1; t < T; t++) n += labels[b * T + t] != MMC_IGNORE_INDEX;
    return n;
}

/* tensor parallelism: logits are this rank's vocabulary slice from vocab_start (tp NULL: all) */
static mmc_tensor *causal_lm_loss(mmc_ctx *ctx, mmc_comm *tp, int64_t vocab_start, mmc_tensor *logits,
                                  const int32_t *labels, double scale, int64_t *n_scored) {
    MMC_CHECK(logits->ndim == 3 && logits->dtype == MMC_F32, "mmc_causal_lm_loss: logits must be f32 [B, T, V]");
    int64_t B = logits->shape[0], T = logits->shape[1], V = logits->shape[2];
    mmc_tensor *tg = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(B * T));                /* [B*T] */
    int32_t *t = tg->data;
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i + 1 < T; i++) {
            int32_t y = labels[b * T + i + 1];
            t[b * T + i] = y;
            n += y != MMC_IGNORE_INDEX;
        }
        t[b * T + T - 1] = MMC_IGNORE_INDEX;
    }
    if (n_scored) *n_scored = n;
    mmc_tensor *flat = mmc_reshape(ctx, logits, 2, MMC_SHAPE(B * T, V));        /* [B*T, V] */
    mmc_tensor *mean = tp ? mmc_tp_cross_entropy(ctx, tp, mmc_contiguous(ctx, flat), tg, vocab_start, MMC_IGNORE_INDEX)
                          : mmc_cross_entropy(ctx, flat, tg, MMC_IGNORE_INDEX);      /* [] */
    return mmc_scale(ctx, mean, (float)((double)n * scale));
}

mmc_tensor *mmc_causal_lm_loss(mmc_ctx *ctx, mmc_tensor *logits, const int32_t *labels,
                               double scale, int64_t *n_scored) {
    return causal_lm_loss(ctx, NULL, 0, logits, labels, scale, n_scored);
}

mmc_tensor *mmc_causal_lm_loss_tp(mmc_ctx *ctx, struct mmc_comm *tp, int64_t vocab_start, mmc_tensor *logits,
                                  const int32_t *labels, double scale, int64_t *n_scored) {
    return causal_lm_loss(ctx, tp, vocab_start, logits, labels, scale, n_scored);
}

mmc_tensor *mmc_qwen2_lm_loss(mmc_ctx *ctx, mmc_qwen2 *m, const mmc_batch *b, double scale,
                              int64_t *n_scored) {
    int64_t B = b->B, T = b->T;
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                 /* [B, T] */
    memcpy(ids->data, b->input_ids, (size_t)(B * T) * sizeof(int32_t));
    mmc_tensor *cos, *sin;
    const int D = (int)m->cfg.head_dim;
    if (m->cfg.mrope) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, T));          /* [3, B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(3 * B * T) * sizeof(int64_t));
        mmc_rope_table_mrope(ctx, pos, m->cfg.mrope_section, D, m->cfg.rope_theta, &cos, &sin);
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, T));             /* [B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(B * T) * sizeof(int64_t));
        mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);   /* rope_scaling: linear, dynamic, llama3 too */
    }
    mmc_attn_opts attn = {.causal = true, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    mmc_tensor *x = mmc_qwen2_embed(ctx, m, ids);                                /* [B, T, C] */
    x = mmc_qwen2_forward(ctx, m, x, cos, sin, &attn, NULL);                     /* [B, T, C] */
    if (m->tp) {   /* vocab-parallel: the loss from this rank's logits [B, T, V/tp], never gathered */
        mmc_tensor *logits = mmc_qwen2_logits_local(ctx, m, x);                  /* [B, T, V/tp] */
        return causal_lm_loss(ctx, m->tp, mmc_comm_rank(m->tp) * m->lm_head->shape[0], logits, b->labels, scale,
                              n_scored);
    }
    mmc_tensor *logits = mmc_qwen2_logits(ctx, m, x);                            /* [B, T, V] */
    return mmc_causal_lm_loss(ctx, logits, b->labels, scale, n_scored);
}

mmc_tensor *mmc_embeds_positions(mmc_ctx *ctx, const mmc_batch *b) {
    const int64_t T = b->T;
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));                         /* [T] */
    int64_t *pd = pos->data;
    for (int64_t t = 0; t < T; t++) pd[t] = t;
    for (int s = 0; b->cu_seqlens && s < b->n_seqs; s++)   /* packed: each segment from 0 */
        for (int64_t t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1] && t < T; t++) pd[t] = t - b->cu_seqlens[s];
    return pos;
}

mmc_attn_opts mmc_embeds_attn(mmc_ctx *ctx, const mmc_batch *b) {
    mmc_attn_opts ao = {.causal = true};
    if (b->cu_seqlens) {   /* block-diagonal; the padding tail (not a segment) one more block covering the row */
        const int64_t T = b->T;
        int n = b->n_seqs;
        int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(n + 2));
        memcpy(cu, b->cu_seqlens, sizeof(int32_t) * (size_t)(n + 1));
        if (n == 0) cu[0] = 0;
        if (cu[n] < T) cu[++n] = (int32_t)T;
        ao.cu_seqlens = cu;
        ao.n_seqs = n;
    }
    return ao;
}

mmc_tensor *mmc_embeds_causal_lm_loss(mmc_ctx *ctx, mmc_qwen2 *lm, mmc_tensor *x, const mmc_batch *b, double scale,
                                      int64_t *n_scored) {
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &lm->cfg, mmc_embeds_positions(ctx, b), &cos, &sin);     /* [T, D] */
    mmc_attn_opts ao = mmc_embeds_attn(ctx, b);
    x = mmc_qwen2_forward(ctx, lm, x, cos, sin, &ao, NULL);                             /* [B, T, C] */
    return mmc_hidden_causal_lm_loss(ctx, lm, x, b, scale, n_scored);
}

mmc_tensor *mmc_hidden_causal_lm_loss(mmc_ctx *ctx, mmc_qwen2 *lm, mmc_tensor *x, const mmc_batch *b, double scale,
                                      int64_t *n_scored) {
    /* the lm_head only on the rows whose next label is scored (logits[t] predicts labels[t + 1]): the same loss
     * and gradients as over every row (an unscored row's gradient is zero), without the head's GEMMs over a VLM
     * prompt's image and instruction rows (LLaVA-1.5: 576 image rows of a 640-token row) */
    const int64_t B = b->B, T = b->T, C = x->shape[2];
    int64_t n = 0;
    for (int64_t r = 0; r < B; r++)
        for (int64_t t = 0; t + 1 < T; t++) n += b->labels[r * T + t + 1] != MMC_IGNORE_INDEX;
    if (lm->tp) {   /* vocab-parallel loss on this rank's logits [B, T, V/tp], never gathered */
        mmc_tensor *logits = mmc_qwen2_logits_local(ctx, lm, x);
        return causal_lm_loss(ctx, lm->tp, mmc_comm_rank(lm->tp) * lm->lm_head->shape[0], logits, b->labels, scale,
                              n_scored);
    }
    if (n == 0 || n == B * (T - 1)) {
        mmc_tensor *logits = mmc_qwen2_logits(ctx, lm, x);                              /* [B, T, V] */
        return mmc_causal_lm_loss(ctx, logits, b->labels, scale, n_scored);
    }
    mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n)), *tg = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(n));  /* [n] */
    int64_t *ix = idx->data, k = 0;
    int32_t *ty = tg->data;
    for (int64_t r = 0; r < B; r++)
        for (int64_t t = 0; t + 1 < T; t++)
            if (b->labels[r * T + t + 1] != MMC_IGNORE_INDEX) ix[k] = r * T + t, ty[k++] = b->labels[r * T + t + 1];
    mmc_tensor *xs = mmc_gather_rows(ctx, mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(B * T, C)), idx);
    mmc_tensor *logits = mmc_qwen2_logits(ctx, lm, xs);                                 /* [n, V] */
    if (n_scored) *n_scored = n;
    return mmc_scale(ctx, mmc_cross_entropy(ctx, logits, tg, MMC_IGNORE_INDEX), (float)((double)n * scale));
}

mmc_status mmc_qwen2_save_weights(const mmc_qwen2 *m, const char *path, mmc_dtype dt) {
    mmc_stw *w = mmc_stw_new();
    void **tmp = calloc((size_t)m->n_params + 1, sizeof *tmp);
    mmc_status st = MMC_OK;
    if (!w || !tmp) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 0; i < m->n_params; i++) {
        const mmc_tensor *p = m->params[i];
        char name[160];
        if (strcmp(m->param_names[i], "lm_head.weight") == 0) snprintf(name, sizeof name, "lm_head.weight");
        else snprintf(name, sizeof name, "model.%s", m->param_names[i]);
        if (p->dtype == dt) {
            st = mmc_stw_add(w, name, p);
        } else {
            int64_t n = mmc_numel(p);
            tmp[i] = malloc((size_t)n * mmc_dtype_size(dt) + 64);
            if (!tmp[i]) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
            mmc_convert(tmp[i], dt, p->data, p->dtype, n);
            st = mmc_stw_add_raw(w, name, dt, p->ndim, p->shape, tmp[i]);
        }
        if (st) goto done;
    }
    if ((st = mmc_stw_set_metadata(w, "format", "pt"))) goto done;
    st = mmc_stw_write(w, path);
done:
    if (tmp) for (int i = 0; i < m->n_params; i++) free(tmp[i]);
    free(tmp);
    mmc_stw_free(w);
    return st;
}

mmc_tensor *mmc_qwen2_vl_batch_media(mmc_ctx *ctx, const mmc_batch *b, mmc_vl_media *out) {
    mmc_vl_media media = {0};
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(b->B, b->T));           /* [B, T] */
    memcpy(ids->data, b->input_ids, (size_t)(b->B * b->T) * sizeof(int32_t));
    if (b->n_images > 0) {
        media.pixel_values = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(b->n_patches, b->patch_dim));      /* [Ni, P] */
        memcpy(media.pixel_values->data, b->pixel_values, mmc_nbytes(media.pixel_values));
        media.image_grid_thw = b->image_grid_thw;
        media.n_images = b->n_images;
    }
    if (b->n_videos > 0) {
        media.pixel_values_videos = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(b->n_video_patches, b->patch_dim)); /* [Nv, P] */
        memcpy(media.pixel_values_videos->data, b->video_values, mmc_nbytes(media.pixel_values_videos));
        media.video_grid_thw = b->video_grid_thw;
        media.n_videos = b->n_videos;
        media.second_per_grid_ts = b->video_second_per_grid_ts;
    }
    *out = media;
    return ids;
}

mmc_status mmc_qwen2_vl_batch_loss(mmc_ctx *ctx, mmc_qwen2_vl *m, const mmc_batch *b, double scale,
                                   mmc_tensor **loss, int64_t *n_scored) {
    *loss = NULL;
    mmc_vl_media media;
    mmc_tensor *ids = mmc_qwen2_vl_batch_media(ctx, b, &media);                  /* [B, T] */
    mmc_vl_seq seq = {.position_ids = b->position_ids, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    mmc_tensor *h;
    mmc_status st = mmc_qwen2_vl_forward_ex(ctx, m, ids, &media, &seq, NULL, NULL, &h);   /* [B, T, C] */
    if (st) return st;
    if (m->lm->tp) {   /* vocab-parallel loss on this rank's logits [B, T, V/tp] */
        mmc_tensor *logits = mmc_qwen2_logits_local(ctx, m->lm, h);
        *loss = causal_lm_loss(ctx, m->lm->tp, mmc_comm_rank(m->lm->tp) * m->lm->lm_head->shape[0], logits, b->labels,
                               scale, n_scored);
        return MMC_OK;
    }
    mmc_tensor *logits = mmc_qwen2_vl_logits(ctx, m, h);                          /* [B, T, V] */
    *loss = mmc_causal_lm_loss(ctx, logits, b->labels, scale, n_scored);
    return MMC_OK;
}
