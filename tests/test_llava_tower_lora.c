/* test_llava_tower_lora.c — LoRA on LLaVA-1.5's CLIP vision tower in `mmc train` (the tower's layers
 * listed by mmc_clip_vision_linears under transformers 5's live names, model.vision_tower.encoder.layers.N.*;
 * the tower runs with a tape once it carries adapters) against transformers 5.23 + PEFT 0.21.2
 * (tools/ref/gen_llava_tower_lora.py -> tests/fixtures/llava_tower_lora): from PEFT's initial adapter on the
 * tower's q_proj / v_proj / fc1 and the LM's q_proj / v_proj, 6 steps over llava_train's samples with
 * AdamW(lr 1, eps 1) — with eps far above every gradient each update is the gradient's running mean, so the
 * adapters compare the gradients that reached them — give
 *   - every step's loss within 1e-4 of PEFT's (measured 5e-6);
 *   - every trained adapter tensor within 1e-2 of PEFT's, normwise (||mmc - PEFT|| / ||PEFT||; measured 2.4e-3
 *     on the tower's layer-0 q_proj lora_B, whose gradient passes the attention's softmax derivative, and
 *     2e-4 or less on the LM's);
 *   - the controls: every tower adapter of layers 0-1 moved (its lora_B is zero at the start: a tower run
 *     without a tape leaves it there and fails the comparison), and layer 2's, whose output LLaVA does not
 *     use (vision_feature_layer -2), stayed as it started. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int main(void) {
    char dir[] = "/tmp/mmc_test_llava_tower_lora.XXXXXX", yaml[128], log[128], ck[160];
    MMC_CHECK(mkdtemp(dir), "cannot create a folder under /tmp");
    snprintf(yaml, sizeof yaml, "%s/run.yaml", dir);
    snprintf(log, sizeof log, "%s/train.log", dir);
    FILE *y = fopen(yaml, "w");
    MMC_CHECK(y, "cannot write %s", yaml);
    fprintf(y, "model: {path: tests/fixtures/llava/v5, dtype: f32, lora: {r: 4, alpha: 8, init: " F "/lora_init}}\n"
               "data: {train: tests/fixtures/llava_train/data.jsonl, batch_size: 1, micro_batch_size: 1, shuffle: false, "
               "num_workers: 0, seq_len: 512}\n"
               "optimizer: {lr: 1.0, eps: 1.0, weight_decay: 0.0, schedule: constant, grad_clip: 0}\n"
               "training: {steps: 6, log_every: 1, save_every: 6, output_dir: %s/out, seed: 0}\n", dir);
    fclose(y);
    mmc_status st = train_run(yaml, NULL, 0, 2, log);   /* its stderr: the step lines */
    CHECKF(st == MMC_OK, "training: %s", mmc_last_error());
    if (st) { mmc_rm_rf(dir); return test_done("test_llava_tower_lora"); }
    /* losses */
    FILE *a = fopen(log, "r"), *b = fopen(F "/losses.txt", "r");
    char line[512];
    double got[8], want[8], worst = 0;
    int n = 0, m = 0, s, tot;
    while (a && fgets(line, sizeof line, a))
        if (n < 8 && sscanf(line, "step %d/%d loss %lf", &s, &tot, &got[n]) == 3) n++;
    while (b && m < 8 && fscanf(b, "%lf", &want[m]) == 1) m++;
    if (a) fclose(a);
    if (b) fclose(b);
    CHECKF(n == 6 && m == 6, "%d losses logged, %d in the fixture (6 each expected)", n, m);
    for (int i = 0; i < n && i < m; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    printf("6 steps with the CLIP tower's LoRA: max |loss - PEFT's| = %.3g (tolerance 1e-4)\n", worst);
    CHECKF(worst <= 1e-4, "losses differ from PEFT's by %.3g", worst);
    /* adapters */
    snprintf(ck, sizeof ck, "%s/out/checkpoint-6/adapter_model.safetensors", dir);
    mmc_st *got_st = NULL, *ref = fixture_open("llava_tower_lora/lora_ref/adapter_model.safetensors"),
           *init = fixture_open("llava_tower_lora/lora_init/adapter_model.safetensors");
    CHECK_OK(mmc_st_open(ck, &got_st));
    if (got_st && ref && init) {
        CHECKF(mmc_st_count(got_st) == mmc_st_count(ref), "%d adapter tensors, PEFT has %d", mmc_st_count(got_st),
               mmc_st_count(ref));
        double wt = 0, wl = 0;
        int tower = 0;
        for (int i = 0; i < mmc_st_count(ref); i++) {
            const char *k = mmc_st_at(ref, i)->name;
            if (!mmc_st_find(got_st, k)) { CHECKF(false, "the checkpoint lacks %s", k); continue; }
            mmc_tensor *x = fixture_tensor(got_st, k, MMC_F32), *r = fixture_tensor(ref, k, MMC_F32),
                       *x0 = fixture_tensor(init, k, MMC_F32);
            double nr, n0, moved = norm_diff(x, x0, &n0), d = norm_diff(x, r, &nr);
            const bool is_tower = strstr(k, "vision_tower") != NULL, unused = strstr(k, "layers.2.") != NULL;
            if (is_tower && unused) {
                CHECKF(moved == 0, "%s: layer 2's adapter (its output unused) moved by %.3g", k, moved);
            } else {
                const double rel = d / nr;
                if (is_tower) wt = fmax(wt, rel), tower++;
                else wl = fmax(wl, rel);
                CHECKF(rel <= 1e-2, "%s: ||mmc - PEFT|| / ||PEFT|| = %.3g", k, rel);
                if (is_tower) CHECKF(moved > 0, "%s: the tower's adapter did not move (no gradient reached it)", k);
            }
            mmc_tensor_free(x), mmc_tensor_free(r), mmc_tensor_free(x0);
        }
        printf("adapters after 6 steps, ||mmc - PEFT|| / ||PEFT|| per tensor: tower (%d tensors) %.3g, LM %.3g "
               "(tolerance 1e-2)\n", tower, wt, wl);
        CHECKF(tower == 12, "%d trained tower adapter tensors, 12 expected", tower);
    }
    mmc_st_close(got_st);
    mmc_st_close(ref);
    mmc_st_close(init);
    mmc_rm_rf(dir);
    return test_done("test_llava_tower_lora");
}
