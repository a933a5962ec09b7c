/* internvl_train.c — training side of InternVL 2.5 / 3 in transformers' HF-native layout
 * (internvl.c), mirroring what InternVLForConditionalGeneration.forward(input_ids, pixel_values,
 * labels) computes in training (transformers 5.x, models/internvl/modeling_internvl.py) and how
 * save_pretrained / PEFT name things:
 *
 *   f = linear_2(act(linear_1(LayerNorm(pixel_shuffle(InternViT(tiles)[layer][:, 1:])))))
 *       [n_tiles * tile_tokens, C]; the tower runs without a tape when frozen (mmc train's
 *       default), with one when its weights require grad (model.freeze without vision_tower);
 *       the projector always with gradients
 *   x = embed_tokens(ids) with f scattered onto the <IMG_CONTEXT> rows (masked_scatter)  [B, T, C]
 *   loss = ForCausalLMLoss(lm_head(norm(Qwen2(x, positions 0 .. T-1))), labels)
 *
 * Packed rows (cu_seqlens) restart the positions at each segment and attend block-diagonally.
 * Parameter names are save_pretrained's (transformers 5 writes vision_tower.*,
 * multi_modal_projector.*, language_model.model.*, language_model.lm_head.weight); LoRA module
 * names are those of the live model (model.language_model.*, model.multi_modal_projector.*,
 * model.vision_tower.encoder.layer.N.attention.{q,k,v}_proj / projection_layer / mlp.fc1 / fc2),
 * which is what PEFT records; LoRA on the tower's linears gives it a tape with its weights frozen.
 *
 * OpenGVLab's InternVLChatModel layout (internvl_chat) trains with its Qwen2 language model as loaded, or its
 * InternLM2 one loaded packed (mmc_internvl_load_ex: one attention.wqkv linear per layer, text/internlm2.c):
 * parameters under its state-dict names (vision_model.*, mlp1.*, language_model.model.*, and the head
 * language_model.lm_head.weight for Qwen2ForCausalLM, language_model.output.weight for InternLM2's), LoRA modules
 * under the live model's (language_model.model.layers.N.self_attn.{q,k,v,o}_proj / mlp.{gate,up,down}_proj, or
 * .attention.wqkv / wo / feed_forward.w1-3; mlp1.1, mlp1.3; the tower's fused qkv is not offered), the loss the
 * same (InternVLChatModel.forward: image rows replaced, mean token loss). */
#include "mmc_internvl.h"
#include "mmc_lora.h"
#include "mmc_trainer.h"
#include "mmc_ops.h"
#include "mmc_cp.h"
#include "../model_weights.h"
#include "vlm_splice.h"
#include "../vision/intern_vit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenGVLab's layout trains with a Qwen2 language model as it loads, and with an InternLM2 one only loaded packed
 * (mmc_internvl_load_ex with trainable, or _opts with packed): its Llama view has no wqkv to train or adapt. */
static mmc_status layout_check(const mmc_internvl *m) {
    if (m->remote_layout && m->lm_internlm2 && !m->lm->cfg.internlm2)
        return mmc_error(MMC_ERR_UNSUPPORTED, "internvl training: OpenGVLab's InternVLChatModel layout (model_type "
                         "internvl_chat) with an InternLM2 language model trains only in its packed layout (one "
                         "attention.wqkv per layer): load it with mmc_internvl_load_ex(dir, true) / _opts(packed)");
    return MMC_OK;
}

/* InternVLChatModel's state-dict names: vision_model.*, mlp1.*, language_model.model.* and the head,
 * language_model.output.weight (InternLM2ForCausalLM's) or language_model.lm_head.weight (Qwen2ForCausalLM's) */
static mmc_status remote_param_list(const mw_set *w, mmc_qwen2 *lm, mmc_tensor ***params, char ***names, int *n) {
    const int nw = w->n_params, total = nw + lm->n_params;
    mmc_tensor **p = calloc((size_t)total + 1, sizeof *p);
    char **nm = calloc((size_t)total + 1, sizeof *nm);
    if (!p || !nm) { free(p); free(nm); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    for (int i = 0; i < total; i++) {
        const char *s = i < nw ? w->names[i] : lm->param_names[i - nw];
        const char *pre = i < nw ? "" : !strcmp(s, "output.weight") || !strcmp(s, "lm_head.weight") ? "language_model."
                                                                                               : "language_model.model.";
        size_t len = strlen(pre) + strlen(s) + 1;
        p[i] = i < nw ? w->params[i] : lm->params[i - nw];
        if (!(nm[i] = malloc(len))) {
            for (int k = 0; k < i; k++) free(nm[k]);
            free(nm);
            free(p);
            return mmc_error(MMC_ERR_OOM, "out of memory");
        }
        snprintf(nm[i], len, "%s%s", pre, s);
    }
    *params = p, *names = nm, *n = total;
    return MMC_OK;
}

mmc_status mmc_internvl_params(mmc_internvl *m, mmc_tensor ***params, char ***names, int *n) {
    *params = NULL, *names = NULL, *n = 0;
    mmc_status st = layout_check(m);
    if (st) return st;
    if (m->remote_layout) return remote_param_list(m->weights, m->lm, params, names, n);
    return vlm_train_param_list(m->weights, m->lm, params, names, n);   /* the same names as LLaVA's */
}

mmc_status mmc_internvl_linears(mmc_internvl *m, mmc_module_list *out) {
    mmc_status st = layout_check(m);
    if (!st && m->remote_layout) {   /* PEFT on InternVLChatModel: its own module names */
        st = mmc_qwen2_linears(m->lm, "language_model.model.", out);
        if (!st) st = mmc_module_list_add(out, &m->proj1, "mlp1.1");
        if (!st) st = mmc_module_list_add(out, &m->proj2, "mlp1.3");
        if (!st) st = intern_vit_linears(m->vision, "vision_model.", out);
        return st;
    }
    if (!st) st = mmc_qwen2_linears(m->lm, "model.language_model.", out);
    if (!st) st = mmc_module_list_add(out, &m->proj1, "model.multi_modal_projector.linear_1");
    if (!st) st = mmc_module_list_add(out, &m->proj2, "model.multi_modal_projector.linear_2");
    if (!st) st = intern_vit_linears(m->vision, "model.vision_tower.", out);
    return st;
}

mmc_status mmc_internvl_attach_adapter(mmc_internvl *m, const char *adapter_dir) {
    if (m->adapter || m->lm->adapter)
        return mmc_error(MMC_ERR_INVALID, "%s: the model already has an adapter", adapter_dir);
    if (m->remote_layout && m->lm_internlm2 && !m->lm->cfg.internlm2)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: LoRA adapters on OpenGVLab's InternVLChatModel layout (model_type "
                         "internvl_chat) with an InternLM2 language model need it loaded packed "
                         "(mmc_internvl_load_opts)", adapter_dir);
    mmc_module_list ml = {0};
    mmc_status st = mmc_internvl_linears(m, &ml);
    if (!st) st = mmc_lora_load(adapter_dir, &ml, false, &m->adapter);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_internvl_batch_embeds(mmc_ctx *ctx, struct mmc_internvl *m, const mmc_batch *b, struct mmc_comm *cp,
                                     mmc_tensor **out) {
    *out = NULL;
    mmc_status st = layout_check(m);
    if (st) return st;
    const mmc_qwen2_config *c = &m->lm->cfg;
    const int64_t B = b->B, T = b->T, BT = B * T, C = c->hidden_size;
    int64_t n_img_tok = 0;
    for (int64_t i = 0; i < BT; i++) {
        int32_t t = b->input_ids[i];
        if (t < 0 || t >= c->vocab_size)
            return mmc_error(MMC_ERR_INVALID, "token %d at position %lld is outside the vocabulary [0, %lld)", t,
                             (long long)i, (long long)c->vocab_size);
        n_img_tok += t == m->image_token_id;
    }
    int64_t S = 0;   /* the tile side, from the row length */
    while (b->n_patches > 0 && 3 * (S + 1) * (S + 1) <= b->patch_dim) S++;
    if (b->n_patches > 0 && 3 * S * S != b->patch_dim)
        return mmc_error(MMC_ERR_SHAPE, "internvl batch: pixel rows of %lld values are not 3 x s x s tiles",
                         (long long)b->patch_dim);
    const int64_t n_feat = b->n_patches > 0 ? b->n_patches * mmc_internvl_tile_tokens(m, S) : 0;
    if (n_img_tok != n_feat)
        return mmc_error(MMC_ERR_INVALID, "the batch has %lld <IMG_CONTEXT> tokens (id %lld) for %lld tiles of "
                         "%lld features", (long long)n_img_tok, (long long)m->image_token_id,
                         (long long)b->n_patches, (long long)(S ? mmc_internvl_tile_tokens(m, S) : 0));
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                       /* [B, T] */
    memcpy(ids->data, b->input_ids, (size_t)BT * sizeof(int32_t));
    mmc_tensor *x = mmc_qwen2_embed(ctx, m->lm, ids);                                  /* [B, T, C] */
    /* the pad row gets no gradient: mmc_qwen2_embed applies the config's padding_idx */
    if (n_feat > 0) {
        mmc_tensor *px = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(b->n_patches, 3, S, S));   /* [N, 3, s, s] */
        memcpy(px->data, b->pixel_values, mmc_nbytes(px));
        mmc_tensor *f;
        if ((st = mmc_internvl_image_features(ctx, m, px, &f))) return st;            /* [N*tok, C] */
        mmc_tensor *idx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n_img_tok));
        int64_t k = 0;
        for (int64_t i = 0; i < BT; i++)
            if (b->input_ids[i] == m->image_token_id) ((int64_t *)idx->data)[k++] = i;
        if (cp) f = mmc_cp_sum_grad(ctx, cp, f);   /* cp: the features' gradient summed over the group */
        x = mmc_reshape(ctx, mmc_contiguous(ctx, x), 2, MMC_SHAPE(BT, C));             /* [B*T, C] */
        x = mmc_reshape(ctx, mmc_scatter_rows(ctx, x, idx, f), 3, MMC_SHAPE(B, T, C)); /* [B, T, C] */
    }
    *out = x;
    return MMC_OK;
}

mmc_status mmc_internvl_batch_loss(mmc_ctx *ctx, struct mmc_internvl *m, const mmc_batch *b, double scale,
                                   mmc_tensor **loss, int64_t *n_scored) {
    *loss = NULL;
    mmc_tensor *x;
    mmc_status st = mmc_internvl_batch_embeds(ctx, m, b, NULL, &x);                  /* [B, T, C] */
    if (st) return st;
    *loss = mmc_embeds_causal_lm_loss(ctx, m->lm, x, b, scale, n_scored);                /* [] */
    return MMC_OK;
}
