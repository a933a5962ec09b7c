/* test_llava_tower_lora.c — LoRA on the LLaVA family's vision towers in `mmc train` (the tower's layers
 * listed by mmc_clip_vision_linears / mmc_siglip_vision_linears under transformers 5's live names,
 * model.vision_tower.encoder.layers.N.*; the tower runs with a tape once it carries adapters) against
 * transformers 5.23 + PEFT 0.21.2. Two parts:
 *   clip  LLaVA-1.5's CLIP tower (tools/ref/gen_llava_tower_lora.py -> tests/fixtures/llava_tower_lora/lora_*):
 *         PEFT's initial adapter on the tower's q_proj / v_proj / fc1 and the LM's q_proj / v_proj, 6 steps
 *         over llava_train's samples;
 *   ov    LLaVA-OneVision's SigLIP tower (tools/ref/gen_llava_anyres_tower_lora.py -> .../ov_*): every linear of
 *         the tower's 2 layers (q/k/v/out_proj, fc1, fc2) and the LM's q_proj / v_proj, 6 steps over
 *         llava_anyres_train's samples (anyres grids downsampled past anyres_max_4, a two-image record of
 *         one padded tile each, a text-only one), then `mmc merge` of PEFT's trained adapter;
 *   next  LLaVA-NeXT's CLIP tower (the same script -> .../next_*): the same on the tiny llava_next/next (3 CLIP
 *         layers, vision_feature_layer -2; 1x2, 3x1, 2x2 anyres grids), merge included.
 * With AdamW(lr 1, eps 1) — eps far above every gradient, so each update is the gradient's running mean —
 * the adapters compare the gradients that reached them:
 *   - every step's loss within 1e-4 of PEFT's (measured: clip 4.6e-6, ov 9.5e-7, next 7.7e-7);
 *   - every trained adapter tensor within 1e-2 of PEFT's, normwise (||mmc - PEFT|| / ||PEFT||; measured: clip
 *     2.4e-3 on the tower's layer-0 q_proj lora_B, whose gradient passes the attention's softmax derivative,
 *     2e-4 or less on the LM's; tower / LM: ov 7e-7 / 1.1e-6, next 8.4e-7 / 1.8e-6);
 *   - the controls: every tower adapter of a used layer moved (its lora_B is zero at the start: a tower run
 *     without a tape leaves it there and fails the comparison), and (clip, next) layer 2's, whose output
 *     LLaVA does not use (vision_feature_layer -2), stayed as it started;
 *   - ov, next: `mmc merge` (mmc_lora_merge_dir) of PEFT's trained adapter folds every module and gives the
 *     tower weights PEFT's merge_and_unload gives, within 1e-6 (float rounding of W + s B A). */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmc_lora.h"
#include "train_run.h"
#include "train/trainer_internal.h"   /* mmc_rm_rf */

#define F "tests/fixtures/llava_tower_lora"

static double norm_diff(const mmc_tensor *a, const mmc_tensor *b, double *nb) {
    double d = 0, n = 0;
    for (int64_t i = 0; i < mmc_numel(b); i++) {
        const double x = mmc_get_flat(a, i), y = mmc_get_flat(b, i);
        d += (x - y) * (x - y), n += y * y;
    }
    *nb = sqrt(n);
    return sqrt(d);
}

typedef struct {
    const char *part, *base, *data, *pre;   /* pre: the fixture files' prefix ("" or "ov_") */
    const char *losses;                     /* the fixture's loss file */
    int tower_tensors;                      /* trained tower adapter tensors expected */
    const char *unused;                     /* a tower layer whose output the model does not use, or NULL */
    int tower_linears;                      /* anyres parts: the tower's adapted linears (merge check), else 0 */
} tower_case;

/* `mmc merge` of PEFT's trained adapter: every adapted module folded (each lora_A in the adapter), the tower's
 * weights equal to what PEFT's merge_and_unload gives (<pre>merged_tower.safetensors) */
static void check_merge(const tower_case *c, const char *dir) {
    char out[160], path[200];
    snprintf(out, sizeof out, "%s/merged", dir);
    snprintf(path, sizeof path, F "/%slora_ref", c->pre);
    int n = 0, modules = 0;
    mmc_status st = mmc_lora_merge_dir(c->base, path, out, &n);
    CHECKF(st == MMC_OK, "%s merge: %s", c->part, mmc_last_error());
    if (st) return;
    snprintf(path, sizeof path, "llava_tower_lora/%slora_ref/adapter_model.safetensors", c->pre);
    mmc_st *ad = fixture_open(path);
    for (int i = 0; ad && i < mmc_st_count(ad); i++) modules += strstr(mmc_st_at(ad, i)->name, "lora_A") != NULL;
    mmc_st_close(ad);
    CHECKF(n == modules && n > 0, "%s: merged %d weights, the adapter has %d modules", c->part, n, modules);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    mmc_st *got = NULL, *base = NULL;
    snprintf(out, sizeof out, "llava_tower_lora/%smerged_tower.safetensors", c->pre);
    mmc_st *ref = fixture_open(out);
    CHECK_OK(mmc_st_open(path, &got));
    snprintf(path, sizeof path, "%s/model.safetensors", c->base);
    CHECK_OK(mmc_st_open(path, &base));
    if (got && ref && base) {
        double worst = 0, moved = 0;
        for (int i = 0; i < mmc_st_count(ref); i++) {
            const char *k = mmc_st_at(ref, i)->name;
            if (!mmc_st_find(got, k)) { CHECKF(false, "the merged model lacks %s", k); continue; }
            mmc_tensor *x = fixture_tensor(got, k, MMC_F32), *r = fixture_tensor(ref, k, MMC_F32),
                       *b = fixture_tensor(base, k, MMC_F32);
            for (int64_t j = 0; j < mmc_numel(r); j++) {
                worst = fmax(worst, fabs(mmc_get_flat(x, j) - mmc_get_flat(r, j)));
                moved = fmax(moved, fabs(mmc_get_flat(r, j) - mmc_get_flat(b, j)));
            }
            mmc_tensor_free(x), mmc_tensor_free(r), mmc_tensor_free(b);
        }
        printf("%s: mmc merge of PEFT's adapter (%d modules), the tower's %d weights: max |mmc - PEFT "
               "merge_and_unload| = %.3g (tolerance 1e-6; the merge moved them by up to %.3g)\n", c->part, n,
               mmc_st_count(ref), worst, moved);
        CHECKF(mmc_st_count(ref) == c->tower_linears, "%s: %d merged tower weights in the fixture, %d expected",
               c->part, mmc_st_count(ref), c->tower_linears);
        CHECKF(worst <= 1e-6, "%s: merged tower weights differ from PEFT's by %.3g", c->part, worst);
        CHECKF(moved > 1e-4, "%s: the fixture's merge moved the tower's weights by only %.3g", c->part, moved);
    }
    mmc_st_close(got);
    mmc_st_close(ref);
    mmc_st_close(base);
}

static void check_case(const tower_case *c) {
    char dir[] = "/tmp/mmc_test_llava_tower_lora.XXXXXX", yaml[128], log[128], ck[160], path[200];
    MMC_CHECK(mkdtemp(dir), "cannot create a folder under /tmp");
    snprintf(yaml, sizeof yaml, "%s/run.yaml", dir);
    snprintf(log, sizeof log, "%s/train.log", dir);
    FILE *y = fopen(yaml, "w");
    MMC_CHECK(y, "cannot write %s", yaml);
    fprintf(y, "model: {path: %s, dtype: f32, lora: {r: 4, alpha: 8, init: " F "/%slora_init}}\n"
               "data: {train: %s, batch_size: 1, micro_batch_size: 1, shuffle: false, "
               "num_workers: 0, seq_len: 512}\n"
               "optimizer: {lr: 1.0, eps: 1.0, weight_decay: 0.0, schedule: constant, grad_clip: 0}\n"
               "training: {steps: 6, log_every: 1, save_every: 6, output_dir: %s/out, seed: 0}\n",
            c->base, c->pre, c->data, dir);
    fclose(y);
    mmc_status st = train_run(yaml, NULL, 0, 2, log);   /* its stderr: the step lines */
    CHECKF(st == MMC_OK, "%s training: %s", c->part, mmc_last_error());
    if (st) { mmc_rm_rf(dir); return; }
    /* losses */
    FILE *a = fopen(log, "r"), *b = fopen(c->losses, "r");
    char line[512];
    double got[8], want[8], worst = 0;
    int n = 0, m = 0, s, tot;
    while (a && fgets(line, sizeof line, a))
        if (n < 8 && sscanf(line, "step %d/%d loss %lf", &s, &tot, &got[n]) == 3) n++;
    while (b && m < 8 && fscanf(b, "%lf", &want[m]) == 1) m++;
    if (a) fclose(a);
    if (b) fclose(b);
    CHECKF(n == 6 && m == 6, "%s: %d losses logged, %d in the fixture (6 each expected)", c->part, n, m);
    for (int i = 0; i < n && i < m; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    printf("%s: 6 steps with the tower's LoRA: max |loss - PEFT's| = %.3g (tolerance 1e-4)\n", c->part, worst);
    CHECKF(worst <= 1e-4, "%s: losses differ from PEFT's by %.3g", c->part, worst);
    /* adapters */
    snprintf(ck, sizeof ck, "%s/out/checkpoint-6/adapter_model.safetensors", dir);
    snprintf(path, sizeof path, "llava_tower_lora/%slora_ref/adapter_model.safetensors", c->pre);
    mmc_st *got_st = NULL, *ref = fixture_open(path);
    snprintf(path, sizeof path, "llava_tower_lora/%slora_init/adapter_model.safetensors", c->pre);
    mmc_st *init = fixture_open(path);
    CHECK_OK(mmc_st_open(ck, &got_st));
    if (got_st && ref && init) {
        CHECKF(mmc_st_count(got_st) == mmc_st_count(ref), "%s: %d adapter tensors, PEFT has %d", c->part,
               mmc_st_count(got_st), mmc_st_count(ref));
        double wt = 0, wl = 0;
        int tower = 0;
        for (int i = 0; i < mmc_st_count(ref); i++) {
            const char *k = mmc_st_at(ref, i)->name;
            if (!mmc_st_find(got_st, k)) { CHECKF(false, "the checkpoint lacks %s", k); continue; }
            mmc_tensor *x = fixture_tensor(got_st, k, MMC_F32), *r = fixture_tensor(ref, k, MMC_F32),
                       *x0 = fixture_tensor(init, k, MMC_F32);
            double nr, n0, moved = norm_diff(x, x0, &n0), d = norm_diff(x, r, &nr);
            const bool is_tower = strstr(k, "vision_tower") != NULL, unused = c->unused && strstr(k, c->unused);
            if (is_tower && unused) {
                CHECKF(moved == 0, "%s: the adapter of a layer whose output is unused moved by %.3g", k, moved);
            } else {
                const double rel = d / nr;
                if (is_tower) wt = fmax(wt, rel), tower++;
                else wl = fmax(wl, rel);
                CHECKF(rel <= 1e-2, "%s: ||mmc - PEFT|| / ||PEFT|| = %.3g", k, rel);
                if (is_tower) CHECKF(moved > 0, "%s: the tower's adapter did not move (no gradient reached it)", k);
            }
            mmc_tensor_free(x), mmc_tensor_free(r), mmc_tensor_free(x0);
        }
        printf("%s: adapters after 6 steps, ||mmc - PEFT|| / ||PEFT|| per tensor: tower (%d tensors) %.3g, LM %.3g "
               "(tolerance 1e-2)\n", c->part, tower, wt, wl);
        CHECKF(tower == c->tower_tensors, "%s: %d trained tower adapter tensors, %d expected", c->part, tower,
               c->tower_tensors);
    }
    mmc_st_close(got_st);
    mmc_st_close(ref);
    mmc_st_close(init);
    if (c->tower_linears) check_merge(c, dir);
    mmc_rm_rf(dir);
}

int main(int argc, char **argv) {
    static const tower_case clip = {"clip", "tests/fixtures/llava/v5", "tests/fixtures/llava_train/data.jsonl", "",
                                    F "/losses.txt", 12, "layers.2.", 0};
    static const tower_case ov = {"ov", "tests/fixtures/llava_onevision/ov",
                                  "tests/fixtures/llava_anyres_train/data.jsonl", "ov_", F "/ov_losses.txt", 24, NULL, 12};
    static const tower_case next = {"next", "tests/fixtures/llava_next/next",
                                    "tests/fixtures/llava_anyres_train/data.jsonl", "next_", F "/next_losses.txt", 24,
                                    "layers.2.", 18};
    if (test_part(argc, argv, "clip")) check_case(&clip);
    if (test_part(argc, argv, "ov")) check_case(&ov);
    if (test_part(argc, argv, "next")) check_case(&next);
    return test_done("test_llava_tower_lora");
}
