/* fuzz_spm_model.c — libFuzzer target for a SentencePiece model file (tokenizer.model, InternLM2's
 * tokenizer: src/tokenizer/spm_model.c) as untrusted input, through mmc_tokenizer_load_spm_memory:
 * the protobuf (every varint and length checked against the bytes left), pieces / types / scores,
 * trainer_spec and normalizer_spec, the precompiled charsmap (a Darts array whose every index is
 * checked when looked up), user-defined and UNUSED pieces, byte pieces. The input is the model,
 * then optionally a NUL-free marker "\xff\xfe\xfd" and tokenizer_config.json. A tokenizer that
 * loads then encodes fixed texts (spaces, user-defined / added tokens, charsmap sources, invalid
 * UTF-8) and the input's own bytes, with and without bos, and decodes what came out.
 * Invariants: every id is inside the vocabulary; encode's token spans lie in the (repaired) text,
 * in order.
 * Seeds: fuzz/corpus/spm_model/ (tools/ref/gen_internlm2_tokenizer.py: both fixture models and a
 * truncated one). */
#include "mmc_tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void use(const mmc_tokenizer *tok, const char *text, int64_t n) {
    int32_t nv = mmc_tokenizer_vocab_size(tok);
    for (int sp = 0; sp < 2; sp++) {
        int32_t *ids = NULL;
        int64_t k = 0, *offs = NULL;
        if (mmc_tokenizer_encode_offsets(tok, text, n, sp == 1, &ids, &offs, &k) != MMC_OK) continue;
        /* spans index the text after the repair of invalid UTF-8 (one U+FFFD per bad byte at most) */
        int64_t prev = 0, len = 3 * (n < 0 ? (int64_t)strlen(text) : n);
        for (int64_t i = 0; i < k; i++) {
            if (ids[i] < 0 || ids[i] >= nv) { fprintf(stderr, "id %d outside the vocabulary (%d)\n", ids[i], nv); abort(); }
            if (offs[2 * i] < prev || offs[2 * i + 1] < offs[2 * i] || offs[2 * i + 1] > len) {
                fprintf(stderr, "token %lld span [%lld, %lld) out of order (text %lld bytes)\n", (long long)i,
                        (long long)offs[2 * i], (long long)offs[2 * i + 1], (long long)len);
                abort();
            }
            prev = offs[2 * i];
        }
        char *s = NULL;
        if (mmc_tokenizer_decode(tok, ids, k, sp == 1, &s) == MMC_OK) free(s);
        free(ids);
        free(offs);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *model = (const char *)data, *cfg = NULL;
    size_t mn = size, cn = 0;
    for (size_t i = 0; i + 3 <= size; i++)
        if (data[i] == 0xff && data[i + 1] == 0xfe && data[i + 2] == 0xfd) {
            mn = i;
            cfg = (const char *)data + i + 3;
            cn = size - i - 3;
            break;
        }
    mmc_tokenizer *tok = NULL;
    if (mmc_tokenizer_load_spm_memory(model, mn, cfg, cn, "fuzz.model", &tok) != MMC_OK) return 0;
    static const char *texts[] = {"", " ", "Hello  world! 123 <|im_start|>user\nhi<|im_end|>", "  a  b\t\n\n ",
                                  "caf\xc3\xa9 \xe4\xb8\x80\xe5\x8f\xaa \xef\xbc\xa1\xef\xbc\xa2 \xef\xac\x81 abc",
                                  "<s></s><unk><img><IMG_CONTEXT></img><fim_pad>", "\xe2\x96\x81\xe2\x96\x81x",
                                  "\xff\xfe bad \xed\xa0\x80 utf8"};
    for (unsigned i = 0; i < sizeof texts / sizeof *texts; i++) use(tok, texts[i], -1);
    use(tok, model, (int64_t)(mn < 512 ? mn : 512));
    int32_t nv = mmc_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < nv && id < 4096; id++) {
        const char *s = mmc_tokenizer_id_to_token(tok, id);
        if (s) (void)mmc_tokenizer_token_to_id(tok, s);
        uint8_t b[64];
        (void)mmc_tokenizer_token_bytes(tok, id, b, sizeof b);
    }
    mmc_tokenizer_free(tok);
    return 0;
}
