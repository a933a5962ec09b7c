/* fuzz_bert_tokenizer.c — libFuzzer target for BERT's WordPiece tokenizer (src/tokenizer/bert_wordpiece.c)
 * on untrusted prompts: added tokens inside text, clean_text, CJK spacing, NFD accent stripping,
 * lowercasing, punctuation splitting, WordPiece with unknown words, truncation and padding to 77,
 * with the committed fixture (tests/fixtures/hunyuan/tokenizer). Invalid UTF-8 is dropped as U+FFFD
 * by clean_text, never a crash. Checked invariants: ids inside the vocabulary, [CLS] first, and the
 * padded form equal to the unpadded word pieces cut to 75, then [SEP] and padding. */
#include "mmc_encoders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_bert_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (mmc_bert_tokenizer_load(MMC_SOURCE_DIR "/tests/fixtures/hunyuan/tokenizer", &g_tok) != MMC_OK) {
        fprintf(stderr, "fuzz_bert_tokenizer: cannot load the fixture tokenizer: %s\n", mmc_last_error());
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
    int n = 0;
    const int32_t V = mmc_bert_tokenizer_vocab_size(g_tok);
    if (mmc_bert_tokenizer_encode(g_tok, text, ids, CAP, &n) != MMC_OK) abort();
    const int m = n < CAP ? n : CAP;
    for (int i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= V) abort();
    if (mmc_bert_tokenizer_encode_padded(g_tok, text, L, padded, mask) != MMC_OK) abort();
    const int keep = n < L - 2 ? n : L - 2;
    if (keep <= m && memcmp(padded + 1, ids, (size_t)keep * sizeof(int32_t)) != 0) abort();
    for (int i = 0; i < L; i++)
        if (mask[i] != (i < keep + 2) || padded[i] < 0 || padded[i] >= V) abort();
    free(text);
    return 0;
}
