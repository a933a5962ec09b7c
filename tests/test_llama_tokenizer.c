/* test_llama_tokenizer.c — SentencePiece-style BPE (Llama, Mistral, LLaVA-1.5, Vicuna: characters,
 * "▁" for spaces, byte fallback "<0xXX>", fuse_unk) in src/tokenizer/tokenizer.c against the
 * fixtures of tools/ref/gen_llama_tokenizer.py, written by tokenizers / transformers 5:
 *   - three tokenizer.json layouts: the Hub's legacy one (Prepend + Replace normalizer), the
 *     non-legacy one (Metaspace "first"), and what transformers 5's save_pretrained writes;
 *   - with their tokenizer_config.json (tokenizer_class LlamaTokenizer), mmc must give the ids of
 *     transformers 5's AutoTokenizer, which rebuilds the pipeline from the vocab and merges
 *     (the legacy Hub file then tokenizes differently from its own JSON: after "<image>", no
 *     "▁" is prepended); without a config, the ids of tokenizers on the file as written;
 *   - llama_tok_joined: a merge joins a character to a following "▁", so the fast path (BPE per
 *     "▁"-run + word, with the word cache) must not be taken: ids still equal;
 *   - 216 texts (16 written, 200 random over words, other scripts, emoji, spaces, special tokens);
 *   - decode with and without special tokens equal to transformers' tokenizer.decode (byte
 *     fallback runs joined, the leading space stripped), single ids too;
 *   - a LLaVA checkpoint's copy of the Hub files (model_type "llava": transformers 5 keeps the file's
 *     pipeline for it) gives the raw file's ids;
 *   - offsets: every token's span lies in the text, in order (what chat masks are built from). */
#include "mmc_tokenizer.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include "mmc_io.h"
#include "ids_check.h"

#define ROOT "tests/fixtures/llama_tokenizer/"

/* with_config: the folder (tokenizer_config.json read: transformers 5's pipeline, key "tf5");
 * else tokenizer.json alone (the file's own pipeline, key "raw"). */
static void check_layout(const cJSON *exp, const char *name, bool with_config) {
    char path[256];
    mmc_tokenizer *t = NULL;
    if (with_config) {
        snprintf(path, sizeof path, ROOT "%s", name);
        CHECK_OK(mmc_tokenizer_load(path, &t));
    } else {
        snprintf(path, sizeof path, ROOT "%s/tokenizer.json", name);
        size_t n = 0;
        char *json = read_all(path, &n);
        CHECK(json != NULL);
        if (json) CHECK_OK(mmc_tokenizer_load_memory(json, n, NULL, 0, path, &t));
        free(json);
    }
    if (!t) return;
    const cJSON *texts = cJSON_GetObjectItem(exp, "texts");
    const cJSON *lay = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "layouts"), name);
    const cJSON *want_ids = cJSON_GetObjectItem(lay, with_config ? "tf5" : "raw");
    const cJSON *want_nosp = cJSON_GetObjectItem(lay, "tf5_nospecial");
    const cJSON *want_dec = cJSON_GetObjectItem(lay, with_config ? "decode" : "raw_decode");
    const cJSON *want_skip = cJSON_GetObjectItem(lay, "decode_skip");
    int bad_ids = 0, bad_dec = 0, bad_offs = 0, i = 0;
    const cJSON *tx;
    cJSON_ArrayForEach(tx, texts) {
        const char *text = tx->valuestring;
        int64_t len = (int64_t)strlen(text);
        int32_t *ids = NULL;
        int64_t n = 0, *offs = NULL;
        CHECK_OK(mmc_tokenizer_encode(t, text, -1, true, &ids, &n));
        const cJSON *w = cJSON_GetArrayItem(want_ids, i);
        if (!ids_equal(ids, n, w)) { if (bad_ids++ < 5) show(name, text, ids, n, w); }
        char *dec = NULL;
        CHECK_OK(mmc_tokenizer_decode(t, ids, n, false, &dec));
        const char *wd = cJSON_GetArrayItem(want_dec, i)->valuestring;
        if (dec && strcmp(dec, wd)) {
            if (bad_dec++ < 5) fprintf(stderr, "%s: decode of text %d: got \"%s\" want \"%s\"\n", name, i, dec, wd);
        }
        free(dec);
        if (with_config) {
            dec = NULL;
            CHECK_OK(mmc_tokenizer_decode(t, ids, n, true, &dec));
            wd = cJSON_GetArrayItem(want_skip, i)->valuestring;
            if (dec && strcmp(dec, wd)) {
                if (bad_dec++ < 5) fprintf(stderr, "%s: decode (skip special) of text %d: got \"%s\" want \"%s\"\n", name, i, dec, wd);
            }
            free(dec);
            free(ids);
            ids = NULL;
            CHECK_OK(mmc_tokenizer_encode_offsets(t, text, -1, false, &ids, &offs, &n));
            w = cJSON_GetArrayItem(want_nosp, i);
            if (!ids_equal(ids, n, w)) { if (bad_ids++ < 5) show("no special tokens", text, ids, n, w); }
            int64_t prev = 0;
            for (int64_t k = 0; k < n && offs; k++) {
                int64_t a = offs[2 * k], b = offs[2 * k + 1];
                if (a < prev || b < a || b > len) { if (bad_offs++ < 3) fprintf(stderr, "%s: text %d token %lld span [%lld, %lld)\n", name, i, (long long)k, (long long)a, (long long)b); break; }
                prev = a;
            }
            free(offs);
        }
        free(ids);
        i++;
    }
    CHECKF(bad_ids == 0, "%s (%s): %d texts with ids unlike %s", name, with_config ? "config" : "file alone", bad_ids,
           with_config ? "transformers 5" : "tokenizers");
    CHECKF(bad_dec == 0, "%s: %d decodes differ", name, bad_dec);
    CHECKF(bad_offs == 0, "%s: %d texts with spans out of order", name, bad_offs);
    if (with_config) {
        const cJSON *sid = cJSON_GetObjectItem(lay, "single_ids"), *sdec = cJSON_GetObjectItem(lay, "single_decode");
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, sid) {
            int32_t id = e->valueint;
            char *dec = NULL;
            CHECK_OK(mmc_tokenizer_decode(t, &id, 1, false, &dec));
            const char *wd = cJSON_GetArrayItem(sdec, k)->valuestring;
            CHECKF(dec && !strcmp(dec, wd), "%s: decode([%d]) = \"%s\", transformers \"%s\"", name, id, dec ? dec : "", wd);
            free(dec);
            k++;
        }
    }
    mmc_tokenizer_free(t);
}

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    size_t n = 0;
    char *buf = read_all(ROOT "expected.json", &n);
    CHECK(buf != NULL);
    cJSON *exp = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    CHECK(exp != NULL);
    if (exp) {
        static const char *layouts[] = {"llama_tok_hub", "llama_tok_meta", "llama_tok_v5", "llama_tok_joined"};
        for (int i = 0; i < 4; i++) {
            check_layout(exp, layouts[i], true);
            check_layout(exp, layouts[i], false);
        }
    }
    /* a LLaVA checkpoint (config.json model_type "llava") with the same files: transformers 5 loads
     * its tokenizer.json as written (TokenizersBackend), so the raw file's ids, not the rebuild's */
    mmc_tokenizer *t = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/llava/hub_llama", &t));
    if (t && exp) {
        const cJSON *lay = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "layouts"), "llama_tok_hub");
        int bad = 0, i = 0;
        const cJSON *tx;
        cJSON_ArrayForEach(tx, cJSON_GetObjectItem(exp, "texts")) {
            int32_t *ids = NULL;
            int64_t n = 0;
            CHECK_OK(mmc_tokenizer_encode(t, tx->valuestring, -1, true, &ids, &n));
            if (!ids_equal(ids, n, cJSON_GetArrayItem(cJSON_GetObjectItem(lay, "raw"), i))) bad++;
            free(ids);
            i++;
        }
        CHECKF(bad == 0, "llava/hub_llama: %d texts unlike the file's own pipeline (transformers 5 keeps it for llava)", bad);
    }
    mmc_tokenizer_free(t);
    /* malformed or unsupported SentencePiece-style files: an error naming what, never a crash */
    size_t jn = 0;
    char *js = read_all(ROOT "llama_tok_meta/tokenizer.json", &jn);
    CHECK(js != NULL);
    static const struct { const char *from, *to; mmc_status want; const char *says; } bad[] = {
        {"\"replacement\":\"\u2581\",\"prepend_scheme\":\"first\"", "\"replacement\":\"_\",\"prepend_scheme\":\"first\"",
         MMC_ERR_UNSUPPORTED, "Metaspace with replacement '_'"},
        {"\"prepend_scheme\":\"first\"", "\"prepend_scheme\":\"sometimes\"", MMC_ERR_FORMAT, "prepend_scheme 'sometimes'"},
        {"{\"type\":\"ByteFallback\"}", "{\"type\":\"WordPiece\"}", MMC_ERR_UNSUPPORTED, "not its entry WordPiece"},
        {"\"merges\":[", "\"merges\":[[\"\u2581zz\",\"q\"],", MMC_ERR_FORMAT, "missing from the vocab"},
    };
    for (size_t i = 0; js && i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *j = cJSON_Parse(js);   /* compact form, so the replacements find their text */
        char *cj = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        char *at = cj ? strstr(cj, bad[i].from) : NULL;
        CHECKF(at != NULL, "case %zu: '%s' not in the fixture", i, bad[i].from);
        if (at) {
            size_t lf = strlen(bad[i].from), lt = strlen(bad[i].to), n = strlen(cj);
            char *m = malloc(n - lf + lt + 1);
            memcpy(m, cj, (size_t)(at - cj));
            memcpy(m + (at - cj), bad[i].to, lt);
            memcpy(m + (at - cj) + lt, at + lf, n - (size_t)(at - cj) - lf + 1);
            mmc_tokenizer *bt = NULL;
            CHECK_ERR(mmc_tokenizer_load_memory(m, strlen(m), NULL, 0, "bad.json", &bt), bad[i].want);
            CHECKF(bt == NULL && strstr(mmc_last_error(), bad[i].says), "case %zu: message '%s'", i, mmc_last_error());
            mmc_tokenizer_free(bt);
            free(m);
        }
        free(cj);
    }
    free(js);
    cJSON_Delete(exp);
    return test_done("test_llama_tokenizer");
}
