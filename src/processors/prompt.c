/* prompt.c — placeholder expansion for vision-language prompts (see mmc_prompt.h), as
 * transformers' Qwen2VLProcessor does it: each image/video pad token becomes as many pads
 * as the vision tower will produce merged tokens for that image/video. */
#include "mmc_prompt.h"

#include <stdlib.h>
#include <string.h>

mmc_status mmc_vl_expand_pads(const int32_t *ids, const uint8_t *mask, int64_t n,
                              int32_t image_pad_id, const int64_t *image_tokens, int n_images,
                              int32_t video_pad_id, const int64_t *video_tokens, int n_videos,
                              int32_t **out_ids, uint8_t **out_mask, int64_t *out_n) {
    *out_ids = NULL;
    if (out_mask) *out_mask = NULL;
    int n_img_pads = 0, n_vid_pads = 0;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == image_pad_id) {
            if (n_img_pads < n_images) total += image_tokens[n_img_pads];
            n_img_pads++;
        } else if (ids[i] == video_pad_id) {
            if (n_vid_pads < n_videos) total += video_tokens[n_vid_pads];
            n_vid_pads++;
        } else {
            total++;
        }
    }
    if (n_img_pads != n_images)
        return mmc_error(MMC_ERR_INVALID, "the prompt has %d image placeholder%s but %d image%s %s given",
                         n_img_pads, n_img_pads == 1 ? "" : "s", n_images, n_images == 1 ? "" : "s",
                         n_images == 1 ? "was" : "were");
    if (n_vid_pads != n_videos)
        return mmc_error(MMC_ERR_INVALID, "the prompt has %d video placeholder%s but %d video%s %s given",
                         n_vid_pads, n_vid_pads == 1 ? "" : "s", n_videos, n_videos == 1 ? "" : "s",
                         n_videos == 1 ? "was" : "were");
    int32_t *o = malloc((size_t)(total ? total : 1) * sizeof *o);
    uint8_t *om = mask && out_mask ? malloc((size_t)(total ? total : 1)) : NULL;
    if (!o || (mask && out_mask && !om)) {
        free(o);
        free(om);
        return mmc_error(MMC_ERR_OOM, "out of memory expanding a %lld-token prompt", (long long)total);
    }
    int64_t k = 0;
    int ii = 0, vi = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t rep = 1;
        if (ids[i] == image_pad_id) rep = image_tokens[ii++];
        else if (ids[i] == video_pad_id) rep = video_tokens[vi++];
        for (int64_t r = 0; r < rep; r++, k++) {
            o[k] = ids[i];
            if (om) om[k] = mask[i];
        }
    }
    *out_ids = o;
    if (out_mask) *out_mask = om;
    *out_n = total;
    return MMC_OK;
}
