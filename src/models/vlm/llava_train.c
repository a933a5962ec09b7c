/* llava_train.c — training side of LLaVA-1.5 (llava.c), mirroring what
 * LlavaForConditionalGeneration.forward(input_ids, pixel_values, labels) computes in training
 * (transformers 5.x, models/llava/modeling_llava.py) and how save_pretrained / PEFT name things:
 *
 *   f = linear_2(act(linear_1(select(vision_tower(pixel_values)))))   [n_images * n_tok, C]
 *       the tower runs without a tape when frozen (the trainer's default), with one when its
 *       weights require grad; the projector always with gradients
 *   x = embed_tokens(ids) with f scattered onto the <image> rows (masked_scatter)   [B, T, C]
 *   loss = ForCausalLMLoss(lm_head(norm(Llama(x, positions 0 .. T-1))), labels)
 *
 * Packed rows (cu_seqlens) restart the positions at each segment and attend block-diagonally.
 * Parameter names are save_pretrained's (transformers 5 writes the legacy layout:
 * vision_tower.*, multi_modal_projector.*, language_model.model.*, language_model.lm_head.weight);
 * LoRA module names are those of the live transformers 5 model (model.language_model.*,
 * model.multi_modal_projector.*), which is what PEFT records. */
#include "mmc_llava.h"
#include "mmc_lora.h"
#include "mmc_trainer.h"
#include "mmc_ops.h"
#include "../model_weights.h"
#include "vlm_splice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_status add_name(char **names, int i, const char *a, const char *b) {
    size_t len = strlen(a) + strlen(b) + 1;
    if (!(names[i] = malloc(len))) return mmc_error(MMC_ERR_OOM, "out of memory");
    snprintf(names[i], len, "%s%s", a, b);
    return MMC_OK;
}

mmc_status vlm_train_param_list(const mw_set *w, mmc_qwen2 *lm, mmc_tensor ***params, char ***names, int *n) {
    *params = NULL;
    *names = NULL;
    *n = 0;
    const int nw = w->n_params, total = nw + lm->n_params;
    mmc_tensor **p = calloc((size_t)total + 1, sizeof *p);
    char **nm = calloc((size_t)total + 1, sizeof *nm);
    mmc_status st = MMC_OK;
    if (!p || !nm) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    for (int i = 0; i < nw && !st; i++) {   /* tower + projector: the checkpoint's names, no "model." */
        const char *s = w->names[i];
        if (!strncmp(s, "model.", 6)) s += 6;
        p[i] = w->params[i];
        st = add_name(nm, i, "", s);
    }
    for (int i = 0; i < lm->n_params && !st; i++) {
        const char *s = lm->param_names[i];
        p[nw + i] = lm->params[i];
        st = strcmp(s, "lm_head.weight") ? add_name(nm, nw + i, "language_model.model.", s)
                                         : add_name(nm, nw + i, "language_model.", s);
    }
    if (st) goto fail;
    *params = p;
    *names = nm;
    *n = total;
    return MMC_OK;
fail:
    for (int i = 0; nm && i < total; i++) free(nm[i]);
    free(nm);
    free(p);
    return st;
}

mmc_status mmc_llava_params(mmc_llava *m, mmc_tensor ***params, char ***names, int *n) {
    if (m->variant != MMC_LLAVA_15 || !m->vision) {   /* NeXT / OneVision / a SigLIP tower: inference only */
        *params = NULL, *names = NULL, *n = 0;
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava training: only LLaVA-1.5 with a CLIP tower is supported");
    }
    return vlm_train_param_list(m->weights, m->lm, params, names, n);
}

mmc_status mmc_llava_linears(mmc_llava *m, mmc_module_list *out) {
    mmc_status st = mmc_qwen2_linears(m->lm, "model.language_model.", out);
    if (!st) st = mmc_module_list_add(out, &m->proj1, "model.multi_modal_projector.linear_1");
    if (!st) st = mmc_module_list_add(out, &m->proj2, "model.multi_modal_projector.linear_2");
    if (!st && m->vision) st = mmc_clip_vision_linears(m->vision, "model.vision_tower.", out);
    return st;
}

mmc_status mmc_llava_attach_adapter(mmc_llava *m, const char *adapter_dir) {
    if (m->adapter || m->lm->adapter)
        return mmc_error(MMC_ERR_INVALID, "%s: the model already has an adapter", adapter_dir);
    mmc_module_list ml = {0};
    mmc_status st = mmc_llava_linears(m, &ml);
    if (!st) st = mmc_lora_load(adapter_dir, &ml, false, &m->adapter);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_llava_batch_loss(mmc_ctx *ctx, struct mmc_llava *m, const mmc_batch *b, double scale,
                                mmc_tensor **loss, int64_t *n_scored) {
    *loss = NULL;
    if (m->variant != MMC_LLAVA_15 || !m->vision)
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava training: only LLaVA-1.5 with a CLIP tower is supported");
    const mmc_qwen2_config *c = &m->lm->cfg;
    const mmc_clip_vision_config *vc = mmc_clip_vision_cfg(m->vision);
    const int64_t B = b->B, T = b->T, BT = B * T, C = c->hidden_size, S = vc->image_size;
    const int64_t n_tok = mmc_llava_image_tokens(m);
    int64_t n_img_tok = 0;
    for (int64_t i = 0; i < BT; i++) {
        int32_t t = b->input_ids[i];
        if (t < 0 || t >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %d at position %lld is outside the vocabulary [0, %lld)", t,
                             (long long)i, (long long)c->vocab_size);
        n_img_tok += t == m->image_token_id;
    }
    if (n_img_tok != (int64_t)b->n_images * n_tok)
        return mmc_error(MMC_ERR_INVALID, "the batch has %lld <image> tokens (id %lld) for %d images of %lld features",
                         (long long)n_img_tok, (long long)m->image_token_id, b->n_images, (long long)n_tok);
    if (b->n_images > 0 && (b->patch_dim != vc->num_channels * S * S || b->n_patches != b->n_images))
        return mmc_error(MMC_ERR_SHAPE, "llava batch: pixel_values must be one row of %lld values per image "
                         "(CLIPImageProcessor at %lld x %lld), got %lld rows of %lld",
                         (long long)(vc->num_channels * S * S), (long long)S, (long long)S,
                         (long long)b->n_patches, (long long)b->patch_dim);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                       /* [B, T] */
    memcpy(ids->data, b->input_ids, (size_t)BT * sizeof(int32_t));
    mmc_tensor *x = mmc_qwen2_embed(ctx, m->lm, ids);                                  /* [B, T, C] */
    if (b->n_images > 0) {
        mmc_tensor *px = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(b->n_images, vc->num_channels, S, S));
        memcpy(px->data, b->pixel_values, mmc_nbytes(px));
        mmc_tensor *f;
        mmc_status st = mmc_llava_image_features(ctx, m, px, &f);                     /* [Ni*n_tok, C] */
        if (st) return st;
        mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n_img_tok));
        int64_t k = 0;
        for (int64_t i = 0; i < BT; i++)
            if (b->input_ids[i] == m->image_token_id) ((int64_t *)idx->data)[k++] = i;
        x = mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(BT, C));             /* [B*T, C] */
        x = mmc_reshape(ctx, mmc_scatter_rows(ctx, x, idx, f), 3, MMC_SHAPE(B, T, C)); /* [B, T, C] */
    }
    *loss = mmc_embeds_causal_lm_loss(ctx, m->lm, x, b, scale, n_scored);                /* [] */
    return MMC_OK;
}
