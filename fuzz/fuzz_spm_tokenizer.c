/* fuzz_spm_tokenizer.c — libFuzzer target for the SentencePiece-style BPE tokenizer (Llama,
 * Mistral, LLaVA-1.5) on untrusted text: mmc_tokenizer_encode (invalid UTF-8 repair, added
 * tokens inside the text, "▁" for spaces, Metaspace "first" / the Hub's Prepend normalizer,
 * byte fallback, the per-word fast path and the whole-section path) and
 * mmc_tokenizer_decode (ByteFallback runs, Strip), with the fixtures of
 * tools/ref/gen_llama_tokenizer.py: llama_tok_hub read with its config (transformers 5's
 * rebuilt pipeline), the same file alone (the legacy Prepend/Replace normalizer) and
 * llama_tok_joined (a merge across "▁": no per-word split). Invariants: decode of encode's own
 * ids succeeds; with the Metaspace "first" pipelines, text that is valid UTF-8, has no "▁"
 * (U+2581) and does not start with a space round-trips exactly (special tokens kept). */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_tokenizer *g_tok[3];

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *root = MMC_SOURCE_DIR "/tests/fixtures/llama_tokenizer/";
    char p[1024];
    snprintf(p, sizeof p, "%sllama_tok_hub", root);
    mmc_status st = mmc_tokenizer_load(p, &g_tok[0]);
    size_t n = 0;
    snprintf(p, sizeof p, "%sllama_tok_hub/tokenizer.json", root);
    char *j = slurp(p, &n);
    if (!st && j) st = mmc_tokenizer_load_memory(j, n, NULL, 0, p, &g_tok[1]);
    free(j);
    snprintf(p, sizeof p, "%sllama_tok_joined", root);
    if (!st) st = mmc_tokenizer_load(p, &g_tok[2]);
    if (st || !g_tok[0] || !g_tok[1] || !g_tok[2]) {
        fprintf(stderr, "fuzz_spm_tokenizer: cannot load the fixture tokenizers: %s\n", mmc_last_error());
        abort();
    }
    return 0;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        int l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!l || i + (size_t)l > n) return false;
        uint32_t cp = l == 1 ? c : l == 2 ? c & 0x1F : l == 3 ? c & 0x0F : c & 0x07;
        for (int k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t minv[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < minv[l] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0) return false;
        i += (size_t)l;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bool exact = size > 0 && data[0] != ' ' && valid_utf8(data, size) && !memmem(data, size, "\xE2\x96\x81", 3);
    for (int k = 0; k < 3; k++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (mmc_tokenizer_encode(g_tok[k], (const char *)data, (int64_t)size, false, &ids, &n) != MMC_OK) continue;
        char *text = NULL;
        if (mmc_tokenizer_decode(g_tok[k], ids, n, false, &text) != MMC_OK) {
            fprintf(stderr, "fuzz_spm_tokenizer: decode of encode's own ids failed: %s\n", mmc_last_error());
            abort();
        }
        if (k != 1 && exact && (strlen(text) != size || memcmp(text, data, size) != 0)) {
            fprintf(stderr, "fuzz_spm_tokenizer: tokenizer %d: text does not round-trip (%zu bytes in, %zu out)\n", k,
                    size, strlen(text));
            abort();
        }
        free(text);
        free(ids);
    }
    return 0;
}
