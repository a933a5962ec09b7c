/* test_adapter.c — inference on a PEFT LoRA adapter without merging (src/nn/lora.c
 * mmc_lora_resolve, mmc_qwen2{,_vl}_attach_adapter): for a Qwen2-VL, a Qwen2.5-VL (the Hub's
 * weight names) and a text Qwen2, the logits of base + adapter (applied in the linears) equal
 * those of the `mmc merge`d model (mmc_lora_merge_dir) within 1e-5, and differ from the
 * base's (the adapter does something). The VL adapters cover vision blocks, the merger and
 * the language model. Also: the base is found from adapter_config.json's
 * base_model_name_or_path (absolute, relative to the working directory or to the adapter),
 * and wrong combinations fail with a message saying what to pass. */
#include "test_util.h"
#include "mmc_lora.h"
#include "mmc_vl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void rm_dir(const char *d) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d);
}

/* logits [T, V] of a prompt with one image (grid 1 x 4 x 4 -> 4 merged tokens), as a copy */
static float *vl_logits(mmc_qwen2_vl *m, int64_t *n_out) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    const mmc_vision_config *c = &m->visual->cfg;
    int64_t P = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    int64_t grid[3] = {1, 4, 4};
    mmc_tensor *px = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(16, P));                /* [16, P] */
    mmc_rng r;
    mmc_rng_init(&r, 11);
    mmc_rng_normal(&r, px->data, mmc_numel(px), 0.0f, 1.0f);
    int32_t ids[12] = {5, 17, 42, (int32_t)m->vision_start_token_id};
    for (int i = 0; i < 4; i++) ids[4 + i] = (int32_t)m->image_token_id;
    ids[8] = 60;
    ids[9] = 33, ids[10] = 7, ids[11] = 99;
    mmc_tensor *t = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, 12));
    memcpy(t->data, ids, sizeof ids);
    mmc_vl_media media = {.pixel_values = px, .image_grid_thw = grid, .n_images = 1};
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_qwen2_vl_forward(ctx, m, t, &media, NULL, NULL, &h));
    float *out = NULL;
    if (h) {
        mmc_tensor *lg = mmc_contiguous(ctx, mmc_qwen2_vl_logits(ctx, m, h));  /* [1, 12, V] */
        *n_out = mmc_numel(lg);
        out = malloc((size_t)*n_out * sizeof *out);
        memcpy(out, lg->data, (size_t)*n_out * sizeof *out);
    }
    mmc_ctx_free(ctx);
    return out;
}

static double max_abs_diff_f(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* A random adapter (A kaiming, B nonzero) on the given targets of `base`, saved in `dir` with
 * base_model_name_or_path = recorded. */
static void make_vl_adapter(const char *base, const char *dir, const char *recorded, const char *const *targets,
                            int n_targets) {
    mmc_qwen2_vl *m = NULL;
    CHECK_OK(mmc_qwen2_vl_load(base, false, &m));
    if (!m) return;
    mmc_module_list ml = {0};
    CHECK_OK(mmc_qwen2_vl_linears(m, &ml));
    mmc_lora_config lc = {.r = 4, .alpha = 8, .targets = targets, .n_targets = n_targets, .seed = 3};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_attach(&ml, &lc, &s));
    if (s) {
        mmc_rng r;
        mmc_rng_init(&r, 5);
        for (int i = 0; i < s->n; i++)
            mmc_rng_uniform(&r, s->adapters[i].B->data, mmc_numel(s->adapters[i].B), -0.2f, 0.2f);
        CHECK_OK(mmc_lora_save(s, dir, recorded));
    }
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_qwen2_vl_free(m);
}

/* want_vision: adapted vision + merger modules expected (0: at least one) */
static void vl_case(const char *base, const char *const *targets, int n_targets, int want_vision) {
    char dir[] = "/tmp/mmc_test_adapter_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char ad[1100], merged[1100], f32[1100];
    const char *name = base;
    /* a bf16 base would be rounded back to bf16 by the merge (as peft's merge_and_unload does
     * in the weight's dtype), while the unmerged adapter adds B(Ax) in f32: compare on an f32
     * copy of the base (same names, same values) */
    snprintf(f32, sizeof f32, "%s/base_f32", dir);
    {
        char path[1200];
        snprintf(path, sizeof path, "%s/model.safetensors", base);
        mmc_st *st = NULL;
        CHECK_OK(mmc_st_open(path, &st));
        mmc_stw *w = mmc_stw_new();
        int n = st ? mmc_st_count(st) : 0;
        void **bufs = calloc((size_t)n + 1, sizeof *bufs);
        for (int i = 0; i < n; i++) {
            const mmc_st_entry *e = mmc_st_at(st, i);
            int64_t k = 1;
            for (int d = 0; d < e->ndim; d++) k *= e->shape[d];
            bool fl = e->dtype == MMC_BF16 || e->dtype == MMC_F16 || e->dtype == MMC_F32;
            bufs[i] = malloc((size_t)k * (fl ? 4 : mmc_dtype_size(e->dtype)) + 1);
            if (fl) mmc_convert(bufs[i], MMC_F32, e->data, e->dtype, k);
            else memcpy(bufs[i], e->data, (size_t)k * mmc_dtype_size(e->dtype));
            CHECK_OK(mmc_stw_add_raw(w, e->name, fl ? MMC_F32 : e->dtype, e->ndim, e->shape, bufs[i]));
        }
        CHECK(mkdir(f32, 0755) == 0);
        snprintf(path, sizeof path, "%s/model.safetensors", f32);
        CHECK_OK(mmc_stw_write(w, path));
        char cmd[2600];
        snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s/'", base, f32);
        CHECK(system(cmd) == 0);
        for (int i = 0; i < n; i++) free(bufs[i]);
        free(bufs);
        mmc_stw_free(w);
        mmc_st_close(st);
        base = f32;
    }
    snprintf(ad, sizeof ad, "%s/checkpoint-4", dir);
    snprintf(merged, sizeof merged, "%s/merged", dir);
    make_vl_adapter(base, ad, base, targets, n_targets);

    /* the checkpoint names its base */
    char b[4096], a[4096];
    CHECK_OK(mmc_lora_resolve(ad, NULL, b, sizeof b, a, sizeof a));
    CHECKF(!strcmp(b, base) && !strcmp(a, ad), "resolved base '%s' adapter '%s'", b, a);

    mmc_qwen2_vl *m0 = NULL, *m1 = NULL, *m2 = NULL;
    CHECK_OK(mmc_qwen2_vl_load(base, false, &m0));
    CHECK_OK(mmc_qwen2_vl_load(b, false, &m1));
    CHECK_OK(mmc_qwen2_vl_attach_adapter(m1, a));
    CHECK(m1 && m1->adapter && m1->adapter->n > 0);
    int nv = 0;
    for (int i = 0; m1 && m1->adapter && i < m1->adapter->n; i++) nv += strstr(m1->adapter->names[i], "visual.") != NULL;
    CHECKF(want_vision > 0 ? nv == want_vision : nv > 0, "%d adapted vision/merger modules, want %d", nv, want_vision);
    CHECK_ERR(mmc_qwen2_vl_attach_adapter(m1, a), MMC_ERR_INVALID);    /* one adapter at a time */
    int n_merged = 0;
    CHECK_OK(mmc_lora_merge_dir(base, ad, merged, &n_merged));
    CHECK(m1 && m1->adapter && n_merged == m1->adapter->n);
    CHECK_OK(mmc_qwen2_vl_load(merged, false, &m2));
    if (m0 && m1 && m2) {
        int64_t n0 = 0, n1 = 0, n2 = 0;
        float *l0 = vl_logits(m0, &n0), *l1 = vl_logits(m1, &n1), *l2 = vl_logits(m2, &n2);
        CHECK(n0 == n1 && n1 == n2 && n0 > 0);
        if (l0 && l1 && l2 && n0 == n1 && n1 == n2) {
            double d12 = max_abs_diff_f(l1, l2, n1), d01 = max_abs_diff_f(l0, l1, n1);
            printf("%s: base+adapter vs merged max |dlogit| %.2e (adapter moves logits by %.2e)\n", name, d12, d01);
            CHECKF(d12 <= 1e-5, "base+adapter vs merged: max |dlogit| %.3g > 1e-5", d12);
            CHECKF(d01 > 1e-3, "the adapter changes nothing (%.3g)", d01);
        }
        free(l0), free(l1), free(l2);
    }
    /* freeing the model frees its adapter (ASan/LSan check) */
    mmc_qwen2_vl_free(m0);
    mmc_qwen2_vl_free(m1);
    mmc_qwen2_vl_free(m2);
    rm_dir(dir);
}

/* the text model: PEFT's own adapter for tests/fixtures/qwen2/tiny */
static void text_case(void) {
    const char *base = "tests/fixtures/qwen2/tiny", *ad = "tests/fixtures/lora/peft_adapter";
    char b[4096], a[4096];
    /* its base_model_name_or_path is an absolute path of the machine that wrote it */
    CHECK_ERR(mmc_lora_resolve(ad, NULL, b, sizeof b, a, sizeof a), MMC_ERR_NOT_FOUND);
    CHECKF(strstr(mmc_last_error(), "not found") && strstr(mmc_last_error(), "--model BASE --adapter"),
           "message: %s", mmc_last_error());
    CHECK_OK(mmc_lora_resolve(base, ad, b, sizeof b, a, sizeof a));
    CHECK(!strcmp(b, base) && !strcmp(a, ad));
    mmc_json *cfg = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/qwen2/tiny/config.json", &cfg));
    char dir[] = "/tmp/mmc_test_adapter_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char merged[1100];
    snprintf(merged, sizeof merged, "%s/merged", dir);
    CHECK_OK(mmc_lora_merge_dir(base, ad, merged, NULL));
    mmc_qwen2 *m[3] = {0};
    CHECK_OK(mmc_qwen2_load(base, cfg, false, &m[0]));
    CHECK_OK(mmc_qwen2_load(base, cfg, false, &m[1]));
    CHECK_OK(mmc_qwen2_attach_adapter(m[1], ad));
    CHECK_OK(mmc_qwen2_load(merged, cfg, false, &m[2]));
    float *lg[3] = {0};
    int64_t V = m[0] ? m[0]->cfg.vocab_size : 0, T = 9;
    for (int k = 0; k < 3 && m[k]; k++) {
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, T));
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
        for (int64_t t = 0; t < T; t++) ((int32_t *)ids->data)[t] = (int32_t)((t * 37 + 5) % V), ((int64_t *)pos->data)[t] = t;
        mmc_tensor *cos, *sin;
        mmc_rope_table_1d(ctx, pos, (int)m[k]->cfg.head_dim, m[k]->cfg.rope_theta, &cos, &sin);
        mmc_attn_opts ao = {.causal = true};
        mmc_tensor *h = mmc_qwen2_forward(ctx, m[k], mmc_qwen2_embed(ctx, m[k], ids), cos, sin, &ao, NULL);
        mmc_tensor *l = mmc_contiguous(ctx, mmc_qwen2_logits(ctx, m[k], h));
        lg[k] = malloc(mmc_nbytes(l));
        memcpy(lg[k], l->data, mmc_nbytes(l));
        mmc_ctx_free(ctx);
    }
    if (lg[0] && lg[1] && lg[2]) {
        double d12 = max_abs_diff_f(lg[1], lg[2], T * V), d01 = max_abs_diff_f(lg[0], lg[1], T * V);
        printf("%s: base+adapter vs merged max |dlogit| %.2e (adapter moves logits by %.2e)\n", base, d12, d01);
        CHECKF(d12 <= 1e-5, "text base+adapter vs merged: max |dlogit| %.3g > 1e-5", d12);
        CHECKF(d01 > 1e-3, "the adapter changes nothing (%.3g)", d01);
    }
    for (int k = 0; k < 3; k++) { free(lg[k]); mmc_qwen2_free(m[k]); }
    mmc_json_free(cfg);
    rm_dir(dir);
}

/* where the base is looked for, and what wrong combinations say */
static void resolve_cases(void) {
    const char *base = "tests/fixtures/eval/model";
    const char *const t[] = {"q_proj"};
    char dir[] = "/tmp/mmc_test_adapter_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cwd[PATH_MAX], abs_base[PATH_MAX + 64], ad[1100], ad2[1100], b[4096], a[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    snprintf(abs_base, sizeof abs_base, "%s/%s", cwd, base);
    snprintf(ad, sizeof ad, "%s/abs", dir);
    make_vl_adapter(base, ad, abs_base, t, 1);                            /* absolute */
    CHECK_OK(mmc_lora_resolve(ad, NULL, b, sizeof b, a, sizeof a));
    CHECK(!strcmp(b, abs_base));
    /* relative to the working directory (as a training run from the repo root records it) */
    snprintf(ad2, sizeof ad2, "%s/cwd", dir);
    make_vl_adapter(base, ad2, base, t, 1);
    CHECK_OK(mmc_lora_resolve(ad2, NULL, b, sizeof b, a, sizeof a));
    CHECK(!strcmp(b, base) && !strcmp(a, ad2));
    /* relative to the adapter directory: <dir>/rel/../base */
    char link[1200];
    snprintf(link, sizeof link, "%s/base", dir);
    CHECK(symlink(abs_base, link) == 0);
    snprintf(ad2, sizeof ad2, "%s/rel", dir);
    make_vl_adapter(base, ad2, "../base", t, 1);
    CHECK_OK(mmc_lora_resolve(ad2, NULL, b, sizeof b, a, sizeof a));
    CHECKF(strstr(b, "/rel/../base") != NULL, "base %s", b);
    /* model without adapter; adapter without model; adapter on an adapter */
    CHECK_OK(mmc_lora_resolve(base, NULL, b, sizeof b, a, sizeof a));
    CHECK(!strcmp(b, base) && a[0] == 0);
    CHECK_OK(mmc_lora_resolve(NULL, ad, b, sizeof b, a, sizeof a));
    CHECK(!strcmp(b, abs_base) && !strcmp(a, ad));
    CHECK_ERR(mmc_lora_resolve(ad2, ad, b, sizeof b, a, sizeof a), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "is a LoRA adapter, not a base model"));
    CHECK_ERR(mmc_lora_resolve(base, base, b, sizeof b, a, sizeof a), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "not a LoRA adapter directory"));
    /* no base recorded (a run from model.init) */
    snprintf(ad2, sizeof ad2, "%s/nobase", dir);
    make_vl_adapter(base, ad2, NULL, t, 1);
    CHECK_ERR(mmc_lora_resolve(ad2, NULL, b, sizeof b, a, sizeof a), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "names no base model") && strstr(mmc_last_error(), "--model BASE --adapter"));
    /* an adapter whose modules the model lacks (text adapter with 2 layers on a 1-layer VL) */
    mmc_qwen2_vl *m = NULL;
    CHECK_OK(mmc_qwen2_vl_load(base, false, &m));
    if (m) {
        mmc_status st = mmc_qwen2_vl_attach_adapter(m, "tests/fixtures/lora/peft_adapter");
        CHECK(st != MMC_OK && m->adapter == NULL);
    }
    mmc_qwen2_vl_free(m);
    rm_dir(dir);
}

int main(void) {
    const char *const all_vl[] = {"qkv", "attn.proj", "fc1", "fc2", "merger.mlp.0", "merger.mlp.2",
                                  "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    vl_case("tests/fixtures/eval/model", all_vl, 13, 6);
    const char *const q25[] = {"qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                               "merger.mlp.0", "q_proj", "v_proj", "o_proj"};
    vl_case("tests/fixtures/qwen2_vl/q25_hub", q25, 9, 0);   /* 0: some */
    text_case();
    resolve_cases();
    return test_done("test_adapter");
}
