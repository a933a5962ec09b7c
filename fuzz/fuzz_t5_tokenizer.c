/* fuzz_t5_tokenizer.c — libFuzzer target for T5's tokenizer (src/tokenizer/t5_unigram.c) on
 * untrusted input of both kinds:
 *
 *   an input starting with '{' is a tokenizer.json: it is written to a scratch file and loaded
 *   (base64 charsmap, the Darts trie read with every index bounds-checked, normalizers,
 *   pre-tokenizers, Unigram vocab, added tokens, TemplateProcessing), as the file says and as
 *   transformers 5 rebuilds it (MMC_T5_PIPELINE_TRANSFORMERS5); a tokenizer that loads
 *   then encodes a few fixed prompts, padded and not. Seeds: fuzz/corpus/t5_tokenizer/load_*.json
 *   (small charsmaps from tools/ref/gen_t5_tokenizer.py);
 *   anything else is a prompt for the committed fixtures (tests/fixtures/t5_tokenizer, both
 *   tokenizer.json layouts): invalid UTF-8 must be an error, never a crash. Checked invariants:
 *   </s> last, ids inside the vocabulary, and the padded form equal to the unpadded one cut to
 *   L - 1 tokens then </s>, pad after it. */
#include "mmc_encoders.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static mmc_t5_tokenizer *g_tok[2];
static char g_dir[64], g_json[96];   /* a scratch folder of its own for the loader inputs */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const char *dirs[2] = {MMC_SOURCE_DIR "/tests/fixtures/t5_tokenizer/t5_tokenizer",
                                  MMC_SOURCE_DIR "/tests/fixtures/t5_tokenizer/t5_tokenizer_hub"};
    for (int i = 0; i < 2; i++)
        if (mmc_t5_tokenizer_load(dirs[i], &g_tok[i]) != MMC_OK) {
            fprintf(stderr, "fuzz_t5_tokenizer: cannot load the fixture tokenizer: %s\n", mmc_last_error());
            abort();
        }
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_t5_tokenizer_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_json, sizeof g_json, "%s/tokenizer.json", g_dir);
    return 0;
}

static void check_text(const mmc_t5_tokenizer *t, const char *text) {
    enum { CAP = 16384, L = 24 };
    static int32_t ids[CAP], padded[L], mask[L];
    int n = 0, n_real = 0;
    int32_t eos, pad, unk;
    mmc_t5_tokenizer_special_ids(t, &eos, &pad, &unk);
    const int32_t nv = mmc_t5_tokenizer_vocab_size(t);
    if (mmc_t5_tokenizer_encode(t, text, ids, CAP, &n) != MMC_OK) return;
    if (n < 1 || ids[n - 1] != eos) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv) abort();
    if (mmc_t5_tokenizer_encode_padded(t, text, L, padded, mask, &n_real) != MMC_OK) abort();
    int keep = n - 1 < L - 1 ? n - 1 : L - 1;
    if (n_real != keep + 1 || memcmp(padded, ids, (size_t)keep * sizeof *ids) != 0 || padded[keep] != eos) abort();
    for (int i = 0; i < L; i++)
        if (mask[i] != (i < n_real) || (i >= n_real && padded[i] != pad)) abort();
}

static void check_loader(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_json, "wb");
    if (!f) return;
    fwrite(data, 1, size, f);
    fclose(f);
    for (int pipeline = 0; pipeline < 2; pipeline++) {   /* the file's, and transformers 5's rebuild */
    mmc_t5_tokenizer *t = NULL;
    if (mmc_t5_tokenizer_load_pipeline(g_json, (mmc_t5_pipeline)pipeline, &t) == MMC_OK) {
        static const char *texts[] = {"a red  circle on the left ", "  caf\xc3\xa9 \xef\xac\x81ne \xe2\x91\xa0\xe3\x80\x80x",
                                      "<extra_id_0></s><pad>\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 e\xcc\x81", "",
                                      "\xff"};
        int32_t ids[256], mask[8];
        int n;
        for (unsigned i = 0; i < sizeof texts / sizeof *texts; i++) {
            (void)mmc_t5_tokenizer_encode(t, texts[i], ids, 256, &n);
            (void)mmc_t5_tokenizer_encode_padded(t, texts[i], 8, ids, mask, &n);
        }
        (void)mmc_t5_tokenizer_model_max_length(t);
        mmc_t5_tokenizer_free(t);
    }
    }
    unlink(g_json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size && data[0] == '{') {
        check_loader(data, size);
        return 0;
    }
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;   /* a NUL inside ends the prompt, as a C string does */
    check_text(g_tok[0], text);
    check_text(g_tok[1], text);
    free(text);
    return 0;
}
