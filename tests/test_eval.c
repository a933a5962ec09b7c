/* test_eval.c — `mmc eval` internals (src/train/eval.c): answer normalisation and match
 * rules, the JSON summary and its by_type table, and a run on a tiny random Qwen2-VL whose
 * teacher-forced losses, token counts and greedy answers must equal transformers'
 * (tests/fixtures/eval, written by tools/ref/gen_eval.py); blanked images, a missing image
 * (skipped and counted) and a malformed line (error naming file:line). Samples are read by
 * the training data pipeline: the same samples written as LLaVA `conversations`, LLaMA-Factory
 * `messages` + `images` and OpenAI content parts give identical losses and answers, and equal
 * the training loader's own token/label count. */
#include "test_util.h"
#include "mmc_data.h"
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
    CHECK(strstr(mmc_last_error(), ":1:") && strstr(mmc_last_error(), "2 image placeholders") &&
          strstr(mmc_last_error(), "but 1 image listed"));
    CHECK_ERR(mmc_eval_run(&(mmc_eval_opts){.model_dir = "tests/fixtures/eval/model", .data_path = "/nonexistent.jsonl",
                                            .max_new_tokens = 4}, &b), MMC_ERR_NOT_FOUND);
    unlink(out);
    mmc_json_free(exp_j);
}

/* The fixture's samples rewritten in one layout: 0 LLaVA, 1 LLaMA-Factory, 2 OpenAI parts. */
static void write_format(const char *path, int fmt) {
    mmc_dataset *ds = NULL;
    CHECK_OK(mmc_dataset_load("tests/fixtures/eval/data/val.jsonl", NULL, &ds));
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    for (int64_t i = 0; ds && f && i < mmc_dataset_size(ds); i++) {
        mmc_example ex;
        mmc_dataset_get(ds, i, &ex);
        const char *img = strstr(ex.images[0], "images/");   /* as written: relative to the data dir */
        fputc('{', f);
        fprintf(f, fmt == 0 ? "\"image\": \"%s\", \"conversations\": [" : fmt == 1 ? "\"images\": [\"%s\"], \"messages\": ["
                                                                  : "%s\"messages\": [", fmt == 2 ? "" : img);
        for (int m = 0; m < ex.n_messages; m++) {
            const mmc_chat_message *msg = &ex.messages[m];
            bool user = !strcmp(msg->role, "user");
            if (fmt == 0) fprintf(f, "%s{\"from\": \"%s\", \"value\": \"", m ? ", " : "", user ? "human" : "gpt");
            else if (fmt == 1) fprintf(f, "%s{\"role\": \"%s\", \"content\": \"", m ? ", " : "", msg->role);
            else fprintf(f, "%s{\"role\": \"%s\", \"content\": [", m ? ", " : "", msg->role);
            for (int p = 0; p < msg->n_parts; p++) {
                const mmc_chat_part *pt = &msg->parts[p];
                if (fmt < 2) {
                    if (pt->type == MMC_CHAT_IMAGE) fputs("<image>", f);
                    else for (const char *c = pt->text; *c; c++) fputs(*c == '\n' ? "\\n" : (char[2]){*c, 0}, f);
                } else if (pt->type == MMC_CHAT_IMAGE) fprintf(f, "%s{\"type\": \"image\", \"image\": \"%s\"}", p ? ", " : "", img);
                else {
                    fprintf(f, "%s{\"type\": \"text\", \"text\": \"", p ? ", " : "");
                    for (const char *c = pt->text; *c; c++) fputs(*c == '\n' ? "\\n" : (char[2]){*c, 0}, f);
                    fputs("\"}", f);
                }
            }
            fputs(fmt < 2 ? "\"}" : "]}", f);
        }
        fputc(']', f);
        if (ex.type) fprintf(f, ", \"type\": \"%s\"", ex.type);
        fputs("}\n", f);
    }
    if (f) fclose(f);
    mmc_dataset_free(ds);
}

static void test_formats(void) {
    char path[3][64], out[3][80];
    mmc_eval_summary s[3];
    char *pred[3] = {0};
    size_t len;
    for (int k = 0; k < 3; k++) {
        snprintf(path[k], sizeof path[k], "/tmp/mmc_test_eval_fmt%d_XXXXXX", k);
        int fd = mkstemp(path[k]);
        close(fd);
        snprintf(out[k], sizeof out[k], "%s.pred", path[k]);
        write_format(path[k], k);
        mmc_eval_opts o = {.model_dir = "tests/fixtures/eval/model", .data_path = path[k], .out_path = out[k],
                           .image_root = "tests/fixtures/eval/data", .max_new_tokens = 4};
        CHECK_OK(mmc_eval_run(&o, &s[k]));
        CHECK_OK(mmc_read_file(out[k], &pred[k], &len));
    }
    static const mmc_data_format want[3] = {MMC_DATA_LLAVA, MMC_DATA_SHAREGPT, MMC_DATA_OPENAI};
    for (int k = 0; k < 3; k++) {   /* each file really is in its layout */
        mmc_dataset *ds = NULL;
        CHECK_OK(mmc_dataset_load(path[k], "tests/fixtures/eval/data", &ds));
        mmc_example ex = {0};
        if (ds) mmc_dataset_get(ds, 0, &ex);
        CHECKF(ds && ex.format == want[k], "file %d detected as format %d", k, (int)ex.format);
        mmc_dataset_free(ds);
    }
    for (int k = 1; k < 3; k++) {
        CHECKF(s[k].samples == 6 && s[k].n_tokens == s[0].n_tokens && s[k].nll_sum == s[0].nll_sum &&
               s[k].normalized == s[0].normalized && s[k].n_types == s[0].n_types,
               "format %d: %lld samples, %lld tokens, nll %.9g vs LLaVA %lld, %lld, %.9g", k, (long long)s[k].samples,
               (long long)s[k].n_tokens, s[k].nll_sum, (long long)s[0].samples, (long long)s[0].n_tokens, s[0].nll_sum);
        CHECKF(pred[k] && pred[0] && !strcmp(pred[k], pred[0]), "format %d predictions differ:\n%s\nvs\n%s", k,
               pred[k] ? pred[k] : "", pred[0] ? pred[0] : "");
    }
    /* the scored tokens are the ones the training loader labels */
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/eval/model", &tok));
    mmc_data_opts d;
    mmc_data_opts_default(&d);
    d.eval = strdup(path[1]);
    d.image_root = strdup("tests/fixtures/eval/data");
    d.num_workers = 1;
    mmc_loader *l = NULL;
    CHECK_OK(mmc_loader_new(&d, tok, MMC_SPLIT_EVAL, &l));
    int64_t labelled = 0;
    for (mmc_batch b; l;) {
        CHECK_OK(mmc_loader_next(l, &b));
        int64_t B = b.B;
        labelled += b.n_label_tokens;
        mmc_batch_free(&b);
        if (B == 0) break;
    }
    CHECKF(labelled == s[1].n_tokens, "eval scored %lld tokens, the training loader labels %lld",
           (long long)s[1].n_tokens, (long long)labelled);
    mmc_loader_free(l);
    mmc_data_opts_free(&d);
    mmc_tokenizer_free(tok);
    for (int k = 0; k < 3; k++) { unlink(path[k]); unlink(out[k]); free(pred[k]); }
}

int main(void) {
    test_metrics();
    test_run();
    test_formats();
    return test_done("test_eval");
}
