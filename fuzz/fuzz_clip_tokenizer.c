/* fuzz_clip_tokenizer.c — libFuzzer target for CLIP's tokenizer (src/tokenizer/clip_bpe.c) on
 * untrusted prompts: added tokens inside text, NFC, the \s+ replacement, lowercasing, CLIP's
 * split regex, BPE with unknown word ends, truncation and padding to 77, with the committed
 * fixture (tests/fixtures/text_encoders/clip_tokenizer). Invalid UTF-8 must be an error, never
 * a crash. Checked invariants: bos first and eos last, ids inside the vocabulary, and the
 * padded form equal to the unpadded one cut to 75 tokens. */
#include "mmc_encoders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_clip_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (mmc_clip_tokenizer_load(MMC_SOURCE_DIR "/tests/fixtures/text_encoders/clip_tokenizer", &g_tok) != MMC_OK) {
        fprintf(stderr, "fuzz_clip_tokenizer: cannot load the fixture tokenizer: %s\n", mmc_last_error());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;   /* a NUL inside ends the prompt, as a C string does */
    enum { CAP = 8192, L = 77 };
    static int32_t ids[CAP], padded[L], mask[L];
    int n = 0, n_real = 0;
    int32_t bos, eos, pad;
    mmc_clip_tokenizer_special_ids(g_tok, &bos, &eos, &pad);
    if (mmc_clip_tokenizer_encode(g_tok, text, ids, CAP, &n) == MMC_OK) {
        if (n < 2 || ids[0] != bos || ids[n - 1] != eos) abort();
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= 600) abort();
        if (mmc_clip_tokenizer_encode_padded(g_tok, text, L, padded, mask, &n_real) != MMC_OK) abort();
        int keep = n - 2 < L - 2 ? n - 2 : L - 2;
        if (n_real != keep + 2 || memcmp(padded, ids, (size_t)(keep + 1) * sizeof *ids) != 0 || padded[keep + 1] != eos)
            abort();
        for (int i = 0; i < L; i++)
            if (mask[i] != (i < n_real) || (i >= n_real && padded[i] != pad)) abort();
    }
    free(text);
    return 0;
}
