/* test_qwen2_vl.c — Qwen2-VL and Qwen2.5-VL against transformers (tools/ref/gen_qwen2_vl.py):
 * vision tower outputs, M-RoPE position ids and rope deltas (get_rope_index), logits for
 * text-only, one image, two images of different sizes, a video, and image + video prompts,
 * in both weight/config layouts (5.x f32 and the Hub's with bf16 matrices), greedy
 * generation through the KV cache (token-identical for 32 tokens), and the errors a user
 * can cause (placeholder/image count mismatch, wrong pixel count, a missing vision weight). */
#include "test_util.h"
#include "mmc_vl.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static mmc_st *ref;

typedef struct {
    const char *name;
    const char *pix[2];       /* pixel fixtures of the images, in order */
    bool video;
} vl_case;

static const vl_case CASES[] = {
    {"text", {NULL, NULL}, false},
    {"image", {"pixels.g146", NULL}, false},
    {"two_images", {"pixels.g146", "pixels.g164"}, false},
    {"video", {NULL, NULL}, true},
    {"mixed", {"pixels.g164", NULL}, true},
};

/* Media of a case; tensors are persistent and freed by media_free. */
typedef struct {
    mmc_vl_media m;
    int64_t ig[6], vg[3];
    double spg[1];
} media_buf;

static void grid_read(const char *key, int64_t *dst, int *n) {
    const mmc_st_entry *e = mmc_st_find(ref, key);
    *n = 0;
    if (!e) return;
    mmc_tensor *g = fixture_tensor(ref, key, MMC_I64);
    *n = (int)g->shape[0];
    memcpy(dst, g->data, sizeof(int64_t) * 3 * (size_t)*n);
    mmc_tensor_free(g);
}

static mmc_tensor *cat_rows(mmc_tensor *a, mmc_tensor *b) {
    if (!b) return a;
    mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(a->shape[0] + b->shape[0], a->shape[1]));
    memcpy(t->data, a->data, mmc_nbytes(a));
    memcpy((char *)t->data + mmc_nbytes(a), b->data, mmc_nbytes(b));
    mmc_tensor_free(a);
    mmc_tensor_free(b);
    return t;
}

static void media_make(const vl_case *c, bool q25, media_buf *mb) {
    memset(mb, 0, sizeof *mb);
    char key[128];
    snprintf(key, sizeof key, "%s.image_grid_thw", c->name);
    grid_read(key, mb->ig, &mb->m.n_images);
    mb->m.image_grid_thw = mb->ig;
    if (c->pix[0])
        mb->m.pixel_values = cat_rows(fixture_tensor(ref, c->pix[0], MMC_F32),
                                      c->pix[1] ? fixture_tensor(ref, c->pix[1], MMC_F32) : NULL);
    snprintf(key, sizeof key, "%s.video_grid_thw", c->name);
    grid_read(key, mb->vg, &mb->m.n_videos);
    mb->m.video_grid_thw = mb->vg;
    if (c->video) mb->m.pixel_values_videos = fixture_tensor(ref, "pixels.video", MMC_F32);
    mb->spg[0] = 1.3;   /* the generator's second_per_grid_ts (Qwen2.5-VL) */
    if (q25 && c->video) mb->m.second_per_grid_ts = mb->spg;
}

static void media_free(media_buf *mb) {
    mmc_tensor_free(mb->m.pixel_values);
    mmc_tensor_free(mb->m.pixel_values_videos);
}

static mmc_qwen2_vl *load(const char *dir) {
    mmc_qwen2_vl *m = NULL;
    mmc_status st = mmc_qwen2_vl_load(dir, false, &m);
    if (st) { fprintf(stderr, "load %s: %s\n", dir, mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static void test_vision(mmc_qwen2_vl *m, const char *arch) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    struct { const char *name, *p0, *p1; int64_t g[6]; int n; } vc[] = {
        {"g146", "pixels.g146", NULL, {1, 4, 6}, 1},
        {"two", "pixels.g146", "pixels.g164", {1, 4, 6, 1, 6, 4}, 2},
        {"video", "pixels.video", NULL, {2, 4, 4}, 1},
    };
    for (int i = 0; i < 3; i++) {
        mmc_tensor *px = cat_rows(fixture_tensor(ref, vc[i].p0, MMC_F32),
                                  vc[i].p1 ? fixture_tensor(ref, vc[i].p1, MMC_F32) : NULL);
        mmc_tensor *out, *hid;
        CHECK_OK(mmc_vision_forward(ctx, m->visual, px, vc[i].g, vc[i].n, &out, &hid));
        char key[128], what[300];
        snprintf(key, sizeof key, "%s.vision.%s", arch, vc[i].name);
        mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
        snprintf(what, sizeof what, "%s vision tower output (1e-4 max-abs)", key);
        if (out) CHECK_CLOSE(out, want, 1e-4, 0, what);
        mmc_tensor_free(want);
        snprintf(key, sizeof key, "%s.vision_hidden.%s", arch, vc[i].name);
        if (mmc_st_find(ref, key) && hid) {
            want = fixture_tensor(ref, key, MMC_F32);
            snprintf(what, sizeof what, "%s last hidden state (1e-4 max-abs)", key);
            CHECK_CLOSE(hid, want, 1e-4, 0, what);
            mmc_tensor_free(want);
        }
        mmc_tensor_free(px);
        mmc_ctx_reset(ctx);
    }
    mmc_ctx_free(ctx);
}

/* The vision tower and the full forward with autograd on (the training path: one tensor per
 * op, kept for backward) and off (the inference form: residual stream in place, row chunks)
 * give the same numbers. */
static void test_train_vs_infer(mmc_qwen2_vl *m, const char *arch) {
    const vl_case *c = &CASES[2];   /* two images of different sizes */
    char key[128], what[200];
    snprintf(key, sizeof key, "%s.ids", c->name);
    mmc_tensor *ids = fixture_tensor(ref, key, MMC_I64);
    media_buf mb;
    media_make(c, m->arch == MMC_VL_QWEN2_5, &mb);
    mmc_ctx *ct = mmc_ctx_new(), *ci = mmc_ctx_new();
    mmc_set_grad_enabled(ci, false);
    setenv("MMC_INFER_CHUNK_ROWS", "5", 1);
    mmc_tensor *vt = NULL, *vi = NULL, *ht = NULL, *hi = NULL;
    CHECK_OK(mmc_vision_forward(ct, m->visual, mb.m.pixel_values, mb.m.image_grid_thw, 2, &vt, NULL));
    CHECK_OK(mmc_vision_forward(ci, m->visual, mb.m.pixel_values, mb.m.image_grid_thw, 2, &vi, NULL));
    snprintf(what, sizeof what, "%s vision tower: inference form vs autograd form (1e-5)", arch);
    if (vt && vi) CHECK_CLOSE(vi, vt, 1e-5, 0, what);
    int64_t dt, di;
    CHECK_OK(mmc_qwen2_vl_forward(ct, m, ids, &mb.m, NULL, &dt, &ht));
    CHECK_OK(mmc_qwen2_vl_forward(ci, m, ids, &mb.m, NULL, &di, &hi));
    snprintf(what, sizeof what, "%s two-image hidden states: inference form vs autograd form (1e-5)", arch);
    if (ht && hi) CHECK_CLOSE(hi, ht, 1e-5, 0, what);
    unsetenv("MMC_INFER_CHUNK_ROWS");
    mmc_ctx_free(ct);
    mmc_ctx_free(ci);
    media_free(&mb);
    mmc_tensor_free(ids);
}

static void test_rope_index(mmc_qwen2_vl *m, const char *arch) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const vl_case *c = &CASES[i];
        char key[128];
        snprintf(key, sizeof key, "%s.%s.position_ids", arch, c->name);
        if (!mmc_st_find(ref, key)) continue;
        mmc_tensor *want = fixture_tensor(ref, key, MMC_I64);
        snprintf(key, sizeof key, "%s.%s.rope_deltas", arch, c->name);
        mmc_tensor *wd = fixture_tensor(ref, key, MMC_I64);
        snprintf(key, sizeof key, "%s.ids", c->name);
        mmc_tensor *ids = fixture_tensor(ref, key, MMC_I32);
        media_buf mb;
        media_make(c, m->arch == MMC_VL_QWEN2_5, &mb);
        int64_t T = ids->shape[1], *pos = calloc(3 * (size_t)T, sizeof *pos), delta = -999;
        CHECK_OK(mmc_qwen2_vl_rope_index(m, ids->data, 1, T, &mb.m, pos, &delta));
        int bad = 0;
        for (int64_t k = 0; k < 3 * T; k++) bad += pos[k] != ((int64_t *)want->data)[k];
        CHECKF(bad == 0, "%s %s: %d position ids differ from get_rope_index", arch, c->name, bad);
        CHECKF(delta == ((int64_t *)wd->data)[0], "%s %s: rope delta %lld, transformers %lld", arch, c->name,
               (long long)delta, (long long)((int64_t *)wd->data)[0]);
        free(pos);
        media_free(&mb);
        mmc_tensor_free(ids);
        mmc_tensor_free(want);
        mmc_tensor_free(wd);
    }
}

static void test_logits(mmc_qwen2_vl *m, const char *arch, const char *layout) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const vl_case *c = &CASES[i];
        char key[128], what[200];
        snprintf(key, sizeof key, "%s.ids", c->name);
        mmc_tensor *ids = fixture_tensor(ref, key, MMC_I64);
        snprintf(key, sizeof key, "%s.%s.logits", arch, c->name);
        mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
        media_buf mb;
        media_make(c, m->arch == MMC_VL_QWEN2_5, &mb);
        mmc_tensor *h = NULL;
        int64_t delta = -999;
        CHECK_OK(mmc_qwen2_vl_forward(ctx, m, ids, &mb.m, NULL, &delta, &h));
        if (h) {
            snprintf(what, sizeof what, "%s logits, %s layout (1e-4 max-abs)", key, layout);
            CHECK_CLOSE(mmc_qwen2_vl_logits(ctx, m, h), want, 1e-4, 0, what);
        }
        media_free(&mb);
        mmc_tensor_free(ids);
        mmc_tensor_free(want);
        mmc_ctx_reset(ctx);
    }
    mmc_ctx_free(ctx);
}

static void test_greedy(mmc_qwen2_vl *m, const char *arch, const char *layout) {
    const vl_case *cs[] = {&CASES[1], &CASES[4]};
    for (int i = 0; i < 2; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.ids", cs[i]->name);
        mmc_tensor *ids = fixture_tensor(ref, key, MMC_I32);
        snprintf(key, sizeof key, "%s.%s.greedy", arch, cs[i]->name);
        mmc_tensor *want = fixture_tensor(ref, key, MMC_I64);
        media_buf mb;
        media_make(cs[i], m->arch == MMC_VL_QWEN2_5, &mb);
        mmc_gen_opts o = {.max_new_tokens = 32};
        mmc_sampler_defaults(&o.sampler);
        int32_t out[32];
        int n = 0;
        mmc_qwen2_vl_request req = {m, &mb.m, 0};
        mmc_decoder dec = mmc_qwen2_vl_decoder(&req);
        CHECK_OK(mmc_generate(&dec, ids->data, ids->shape[1], &o, out, &n));
        int same = 0;
        for (int k = 0; k < n && k < 32; k++) same += out[k] == ((int64_t *)want->data)[k];
        CHECKF(n == 32 && same == 32, "%s %s greedy (%s layout): %d of %d tokens identical to transformers",
               arch, cs[i]->name, layout, same, n);
        media_free(&mb);
        mmc_tensor_free(ids);
        mmc_tensor_free(want);
    }
}

/* Logits of the two-image case (a persistent copy; NULL on failure). */
static mmc_tensor *two_image_logits(mmc_qwen2_vl *m) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *ids = fixture_tensor(ref, "two_images.ids", MMC_I64), *h = NULL, *out = NULL;
    media_buf mb;
    media_make(&CASES[2], m->arch == MMC_VL_QWEN2_5, &mb);
    int64_t delta = 0;
    CHECK_OK(mmc_qwen2_vl_forward(ctx, m, ids, &mb.m, NULL, &delta, &h));
    if (h) {
        mmc_tensor *lg = mmc_qwen2_vl_logits(ctx, m, h);
        out = mmc_tensor_new(MMC_F32, lg->ndim, lg->shape);
        memcpy(out->data, lg->data, mmc_nbytes(lg));
    }
    media_free(&mb);
    mmc_tensor_free(ids);
    mmc_ctx_free(ctx);
    return out;
}

/* Pre-packed weights (mmc_qwen2_vl_prepack, as the inference commands load a model): the packed
 * copies replace the f32 weights; every GEMM of these prompts has more than 4 rows, where the
 * packed path sums as the unpacked one does, so the logits are the same bits; then the fixture
 * checks again (vision, logits, greedy generation, whose decode steps run the packed path on 1 row). */
static void test_prepacked(mmc_qwen2_vl *m, const char *arch, const char *layout) {
    mmc_tensor *before = two_image_logits(m);
    int n = 0, n_params = m->lm->n_params + m->visual->n_params;
    int64_t b0 = 0, b1 = 0;
    CHECK_OK(mmc_qwen2_vl_prepack(m, &n, &b0, &b1));
    CHECKF(n > 0 && m->lm->n_params + m->visual->n_params == n_params - n && b1 >= b0 && b1 < 2 * b0 + (1 << 20),
           "%s %s: prepack: %d linears, %d -> %d params, %lld -> %lld bytes", arch, layout, n, n_params,
           m->lm->n_params + m->visual->n_params, (long long)b0, (long long)b1);
    mmc_tensor *after = two_image_logits(m);
    CHECKF(before && after && mmc_nbytes(before) == mmc_nbytes(after) &&
               memcmp(before->data, after->data, mmc_nbytes(before)) == 0,
           "%s %s: logits with pre-packed weights differ from the unpacked ones (max |diff| %.3g)", arch, layout,
           before && after ? max_abs_diff(before, after) : -1.0);
    mmc_tensor_free(before);
    mmc_tensor_free(after);
    test_vision(m, arch);
    test_logits(m, arch, layout);
    test_greedy(m, arch, layout);
}

static void test_errors(mmc_qwen2_vl *m) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *ids = fixture_tensor(ref, "image.ids", MMC_I64);   /* 6 image placeholders */
    media_buf mb;
    media_make(&CASES[1], false, &mb);
    /* a 4x4 grid gives 4 features for 6 placeholders */
    int64_t g44[3] = {1, 4, 4};
    mmc_vl_media bad = mb.m;
    bad.image_grid_thw = g44;
    mmc_tensor *h;
    CHECK_ERR(mmc_qwen2_vl_forward(ctx, m, ids, &bad, NULL, NULL, &h), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "has 6 <|image_pad|> tokens") && strstr(mmc_last_error(), "gives 4 features"),
           "message names both counts: %s", mmc_last_error());
    /* no images at all for a prompt with placeholders */
    CHECK_ERR(mmc_qwen2_vl_forward(ctx, m, ids, NULL, NULL, NULL, &h), MMC_ERR_INVALID);
    CHECKF(strstr(mmc_last_error(), "has 6 <|image_pad|> tokens") && strstr(mmc_last_error(), "give 0 features"),
           "message: %s", mmc_last_error());
    /* pixel rows that do not match the grid */
    int64_t g2x[3] = {1, 2, 12};   /* 6 tokens like the prompt, 24 patches like the pixels: fine */
    bad.image_grid_thw = g2x;
    CHECK_OK(mmc_qwen2_vl_forward(ctx, m, ids, &bad, NULL, NULL, &h));
    int64_t g3[3] = {1, 6, 4};
    bad.image_grid_thw = g3;
    mmc_tensor *few = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(20, mb.m.pixel_values->shape[1]));
    bad.pixel_values = few;
    CHECK_ERR(mmc_qwen2_vl_forward(ctx, m, ids, &bad, NULL, NULL, &h), MMC_ERR_SHAPE);
    CHECKF(strstr(mmc_last_error(), "[20, 1176]") && strstr(mmc_last_error(), "[24, 1176]"),
           "message: %s", mmc_last_error());
    mmc_tensor_free(few);
    /* a token outside the vocabulary */
    ((int64_t *)ids->data)[0] = 100000;
    CHECK_ERR(mmc_qwen2_vl_forward(ctx, m, ids, &mb.m, NULL, NULL, &h), MMC_ERR_INVALID);
    media_free(&mb);
    mmc_tensor_free(ids);
    mmc_ctx_free(ctx);
}

/* A copy of the Hub checkpoint without one vision weight and with one LM weight of the wrong
 * shape: loading names both. */
static void test_missing_weight(void) {
    char dir[] = "/tmp/mmc_vl_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(!"mkdtemp"); return; }
    char p[256], q[256];
    char *cfg;
    size_t n;
    CHECK_OK(mmc_read_file("tests/fixtures/qwen2_vl/q2_hub/config.json", &cfg, &n));
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK_OK(mmc_write_file_atomic(p, cfg, n));
    free(cfg);
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open("tests/fixtures/qwen2_vl/q2_hub", &st));
    if (!st) return;
    mmc_stw *w = mmc_stw_new();
    const int64_t short_bias[1] = {31};
    for (int i = 0; i < mmc_st_count(st); i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        if (!strcmp(e->name, "visual.blocks.1.attn.qkv.weight")) continue;
        if (!strcmp(e->name, "model.layers.1.self_attn.k_proj.bias"))
            CHECK_OK(mmc_stw_add_raw(w, e->name, e->dtype, 1, short_bias, e->data));
        else
            CHECK_OK(mmc_stw_add_raw(w, e->name, e->dtype, e->ndim, e->shape, e->data));
    }
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    CHECK_OK(mmc_stw_write(w, q));
    mmc_stw_free(w);
    mmc_st_close(st);
    mmc_qwen2_vl *m = NULL;
    CHECK_ERR(mmc_qwen2_vl_load(dir, false, &m), MMC_ERR_FORMAT);
    CHECK(m == NULL);
    CHECKF(strstr(mmc_last_error(), "missing tensor 'visual.blocks.1.attn.qkv.weight'") != NULL,
           "names the missing vision weight: %s", mmc_last_error());
    CHECKF(strstr(mmc_last_error(), "'model.layers.1.self_attn.k_proj.bias': expected shape [32], found [31]") != NULL,
           "names the mis-shaped LM weight too: %s", mmc_last_error());
    unlink(p);
    unlink(q);
    rmdir(dir);
}

/* config.json inputs that were undefined behaviour in the readers (found while fuzzing
 * fuzz_model_config; kept as its corpus): a double past int64 converted, sizes whose sum or
 * product overflowed. Each is refused, naming the key. */
static void test_config_regressions(void) {
    static const struct { const char *file, *key; mmc_vl_arch arch; } cases[] = {
        {"regress_mlp_ratio_1e300.json", "mlp_ratio", MMC_VL_QWEN2},
        {"regress_mrope_overflow.json", "mrope_section", MMC_VL_QWEN2},
        {"regress_merge_times_patch_overflow.json", "spatial_merge_size", MMC_VL_QWEN2_5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[256];
        snprintf(path, sizeof path, "fuzz/corpus/model_config/%s", cases[i].file);
        mmc_json *j = NULL;
        CHECK_OK(mmc_json_load(path, &j));
        if (!j) continue;
        mmc_qwen2_config tc;
        mmc_vision_config vc;
        mmc_status st = mmc_qwen2_config_read(j, &tc);
        if (!st) st = mmc_vision_config_read(j, cases[i].arch, &vc);
        CHECKF(st == MMC_ERR_FORMAT && strstr(mmc_last_error(), cases[i].key), "%s: status %d, message: %s",
               cases[i].file, st, mmc_last_error());
        mmc_json_free(j);
    }
}

int main(void) {
    ref = fixture_open("qwen2_vl/ref.safetensors");
    if (!ref) return test_done("test_qwen2_vl");
    const char *archs[] = {"q2", "q25"}, *layouts[] = {"v5", "hub"};
    for (int a = 0; a < 2; a++)
        for (int l = 0; l < 2; l++) {
            char dir[256];
            snprintf(dir, sizeof dir, "tests/fixtures/qwen2_vl/%s_%s", archs[a], layouts[l]);
            mmc_qwen2_vl *m = load(dir);
            if (!m) continue;
            CHECKF(m->arch == (a ? MMC_VL_QWEN2_5 : MMC_VL_QWEN2) && m->hub_layout == (l == 1),
                   "%s: arch %d hub %d", dir, m->arch, m->hub_layout);
            CHECK(m->lm->cfg.mrope && m->lm->cfg.mrope_section[0] == 2 && m->lm->cfg.mrope_section[2] == 3);
            CHECK(a == 1 || m->lm->lm_head == m->lm->embed);   /* Qwen2-VL fixture: tied head */
            test_vision(m, archs[a]);
            if (l == 0) test_rope_index(m, archs[a]);
            test_logits(m, archs[a], layouts[l]);
            test_greedy(m, archs[a], layouts[l]);
            if (l == 0) {
                /* the inference forms' row chunks capped at 3 rows: the vision blocks, the
                 * merger and the LM's MLP cross chunk boundaries on these small inputs */
                setenv("MMC_INFER_CHUNK_ROWS", "3", 1);
                test_vision(m, archs[a]);
                test_logits(m, archs[a], layouts[l]);
                unsetenv("MMC_INFER_CHUNK_ROWS");
                test_train_vs_infer(m, archs[a]);
            }
            if (a == 0 && l == 0) test_errors(m);
            if (l == 0) test_prepacked(m, archs[a], layouts[l]);   /* f32 weights (hub: bf16, kept unpacked) */
            mmc_qwen2_vl_free(m);
        }
    test_missing_weight();
    test_config_regressions();
    mmc_st_close(ref);
    return test_done("test_qwen2_vl");
}
