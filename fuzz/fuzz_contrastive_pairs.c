/* fuzz_contrastive_pairs.c — libFuzzer target for the training pairs reader of `mmc train` on
 * CLIPModel folders (mmc_contrastive_pairs_parse, src/train/trainer_contrastive.c): JSONL lines,
 * their "image" / "caption" / "captions" keys, blank lines, errors naming the line. */
#include "mmc_embed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_contrastive_pairs p;
    if (mmc_contrastive_pairs_parse((const char *)data, size, "fuzz", "root", &p) == MMC_OK)
        mmc_contrastive_pairs_free(&p);
    return 0;
}
