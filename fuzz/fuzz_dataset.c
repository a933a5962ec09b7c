/* fuzz_dataset.c — libFuzzer target for training/eval dataset files (mmc_dataset_load):
 * JSON arrays and JSONL in the LLaVA, LLaMA-Factory (`messages` + `images`) and OpenAI
 * (content parts) layouts, auto-detected, with placeholder/media count checks; then every
 * text-only record is rendered through the chat template and tokenised (mmc_data_prepare,
 * full and prompt-only) with the fixture tokenizer. Records with media are not opened:
 * their paths come from the input and could name any file. */
#include "mmc_data.h"
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static mmc_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_tok = fuzz_fixture_tokenizer("fuzz_dataset");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_input_file(data, size, "fuzz.jsonl", path, sizeof path);
    if (fd < 0) return 0;
    mmc_dataset *ds = NULL;
    if (mmc_dataset_load(path, "/nonexistent-mmc-fuzz", &ds) == MMC_OK) {
        mmc_data_opts o;
        mmc_data_opts_default(&o);
        o.seq_len = 256;
        for (int64_t i = 0; i < mmc_dataset_size(ds) && i < 64; i++) {
            mmc_example ex;
            mmc_dataset_get(ds, i, &ex);
            if (ex.n_images || ex.n_videos) continue;
            for (int p = 0; p < 2; p++) {
                mmc_batch b = {0};
                if (mmc_data_prepare(&o, g_tok, ds, i, p == 1, &b) == MMC_OK) mmc_batch_free(&b);
            }
        }
        mmc_data_opts_free(&o);
        mmc_dataset_free(ds);
    }
    close(fd);
    return 0;
}
