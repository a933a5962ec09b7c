/* prompt_encoders.c — the text-encoder calls the diffusion pipelines share: a CLIP text model over
 * prompts padded to the tokenizer's model_max_length, and T5 over max_sequence_length padded
 * tokens, each tokenizer called as the pipelines call it (padding="max_length", truncation=True),
 * no attention mask. Each loads its tokenizer and encoder, keeps persistent copies of what the
 * caller asks for, and frees both before returning. T5 is tokenized as the pinned transformers 5
 * rebuilds T5Tokenizer's pipeline (what diffusers gets), not as tokenizer.json's own pipeline: the
 * two differ on trailing and whitespace-only text. */
#include "mmc_diffusion.h"
#include "mmc_encoders.h"

#include <string.h>

static mmc_tensor *keep_copy(const mmc_tensor *t) {
    mmc_tensor *c = mmc_tensor_new(MMC_F32, t->ndim, t->shape);
    if (c) memcpy(c->data, t->data, mmc_nbytes(t));
    return c;
}

mmc_status mmc_pipe_clip_encode(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const char *const *prompts,
                                int B, mmc_tensor **penultimate, mmc_tensor **pooled, mmc_tensor **text_embeds) {
    return mmc_pipe_clip_encode_st(ctx, tok_dir, enc_dir, NULL, prompts, B, penultimate, pooled, text_embeds);
}

mmc_status mmc_pipe_clip_encode_st(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const mmc_clip_load *lo,
                                   const char *const *prompts, int B, mmc_tensor **penultimate, mmc_tensor **pooled,
                                   mmc_tensor **text_embeds) {
    mmc_clip_tokenizer *ct = NULL;
    mmc_clip_text *m = NULL;
    const bool was = mmc_set_grad_enabled(ctx, false);
    mmc_st *weights = lo ? lo->weights : NULL;
    mmc_status st = mmc_clip_tokenizer_load(tok_dir, &ct);
    if (st && weights) mmc_st_close(weights);
    if (st || (st = weights ? mmc_clip_text_load_st(enc_dir, weights, lo->what ? lo->what : enc_dir, &m)
                            : mmc_clip_text_load(enc_dir, &m)))
        goto done;
    if (lo && lo->patch && (st = lo->patch(lo->user, m))) goto done;
    const int L = mmc_clip_tokenizer_model_max_length(ct);
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, L));
    for (int b = 0; b < B && !st; b++)
        st = mmc_clip_tokenizer_encode_padded(ct, prompts[b], L, (int32_t *)ids->data + (int64_t)b * L, NULL, NULL);
    mmc_clip_text_out o;
    if (st || (st = mmc_clip_text_forward(ctx, m, ids, NULL, &o))) goto done;
    if (text_embeds && !o.text_embeds) {
        st = mmc_error(MMC_ERR_FORMAT, "%s: this pipeline takes a CLIPTextModelWithProjection (a text_projection)",
                       enc_dir);
        goto done;
    }
    if ((penultimate && !(*penultimate = keep_copy(o.penultimate))) || (pooled && !(*pooled = keep_copy(o.pooled))) ||
        (text_embeds && !(*text_embeds = keep_copy(o.text_embeds))))
        st = mmc_error(MMC_ERR_OOM, "out of memory");
done:
    mmc_clip_text_free(m);
    mmc_clip_tokenizer_free(ct);
    mmc_set_grad_enabled(ctx, was);
    return st;
}

mmc_status mmc_pipe_t5_encode(mmc_ctx *ctx, const char *tok_dir, const char *enc_dir, const char *const *prompts,
                              int B, int max_sequence_length, mmc_tensor **states) {
    mmc_t5_tokenizer *tt = NULL;
    mmc_t5_encoder *t5 = NULL;
    const bool was = mmc_set_grad_enabled(ctx, false);
    const int T = max_sequence_length;
    mmc_status st;
    if ((st = mmc_t5_tokenizer_load_pipeline(tok_dir, MMC_T5_PIPELINE_TRANSFORMERS5, &tt)) ||
        (st = mmc_t5_encoder_load(enc_dir, &t5)))
        goto done;
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T)), *h = NULL;
    for (int b = 0; b < B && !st; b++)
        st = mmc_t5_tokenizer_encode_padded(tt, prompts[b], T, (int32_t *)ids->data + (int64_t)b * T, NULL, NULL);
    if (st || (st = mmc_t5_encoder_forward(ctx, t5, ids, NULL, &h, NULL))) goto done;
    if (!(*states = keep_copy(h))) st = mmc_error(MMC_ERR_OOM, "out of memory");
done:
    mmc_t5_encoder_free(t5);
    mmc_t5_tokenizer_free(tt);
    mmc_set_grad_enabled(ctx, was);
    return st;
}
