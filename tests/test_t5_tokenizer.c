/* test_t5_tokenizer.c — T5's SentencePiece Unigram tokenizer (src/tokenizer/t5_unigram.c) against
 * HF tokenizers on the fixtures of tools/ref/gen_t5_tokenizer.py: for both tokenizer.json layouts
 * (transformers 5's and the Hub's), every caption of t5_cases.json gives tokenizers' ids
 * unpadded and padded / truncated to 16 and 77 (ids and attention mask); random strings over many
 * Unicode blocks (also on a third layout, SpmConverter's); the pipeline transformers 5's
 * T5Tokenizer rebuilds from those folders (MMC_T5_PIPELINE_TRANSFORMERS5); then the user-facing
 * limits and the load errors (a pipeline that is not T5's: MMC_ERR_UNSUPPORTED naming the part;
 * a malformed file: MMC_ERR_FORMAT naming the key). */
#include "mmc_encoders.h"
#include "test_util.h"

#include <unistd.h>

#define ROOT "tests/fixtures/t5_tokenizer/"

static void check_ids(const char *name) {
    char dir[256], key[96];
    snprintf(dir, sizeof dir, ROOT "%s", name);
    mmc_t5_tokenizer *t = NULL;
    CHECK_OK(mmc_t5_tokenizer_load(dir, &t));
    if (!t) return;
    mmc_json *cases = NULL;
    CHECK_OK(mmc_json_load(ROOT "t5_cases.json", &cases));
    mmc_st *exp = fixture_open("t5_tokenizer/t5_expected.safetensors");
    snprintf(key, sizeof key, "%s.full_ids", name);
    mmc_tensor *full = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.full_len", name);
    mmc_tensor *full_len = fixture_tensor(exp, key, MMC_I32);
    const int n = (int)full_len->shape[0];
    int bad = 0;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *text = NULL;
        snprintf(key, sizeof key, "%d", i);
        CHECK_OK(mmc_json_str(cases, key, NULL, &text));
        if (!text) break;
        int32_t got[512];
        int n_full = 0;
        CHECK_OK(mmc_t5_tokenizer_encode(t, text, got, 512, &n_full));
        int wl = ((const int32_t *)full_len->data)[i];
        const int32_t *want = (const int32_t *)full->data + off;
        off += wl;
        if (n_full != wl || memcmp(got, want, (size_t)wl * 4)) {
            bad++;
            fprintf(stderr, "%s: caption %d \"%.40s\": ids differ from tokenizers (%d vs %d tokens)\n  got: ", name, i,
                    text, n_full, wl);
            for (int k = 0; k < n_full; k++) fprintf(stderr, " %d", got[k]);
            fprintf(stderr, "\n want:");
            for (int k = 0; k < wl; k++) fprintf(stderr, " %d", want[k]);
            fputc('\n', stderr);
        }
    }
    static const int lens[] = {16, 77};
    for (int li = 0; li < 2; li++) {
        const int L = lens[li];
        snprintf(key, sizeof key, "%s.ids%d", name, L);
        mmc_tensor *wi = fixture_tensor(exp, key, MMC_I32);
        snprintf(key, sizeof key, "%s.mask%d", name, L);
        mmc_tensor *wm = fixture_tensor(exp, key, MMC_I32);
        for (int i = 0; i < n; i++) {
            const char *text = NULL;
            snprintf(key, sizeof key, "%d", i);
            CHECK_OK(mmc_json_str(cases, key, NULL, &text));
            if (!text) break;
            int32_t ids[77], mask[77];
            int n_real = -1;
            CHECK_OK(mmc_t5_tokenizer_encode_padded(t, text, L, ids, mask, &n_real));
            const int32_t *want_ids = (const int32_t *)wi->data + (int64_t)i * L, *want_mask = (const int32_t *)wm->data + (int64_t)i * L;
            int want_real = 0;
            for (int k = 0; k < L; k++) want_real += want_mask[k];
            if (memcmp(ids, want_ids, (size_t)L * 4) || memcmp(mask, want_mask, (size_t)L * 4) || n_real != want_real) {
                bad++;
                fprintf(stderr, "%s: caption %d padded to %d: ids / mask differ from tokenizers\n", name, i, L);
            }
        }
        mmc_tensor_free(wi);
        mmc_tensor_free(wm);
    }
    CHECK(bad == 0);
    printf("%s: %d captions (unpadded, padded to 16 and 77), %d differ from tokenizers\n", name, n, bad);

    int32_t eos, pad, unk;
    mmc_t5_tokenizer_special_ids(t, &eos, &pad, &unk);
    CHECK(eos == 1 && pad == 0 && unk == 2);
    CHECK(mmc_t5_tokenizer_model_max_length(t) == 512);   /* the fixture's config says 1e30: unlimited */
    CHECK(mmc_t5_tokenizer_vocab_size(t) > 200);
    /* the user-facing limits */
    int32_t ids[4];
    int k = 0;
    CHECK_ERR(mmc_t5_tokenizer_encode(t, "a red circle on the left", ids, 4, &k), MMC_ERR_INVALID);
    CHECK_ERR(mmc_t5_tokenizer_encode_padded(t, "x", 1, ids, NULL, NULL), MMC_ERR_INVALID);
    CHECK_ERR(mmc_t5_tokenizer_encode(t, "bad \xff utf-8", ids, 4, &k), MMC_ERR_INVALID);
    CHECK_ERR(mmc_t5_tokenizer_encode(t, "overlong \xc0\xaf", ids, 4, &k), MMC_ERR_INVALID);
    /* the empty string is </s> alone; max_length 2 keeps one token */
    CHECK_OK(mmc_t5_tokenizer_encode(t, "", ids, 4, &k));
    CHECK(k == 1 && ids[0] == eos);
    int n_real = 0;
    CHECK_OK(mmc_t5_tokenizer_encode_padded(t, "a cat", 2, ids, NULL, &n_real));
    CHECK(n_real == 2 && ids[1] == eos);
    mmc_tensor_free(full);
    mmc_tensor_free(full_len);
    mmc_st_close(exp);
    mmc_json_free(cases);
    mmc_t5_tokenizer_free(t);
}

/* The unpadded ids of every string of `cases` (a JSON list) equal the fixture's NAME.KEY_ids
 * (flattened, lengths in NAME.KEY_len): the random strings over many Unicode blocks
 * (t5_stress.json) on the file's pipeline, and both lists on transformers 5's. */
static void check_list(const char *name, mmc_t5_pipeline pipeline, const char *cases_file, const char *what) {
    char dir[256], key[96];
    snprintf(dir, sizeof dir, ROOT "%s", name);
    mmc_t5_tokenizer *t = NULL;
    CHECK_OK(mmc_t5_tokenizer_load_pipeline(dir, pipeline, &t));
    if (!t) return;
    mmc_json *cases = NULL;
    CHECK_OK(mmc_json_load(cases_file, &cases));
    mmc_st *exp = fixture_open("t5_tokenizer/t5_expected.safetensors");
    snprintf(key, sizeof key, "%s.%s_ids", name, what);
    mmc_tensor *full = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.%s_len", name, what);
    mmc_tensor *full_len = fixture_tensor(exp, key, MMC_I32);
    const int n = (int)full_len->shape[0];
    int bad = 0;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *text = NULL;
        snprintf(key, sizeof key, "%d", i);
        CHECK_OK(mmc_json_str(cases, key, NULL, &text));
        if (!text) break;
        int32_t got[512];
        int k = 0;
        CHECK_OK(mmc_t5_tokenizer_encode(t, text, got, 512, &k));
        int wl = ((const int32_t *)full_len->data)[i];
        if (k != wl || memcmp(got, (const int32_t *)full->data + off, (size_t)wl * 4)) {
            bad++;
            fprintf(stderr, "%s (%s): string %d: ids differ (%d vs %d tokens)\n", name, what, i, k, wl);
        }
        off += wl;
    }
    CHECK(bad == 0);
    printf("%s (%s): %d strings, %d differ from HF\n", name, what, n, bad);
    mmc_tensor_free(full);
    mmc_tensor_free(full_len);
    mmc_st_close(exp);
    mmc_json_free(cases);
    mmc_t5_tokenizer_free(t);
}

/* transformers 5's padded form (77) of the captions */
static void check_tf5_padded(const char *name) {
    char dir[256], key[96];
    snprintf(dir, sizeof dir, ROOT "%s", name);
    mmc_t5_tokenizer *t = NULL;
    CHECK_OK(mmc_t5_tokenizer_load_pipeline(dir, MMC_T5_PIPELINE_TRANSFORMERS5, &t));
    if (!t) return;
    mmc_json *cases = NULL;
    CHECK_OK(mmc_json_load(ROOT "t5_cases.json", &cases));
    mmc_st *exp = fixture_open("t5_tokenizer/t5_expected.safetensors");
    snprintf(key, sizeof key, "%s.tf5_ids77", name);
    mmc_tensor *wi = fixture_tensor(exp, key, MMC_I32);
    snprintf(key, sizeof key, "%s.tf5_mask77", name);
    mmc_tensor *wm = fixture_tensor(exp, key, MMC_I32);
    int bad = 0;
    for (int i = 0; i < (int)wi->shape[0]; i++) {
        const char *text = NULL;
        snprintf(key, sizeof key, "%d", i);
        CHECK_OK(mmc_json_str(cases, key, NULL, &text));
        if (!text) break;
        int32_t ids[77], mask[77];
        CHECK_OK(mmc_t5_tokenizer_encode_padded(t, text, 77, ids, mask, NULL));
        bad += memcmp(ids, (const int32_t *)wi->data + i * 77, sizeof ids) != 0 ||
               memcmp(mask, (const int32_t *)wm->data + i * 77, sizeof mask) != 0;
    }
    CHECK(bad == 0);
    printf("%s (transformers 5, padded to 77): %d captions differ\n", name, bad);
    int32_t eos, pad, unk;
    mmc_t5_tokenizer_special_ids(t, &eos, &pad, &unk);
    CHECK(eos == 1 && pad == 0 && unk == 2);
    mmc_tensor_free(wi);
    mmc_tensor_free(wm);
    mmc_st_close(exp);
    mmc_json_free(cases);
    mmc_t5_tokenizer_free(t);
}

/* ---- load errors: variants of the fixture's tokenizer.json with one part replaced */
static char *g_json;   /* the fixture's tokenizer.json */
static char g_tmp[256];

/* Writes g_json with the first occurrence of `from` replaced by `to` into g_tmp/tokenizer.json
 * and loads it; returns the status, the message in msg. */
static mmc_status load_variant(const char *from, const char *to, char *msg, size_t cap) {
    const char *at = strstr(g_json, from);
    MMC_CHECK(at, "variant anchor '%s' not in the fixture", from);
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmp);
    FILE *f = fopen(path, "wb");
    MMC_CHECK(f, "%s", path);
    fwrite(g_json, 1, (size_t)(at - g_json), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
    mmc_t5_tokenizer *t = NULL;
    mmc_status st = mmc_t5_tokenizer_load(path, &t);
    snprintf(msg, cap, "%s", st ? mmc_last_error() : "");
    if (!st) {   /* what loads must encode without crashing */
        int32_t ids[64];
        int n;
        (void)mmc_t5_tokenizer_encode(t, "A caf\xc3\xa9 with \xef\xac\x81ne  spaces \xe2\x91\xa0 <extra_id_0>", ids, 64, &n);
    }
    mmc_t5_tokenizer_free(t);
    return st;
}

#define EXPECT_LOAD(from, to, code, needle) do { char m_[512]; \
    mmc_status s_ = load_variant(from, to, m_, sizeof m_); CHECKF(s_ == (code), "%s -> %d (%s)", to, s_, m_); \
    CHECKF(!(needle)[0] || strstr(m_, needle), "message '%s' lacks '%s'", m_, needle); } while (0)

static void check_errors(void) {
    size_t len = 0;
    CHECK_OK(mmc_read_file(ROOT "t5_tokenizer_hub/tokenizer.json", &g_json, &len));
    if (!g_json) return;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/test_t5_tok_XXXXXX");
    MMC_CHECK(mkdtemp(g_tmp), "mkdtemp");
    /* the untouched file loads (a path to the .json itself) */
    EXPECT_LOAD("\"Unigram\"", "\"Unigram\"", MMC_OK, "");
    /* not T5's pipeline: UNSUPPORTED naming the part */
    EXPECT_LOAD("\"type\": \"Unigram\"", "\"type\": \"BPE\"", MMC_ERR_UNSUPPORTED, "Unigram");
    EXPECT_LOAD("\"byte_fallback\": false", "\"byte_fallback\": true", MMC_ERR_UNSUPPORTED, "byte_fallback");
    EXPECT_LOAD("\"type\": \"Replace\"", "\"type\": \"NFD\"", MMC_ERR_UNSUPPORTED, "normalizer 'NFD'");
    EXPECT_LOAD("\"type\": \"Metaspace\"", "\"type\": \"ByteLevel\"", MMC_ERR_UNSUPPORTED, "pre_tokenizer 'ByteLevel'");
    EXPECT_LOAD("\"add_prefix_space\": true", "\"prepend_scheme\": \"first\"", MMC_ERR_UNSUPPORTED, "prepend_scheme");
    EXPECT_LOAD("\"type\": \"TemplateProcessing\"", "\"type\": \"BertProcessing\"", MMC_ERR_UNSUPPORTED, "post_processor");
    EXPECT_LOAD("\"normalized\": false", "\"normalized\": true", MMC_ERR_UNSUPPORTED, "normalized");
    EXPECT_LOAD("\"pattern\": {\n          \"Regex\": \" {2,}\"", "\"pattern\": {\n          \"Regex\": \"(\"",
                MMC_ERR_UNSUPPORTED, "Replace");
    /* malformed: FORMAT naming the key */
    EXPECT_LOAD("\"vocab\": [", "\"vocab\": 3, \"x\": [", MMC_ERR_FORMAT, "model.vocab");
    EXPECT_LOAD("[\n        \"<pad>\",\n        0.0\n      ]", "[\"<pad>\"]", MMC_ERR_FORMAT, "model.vocab");
    EXPECT_LOAD("\"unk_id\": 2", "\"unk_id\": 100000", MMC_ERR_FORMAT, "unk_id");
    EXPECT_LOAD("\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"!!", MMC_ERR_FORMAT, "precompiled_charsmap");
    EXPECT_LOAD("\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"/////w==\", \"x\": \"", MMC_ERR_FORMAT,
                "truncated");
    EXPECT_LOAD("\"replacement\": \"\xe2\x96\x81\"", "\"replacement\": \"ab\"", MMC_ERR_FORMAT, "replacement");
    EXPECT_LOAD("\"ids\": [\n          1\n        ]", "\"ids\": \"x\"", MMC_ERR_FORMAT, "special_tokens");
    EXPECT_LOAD("{", "[", MMC_ERR_FORMAT, "");
    /* a corrupt trie (valid base64, wrong contents) loads and encodes without crashing */
    EXPECT_LOAD("\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"CAAAAP////8AAAAAYWJj\", \"x\": \"", MMC_OK, "");
    EXPECT_LOAD("\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"EAAAAP8DAAAAAQAAAAAAAAAAAAAA\", \"x\": \"", MMC_OK, "");
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmp);
    unlink(path);
    rmdir(g_tmp);
    free(g_json);
    /* a directory without tokenizer.json */
    mmc_t5_tokenizer *t = NULL;
    CHECK(mmc_t5_tokenizer_load("tests/fixtures/no_such_dir", &t) != MMC_OK && !t);
}

int main(void) {
    check_ids("t5_tokenizer");
    check_ids("t5_tokenizer_hub");
    check_list("t5_tokenizer", MMC_T5_PIPELINE_FILE, ROOT "t5_stress.json", "stress");
    check_list("t5_tokenizer_hub", MMC_T5_PIPELINE_FILE, ROOT "t5_stress.json", "stress");
    /* Strip and Replace(" {2,}" -> "▁"): SpmConverter's layout */
    check_list("t5_small_spm", MMC_T5_PIPELINE_FILE, ROOT "t5_stress.json", "stress");
    /* what transformers 5's T5Tokenizer rebuilds from the same folders */
    static const char *tf5[] = {"t5_tokenizer_hub", "t5_small_spm"};
    for (int i = 0; i < 2; i++) {
        check_list(tf5[i], MMC_T5_PIPELINE_TRANSFORMERS5, ROOT "t5_cases.json", "tf5_full");
        check_list(tf5[i], MMC_T5_PIPELINE_TRANSFORMERS5, ROOT "t5_stress.json", "tf5_stress");
        check_tf5_padded(tf5[i]);
    }
    check_errors();
    return test_done("test_t5_tokenizer");
}
