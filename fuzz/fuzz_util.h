/* fuzz_util.h — what the fuzz targets share: the committed fixture tokenizer
 * (tests/fixtures/tokenizer), loaded once from LLVMFuzzerInitialize; a target that cannot
 * load it aborts rather than fuzz nothing. */
#ifndef MMC_FUZZ_UTIL_H
#define MMC_FUZZ_UTIL_H

#include "mmc_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

static inline mmc_tokenizer *fuzz_fixture_tokenizer(const char *target) {
    mmc_tokenizer *tok = NULL;
    if (mmc_tokenizer_load(MMC_SOURCE_DIR "/tests/fixtures/tokenizer", &tok) != MMC_OK) {
        fprintf(stderr, "%s: cannot load the fixture tokenizer: %s\n", target, mmc_last_error());
        abort();
    }
    return tok;
}

#endif
