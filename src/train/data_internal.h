/* data_internal.h — shared between the data pipeline's files (not public). */
#ifndef MMC_DATA_INTERNAL_H
#define MMC_DATA_INTERNAL_H

#include "mmc_data.h"

/* mmc_data_prepare, telling media failures (missing/corrupt image or video: skippable)
 * apart from the rest (fatal). */
mmc_status mmc_data_prepare_ex(const mmc_data_opts *o, const mmc_tokenizer *tok, const mmc_dataset *ds,
                               int64_t idx, bool prompt_only, mmc_batch *out, bool *media_err);
/* Padding id: pad_token, else <|endoftext|>, else 0. */
int32_t mmc_data_pad_id(const mmc_tokenizer *tok);

/* The loader's audio feature cache (audio_cache.c): a clip's real frames [mels, frames] by
 * (path, silent); budget in bytes, filled until spent. get copies a hit into dst (row stride
 * dst_stride >= frames) and returns true; put copies src (row stride src_stride). NULL cache: no-op. */
typedef struct mmc_audio_cache mmc_audio_cache;
mmc_audio_cache *mmc_audio_cache_new(size_t budget_bytes);
void mmc_audio_cache_free(mmc_audio_cache *c);
bool mmc_audio_cache_get(mmc_audio_cache *c, const char *path, bool silent, int64_t mels, float *dst,
                         int64_t dst_stride, int64_t *frames);
void mmc_audio_cache_put(mmc_audio_cache *c, const char *path, bool silent, int64_t mels, const float *src,
                         int64_t src_stride, int64_t frames);

#endif
