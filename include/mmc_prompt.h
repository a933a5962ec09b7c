/* mmc_prompt.h — turning a chat with images/videos into model inputs, shared by
 * generation, evaluation, training data and serving so they cannot drift apart.
 *
 * The chat template emits ONE <|image_pad|> (or <|video_pad|>) per image (video); the
 * Qwen2-VL processor expands each to t*h*w / merge^2 copies, one per merged patch
 * (transformers' Qwen2VLProcessor.__call__). */
#ifndef MMC_PROMPT_H
#define MMC_PROMPT_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ids [n] (and an optional per-token mask [n], e.g. assistant labels, copied alongside)
 * -> *out_ids [*out_n] (malloc'd) with the k-th image pad repeated image_tokens[k] times and
 * the k-th video pad video_tokens[k] times. Fails with MMC_ERR_INVALID naming both counts
 * when the prompt has a different number of placeholders than images (videos). */
mmc_status mmc_vl_expand_pads(const int32_t *ids, const uint8_t *mask, int64_t n,
                              int32_t image_pad_id, const int64_t *image_tokens, int n_images,
                              int32_t video_pad_id, const int64_t *video_tokens, int n_videos,
                              int32_t **out_ids, uint8_t **out_mask, int64_t *out_n);

#ifdef __cplusplus
}
#endif
#endif
