/* llava_train.c — training side of the LLaVA family (llava.c), mirroring what
 * LlavaForConditionalGeneration / LlavaNextForConditionalGeneration /
 * LlavaOnevisionForConditionalGeneration.forward(input_ids, pixel_values, image_sizes, labels)
 * compute in training (transformers 5.x, models/llava{,_next,_onevision}/modeling_*.py) and how save_pretrained /
 * PEFT name things:
 *
 *   f = linear_2(act(linear_1(select(vision_tower(pixel_values)))))   [n_tiles * n_tok, C]
 *       the tower runs without a tape when frozen (the trainer's default), with one when its
 *       weights require grad; the projector always with gradients
 *   NeXT / OneVision: f packed per image (pack_image_features: base tile, the un-padded anyres
 *       grid, OneVision's anyres_max bilinear downsampling, image_newline after each row) as row
 *       gathers, so image_newline gets its gradient with the projector; a sample with several
 *       images is OneVision's one-padded-tile-each case (batch_num_images > 1)
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
#include "mmc_cp.h"
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
    return vlm_train_param_list(m->weights, m->lm, params, names, n);
}

mmc_status mmc_llava_linears(mmc_llava *m, mmc_module_list *out) {
    mmc_status st = mmc_qwen2_linears(m->lm, "model.language_model.", out);
    if (!st) st = mmc_module_list_add(out, &m->proj1, "model.multi_modal_projector.linear_1");
    if (!st) st = mmc_module_list_add(out, &m->proj2, "model.multi_modal_projector.linear_2");
    /* the tower's encoder linears, CLIP (LLaVA-1.5 / NeXT) or SigLIP (OneVision): transformers 5 names both
     * model.vision_tower.encoder.layers.N.* live (no vision_model.), which is what PEFT records */
    if (!st && m->vision) st = mmc_clip_vision_linears(m->vision, "model.vision_tower.", out);
    if (!st && m->siglip) st = mmc_siglip_vision_linears(m->siglip, "model.vision_tower.", out);
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

/* NeXT / OneVision: each image's (height, width) and multi flag from image_grid_thw (tiles, height,
 * width), checked against the tiles the model expects; arrays in ctx's arena */
static mmc_status anyres_images(mmc_ctx *ctx, const mmc_llava *m, const mmc_batch *b, int64_t (**sizes)[2],
                                bool **multi) {
    const int n = b->n_images;
    *sizes = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof **sizes * (size_t)n);
    *multi = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof **multi * (size_t)n);
    int64_t P = 0;
    for (int i = 0; i < n; i++) {
        const int64_t *g = b->image_grid_thw + 3 * i;
        (*sizes)[i][0] = g[1], (*sizes)[i][1] = g[2];
        /* a OneVision image of a several-image sample is one padded tile; a single image always has more */
        (*multi)[i] = m->variant == MMC_LLAVA_ONEVISION && g[0] == 1;
        const int64_t want = g[1] < 1 || g[2] < 1 ? -1 : mmc_llava_image_patches(m, g[1], g[2], (*multi)[i]);
        if (g[0] != want)
            return mmc_error(MMC_ERR_SHAPE, "llava batch: image %d (%lld x %lld) comes with %lld tiles; the model's "
                             "image_grid_pinpoints call for %lld (does the processor config give other "
                             "image_grid_pinpoints than config.json?)", i, (long long)g[2], (long long)g[1],
                             (long long)g[0], (long long)want);
        P += g[0];
    }
    if (P != b->n_patches)
        return mmc_error(MMC_ERR_SHAPE, "llava batch: %lld pixel rows for %d images of %lld tiles", (long long)b->n_patches,
                         n, (long long)P);
    return MMC_OK;
}

mmc_status mmc_llava_batch_embeds(mmc_ctx *ctx, struct mmc_llava *m, const mmc_batch *b, struct mmc_comm *cp,
                                  mmc_tensor **out) {
    *out = NULL;
    const mmc_qwen2_config *c = &m->lm->cfg;
    const bool anyres = m->variant != MMC_LLAVA_15;
    const int64_t B = b->B, T = b->T, BT = B * T, C = c->hidden_size;
    const int64_t S = m->siglip ? mmc_siglip_vision_cfg(m->siglip)->image_size : mmc_clip_vision_cfg(m->vision)->image_size;
    const int64_t Cin = m->siglip ? mmc_siglip_vision_cfg(m->siglip)->num_channels
                                  : mmc_clip_vision_cfg(m->vision)->num_channels;
    if (m->sliding_window > 0 && T > m->sliding_window)
        return mmc_error(MMC_ERR_UNSUPPORTED, "llava training: rows of %lld tokens exceed the %s language model's "
                         "sliding_window %lld (not implemented); lower data.seq_len", (long long)T, m->lm_family,
                         (long long)m->sliding_window);
    int64_t n_img_tok = 0;
    for (int64_t i = 0; i < BT; i++) {
        int32_t t = b->input_ids[i];
        if (t < 0 || t >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %d at position %lld is outside the vocabulary [0, %lld)", t,
                             (long long)i, (long long)c->vocab_size);
        n_img_tok += t == m->image_token_id;
    }
    const int64_t n_tok = mmc_llava_image_tokens(m);
    if (!anyres && n_img_tok != (int64_t)b->n_images * n_tok)
        return mmc_error(MMC_ERR_INVALID, "the batch has %lld <image> tokens (id %lld) for %d images of %lld features",
                         (long long)n_img_tok, (long long)m->image_token_id, b->n_images, (long long)n_tok);
    if (b->n_images > 0 && (b->patch_dim != Cin * S * S || (!anyres && b->n_patches != b->n_images)))
        return mmc_error(MMC_ERR_SHAPE, "llava batch: pixel_values must be rows of %lld values (%s at %lld x %lld, "
                         "one per %s), got %lld rows of %lld", (long long)(Cin * S * S),
                         anyres ? "the anyres image processor" : "CLIPImageProcessor", (long long)S, (long long)S,
                         anyres ? "tile" : "image", (long long)b->n_patches, (long long)b->patch_dim);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                       /* [B, T] */
    memcpy(ids->data, b->input_ids, (size_t)BT * sizeof(int32_t));
    mmc_tensor *x = mmc_qwen2_embed(ctx, m->lm, ids);                                  /* [B, T, C] */
    if (b->n_images > 0) {
        mmc_tensor *px = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(b->n_patches, Cin, S, S));  /* [P, 3, S, S] */
        memcpy(px->data, b->pixel_values, mmc_nbytes(px));
        mmc_tensor *f;
        mmc_status st;
        if (anyres) {
            int64_t (*sizes)[2];
            bool *multi;
            if ((st = anyres_images(ctx, m, b, &sizes, &multi))) return st;
            st = mmc_llava_image_features_multi(ctx, m, px, (const int64_t (*)[2])sizes, multi, b->n_images, &f);
        } else {
            st = mmc_llava_image_features(ctx, m, px, &f);
        }
        if (st) return st;                                                             /* [n_feat, C] */
        if (f->shape[0] != n_img_tok)
            return mmc_error(MMC_ERR_INVALID, "the batch has %lld <image> tokens (id %lld) for %d images of %lld "
                             "features in all", (long long)n_img_tok, (long long)m->image_token_id, b->n_images,
                             (long long)f->shape[0]);
        mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n_img_tok));
        int64_t k = 0;
        for (int64_t i = 0; i < BT; i++)
            if (b->input_ids[i] == m->image_token_id) ((int64_t *)idx->data)[k++] = i;
        if (cp) f = mmc_cp_sum_grad(ctx, cp, f);   /* cp: the features' gradient summed over the group */
        x = mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(BT, C));             /* [B*T, C] */
        x = mmc_reshape(ctx, mmc_scatter_rows(ctx, x, idx, f), 3, MMC_SHAPE(B, T, C)); /* [B, T, C] */
    } else if (n_img_tok)
        return mmc_error(MMC_ERR_INVALID, "the batch has %lld <image> tokens (id %lld) but no images",
                         (long long)n_img_tok, (long long)m->image_token_id);
    *out = x;
    return MMC_OK;
}

mmc_status mmc_llava_batch_loss(mmc_ctx *ctx, struct mmc_llava *m, const mmc_batch *b, double scale,
                                mmc_tensor **loss, int64_t *n_scored) {
    *loss = NULL;
    mmc_tensor *x;
    mmc_status st = mmc_llava_batch_embeds(ctx, m, b, NULL, &x);                     /* [B, T, C] */
    if (st) return st;
    *loss = mmc_embeds_causal_lm_loss(ctx, m->lm, x, b, scale, n_scored);                /* [] */
    return MMC_OK;
}
