/* test_json.c — config.json access: dotted paths, typed reads with defaults, type errors
 * naming file/key/expected/found, and parse errors with line:column. */
#include "test_util.h"

#define FIX "tests/fixtures/io/"

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
#define CHECK_MSG(sub) CHECKF(contains(mmc_last_error(), sub), "message '%s' lacks '%s'", mmc_last_error(), sub)

static void test_config(void) {
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_load(FIX "config.json", &j));
    if (!j) return;
    int64_t i = 0;
    double d = 0;
    bool b = false;
    const char *s = NULL;
    CHECK_OK(mmc_json_int(j, "hidden_size", -1, &i));
    CHECK(i == 1536);
    CHECK_OK(mmc_json_int(j, "vision_config.depth", -1, &i));
    CHECK(i == 32);
    CHECK_OK(mmc_json_int(j, "rope_theta", -1, &i));          /* 1000000.0 is integral */
    CHECK(i == 1000000);
    CHECK_OK(mmc_json_num(j, "rms_norm_eps", 0, &d));
    CHECK(d == 1e-6);
    CHECK_OK(mmc_json_num(j, "hidden_size", 0, &d));          /* ints are numbers */
    CHECK(d == 1536);
    CHECK_OK(mmc_json_bool(j, "tie_word_embeddings", false, &b));
    CHECK(b);
    CHECK_OK(mmc_json_str(j, "vision_config.hidden_act", NULL, &s));
    CHECK(s && strcmp(s, "quick_gelu") == 0);
    CHECK_OK(mmc_json_str(j, "layer_types.1", NULL, &s));     /* array index in the path */
    CHECK(s && strcmp(s, "sliding") == 0);
    CHECK_OK(mmc_json_str(j, "architectures.0", NULL, &s));
    CHECK(s && strcmp(s, "Qwen2VLForConditionalGeneration") == 0);
    int64_t sec[4];
    int n = 4;
    CHECK_OK(mmc_json_int_array(j, "rope_scaling.mrope_section", sec, &n));
    CHECK(n == 3 && sec[0] == 16 && sec[1] == 24 && sec[2] == 24);
    /* absent keys and null: the default */
    CHECK_OK(mmc_json_int(j, "vision_config.nope", 7, &i));
    CHECK(i == 7);
    CHECK_OK(mmc_json_int(j, "sliding_window", 4096, &i));
    CHECK(i == 4096);
    CHECK(!mmc_json_has(j, "sliding_window") && mmc_json_has(j, "vision_config.depth"));
    CHECK(!mmc_json_has(j, "hidden_size.x") && !mmc_json_has(j, "layer_types.9"));
    n = 4;
    CHECK_OK(mmc_json_int_array(j, "missing", sec, &n));
    CHECK(n == 0);
    CHECK_OK(mmc_json_str(j, "missing.deeper", "dflt", &s));
    CHECK(strcmp(s, "dflt") == 0);
    /* a sub-node works as a root */
    const mmc_json *vc = mmc_json_get(j, "vision_config");
    CHECK_OK(mmc_json_int(vc, "patch_size", 0, &i));
    CHECK(i == 14);

    /* wrong types: file, key, expected and found */
    CHECK_ERR(mmc_json_int(j, "model_type", 0, &i), MMC_ERR_FORMAT);
    CHECK_MSG("config.json: model_type: expected an integer, found a string (\"qwen2_vl\")");
    CHECK_ERR(mmc_json_int(j, "rms_norm_eps", 0, &i), MMC_ERR_FORMAT);
    CHECK_MSG("found a number (1e-06)");
    CHECK_ERR(mmc_json_bool(j, "hidden_size", false, &b), MMC_ERR_FORMAT);
    CHECK_MSG("hidden_size: expected a boolean, found a number (1536)");
    CHECK_ERR(mmc_json_str(j, "vision_config", NULL, &s), MMC_ERR_FORMAT);
    CHECK_MSG("vision_config: expected a string, found an object");
    CHECK_ERR(mmc_json_num(j, "layer_types", 0, &d), MMC_ERR_FORMAT);
    CHECK_MSG("found an array");
    n = 2;
    CHECK_ERR(mmc_json_int_array(j, "rope_scaling.mrope_section", sec, &n), MMC_ERR_INVALID);
    CHECK_MSG("rope_scaling.mrope_section: array has 3 elements, at most 2");
    n = 4;
    CHECK_ERR(mmc_json_int_array(j, "layer_types", sec, &n), MMC_ERR_FORMAT);
    CHECK_MSG("layer_types[0]: expected an integer");
    CHECK_ERR(mmc_json_int_array(j, "hidden_size", sec, &n), MMC_ERR_FORMAT);
    mmc_json_free(j);
}

static void test_errors(void) {
    mmc_json *j = (mmc_json *)1;
    CHECK_ERR(mmc_json_load(FIX "bad_syntax.json", &j), MMC_ERR_FORMAT);
    CHECK(j == NULL);
    CHECK_MSG("bad_syntax.json:4:17: invalid JSON near ','");
    CHECK_ERR(mmc_json_load(FIX "nope.json", &j), MMC_ERR_NOT_FOUND);
    CHECK_MSG("nope.json");
    CHECK_ERR(mmc_json_parse("", 0, "empty.json", &j), MMC_ERR_FORMAT);
    CHECK_MSG("empty.json:1:1");
    const char *trunc = "{\n \"a\": [1, 2,";
    CHECK_ERR(mmc_json_parse(trunc, strlen(trunc), "t.json", &j), MMC_ERR_FORMAT);
    CHECK_MSG("t.json:2:");
    CHECK_MSG("unexpected end");
    CHECK_ERR(mmc_json_parse("{} x", 4, "tr.json", &j), MMC_ERR_FORMAT);
    CHECK_MSG("tr.json:1:4: invalid JSON: trailing characters");
    /* length is honoured: the text need not be NUL-terminated */
    CHECK_OK(mmc_json_parse("{\"a\": 5}GARBAGE", 8, "len.json", &j));
    int64_t i = 0;
    CHECK_OK(mmc_json_int(j, "a", 0, &i));
    CHECK(i == 5);
    CHECK_ERR(mmc_json_int(j, "a.b", 0, &i), MMC_OK);      /* path through a scalar: absent */
    mmc_json_free(j);
    /* a non-object root: everything is absent */
    CHECK_OK(mmc_json_parse("42", 2, "n.json", &j));
    CHECK_OK(mmc_json_int(j, "a", 3, &i));
    CHECK(i == 3);
    mmc_json_free(j);
    /* large and fractional values are not integers */
    const char *big = "{\"a\": 1e300, \"b\": 2.5, \"c\": -3}";
    CHECK_OK(mmc_json_parse(big, strlen(big), "big.json", &j));
    CHECK_ERR(mmc_json_int(j, "a", 0, &i), MMC_ERR_FORMAT);
    CHECK_ERR(mmc_json_int(j, "b", 0, &i), MMC_ERR_FORMAT);
    CHECK_OK(mmc_json_int(j, "c", 0, &i));
    CHECK(i == -3);
    mmc_json_free(j);
}

int main(void) {
    test_config();
    test_errors();
    return test_done("test_json");
}
