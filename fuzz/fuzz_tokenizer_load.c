/* fuzz_tokenizer_load.c — libFuzzer target for LOADING a tokenizer from untrusted files:
 * tokenizer.json and tokenizer_config.json through mmc_tokenizer_load_memory (vocab and
 * ids, merges in both forms, added_tokens, normalizer / pre-tokenizer / post-processor /
 * decoder sections, added_tokens_decoder, special-token roles, chat template). The input is
 * tokenizer.json, then optionally a NUL byte and tokenizer_config.json. A tokenizer that
 * loads is then used: a few fixed strings and the input's own bytes are encoded (with and
 * without the post-processor's specials) and decoded, every id is looked up, so a loaded
 * but inconsistent table shows up here rather than in a user's run. */
#include "mmc_tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void use(const mmc_tokenizer *tok, const char *text, int64_t n) {
    for (int sp = 0; sp < 2; sp++) {
        int32_t *ids = NULL;
        int64_t k = 0;
        if (mmc_tokenizer_encode(tok, text, n, sp == 1, &ids, &k) != MMC_OK) continue;
        char *s = NULL;
        if (mmc_tokenizer_decode(tok, ids, k, sp == 1, &s) == MMC_OK) free(s);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *cfg = NULL;
    size_t jn = size, cn = 0;
    const uint8_t *nul = memchr(data, 0, size);
    if (nul) {
        jn = (size_t)(nul - data);
        cfg = (const char *)nul + 1;
        cn = size - jn - 1;
    }
    mmc_tokenizer *tok = NULL;
    if (mmc_tokenizer_load_memory(json, jn, cfg, cn, "fuzz", &tok) != MMC_OK) return 0;
    static const char *texts[] = {"Hello world! 123 <|im_start|>user\nhi<|im_end|>", "  a  b\t\n\n",
                                  "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac e\xcc\x81", "\xff\xfe"};
    for (unsigned i = 0; i < sizeof texts / sizeof *texts; i++) use(tok, texts[i], -1);
    use(tok, json, (int64_t)(jn < 512 ? jn : 512));
    int32_t nv = mmc_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < nv && id < 4096; id++) {
        const char *s = mmc_tokenizer_id_to_token(tok, id);
        if (s) (void)mmc_tokenizer_token_to_id(tok, s);
        (void)mmc_tokenizer_is_special(tok, id);
    }
    for (int r = 0; r < MMC_TOK_ROLE_COUNT; r++) (void)mmc_tokenizer_special_id(tok, (mmc_tok_role)r);
    int32_t eos[8];
    (void)mmc_tokenizer_eos_ids(tok, eos, 8);
    mmc_chat_message m = {.role = "user", .content = "hi"};
    char *chat = NULL;
    if (mmc_chat_render(tok, &m, 1, NULL, &chat, NULL, NULL) == MMC_OK) free(chat);
    mmc_tokenizer_free(tok);
    return 0;
}
