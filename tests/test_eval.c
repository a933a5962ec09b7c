/* test_eval.c — `mmc eval` internals (src/train/eval.c): answer normalisation and match
 * rules, the JSON summary and its by_type table, and a run on a tiny random Qwen2-VL whose
 * teacher-forced losses, token counts and greedy answers must equal transformers'
 * (tests/fixtures/eval, written by tools/ref/gen_eval.py); blanked images, a missing image
 * (skipped and counted) and a malformed line (error naming file:line). */
#include "test_util.h"
#include "mmc_eval.h"
#include "mmc_io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check_norm(const char *in, const char *want) {
    char *got = mmc_eval_normalize(in);
    CHECKF(got && !strcmp(got, want), "normalize('%s') = '%s', want '%s'", in, got ? got : "(null)", want);
    free(got);
}

static void test_metrics(void) {
    check_norm("  The Red circle. ", "red circle");
    check_norm("Two", "2");
    check_norm("an apple, a pear!", "apple pear");
    check_norm("There are THREE shapes", "there are 3 shapes");
    check_norm("twenty-one", "20 1");      /* hyphen -> space, each word mapped */
    check_norm("", "");
    check_norm("\tleft\n", "left");
    check_norm("théâtre", "théâtre");     /* non-ASCII bytes kept */
    CHECK(mmc_eval_exact_match(" red\n", "red"));
    CHECK(!mmc_eval_exact_match("Red", "red"));
    CHECK(!mmc_eval_exact_match("red.", "red"));
    CHECK(mmc_eval_normalized_match("Red.", "red"));
    CHECK(mmc_eval_normalized_match("two", "2"));
    CHECK(mmc_eval_normalized_match("The square", "square"));
    CHECK(!mmc_eval_normalized_match("squares", "square"));
    CHECK(!mmc_eval_normalized_match("", "red"));

    mmc_eval_summary s;
    memset(&s, 0, sizeof s);
    mmc_eval_summary_add(&s, "colour", 2.0, 4, true, true);
    mmc_eval_summary_add(&s, "colour", 1.0, 2, false, true);
    mmc_eval_summary_add(&s, "count", 3.0, 2, false, false);
    mmc_eval_summary_add(&s, NULL, 0.0, 0, true, true);
    CHECK_NEAR(mmc_eval_loss(&s), 6.0 / 8.0, 1e-12);
    char *txt = mmc_eval_summary_json(&s);
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_parse(txt, strlen(txt), "summary", &j));
    double v;
    CHECK_OK(mmc_json_num(j, "loss", NAN, &v)); CHECK_NEAR(v, 0.75, 1e-12);
    CHECK_OK(mmc_json_num(j, "perplexity", NAN, &v)); CHECK_NEAR(v, exp(0.75), 1e-9);
    CHECK_OK(mmc_json_num(j, "exact_match", NAN, &v)); CHECK_NEAR(v, 0.5, 1e-12);
    CHECK_OK(mmc_json_num(j, "normalized_match", NAN, &v)); CHECK_NEAR(v, 0.75, 1e-12);
    CHECK_OK(mmc_json_num(j, "samples", NAN, &v)); CHECK_NEAR(v, 4, 0);
    CHECK_OK(mmc_json_num(j, "by_type.colour", NAN, &v)); CHECK_NEAR(v, 1.0, 1e-12);
    CHECK_OK(mmc_json_num(j, "by_type.count", NAN, &v)); CHECK_NEAR(v, 0.0, 1e-12);
    CHECK_OK(mmc_json_num(j, "by_type_exact.colour", NAN, &v)); CHECK_NEAR(v, 0.5, 1e-12);
    mmc_json_free(j);
    free(txt);
    /* nothing scored: loss is null, not NaN text */
    memset(&s, 0, sizeof s);
    txt = mmc_eval_summary_json(&s);
    CHECK(strstr(txt, "\"loss\":null") && !strstr(txt, "by_type"));
    free(txt);
}

static void test_run(void) {
    mmc_json *exp_j = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/eval/expected.json", &exp_j));
    char out[] = "/tmp/mmc_test_eval_XXXXXX";
    int fd = mkstemp(out);
    CHECK(fd >= 0);
    close(fd);
    mmc_eval_opts o = {.model_dir = "tests/fixtures/eval/model", .data_path = "tests/fixtures/eval/data/val.jsonl",
                       .out_path = out, .max_new_tokens = 4};
    mmc_eval_summary s;
    CHECK_OK(mmc_eval_run(&o, &s));
    CHECK(s.samples == 6 && s.skipped == 0);
    CHECK(s.n_types == 3);   /* colour, count, leftright; the last sample has no type */
    char *text = NULL;
    size_t len;
    CHECK_OK(mmc_read_file(out, &text, &len));
    char *save = NULL;
    int i = 0;
    double nll = 0, ntok = 0;
    for (char *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save), i++) {
        mmc_json *p = NULL;
        CHECK_OK(mmc_json_parse(ln, strlen(ln), "predictions", &p));
        char key[64];
        double got, want;
        const char *gp = NULL, *wp = NULL;
        snprintf(key, sizeof key, "samples.%d.loss", i);
        CHECK_OK(mmc_json_num(exp_j, key, NAN, &want));
        CHECK_OK(mmc_json_num(p, "loss", NAN, &got));
        /* f32 forward of the same weights: 1e-4 absolute on a mean NLL of ~8 */
        CHECKF(fabs(got - want) < 1e-4, "sample %d loss %.6f vs transformers %.6f", i, got, want);
        snprintf(key, sizeof key, "samples.%d.tokens", i);
        CHECK_OK(mmc_json_num(exp_j, key, NAN, &want));
        CHECK_OK(mmc_json_num(p, "tokens", NAN, &got));
        CHECKF(got == want, "sample %d: %g scored tokens, transformers %g", i, got, want);
        double l;
        CHECK_OK(mmc_json_num(exp_j, (snprintf(key, sizeof key, "samples.%d.loss", i), key), NAN, &l));
        nll += l * want;
        ntok += want;
        snprintf(key, sizeof key, "samples.%d.prediction", i);
        CHECK_OK(mmc_json_str(exp_j, key, NULL, &wp));
        CHECK_OK(mmc_json_str(p, "prediction", NULL, &gp));
        CHECKF(gp && wp && !strcmp(gp, wp), "sample %d greedy answer '%s' vs transformers '%s'", i, gp, wp);
        mmc_json_free(p);
    }
    CHECK(i == 6);
    CHECK_NEAR(mmc_eval_loss(&s), nll / ntok, 1e-4);
    free(text);

    /* blank images: same tokens, other loss */
    mmc_eval_summary b;
    o.blank_images = true;
    o.out_path = NULL;
    CHECK_OK(mmc_eval_run(&o, &b));
    CHECK(b.n_tokens == s.n_tokens && fabs(mmc_eval_loss(&b) - mmc_eval_loss(&s)) > 1e-4);
    o.blank_images = false;

    /* a missing image is skipped and counted; a malformed line is an error with its line */
    FILE *f = fopen(out, "w");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>Q?\"}, {\"role\": \"assistant\", \"content\": \"a\"}], "
               "\"images\": [\"images/nope.png\"]}\n");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>Q?\"}, {\"role\": \"assistant\", \"content\": \"a\"}], "
               "\"images\": [\"images/s0.png\"]}\n");
    fclose(f);
    o.data_path = out;
    o.image_root = "tests/fixtures/eval/data";
    CHECK_OK(mmc_eval_run(&o, &b));
    CHECK(b.samples == 1 && b.skipped == 1);
    f = fopen(out, "w");
    fprintf(f, "\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    fclose(f);
    CHECK_ERR(mmc_eval_run(&o, &b), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), ":2:") && strstr(mmc_last_error(), "no assistant turn"));
    f = fopen(out, "w");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"<image><image>x\"}, {\"role\": \"assistant\", \"content\": \"a\"}], "
               "\"images\": [\"images/s0.png\"]}\n{oops\n");
    fclose(f);
    CHECK_ERR(mmc_eval_run(&o, &b), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "2 <image> tags but 1 images"));
    CHECK_ERR(mmc_eval_run(&(mmc_eval_opts){.model_dir = "tests/fixtures/eval/model", .data_path = "/nonexistent.jsonl",
                                            .max_new_tokens = 4}, &b), MMC_ERR_NOT_FOUND);
    unlink(out);
    mmc_json_free(exp_j);
}

int main(void) {
    test_metrics();
    test_run();
    return test_done("test_eval");
}
