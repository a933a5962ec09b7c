/* vlm_splice.h — what the VLMs that splice projected image features into the language model's
 * token embeddings share (LLaVA, InternVL: transformers' masked_scatter of image_features at the
 * image-token positions), and their decoder glue: the prompt (or one token) through the model's
 * forward, the last position's logits. */
#ifndef MMC_VLM_SPLICE_H
#define MMC_VLM_SPLICE_H

#include "mmc_models.h"
#include "../encoders/encoder_common.h"

/* Every id in [0, vocab) (else an error naming the position); *n_img: how many are image_token_id. */
mmc_status vlm_check_ids(const mmc_tensor *ids, int64_t vocab, int64_t image_token_id, int64_t *n_img);
/* e [B, T, C] (contiguous f32): row i = feats row k++ wherever ids[i] == image_token_id. */
void vlm_splice(mmc_tensor *e, const mmc_tensor *ids, int64_t image_token_id, const mmc_tensor *feats);

typedef mmc_status (*vlm_forward_fn)(mmc_ctx *ctx, void *model, mmc_tensor *ids, mmc_tensor *pixels,
                                     mmc_kv_cache *kv, mmc_tensor **hidden);
/* ids_in[0, n) through fwd (pixels only with the prompt), then *logits = lm's logits of the last
 * position [1, 1, V] (arena memory). */
mmc_status vlm_feed(mmc_ctx *ctx, vlm_forward_fn fwd, void *model, mmc_qwen2 *lm, const int32_t *ids_in, int64_t n,
                    mmc_tensor *pixels, mmc_kv_cache *kv, float **logits);

/* The trainable parameters of a tower + projector weight set w and its language model lm, named as
 * LLaVA's / InternVL's save_pretrained names them: w's names without "model.", then
 * "language_model.model.<name>" ("language_model.lm_head.weight"). Arrays owned by the caller. */
mmc_status vlm_train_param_list(const mw_set *w, mmc_qwen2 *lm, mmc_tensor ***params, char ***names, int *n);

#endif
