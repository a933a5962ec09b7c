/* test_json_constraint.c — the JSON-constrained decoding of response_format
 * (src/serve/json_constraint.c): the automaton accepts valid JSON texts of a schema (compact and
 * with whitespace, escapes, UTF-8, nested objects and arrays, enums, numbers with fraction and
 * exponent) and refuses invalid ones byte by byte (a wrong key, a missing required property, a
 * type mismatch, a string over maxLength, a leading zero, an unescaped control character, an
 * overlong UTF-8 sequence, anything after the end); the shortest completion of every prefix of
 * the valid texts, appended, gives a text the automaton accepts to the end and cJSON parses;
 * then 200 random generations over the tiny Qwen2 fixture's vocabulary (uniform random logits,
 * masked, budgets of 44..100 tokens) all end complete, parse, and satisfy the schema (checked
 * here field by field); and schemas with unsupported keywords are refused with messages naming
 * the keyword and its path. */
#include "test_util.h"
#include "mmc_json_constraint.h"

#include <cjson/cJSON.h>

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",3,null]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},\"maxItems\":3},"
    "\"pos\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},"
    "\"required\":[\"x\",\"y\"]}},"
    "\"required\":[\"name\",\"age\",\"pos\"],\"additionalProperties\":false}";

static bool accepts(const mmc_jc_schema *s, const char *text) {
    mmc_jc_state *st = mmc_jc_start(s);
    bool ok = mmc_jc_feed(st, (const uint8_t *)text, strlen(text)) && mmc_jc_done(st);
    mmc_jc_state_free(st);
    return ok;
}

/* characters (code points) of a UTF-8 string */
static int64_t chars(const char *s) {
    int64_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

/* the schema above, checked on a parsed value */
static bool valid(const cJSON *o) {
    if (!cJSON_IsObject(o)) return false;
    const cJSON *v;
    int n = 0;
    cJSON_ArrayForEach(v, o) {
        n++;
        const char *k = v->string;
        if (!strcmp(k, "name")) { if (!cJSON_IsString(v) || chars(v->valuestring) > 8) return false; }
        else if (!strcmp(k, "age")) { if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) return false; }
        else if (!strcmp(k, "score")) { if (!cJSON_IsNumber(v)) return false; }
        else if (!strcmp(k, "ok")) { if (!cJSON_IsBool(v)) return false; }
        else if (!strcmp(k, "color")) {
            if (!(cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble == 3) ||
                  (cJSON_IsString(v) && (!strcmp(v->valuestring, "red") || !strcmp(v->valuestring, "green")))))
                return false;
        } else if (!strcmp(k, "tags")) {
            if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > 3) return false;
            const cJSON *t;
            cJSON_ArrayForEach(t, v) if (!cJSON_IsString(t) || chars(t->valuestring) > 4) return false;
        } else if (!strcmp(k, "pos")) {
            if (!cJSON_IsObject(v) || !cJSON_IsNumber(cJSON_GetObjectItem(v, "x")) ||
                !cJSON_IsNumber(cJSON_GetObjectItem(v, "y")) || cJSON_GetArraySize(v) != 2)
                return false;
        } else
            return false;
    }
    return cJSON_GetObjectItem(o, "name") && cJSON_GetObjectItem(o, "age") && cJSON_GetObjectItem(o, "pos") && n <= 7;
}

static void check_refused(const char *schema, const char *needle) {
    mmc_jc_schema *s = NULL;
    char err[512];
    bool ok = mmc_jc_compile(schema, strlen(schema), &s, err, sizeof err);
    CHECKF(!ok && strstr(err, needle), "schema %s: %s (wanted an error naming '%s')", schema, ok ? "accepted" : err,
           needle);
    mmc_jc_schema_free(s);
}

int main(void) {
    mmc_jc_schema *s = NULL, *any = NULL;
    char err[512];
    CHECKF(mmc_jc_compile(SCHEMA, strlen(SCHEMA), &s, err, sizeof err), "%s", err);
    CHECKF(mmc_jc_compile(NULL, 0, &any, err, sizeof err), "%s", err);
    if (!s || !any) return test_done("test_json_constraint");
    static const char *good[] = {
        "{\"name\":\"ab\",\"age\":-12,\"pos\":{\"x\":1.5e-3,\"y\":0}}",
        "{ \"pos\" : { \"y\" : 2 , \"x\" : -0.25 } ,\n  \"age\": 0, \"name\": \"\\u00e9\\n\" , \"ok\": false}",
        "{\"name\":\"h\xC3\xA9llo\",\"age\":7,\"pos\":{\"x\":1,\"y\":2},\"color\":3,\"tags\":[\"a\",\"bc\"],\"score\":1E+2}",
        "{\"color\":null,\"tags\":[],\"name\":\"\",\"age\":1,\"pos\":{\"x\":0,\"y\":0},\"ok\":true,\"score\":-0}",
    };
    static const char *bad[] = {
        "{\"name\":\"a\",\"age\":1}",                                              /* pos missing */
        "{\"name\":\"a\",\"age\":1.5,\"pos\":{\"x\":1,\"y\":2}}",                   /* age not an integer */
        "{\"name\":\"a\",\"age\":01,\"pos\":{\"x\":1,\"y\":2}}",                    /* leading zero */
        "{\"name\":\"123456789\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}}",             /* maxLength 8 */
        "{\"nam\":\"a\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}}",                      /* unknown key */
        "{\"name\":\"a\",\"name\":\"b\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}}",      /* a key twice */
        "{\"name\":\"a\tb\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}}",                  /* raw tab in a string */
        "{\"name\":\"\xC0\xAF\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}}",              /* overlong UTF-8 */
        "{\"name\":\"a\",\"age\":1,\"pos\":{\"x\":1,\"y\":2},\"color\":\"blue\"}",  /* not in the enum */
        "{\"name\":\"a\",\"age\":1,\"pos\":{\"x\":1,\"y\":2},\"tags\":[\"a\",\"b\",\"c\",\"d\"]}",   /* maxItems */
        "{\"name\":\"a\",\"age\":1,\"pos\":{\"x\":1,\"y\":2}} ",                    /* after the end */
        "{\"name\":\"a\",\"age\":1,\"pos\":{\"x\":1,\"y\":2},}",                    /* trailing comma */
        "[1]",                                                                     /* not an object */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECKF(accepts(s, good[i]), "refused %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECKF(!accepts(s, bad[i]), "accepted %s", bad[i]);
    CHECK(accepts(any, "{\"a\":[1,{\"b\":null}],\"c\":\"d\",\"e\":-1.5e3,\"f\":true}") && accepts(any, "{}"));
    CHECK(!accepts(any, "[]") && !accepts(any, "{\"a\":tru}") && !accepts(any, "{\"a\" 1}"));
    /* every prefix of the valid texts + its shortest completion is a whole valid text */
    int n_prefix = 0;
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        size_t L = strlen(good[i]);
        for (size_t k = 0; k < L; k++) {
            mmc_jc_state *st = mmc_jc_start(s);
            CHECK(mmc_jc_feed(st, (const uint8_t *)good[i], k));
            char close[1024], text[2048];
            size_t c = mmc_jc_close(st, close, sizeof close);
            bool fed = c < sizeof close && mmc_jc_feed(st, (const uint8_t *)close, c) && mmc_jc_done(st);
            snprintf(text, sizeof text, "%.*s%s", (int)k, good[i], close);
            cJSON *j = cJSON_Parse(text);
            CHECKF(fed && j && valid(j), "prefix %zu of text %zu + completion: %s", k, i, text);
            cJSON_Delete(j);
            mmc_jc_state_free(st);
            n_prefix++;
        }
    }
    /* random generations over a real vocabulary under the mask */
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/qwen2/chat", &tok));
    mmc_jc_vocab *voc = NULL;
    if (tok) CHECK_OK(mmc_jc_vocab_build(tok, &voc));
    int n_ok = 0, n_gen = 200;
    if (voc) {
        const int64_t V = mmc_tokenizer_vocab_size(tok);
        float *lg = malloc((size_t)V * sizeof *lg);
        int32_t eos = mmc_tokenizer_special_id(tok, MMC_TOK_EOS);
        uint64_t r = 12345;
        for (int g = 0; g < n_gen; g++) {
            const mmc_jc_schema *sch = g % 4 == 3 ? any : s;
            mmc_jc_state *st = mmc_jc_start(sch);
            int64_t budget = 44 + g % 57;   /* the schema's smallest value takes 39 single-byte tokens */
            char *text = calloc(1, 8192);
            size_t tl = 0;
            bool ended = false;
            for (int64_t t = 0; t < budget && !ended; t++) {
                for (int64_t v = 0; v < V; v++) {
                    r = r * 6364136223846793005ull + 1442695040888963407ull;
                    lg[v] = (float)(r >> 40) / (float)(1 << 24);
                }
                mmc_jc_mask(st, voc, budget - t, &eos, eos >= 0 ? 1 : 0, lg, V);
                int64_t best = -1;
                for (int64_t v = 0; v < V; v++)
                    if (lg[v] > -INFINITY && (best < 0 || lg[v] > lg[best])) best = v;
                if (best < 0 || best == eos) { ended = true; break; }
                uint8_t b[256];
                int64_t nb = mmc_tokenizer_token_bytes(tok, (int32_t)best, b, sizeof b);
                CHECK(mmc_jc_feed_token(st, voc, (int32_t)best));
                if (nb > 0 && tl + (size_t)nb < 8191) { memcpy(text + tl, b, (size_t)nb); tl += (size_t)nb; }
                if (mmc_jc_done(st)) ended = true;
            }
            cJSON *j = cJSON_Parse(text);
            bool ok = mmc_jc_done(st) && j && (sch == any ? cJSON_IsObject(j) : valid(j));
            CHECKF(ok, "generation %d (budget %lld): %s", g, (long long)budget, text);
            n_ok += ok;
            cJSON_Delete(j);
            free(text);
            mmc_jc_state_free(st);
        }
        free(lg);
    }
    printf("test_json_constraint: %d prefixes completed to valid texts; %d of %d masked random generations valid\n",
           n_prefix, n_ok, n_gen);
    mmc_jc_vocab_free(voc);
    mmc_tokenizer_free(tok);
    mmc_jc_schema_free(s);
    mmc_jc_schema_free(any);
    /* a wrapped value (tool calls): literal prefix and suffix, completions through them */
    {
        const char *ts = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},\"arguments\":{\"type\":"
                         "\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}},"
                         "\"required\":[\"name\",\"arguments\"]}";
        mmc_jc_schema *w = NULL;
        CHECKF(mmc_jc_compile(ts, strlen(ts), &w, err, sizeof err), "%s", err);
        if (w) {
            CHECK(mmc_jc_wrap(w, "<tool_call>\n", "\n</tool_call>"));
            const char *good_w = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 3}}\n</tool_call>";
            CHECK(accepts(w, good_w));
            CHECK(!accepts(w, "{\"name\":\"f\",\"arguments\":{\"x\":3}}"));
            CHECK(!accepts(w, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":3}}"));
            for (size_t k = 0; k < strlen(good_w); k++) {
                mmc_jc_state *st = mmc_jc_start(w);
                char close[512];
                CHECK(mmc_jc_feed(st, (const uint8_t *)good_w, k));
                size_t c = mmc_jc_close(st, close, sizeof close);
                CHECKF(mmc_jc_feed(st, (const uint8_t *)close, c) && mmc_jc_done(st), "wrapped prefix %zu + %s", k, close);
                mmc_jc_state_free(st);
            }
            mmc_jc_state *st = mmc_jc_start(w);
            char close[512];
            mmc_jc_close(st, close, sizeof close);
            CHECKF(!strcmp(close, "<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":0}}\n</tool_call>"), "%s", close);
            mmc_jc_state_free(st);
        }
        mmc_jc_schema_free(w);
    }
    /* refused schemas */
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"}]}}}", "'anyOf'");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
                  "schema.properties.a");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/x\"}}}", "'$ref'");
    check_refused("{\"type\":\"array\"}", "top of the schema must be of type object");
    check_refused("{\"type\":[\"string\",\"null\"]}", "one string");
    check_refused("{\"type\":\"object\",\"required\":[\"b\"],\"properties\":{\"a\":{}}}", "'b'");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0}}}", "'minimum'");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strin\"}}}", "'strin'");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"maxLength\":3}}}", "'maxLength'");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[[1]]}}}", "enum");
    check_refused("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{}}}", "quotes");
    check_refused("{\"type\":", "not valid JSON");
    return test_done("test_json_constraint");
}
