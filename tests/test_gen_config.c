/* test_gen_config.c — generation_config.json as transformers' generate() resolves it:
 * every case in tests/fixtures/gencfg (written by GenerationConfig.save_pretrained, expected
 * values from model._prepare_generation_config; tools/ref/gen_gencfg.py) gives the same
 * do_sample / temperature / top_k / top_p / min_p / repetition_penalty / lengths / eos / bos /
 * pad; the sampler options follow do_sample; malformed files are errors naming the key. */
#include "test_util.h"
#include "mmc_infer.h"

#include <unistd.h>

static void check_case(const mmc_json *exp, const char *name) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/gencfg/%s", name);
    mmc_gen_config g;
    CHECK_OK(mmc_gen_config_read(dir, &g));
    CHECKF(g.present, "%s: generation_config.json not found", name);
    bool b;
    int64_t i;
    double d;
#define NUM(field, member) snprintf(key, sizeof key, "%s." field, name); \
    CHECK_OK(mmc_json_num(exp, key, -99, &d)); CHECKF(d == (double)(member), "%s: %s %g, transformers %g", \
                                                      name, field, (double)(member), d)
    snprintf(key, sizeof key, "%s.do_sample", name);
    CHECK_OK(mmc_json_bool(exp, key, false, &b));
    CHECKF(b == g.do_sample, "%s: do_sample %d, transformers %d", name, g.do_sample, b);
    NUM("temperature", g.temperature);
    NUM("top_k", g.top_k);
    NUM("top_p", g.top_p);
    NUM("min_p", g.min_p);
    NUM("repetition_penalty", g.repetition_penalty);
    NUM("max_new_tokens", g.max_new_tokens);
    NUM("max_length", g.max_length);
    NUM("bos", g.bos_id);
    NUM("pad", g.pad_id);
#undef NUM
    int64_t eos[MMC_GEN_MAX_EOS];
    int n = MMC_GEN_MAX_EOS;
    snprintf(key, sizeof key, "%s.eos", name);
    CHECK_OK(mmc_json_int_array(exp, key, eos, &n));
    CHECKF(n == g.n_eos, "%s: %d eos ids, transformers %d", name, g.n_eos, n);
    for (int k = 0; k < n && k < g.n_eos; k++) CHECK(eos[k] == g.eos_ids[k]);
    /* the sampler: greedy unless do_sample; the repetition penalty either way */
    mmc_sampler_opts o;
    mmc_gen_config_sampler(&g, &o);
    CHECK(o.repetition_penalty == (float)g.repetition_penalty);
    if (g.do_sample) {
        CHECK(o.temperature == (float)g.temperature && o.top_k == (int)g.top_k && o.top_p == (float)g.top_p &&
              o.min_p == (float)g.min_p);
    } else {
        CHECK(o.temperature == 0 && o.top_k == 0 && o.top_p == 1 && o.min_p == 0);
    }
    (void)i;
}

static mmc_status read_text(const char *dir, const char *text, mmc_gen_config *g) {
    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return mmc_error(MMC_ERR_IO, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    return mmc_gen_config_read(dir, g);
}

int main(void) {
    mmc_json *exp = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/gencfg/expected.json", &exp));
    if (!exp) return test_done("test_gen_config");
    const char *cases[] = {"qwen2_vl_instruct", "qwen3_like", "sample_temperature_only", "greedy_max_new",
                           "greedy_max_length", "empty"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) check_case(exp, cases[c]);
    mmc_json_free(exp);

    /* lengths: max_new_tokens wins; else max_length counts the prompt */
    mmc_gen_config g;
    CHECK_OK(mmc_gen_config_read("tests/fixtures/gencfg/greedy_max_length", &g));
    CHECK(g.length_set && mmc_gen_config_max_new(&g, 100) == 28 && mmc_gen_config_max_new(&g, 200) == 0);
    CHECK_OK(mmc_gen_config_read("tests/fixtures/gencfg/greedy_max_new", &g));
    CHECK(g.length_set && mmc_gen_config_max_new(&g, 100) == 64);
    CHECK_OK(mmc_gen_config_read("tests/fixtures/gencfg/qwen3_like", &g));
    CHECK(!g.length_set);

    /* no file: transformers' global defaults, not present */
    CHECK_OK(mmc_gen_config_read("tests/fixtures/qwen2/chat", &g));
    CHECK(!g.present && !g.do_sample && g.top_k == 50 && g.n_eos == 0 && g.max_length == 20);

    /* malformed files: errors that name the file and the key */
    char dir[] = "/tmp/mmc_gencfg_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    static const struct { const char *text, *want; } bad[] = {
        {"{\"temperature\": \"hot\"}", "temperature"},
        {"{\"eos_token_id\": [\"</s>\"]}", "eos_token_id"},
        {"{\"eos_token_id\": -5}", "eos_token_id"},
        {"{\"top_p\": 1.5}", "top_p"},
        {"{\"repetition_penalty\": 0}", "repetition_penalty"},
        {"{\"do_sample\": 1}", "do_sample"},
        {"{\"top_k\": 2.5}", "top_k"},
        {"{\"max_new_tokens\": -3}", "max_new_tokens"},
        {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "eos_token_id"},
        {"{\"do_sample\": true,", "generation_config.json"},
        {"[1, 2]", "generation_config.json"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        mmc_status st = read_text(dir, bad[k].text, &g);
        CHECKF(st != MMC_OK && strstr(mmc_last_error(), bad[k].want) &&
               strstr(mmc_last_error(), "generation_config.json"),
               "%s: status %d, message '%s' should name %s", bad[k].text, st, mmc_last_error(), bad[k].want);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
    return test_done("test_gen_config");
}
