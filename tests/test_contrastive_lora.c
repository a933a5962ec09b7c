/* test_contrastive_lora.c — LoRA contrastive training of the tiny CLIPModel and SiglipModel
 * (src/train/trainer_contrastive.c, examples/clip_contrastive_lora.yaml) against transformers + PEFT
 * (tools/ref/gen_contrastive_lora.py -> tests/fixtures/contrastive_lora): starting from PEFT's fresh
 * adapter (model.lora.init), 10 steps give
 *   - per-step losses within 2e-5 relative of PEFT's loop (measured: CLIP 5.5e-6, SigLIP 1.2e-6);
 *   - checkpoint-10/adapter_model.safetensors with PEFT's keys, each tensor within 2e-4 of the largest
 *     |value| of PEFT's (measured 5.4e-5: AdamW's first steps divide tiny gradients by their own
 *     magnitude, so the last float bits of a B element move by ~5e-7 on values ~1e-2);
 *   - mmc_lora_merge_dir (what `mmc merge` runs) of that adapter into the base folder: the merged
 *     folder's logits_per_image on the 4 pairs within 1e-4 of PEFT's merge_and_unload (measured
 *     2.7e-5 in transformers); the base folder's logits must miss them (the control).
 * Also: a target that matches no module, and SigLIP's attention-pooling out_proj, are refused with
 * messages, as are a model.lora.r that differs from the init adapter's rank and an init folder without an
 * adapter. Parts: test_contrastive_lora clip | siglip | errors. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmc_embed.h"
#include "mmc_io.h"
#include "mmc_lora.h"
#include "train_run.h"
#include "train/trainer_internal.h"   /* mmc_rm_rf */

static char g_tmp[256];

/* mmc train examples/clip_contrastive_lora.yaml --set sets...: its stdout into log */
static mmc_status train(const char *const *sets, int n, const char *log) {
    return train_run("examples/clip_contrastive_lora.yaml", sets, n, 1, log);
}

static int read_losses(const char *log, double *out, int cap) {
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[512];
    int n = 0;
    long long s;
    double l;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "step %lld loss %lf", &s, &l) == 2 && n < cap) out[n++] = l;
    fclose(f);
    return n;
}

/* logits_per_image [4, 4] of the dual encoder in dir on retrieval.jsonl's images and first captions */
static mmc_status logits_of(const char *dir, float *logits) {
    mmc_dual_encoder *m = NULL;
    mmc_contrastive_pairs p = {0};
    char *text = NULL;
    size_t len = 0;
    mmc_image imgs[4] = {0};
    float *img = NULL, *txt = NULL;
    mmc_status st = mmc_dual_encoder_load(dir, &m);
    if (!st) st = mmc_read_file("tests/fixtures/clip_model/retrieval.jsonl", &text, &len);
    if (!st) st = mmc_contrastive_pairs_parse(text, len, "retrieval.jsonl", "tests/fixtures/clip_model", &p);
    if (!st && p.n != 4) st = mmc_error(MMC_ERR_FORMAT, "retrieval.jsonl: %d pairs, 4 expected", p.n);
    const int64_t D = st ? 0 : mmc_dual_encoder_dim(m);
    if (!st && (!(img = malloc(sizeof(float) * 4 * (size_t)D)) || !(txt = malloc(sizeof(float) * 4 * (size_t)D))))
        st = mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_image_opts io;
    mmc_image_opts_default(&io);
    for (int i = 0; i < 4 && !st; i++) st = mmc_image_load(p.image[i], &io, &imgs[i]);
    if (!st) st = mmc_dual_encoder_embed_images(m, imgs, 4, img);
    if (!st) st = mmc_dual_encoder_embed_texts(m, (const char *const *)p.caption, 4, txt);
    if (!st) mmc_dual_encoder_logits(m, img, 4, txt, 4, logits);
    for (int i = 0; i < 4; i++) mmc_image_free(&imgs[i]);
    free(img), free(txt), free(text);
    mmc_contrastive_pairs_free(&p);
    mmc_dual_encoder_free(m);
    return st;
}

static void check_family(const char *fam, const char *targets) {
    char out[512], log[600], init[256], exp[256], path[700], ref[300], merged[600], sp[300], st_out[600], st_init[300],
        st_tg[300];
    snprintf(out, sizeof out, "%s/%s", g_tmp, fam);
    snprintf(log, sizeof log, "%s/%s.log", g_tmp, fam);
    snprintf(init, sizeof init, "tests/fixtures/contrastive_lora/%s_init", fam);
    snprintf(exp, sizeof exp, "tests/fixtures/contrastive_lora/expected_%s.json", fam);
    snprintf(sp, sizeof sp, "model.path=tests/fixtures/%s_model/model", fam);
    snprintf(st_out, sizeof st_out, "training.output_dir=%s", out);
    snprintf(st_init, sizeof st_init, "model.lora.init=%s", init);
    snprintf(st_tg, sizeof st_tg, "model.lora.targets=%s", targets);
    const char *sets[] = {sp, st_out, st_init, st_tg};
    mmc_status st = train(sets, 4, log);
    CHECKF(st == MMC_OK, "%s: training: %s", fam, mmc_last_error());
    if (st) return;
    mmc_json *e = NULL;
    CHECK_OK(mmc_json_load(exp, &e));
    if (!e) return;
    /* losses */
    double got[16], maxrel = 0;
    const int n = read_losses(log, got, 16);
    CHECKF(n == 10, "%s: %d losses logged, 10 expected", fam, n);
    for (int i = 0; i < n; i++) {
        char k[32];
        double want = NAN;
        snprintf(k, sizeof k, "losses.%d", i);
        mmc_json_num(e, k, NAN, &want);
        maxrel = fmax(maxrel, fabs(got[i] - want) / fabs(want));
    }
    printf("%s: 10 LoRA steps: max relative loss difference vs PEFT %.3g (tolerance 2e-5)\n", fam, maxrel);
    CHECKF(maxrel <= 2e-5, "%s: losses differ from PEFT's by %.3g relative", fam, maxrel);
    CHECKF(n == 10 && got[9] < got[0] - 0.1, "%s: loss does not fall (%g -> %g)", fam, got[0], n ? got[n - 1] : 0);
    /* the trained adapter vs PEFT's */
    snprintf(path, sizeof path, "%s/checkpoint-10/adapter_model.safetensors", out);
    snprintf(ref, sizeof ref, "contrastive_lora/%s_final/adapter_model.safetensors", fam);
    mmc_st *a = NULL, *b = fixture_open(ref);
    CHECK_OK(mmc_st_open(path, &a));
    if (a && b) {
        CHECKF(mmc_st_count(a) == mmc_st_count(b), "%s: %d adapter tensors, PEFT has %d", fam, mmc_st_count(a),
               mmc_st_count(b));
        double worst = 0;
        for (int i = 0; i < mmc_st_count(b); i++) {
            const char *k = mmc_st_at(b, i)->name;
            if (!mmc_st_find(a, k)) { CHECKF(false, "%s: the checkpoint lacks %s", fam, k); continue; }
            mmc_tensor *x = fixture_tensor(a, k, MMC_F32), *y = fixture_tensor(b, k, MMC_F32);
            worst = fmax(worst, max_abs_diff(x, y) / max_abs(y));
            mmc_tensor_free(x), mmc_tensor_free(y);
        }
        printf("%s: adapter after 10 steps: max |mmc - PEFT| / max |PEFT| per tensor %.3g (tolerance 2e-4)\n", fam,
               worst);
        CHECKF(worst <= 2e-4, "%s: adapter weights differ from PEFT's by %.3g", fam, worst);
    }
    mmc_st_close(a);
    mmc_st_close(b);
    /* merged (`mmc merge`) vs PEFT's merge_and_unload; the base folder is the control */
    snprintf(merged, sizeof merged, "%s/merged", out);
    snprintf(path, sizeof path, "%s/checkpoint-10", out);
    int nm = 0;
    CHECK_OK(mmc_lora_merge_dir(sp + strlen("model.path="), path, merged, &nm));
    float lm[16], lb[16];
    double dm = 0, db = 0;
    CHECK_OK(logits_of(merged, lm));
    CHECK_OK(logits_of(sp + strlen("model.path="), lb));
    for (int i = 0; i < 16; i++) {
        char k[48];
        double want = NAN;
        snprintf(k, sizeof k, "logits_per_image.%d.%d", i / 4, i % 4);
        mmc_json_num(e, k, NAN, &want);
        dm = fmax(dm, fabs(lm[i] - want)), db = fmax(db, fabs(lb[i] - want));
    }
    printf("%s: merged (%d weights) logits_per_image vs PEFT's merge_and_unload: max abs %.3g (tolerance 1e-4); "
           "the base model's: %.3g\n", fam, nm, dm, db);
    CHECKF(dm <= 1e-4, "%s: merged logits differ by %.3g", fam, dm);
    CHECKF(db > 1e-3, "%s: the control (unmerged base) matches too: %.3g", fam, db);
    mmc_json_free(e);
}

static void check_errors(void) {
    char st_out[300], log[300];
    snprintf(st_out, sizeof st_out, "training.output_dir=%s/err", g_tmp);
    snprintf(log, sizeof log, "%s/err.log", g_tmp);
    const char *none[] = {st_out, "model.lora.targets=[no_such_proj]"};
    CHECK(train(none, 2, log) != MMC_OK);
    CHECKF(strstr(mmc_last_error(), "no_such_proj") != NULL, "message: %s", mmc_last_error());
    const char *mha[] = {st_out, "model.path=tests/fixtures/siglip_model/model", "model.lora.targets=[out_proj]"};
    CHECK(train(mha, 3, log) == MMC_ERR_UNSUPPORTED);
    CHECKF(strstr(mmc_last_error(), "head.attention.out_proj") != NULL, "message: %s", mmc_last_error());
    const char *rank[] = {st_out, "model.lora.init=tests/fixtures/contrastive_lora/clip_init", "model.lora.r=8"};
    CHECK(train(rank, 3, log) != MMC_OK);
    CHECKF(strstr(mmc_last_error(), "rank 4") != NULL, "message: %s", mmc_last_error());
    const char *noad[] = {st_out, "model.lora.init=tests/fixtures/contrastive_lora"};   /* no adapter there */
    CHECK(train(noad, 2, log) != MMC_OK);
    CHECKF(strstr(mmc_last_error(), "contrastive_lora") != NULL, "message: %s", mmc_last_error());
}

int main(int argc, char **argv) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/mmc_test_contrastive_lora.XXXXXX");
    MMC_CHECK(mkdtemp(g_tmp), "cannot create a folder under /tmp");
    if (test_part(argc, argv, "clip"))
        check_family("clip", "[q_proj, v_proj, out_proj, fc1, text_model.encoder.layers.0.mlp.fc2, visual_projection]");
    if (test_part(argc, argv, "siglip")) check_family("siglip", "[k_proj, fc2]");
    if (test_part(argc, argv, "errors")) check_errors();
    mmc_rm_rf(g_tmp);
    return test_done("test_contrastive_lora");
}
