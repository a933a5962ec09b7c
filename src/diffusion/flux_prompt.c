/* flux_prompt.c — FluxPipeline.encode_prompt: the CLIP text model's pooled output over 77
 * padded tokens and the T5 encoder's states over max_sequence_length padded tokens, each
 * tokenizer called as the pipeline calls it (padding="max_length", truncation=True), neither
 * encoder given an attention mask. Both encoders are loaded here and freed before returning. */
#include "flux_pipeline_internal.h"
#include "mmc_encoders.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ prompts */
mmc_status mmc_flux_encode_prompt(mmc_ctx *ctx, mmc_flux_pipeline *p, const char *const *prompts, int B,
                                  int max_sequence_length, mmc_flux_cond *out) {
    memset(out, 0, sizeof *out);
    mmc_status st;
    mmc_clip_tokenizer *ct = NULL;
    mmc_t5_tokenizer *tt = NULL;
    mmc_clip_text *clip = NULL;
    mmc_t5_encoder *t5 = NULL;
    const bool was = mmc_set_grad_enabled(ctx, false);
    if ((st = mmc_clip_tokenizer_load(p->comp_dir[C_TOK], &ct)) || (st = mmc_clip_text_load(p->comp_dir[C_TEXT], &clip)))
        goto done;
    const int L = mmc_clip_tokenizer_model_max_length(ct);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L));
    for (int b = 0; b < B; b++)
        if ((st = mmc_clip_tokenizer_encode_padded(ct, prompts[b], L, (int32_t *)ids->data + (int64_t)b * L, NULL, NULL)))
            goto done;
    mmc_clip_text_out co;
    if ((st = mmc_clip_text_forward(ctx, clip, ids, NULL, &co))) goto done;
    out->pooled = mmc_tensor_new(MMC_F32, 2, co.pooled->shape);
    memcpy(out->pooled->data, co.pooled->data, mmc_nbytes(co.pooled));
    mmc_clip_text_free(clip), clip = NULL;

    /* the pipeline the pinned transformers' T5TokenizerFast rebuilds from the folder (what diffusers
     * gets), not the file's own: they differ on trailing and whitespace-only text */
    if ((st = mmc_t5_tokenizer_load_pipeline(p->comp_dir[C_TOK2], MMC_T5_PIPELINE_TRANSFORMERS5, &tt)) || (st = mmc_t5_encoder_load(p->comp_dir[C_TEXT2], &t5)))
        goto done;
    const int T = max_sequence_length;
    ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));
    for (int b = 0; b < B; b++)
        if ((st = mmc_t5_tokenizer_encode_padded(tt, prompts[b], T, (int32_t *)ids->data + (int64_t)b * T, NULL, NULL)))
            goto done;
    mmc_tensor *h = NULL;
    if ((st = mmc_t5_encoder_forward(ctx, t5, ids, NULL, &h, NULL))) goto done;
    if (h->shape[2] != p->tr_cfg.joint_attention_dim || out->pooled->shape[1] != p->tr_cfg.pooled_projection_dim) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: the text encoders give %lld-d states and %lld-d pooled vectors, the "
                       "transformer takes %lld and %lld (joint_attention_dim, pooled_projection_dim)", p->dir.dir,
                       (long long)h->shape[2], (long long)out->pooled->shape[1],
                       (long long)p->tr_cfg.joint_attention_dim, (long long)p->tr_cfg.pooled_projection_dim);
        goto done;
    }
    out->prompt_embeds = mmc_tensor_new(MMC_F32, 3, h->shape);
    memcpy(out->prompt_embeds->data, h->data, mmc_nbytes(h));
done:
    mmc_clip_text_free(clip);
    mmc_t5_encoder_free(t5);
    mmc_clip_tokenizer_free(ct);
    mmc_t5_tokenizer_free(tt);
    mmc_set_grad_enabled(ctx, was);
    if (st) mmc_flux_cond_free(out);
    return st;
}


