/* test_internlm2_tokenizer.c — InternLM2's tokenizer.model (a SentencePiece BPE model, no
 * tokenizer.json; src/tokenizer/spm_model.c under tokenizer.c) against the fixtures of
 * tools/ref/gen_internlm2_tokenizer.py (sentencepiece 0.2.3's trainer; the reference ids are
 * InternLM2Tokenizer's encoding over transformers 4.44.2, equal there to LlamaTokenizer(legacy=True)):
 *   - internlm2/: InternLM2's settings (byte fallback, identity normalizer, dummy prefix, spaces
 *     kept), its chat tokens as user-defined pieces, InternVL 2.5's added tokens past the vocab;
 *     variant/: a precompiled charsmap, no dummy prefix, extra whitespace removed, no byte
 *     fallback (fused <unk>), UNUSED pieces split back; no tokenizer_config.json; unigram/: a
 *     Unigram model (Viterbi; byte fallback, a user-defined piece);
 *   - 226 texts (26 written: captions, chat / InternVL prompts, code, CJK, emoji, a long one, the
 *     empty text, whitespace only; 200 random): ids with and without bos equal, exactly;
 *   - offsets: every token's span inside the text, in order; decode of sentencepiece's own ids
 *     equal to sentencepiece's decode (internlm2/: no unknown pieces there);
 *   - loading by folder and by the .model path; vocab size and the added tokens' ids;
 *   - malformed files are errors naming the problem (truncated protobuf, a duplicate piece,
 *     byte_fallback without byte pieces, a WORD model, an unknown piece type). */
#include "mmc_tokenizer.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include "mmc_io.h"
#include "ids_check.h"

#define ROOT "tests/fixtures/internlm2_tokenizer/"

static void check_layout(const cJSON *exp, const char *name, mmc_tokenizer *t) {
    const cJSON *texts = cJSON_GetObjectItem(exp, "texts");
    const cJSON *lay = cJSON_GetObjectItem(cJSON_GetObjectItem(exp, "layouts"), name);
    const cJSON *want_ids = cJSON_GetObjectItem(lay, "ids"), *want_nosp = cJSON_GetObjectItem(lay, "ids_nospecial");
    const cJSON *sp_ids = cJSON_GetObjectItem(lay, "sp_ids"), *sp_dec = cJSON_GetObjectItem(lay, "sp_decode");
    CHECKF(mmc_tokenizer_vocab_size(t) == cJSON_GetObjectItem(lay, "vocab_size")->valueint,
           "%s: vocab size %d, transformers %d", name, mmc_tokenizer_vocab_size(t),
           cJSON_GetObjectItem(lay, "vocab_size")->valueint);
    int bad_ids = 0, bad_nosp = 0, bad_offs = 0, bad_dec = 0, i = 0, n_texts = 0;
    const cJSON *tx;
    cJSON_ArrayForEach(tx, texts) {
        const char *text = tx->valuestring;
        int64_t len = (int64_t)strlen(text), n = 0, *offs = NULL;
        int32_t *ids = NULL;
        n_texts++;
        CHECK_OK(mmc_tokenizer_encode(t, text, len, true, &ids, &n));
        const cJSON *w = cJSON_GetArrayItem(want_ids, i);
        if (!ids_equal(ids, n, w) && bad_ids++ < 5) show(name, text, ids, n, w);
        free(ids);
        ids = NULL;
        CHECK_OK(mmc_tokenizer_encode_offsets(t, text, len, false, &ids, &offs, &n));
        w = cJSON_GetArrayItem(want_nosp, i);
        if (!ids_equal(ids, n, w) && bad_nosp++ < 5) show("no bos", text, ids, n, w);
        int64_t prev = 0;
        for (int64_t k = 0; k < n && offs; k++) {
            int64_t a = offs[2 * k], b = offs[2 * k + 1];
            if (a < prev || b < a || b > len) {
                if (bad_offs++ < 3)
                    fprintf(stderr, "%s: text %d token %lld span [%lld, %lld)\n", name, i, (long long)k, (long long)a,
                            (long long)b);
                break;
            }
            prev = a;
        }
        free(ids);
        free(offs);
        if (!strcmp(name, "internlm2")) {   /* sentencepiece's own ids decode as sentencepiece does */
            const cJSON *si = cJSON_GetArrayItem(sp_ids, i), *e;
            int32_t buf[4096];
            int m = 0;
            cJSON_ArrayForEach(e, si) if (m < 4096) buf[m++] = e->valueint;
            char *dec = NULL;
            CHECK_OK(mmc_tokenizer_decode(t, buf, m, false, &dec));
            const char *wd = cJSON_GetArrayItem(sp_dec, i)->valuestring;
            if (dec && strcmp(dec, wd) && bad_dec++ < 3)
                fprintf(stderr, "%s: decode of text %d: got \"%s\" want \"%s\"\n", name, i, dec, wd);
            free(dec);
        }
        i++;
    }
    CHECKF(bad_ids == 0, "%s: %d of %d texts with ids unlike InternLM2Tokenizer's", name, bad_ids, n_texts);
    CHECKF(bad_nosp == 0, "%s: %d of %d texts (no special tokens) with ids unlike InternLM2Tokenizer's", name,
           bad_nosp, n_texts);
    CHECKF(bad_offs == 0, "%s: %d texts with spans out of order", name, bad_offs);
    CHECKF(bad_dec == 0, "%s: %d decodes unlike sentencepiece's", name, bad_dec);
    printf("%s: %d texts, ids equal to the reference: %s\n", name, n_texts, bad_ids + bad_nosp ? "NO" : "yes");
}

/* the fixture model's bytes with `extra` appended (protobuf: a repeated or embedded field again) */
static mmc_status load_patched(const char *model, size_t n, const void *extra, size_t en, mmc_tokenizer **t) {
    char *b = malloc(n + en);
    memcpy(b, model, n);
    memcpy(b + n, extra, en);
    mmc_status st = mmc_tokenizer_load_spm_memory(b, n + en, NULL, 0, "patched.model", t);
    free(b);
    return st;
}

static void check_errors(void) {
    size_t n = 0;
    char *model = read_all(ROOT "variant/tokenizer.model", &n);
    CHECK(model != NULL);
    if (!model) return;
    mmc_tokenizer *t = NULL;
    CHECK_OK(mmc_tokenizer_load_spm_memory(model, n, NULL, 0, "variant.model", &t));
    mmc_tokenizer_free(t);
    t = NULL;
    CHECK_ERR(mmc_tokenizer_load_spm_memory(model, n - 2, NULL, 0, "truncated.model", &t), MMC_ERR_FORMAT);
    CHECK(t == NULL && strstr(mmc_last_error(), "truncated.model") && strstr(mmc_last_error(), "protobuf"));
    /* pieces {piece: "<s>"} again */
    static const uint8_t dup[] = {0x0A, 0x05, 0x0A, 0x03, '<', 's', '>'};
    CHECK_ERR(load_patched(model, n, dup, sizeof dup, &t), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "appears twice") != NULL);
    /* trainer_spec {byte_fallback: true}: the variant has no <0xXX> pieces */
    static const uint8_t bf[] = {0x12, 0x03, 0x98, 0x02, 0x01};
    CHECK_ERR(load_patched(model, n, bf, sizeof bf, &t), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "byte_fallback") != NULL);
    /* trainer_spec {model_type: WORD} */
    static const uint8_t word[] = {0x12, 0x02, 0x18, 0x03};
    CHECK_ERR(load_patched(model, n, word, sizeof word, &t), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "WORD") != NULL);
    /* a piece of type 9 */
    static const uint8_t ty[] = {0x0A, 0x07, 0x0A, 0x03, 'z', 'z', 'z', 0x18, 0x09};
    CHECK_ERR(load_patched(model, n, ty, sizeof ty, &t), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "type 9") != NULL);
    /* an empty piece */
    static const uint8_t em[] = {0x0A, 0x02, 0x18, 0x01};
    CHECK_ERR(load_patched(model, n, em, sizeof em, &t), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "empty") != NULL);
    /* an unknown wire type */
    static const uint8_t wt[] = {0x0F};
    CHECK_ERR(load_patched(model, n, wt, sizeof wt, &t), MMC_ERR_FORMAT);
    free(model);
    /* a tokenizer class this reader does not stand for */
    static const char cfg[] = "{\"tokenizer_class\": \"T5Tokenizer\"}";
    model = read_all(ROOT "internlm2/tokenizer.model", &n);
    CHECK_ERR(mmc_tokenizer_load_spm_memory(model, n, cfg, sizeof cfg - 1, "x.model", &t), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "T5Tokenizer") != NULL);
    free(model);
}

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    size_t n = 0;
    char *buf = read_all(ROOT "expected.json", &n);
    CHECK(buf != NULL);
    cJSON *exp = buf ? cJSON_Parse(buf) : NULL;
    free(buf);
    CHECK(exp != NULL);
    if (!exp) return test_done("test_internlm2_tokenizer");
    mmc_tokenizer *t = NULL;
    CHECK_OK(mmc_tokenizer_load(ROOT "internlm2", &t));
    if (t) {
        check_layout(exp, "internlm2", t);
        CHECK(mmc_tokenizer_token_to_id(t, "<IMG_CONTEXT>") == 702);
        CHECK(mmc_tokenizer_token_to_id(t, "<|im_end|>") >= 3 && mmc_tokenizer_is_special(t, mmc_tokenizer_token_to_id(t, "<|im_end|>")));
        CHECK(mmc_tokenizer_special_id(t, MMC_TOK_BOS) == 1 && mmc_tokenizer_special_id(t, MMC_TOK_EOS) == 2);
        int32_t eos[4];
        int ne = mmc_tokenizer_eos_ids(t, eos, 4);
        CHECK(ne == 2 && eos[0] == 2 && eos[1] == mmc_tokenizer_token_to_id(t, "<|im_end|>"));
        /* the chat template renders and encodes through the same tokenizer */
        mmc_chat_message msg = {.role = "user", .content = "Hello"};
        mmc_chat_options opt = {.add_generation_prompt = true};
        int32_t *ids = NULL, *ids2 = NULL;
        int64_t ni = 0, ni2 = 0;
        char *r = NULL;
        CHECK_OK(mmc_chat_render(t, &msg, 1, &opt, &r, NULL, NULL));
        CHECK(r && !strcmp(r, "<s><|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"));
        CHECK_OK(mmc_chat_encode(t, &msg, 1, &opt, &ids, NULL, &ni));
        CHECK_OK(mmc_tokenizer_encode(t, r, -1, false, &ids2, &ni2));
        CHECK(ni > 3 && ni == ni2 && !memcmp(ids, ids2, (size_t)ni * 4) && ids[0] == 1);
        free(r); free(ids); free(ids2);
        mmc_tokenizer_free(t);
    }
    t = NULL;
    CHECK_OK(mmc_tokenizer_load(ROOT "variant/tokenizer.model", &t));
    if (t) { check_layout(exp, "variant", t); mmc_tokenizer_free(t); }
    t = NULL;
    CHECK_OK(mmc_tokenizer_load(ROOT "unigram", &t));
    if (t) { check_layout(exp, "unigram", t); mmc_tokenizer_free(t); }
    check_errors();
    cJSON_Delete(exp);
    return test_done("test_internlm2_tokenizer");
}
