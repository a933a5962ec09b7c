/* mmc_data.h — the training data pipeline's output: a micro-batch ready for the model.
 *
 * Two layouts:
 *  - padded: B rows, right-padded to T with pad_id; labels -100 on padding. Causal
 *    attention needs no mask for right padding (real tokens never see later pads).
 *  - packed: B == 1, one row of T = seq_len holding several samples back to back;
 *    cu_seqlens gives their boundaries (block-diagonal causal attention) and position ids
 *    restart at every sample.
 * labels[b, t] is the token expected at position t (HF convention: the model shifts, so
 * logits[:, t] are scored against labels[:, t + 1]); -100 is ignored (prompt, system, user
 * turns, vision placeholders, padding).
 */
#ifndef MMC_DATA_H
#define MMC_DATA_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MMC_IGNORE_INDEX (-100)

typedef struct {
    int64_t B, T;
    int32_t *input_ids;        /* [B, T] */
    int32_t *labels;           /* [B, T], MMC_IGNORE_INDEX where not trained */
    int64_t *position_ids;     /* [3, B, T] M-RoPE positions (t, h, w); text rows repeat */
    int32_t *cu_seqlens;       /* packed: [n_seqs + 1], else NULL */
    int n_seqs;
    /* vision inputs of all samples, in token order */
    float *pixel_values;       /* [n_patches, patch_dim] images */
    int64_t n_patches, patch_dim;
    int64_t *image_grid_thw;   /* [n_images, 3] */
    int n_images;
    float *video_values;       /* [n_video_patches, patch_dim] */
    int64_t n_video_patches;
    int64_t *video_grid_thw;   /* [n_videos, 3] */
    int n_videos;
    int64_t n_label_tokens;    /* labels != -100 after the shift (what the loss averages over) */
    int64_t sample_index;      /* index of the first sample (for logging/resume) */
} mmc_batch;

void mmc_batch_free(mmc_batch *b);   /* frees every array, zeroes the struct */

#ifdef __cplusplus
}
#endif
#endif
