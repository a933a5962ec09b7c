/* fuzz_tokenizer.c — libFuzzer target for the byte-level BPE tokenizer on untrusted text:
 * mmc_tokenizer_encode (invalid UTF-8 repair, NFC, the pre-tokenizer regex, added/special
 * tokens matched inside text, BPE merges) and mmc_tokenizer_decode, with the committed
 * fixture tokenizer (tests/fixtures/tokenizer, trained with HF tokenizers). Checked
 * invariant: plain ASCII text (which NFC leaves alone) round-trips exactly through
 * encode and decode (special tokens kept). */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_tok = fuzz_fixture_tokenizer("fuzz_tokenizer");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (mmc_tokenizer_encode(g_tok, (const char *)data, (int64_t)size, false, &ids, &n) != MMC_OK) return 0;
    char *text = NULL;
    if (mmc_tokenizer_decode(g_tok, ids, n, false, &text) != MMC_OK) {
        fprintf(stderr, "fuzz_tokenizer: decode of encode's own ids failed: %s\n", mmc_last_error());
        abort();
    }
    bool ascii = true;
    for (size_t i = 0; i < size && ascii; i++) ascii = data[i] >= 1 && data[i] < 0x80;
    if (ascii && (strlen(text) != size || memcmp(text, data, size) != 0)) {
        fprintf(stderr, "fuzz_tokenizer: ASCII text does not round-trip (%zu bytes in, %zu out)\n",
                size, strlen(text));
        abort();
    }
    free(text);
    free(ids);
    return 0;
}
