/* fuzz_siglip_tokenizer.c — libFuzzer target for SigLIP's tokenizer (src/tokenizer/siglip_spm.c)
 * on untrusted input of both kinds:
 *
 *   an input starting with 0x0A (ModelProto field 1, a piece) is a spiece.model: it is written to
 *   a scratch folder and loaded (the protobuf read with every length bounds-checked, the charsmap's
 *   Darts array looked up with every index checked); a tokenizer that loads then encodes a few
 *   fixed texts. Seeds: fuzz/corpus/siglip_tokenizer/model_*.bin (the fixture's pieces without
 *   the 240 kB charsmap) and texts;
 *   anything else is a text for the committed fixture (tests/fixtures/siglip_model/model): invalid
 *   UTF-8 must be an error, never a crash. Checked invariants: ids inside the vocabulary, </s>
 *   last of the real tokens, the mask 1 exactly on them, pad after, and a longer max_length
 *   giving the same prefix. */
#include "mmc_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static mmc_siglip_tokenizer *g_tok;
static char g_dir[64], g_path[96];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (mmc_siglip_tokenizer_load(MMC_SOURCE_DIR "/tests/fixtures/siglip_model/model", &g_tok) != MMC_OK) {
        fprintf(stderr, "fuzz_siglip_tokenizer: cannot load the fixture tokenizer: %s\n", mmc_last_error());
        abort();
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_siglip_tokenizer_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_path, sizeof g_path, "%s/spiece.model", g_dir);
    return 0;
}

static void check_text(const mmc_siglip_tokenizer *t, const char *text) {
    enum { L = 24, L2 = 64 };
    int32_t ids[L], mask[L], ids2[L2], mask2[L2];
    int n = 0, n2 = 0;
    if (mmc_siglip_tokenizer_encode_padded(t, text, L, ids, mask, &n) != MMC_OK) return;
    if (mmc_siglip_tokenizer_encode_padded(t, text, L2, ids2, mask2, &n2) != MMC_OK) abort();
    const int32_t nv = mmc_siglip_tokenizer_vocab_size(t);
    if (n < 1 || n > L || n2 < n) abort();
    for (int i = 0; i < L; i++)
        if (ids[i] < 0 || ids[i] >= nv || mask[i] != (i < n)) abort();
    if (ids[n - 1] != ids2[n2 - 1] || memcmp(ids, ids2, (size_t)(n - 1) * sizeof *ids)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size && data[0] == 0x0A) {
        FILE *f = fopen(g_path, "wb");
        if (!f) return 0;
        fwrite(data, 1, size, f);
        fclose(f);
        mmc_siglip_tokenizer *t = NULL;
        if (mmc_siglip_tokenizer_load(g_dir, &t) == MMC_OK) {
            static const char *texts[] = {"a red  circle on the LEFT!", "caf\xc3\xa9 \xef\xac\x81ne \xe2\x91\xa0\xe3\x80\x80x",
                                          "", "\xff", "<unk></s>\xe2\x96\x81\xe2\x96\x81 x"};
            int32_t ids[8], mask[8];
            int n;
            for (unsigned i = 0; i < sizeof texts / sizeof *texts; i++)
                (void)mmc_siglip_tokenizer_encode_padded(t, texts[i], 8, ids, mask, &n);
            mmc_siglip_tokenizer_free(t);
        }
        unlink(g_path);
        return 0;
    }
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    check_text(g_tok, text);
    free(text);
    return 0;
}
