/* test_recompute.c — activation recompute (model.recompute: full) covers the vision tower:
 * on tiny Qwen2-VL and Qwen2.5-VL (window + full attention blocks) checkpoints, one
 * forward/backward of a batch with two images gives bitwise the same loss and gradients
 * (every vision, merger and LM parameter) with recompute off, on for the LM blocks only, and
 * on for the vision blocks too; the same with LoRA adapters (dropout on) on vision and LM
 * modules over a frozen base. Recomputing the vision blocks must shorten the tape (one node
 * per block) and lower the activation arena's peak, so the test fails if they are not wrapped;
 * a frozen tower with nothing to train records no checkpoint node at all. */
#include "test_util.h"
#include "mmc_data.h"
#include "mmc_trainer.h"
#include "mmc_vl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    float loss;
    int n;              /* gradients */
    float **g;          /* copies, in parameter order (NULL: no gradient) */
    int64_t *len;
    int tape;           /* tape nodes after forward */
    size_t peak;        /* activation arena high-water mark over forward + backward */
} run_out;

static void run_free(run_out *r) {
    for (int i = 0; i < r->n; i++) free(r->g[i]);
    free(r->g);
    free(r->len);
    memset(r, 0, sizeof *r);
}

/* two images of grids (1, 8, 8) and (1, 4, 8): 16 + 8 merged tokens, text around them */
static void make_batch(const mmc_qwen2_vl *m, mmc_batch *b) {
    memset(b, 0, sizeof *b);
    const mmc_vision_config *c = &m->visual->cfg;
    int64_t P = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    static int64_t grid[2][3] = {{1, 8, 8}, {1, 4, 8}};
    int64_t T = 3 + 16 + 2 + 8 + 6;
    b->B = 1, b->T = T, b->n_seqs = 1;
    b->input_ids = malloc(sizeof(int32_t) * (size_t)T);
    b->labels = malloc(sizeof(int32_t) * (size_t)T);
    int64_t t = 0;
    int32_t img = (int32_t)m->image_token_id, vs = (int32_t)m->vision_start_token_id;
    b->input_ids[t++] = 11, b->input_ids[t++] = 12, b->input_ids[t++] = vs;
    for (int i = 0; i < 16; i++) b->input_ids[t++] = img;
    b->input_ids[t++] = 13, b->input_ids[t++] = vs;
    for (int i = 0; i < 8; i++) b->input_ids[t++] = img;
    for (int i = 0; i < 6; i++) b->input_ids[t++] = 20 + 7 * i;
    for (int64_t i = 0; i < T; i++) b->labels[i] = i >= T - 6 ? b->input_ids[i] : MMC_IGNORE_INDEX;
    b->n_patches = 64 + 32;
    b->patch_dim = P;
    b->pixel_values = malloc(sizeof(float) * (size_t)(b->n_patches * P));
    mmc_rng r;
    mmc_rng_init(&r, 21);
    mmc_rng_normal(&r, b->pixel_values, b->n_patches * P, 0.0f, 1.0f);
    b->image_grid_thw = malloc(sizeof grid);
    memcpy(b->image_grid_thw, grid, sizeof grid);
    b->n_images = 2;
    b->n_tokens = T;
    b->n_label_tokens = 6;
}

static void collect(mmc_tensor **p, int n, run_out *r) {
    for (int i = 0; i < n; i++, r->n++) {
        r->g[r->n] = NULL;
        r->len[r->n] = 0;
        if (!p[i]->grad) continue;
        r->len[r->n] = mmc_numel(p[i]->grad);
        r->g[r->n] = malloc(mmc_nbytes(p[i]->grad));
        memcpy(r->g[r->n], p[i]->grad->data, mmc_nbytes(p[i]->grad));
        memset(p[i]->grad->data, 0, mmc_nbytes(p[i]->grad));
    }
}

static void run(mmc_qwen2_vl *m, mmc_lora_set *lora, bool rc_lm, bool rc_vis, run_out *r) {
    memset(r, 0, sizeof *r);
    m->lm->recompute = rc_lm;
    m->visual->recompute = rc_vis;
    mmc_batch b;
    make_batch(m, &b);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_nn_set_dropout_seed(ctx, 1234);
    mmc_tensor *loss = NULL;
    int64_t ns = 0;
    CHECK_OK(mmc_qwen2_vl_batch_loss(ctx, m, &b, 1.0 / 6, &loss, &ns));
    r->tape = mmc_tape_len(ctx);
    if (loss) {
        r->loss = ((float *)loss->data)[0];
        mmc_backward(ctx, loss);
    }
    r->peak = mmc_arena_peak(mmc_ctx_arena(ctx));
    int total = m->visual->n_params + m->lm->n_params + (lora ? lora->n_params : 0);
    r->g = calloc((size_t)total, sizeof *r->g);
    r->len = calloc((size_t)total, sizeof *r->len);
    collect(m->visual->params, m->visual->n_params, r);
    collect(m->lm->params, m->lm->n_params, r);
    if (lora) collect(lora->params, lora->n_params, r);
    mmc_ctx_free(ctx);
    mmc_batch_free(&b);
}

static int same(const run_out *a, const run_out *b, const char *what) {
    int diff = 0, with = 0;
    CHECKF(a->n == b->n, "%s: %d vs %d gradients", what, a->n, b->n);
    CHECKF(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: loss %.9g vs %.9g", what, a->loss, b->loss);
    for (int i = 0; i < a->n && i < b->n; i++) {
        if (!a->g[i] || !b->g[i]) { diff += !a->g[i] != !b->g[i]; continue; }
        with++;
        if (a->len[i] != b->len[i] || memcmp(a->g[i], b->g[i], sizeof(float) * (size_t)a->len[i])) {
            double mx = 0;
            for (int64_t k = 0; k < a->len[i] && a->len[i] == b->len[i]; k++) mx = fmax(mx, fabs(a->g[i][k] - b->g[i][k]));
            fprintf(stderr, "%s: gradient %d differs (max |d| %.3g)\n", what, i, mx);
            diff++;
        }
    }
    CHECKF(diff == 0, "%s: %d gradients differ", what, diff);
    return with;
}

static void case_model(const char *dir, bool with_lora) {
    mmc_qwen2_vl *m = NULL;
    CHECK_OK(mmc_qwen2_vl_load(dir, true, &m));
    if (!m) return;
    mmc_lora_set *lora = NULL;
    if (with_lora) {   /* adapters on vision blocks, merger and LM; everything else frozen */
        for (int i = 0; i < m->visual->n_params; i++) m->visual->params[i]->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        for (int i = 0; i < m->lm->n_params; i++) m->lm->params[i]->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        mmc_module_list ml = {0};
        CHECK_OK(mmc_qwen2_vl_linears(m, &ml));
        const char *const t[] = {"qkv", "attn.proj", "fc2", "mlp.down_proj", "merger.mlp.0", "q_proj", "o_proj"};
        mmc_lora_config lc = {.r = 2, .alpha = 4, .dropout = 0.1f, .targets = t, .n_targets = 7, .seed = 9};
        CHECK_OK(mmc_lora_attach(&ml, &lc, &lora));
        mmc_module_list_free(&ml);
        mmc_rng r;
        mmc_rng_init(&r, 2);
        for (int i = 0; lora && i < lora->n; i++)   /* B != 0 so every path carries gradient */
            mmc_rng_uniform(&r, lora->adapters[i].B->data, mmc_numel(lora->adapters[i].B), -0.1f, 0.1f);
    }
    run_out off, lm, all;
    run(m, lora, false, false, &off);
    run(m, lora, true, false, &lm);
    run(m, lora, true, true, &all);
    char what[256];
    snprintf(what, sizeof what, "%s%s recompute lm", dir, with_lora ? " +LoRA" : "");
    int n = same(&off, &lm, what);
    snprintf(what, sizeof what, "%s%s recompute lm+vision", dir, with_lora ? " +LoRA" : "");
    same(&off, &all, what);
    CHECKF(n > 0, "%s: no gradients at all", what);
    int depth = (int)m->visual->cfg.depth;
    /* each vision block becomes one checkpoint node */
    CHECKF(all.tape < lm.tape && lm.tape - all.tape >= depth, "%s: tape %d -> %d nodes with vision recompute (depth %d)",
           what, lm.tape, all.tape, depth);
    CHECKF(all.peak < lm.peak, "%s: activation peak %zu -> %zu bytes", what, lm.peak, all.peak);
    printf("%-32s%s: %d gradients bitwise equal; tape %d/%d/%d nodes, activation peak %zu/%zu/%zu bytes "
           "(recompute off / LM / LM+vision)\n", dir, with_lora ? " +LoRA" : "", n, off.tape, lm.tape, all.tape,
           off.peak, lm.peak, all.peak);
    run_free(&off);
    run_free(&lm);
    run_free(&all);
    mmc_lora_free(lora);
    mmc_qwen2_vl_free(m);
}

/* a frozen tower (vision params frozen, no adapters there) is not checkpointed: nothing to redo */
static void frozen_tower(const char *dir) {
    mmc_qwen2_vl *m = NULL;
    CHECK_OK(mmc_qwen2_vl_load(dir, true, &m));
    if (!m) return;
    for (int i = 0; i < m->visual->n_params; i++) m->visual->params[i]->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    run_out a, b;
    run(m, NULL, true, false, &a);
    run(m, NULL, true, true, &b);
    CHECKF(a.tape == b.tape, "frozen tower: tape %d vs %d nodes", a.tape, b.tape);
    same(&a, &b, "frozen tower");
    run_free(&a);
    run_free(&b);
    mmc_qwen2_vl_free(m);
}

int main(void) {
    case_model("tests/fixtures/qwen2_vl/q2_v5", false);
    case_model("tests/fixtures/qwen2_vl/q25_v5", false);
    case_model("tests/fixtures/qwen2_vl/q2_v5", true);
    case_model("tests/fixtures/qwen2_vl/q25_v5", true);
    frozen_tower("tests/fixtures/qwen2_vl/q2_v5");
    return test_done("test_recompute");
}
