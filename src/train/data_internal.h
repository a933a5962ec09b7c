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

#endif
