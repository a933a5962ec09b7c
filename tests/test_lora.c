/* test_lora.c — LoRA and QLoRA against PEFT 0.21.2 and bitsandbytes 0.50.2
 * (tools/ref/gen_lora.py): target matching, gradcheck of the adapted linear, dropout
 * (mask/backward consistency, recompute-safe), PEFT adapter -> mmc logits, mmc adapter ->
 * PEFT (tests/fixtures/lora/mmc_adapter is what mmc_lora_save writes for test_mmc_adapter's
 * recipe, checked tensor by tensor; PEFT loads it onto the base and computes
 * mmc_adapter/peft_logits.safetensors in gen_lora.py), save/load round trip, merge vs
 * merge_and_unload, NF4 codes/scales/dequant vs bitsandbytes, the NF4 linear (forward and dx
 * gradcheck). */
#include "test_util.h"
#include "mmc_models.h"
#include "mmc_lora.h"
#include "mmc_quant.h"

#include <unistd.h>

static const char *BASE = "tests/fixtures/qwen2/tiny";

static mmc_qwen2 *load_base(bool trainable) {
    mmc_json *cfg = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", BASE);
    if (mmc_json_load(p, &cfg) != MMC_OK) { g_fail++; return NULL; }
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_load(BASE, cfg, trainable, &m);
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load: %s\n", mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static mmc_qwen2 *load_dir(const char *dir) {
    mmc_json *cfg = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (mmc_json_load(p, &cfg) != MMC_OK) { g_fail++; return NULL; }
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_load(dir, cfg, false, &m);
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load %s: %s\n", dir, mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static mmc_tensor *logits(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *ids) {
    int64_t T = ids->shape[1];
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *cos, *sin;
    mmc_rope_table_1d(ctx, pos, (int)m->cfg.head_dim, m->cfg.rope_theta, &cos, &sin);
    mmc_attn_opts o = {.causal = true};
    return mmc_qwen2_logits(ctx, m, mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &o, NULL));
}

/* ------------------------------------------------------------------ matching */
static void test_match(void) {
    const char *n = "model.layers.3.self_attn.q_proj";
    CHECK(mmc_lora_target_match("q_proj", n));
    CHECK(mmc_lora_target_match("self_attn.q_proj", n));
    CHECK(!mmc_lora_target_match("proj", n));
    CHECK(!mmc_lora_target_match("_proj", n));
    CHECK(mmc_lora_target_match(n, n));
    CHECK(mmc_lora_target_match("model.layers.*.self_attn.q_proj", n));
    CHECK(!mmc_lora_target_match("model.layers.*.mlp.*", n));
    CHECK(mmc_lora_target_match("visual.blocks.*.attn.qkv", "visual.blocks.0.attn.qkv"));
    CHECK(mmc_lora_target_match("re:.*\\.(q|v)_proj", n));
    CHECK(!mmc_lora_target_match("re:.*\\.(k|v)_proj", n));
    char c[128];
    mmc_lora_canonical_name("model.language_model.layers.0.mlp.up_proj", c, sizeof c);
    CHECK(strcmp(c, "lm.layers.0.mlp.up_proj") == 0);
    mmc_lora_canonical_name("model.layers.0.mlp.up_proj", c, sizeof c);
    CHECK(strcmp(c, "lm.layers.0.mlp.up_proj") == 0);
    mmc_lora_canonical_name("model.visual.blocks.0.attn.qkv", c, sizeof c);
    CHECK(strcmp(c, "visual.blocks.0.attn.qkv") == 0);
}

/* ------------------------------------------------------------------ gradcheck */
typedef struct { mmc_linear_w l; } lin_user;
static mmc_tensor *lora_fn(mmc_ctx *ctx, mmc_tensor **in, void *user) {
    lin_user *u = user;
    return mmc_nn_linear(ctx, in[0], &u->l);
}

static void test_gradcheck(void) {
    mmc_tensor *x = randn_param(1, 3, MMC_SHAPE(2, 3, 8), 1.0f);
    mmc_tensor *w = randn_param(2, 2, MMC_SHAPE(6, 8), 0.3f);
    mmc_tensor *b = randn_param(3, 1, MMC_SHAPE(6), 0.3f);
    lin_user u = {.l = {.w = w, .b = b, .out_features = 6, .in_features = 8}};
    mmc_module_list ml = {0};
    CHECK_OK(mmc_module_list_add(&ml, &u.l, "layer.q_proj"));
    const char *t[] = {"q_proj"};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_attach(&ml, &(mmc_lora_config){.r = 3, .alpha = 6, .targets = t, .n_targets = 1, .seed = 5}, &s));
    if (!s) return;
    CHECK(!(w->flags & MMC_REQUIRES_GRAD) && !(b->flags & MMC_REQUIRES_GRAD));
    CHECK(s->n == 1 && s->n_params == 2 && fabsf(u.l.lora->scale - 2.0f) < 1e-7f);
    /* PEFT init: B = 0 and A within kaiming bound 1/sqrt(K) */
    CHECK(max_abs(u.l.lora->B) == 0 && max_abs(u.l.lora->A) <= 1.0 / sqrt(8.0) && max_abs(u.l.lora->A) > 0);
    mmc_rng r;
    mmc_rng_init(&r, 9);
    mmc_rng_normal(&r, u.l.lora->B->data, mmc_numel(u.l.lora->B), 0, 0.5f);
    mmc_tensor *in[3] = {x, u.l.lora->A, u.l.lora->B};
    CHECK(gradcheck("lora linear (x, A, B)", lora_fn, in, 3, &u, 1e-3, 1e-3, 1e-2, 200) == 0);
    /* forward value: base + scale * B A x */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *y = mmc_nn_linear(ctx, x, &u.l);
    mmc_tensor *y0 = mmc_linear(ctx, x, w, b);
    mmc_tensor *h = mmc_linear(ctx, mmc_linear(ctx, x, u.l.lora->A, NULL), u.l.lora->B, NULL);
    CHECK_CLOSE(y, mmc_add(ctx, y0, mmc_scale(ctx, h, 2.0f)), 1e-6, 0, "lora forward (1e-6)");
    mmc_ctx_free(ctx);
    mmc_lora_free(s);
    CHECK(u.l.lora == NULL);
    mmc_module_list_free(&ml);
    mmc_tensor_free(x); mmc_tensor_free(w); mmc_tensor_free(b);
}

/* dropout: forward mask consistent with backward, rate ~ p, off in eval, same under recompute */
static mmc_tensor *ckpt_block(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    (void)n_in;
    return mmc_nn_linear(ctx, in[0], user);
}

static void test_dropout(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *x = randn_param(4, 2, MMC_SHAPE(64, 50), 1.0f);
    mmc_nn_set_dropout_seed(ctx, mmc_nn_dropout_seed(42, 3, 0));
    mmc_tensor *y = mmc_nn_dropout(ctx, x, 0.25f, 7);
    mmc_tensor *gy = mmc_grad(ctx, y);
    mmc_rng r;
    mmc_rng_init(&r, 3);
    mmc_rng_uniform(&r, gy->data, mmc_numel(y), -1, 1);
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    int64_t n = mmc_numel(x), zeros = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float xv = ((float *)x->data)[i], yv = ((float *)y->data)[i], g = ((float *)x->grad->data)[i];
        float gv = ((float *)gy->data)[i];
        if (yv == 0) { zeros++; if (g != 0) bad++; }
        else if (fabsf(yv - xv / 0.75f) > 1e-6f || fabsf(g - gv / 0.75f) > 1e-6f) bad++;
    }
    CHECK(bad == 0);
    CHECKF(fabs((double)zeros / n - 0.25) < 0.03, "drop rate %g", (double)zeros / n);
    /* same seed and stream -> same mask; other stream -> another mask */
    mmc_tensor *y2 = mmc_nn_dropout(ctx, x, 0.25f, 7), *y3 = mmc_nn_dropout(ctx, x, 0.25f, 8);
    CHECK(max_abs_diff(y, y2) == 0 && max_abs_diff(y, y3) > 0);
    mmc_set_grad_enabled(ctx, false);   /* eval: identity */
    CHECK(mmc_nn_dropout(ctx, x, 0.25f, 7) == x);
    mmc_set_grad_enabled(ctx, true);
    mmc_nn_set_dropout_off(ctx);
    CHECK(mmc_nn_dropout(ctx, x, 0.25f, 7) == x);
    mmc_ctx_free(ctx);

    /* LoRA with dropout 0.5: checkpointed block gives the same output and grads */
    mmc_tensor *w = randn_param(5, 2, MMC_SHAPE(12, 50), 0.2f);
    mmc_linear_w l = {.w = w, .out_features = 12, .in_features = 50};
    mmc_module_list ml = {0};
    mmc_module_list_add(&ml, &l, "m.q_proj");
    const char *t[] = {"q_proj"};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_attach(&ml, &(mmc_lora_config){.r = 4, .alpha = 8, .dropout = 0.5f, .targets = t, .n_targets = 1}, &s));
    mmc_rng_normal(&r, l.lora->B->data, mmc_numel(l.lora->B), 0, 0.5f);
    float *ga[2], *gb[2], loss[2];
    for (int pass = 0; pass < 2; pass++) {
        ctx = mmc_ctx_new();
        mmc_nn_set_dropout_seed(ctx, 99);
        mmc_zero_grad(s->params, s->n_params);
        mmc_tensor *xin = mmc_alias(ctx, x);
        xin->flags |= MMC_REQUIRES_GRAD;
        mmc_tensor *o = pass ? mmc_checkpoint(ctx, ckpt_block, &l, &xin, 1) : mmc_nn_linear(ctx, xin, &l);
        mmc_tensor *L = mmc_sum(ctx, mmc_mul(ctx, o, o));
        loss[pass] = *(float *)L->data;
        mmc_backward(ctx, L);
        ga[pass] = malloc(mmc_nbytes(l.lora->A)); memcpy(ga[pass], l.lora->A->grad->data, mmc_nbytes(l.lora->A));
        gb[pass] = malloc(mmc_nbytes(l.lora->B)); memcpy(gb[pass], l.lora->B->grad->data, mmc_nbytes(l.lora->B));
        mmc_ctx_free(ctx);
    }
    CHECK_NEAR(loss[0], loss[1], 1e-4 * fabs(loss[0]));
    double da = 0, db = 0;
    for (int64_t i = 0; i < mmc_numel(l.lora->A); i++) da = fmax(da, fabs(ga[0][i] - ga[1][i]));
    for (int64_t i = 0; i < mmc_numel(l.lora->B); i++) db = fmax(db, fabs(gb[0][i] - gb[1][i]));
    CHECKF(da < 1e-4 && db < 1e-4, "recompute grads differ: A %g B %g", da, db);
    for (int p = 0; p < 2; p++) { free(ga[p]); free(gb[p]); }
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_tensor_free(w);
    mmc_tensor_free(x);
}

/* ------------------------------------------------------------------ PEFT parity */
static void test_peft(mmc_st *ref) {
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_qwen2 *m = load_base(false);
    if (!m) return;
    mmc_module_list ml = {0};
    CHECK_OK(mmc_qwen2_linears(m, "model.", &ml));
    CHECK(ml.n == 14 && strcmp(ml.names[0], "model.layers.0.self_attn.q_proj") == 0);
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_load("tests/fixtures/lora/peft_adapter", &ml, false, &s));
    if (s) {
        CHECK(s->n == 6 && s->r == 4 && fabsf(s->adapters[0].scale - 2.0f) < 1e-7f);
        mmc_tensor *want = fixture_tensor(ref, "logits", MMC_F32);
        CHECK_CLOSE(logits(ctx, m, ids), want, 1e-4, 0, "PEFT adapter logits (1e-4 max-abs)");
        mmc_tensor_free(want);
        mmc_lora_free(s);
    }
    /* detached: back to the base model */
    mmc_tensor *base_want = fixture_tensor(ref, "base_logits", MMC_F32);
    CHECK_CLOSE(logits(ctx, m, ids), base_want, 1e-4, 0, "base logits after detaching (1e-4)");
    mmc_tensor_free(base_want);
    /* an adapter saved against Qwen2-VL's 5.x names still finds the modules */
    mmc_module_list vl = {0};
    CHECK_OK(mmc_qwen2_linears(m, "model.language_model.", &vl));
    CHECK_OK(mmc_lora_load("tests/fixtures/lora/peft_adapter", &vl, false, &s));
    if (s) { CHECK(s->n == 6); mmc_lora_free(s); }
    mmc_module_list_free(&vl);
    /* bad input: a missing directory */
    CHECK_ERR(mmc_lora_load("tests/fixtures/lora/nope", &ml, false, &s), MMC_ERR_NOT_FOUND);
    mmc_module_list_free(&ml);
    mmc_qwen2_free(m);
    mmc_ctx_free(ctx);
    mmc_tensor_free(ids);
}

/* The bytes of DIR/NAME, NUL-terminated, or NULL. */
static char *slurp(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 16);
    if (b) fread(b, 1, (1 << 16) - 1, f);
    fclose(f);
    return b;
}

/* DIR_A and DIR_B hold the same adapter: adapter_config.json byte for byte, and the same tensors
 * in adapter_model.safetensors up to float rounding (1e-6 of the tensor's max: the random init
 * of lora_A rounds differently between -O2 and the sanitizer build), printing the first
 * difference. */
static bool same_adapter(const char *dir_a, const char *dir_b) {
    char *ca = slurp(dir_a, "adapter_config.json"), *cb = slurp(dir_b, "adapter_config.json");
    bool same = ca && cb && strcmp(ca, cb) == 0;
    if (!same) fprintf(stderr, "adapter_config.json differs between %s and %s\n", dir_a, dir_b);
    free(ca);
    free(cb);
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/adapter_model.safetensors", dir_a);
    snprintf(pb, sizeof pb, "%s/adapter_model.safetensors", dir_b);
    mmc_st *a = NULL, *b = NULL;
    same = same && mmc_st_open(pa, &a) == MMC_OK && mmc_st_open(pb, &b) == MMC_OK && mmc_st_count(a) == mmc_st_count(b);
    for (int i = 0; same && i < mmc_st_count(a); i++) {
        const mmc_st_entry *ea = mmc_st_at(a, i), *eb = mmc_st_find(b, ea->name);
        same = eb && ea->dtype == eb->dtype && ea->ndim == eb->ndim && ea->nbytes == eb->nbytes;
        if (same) {
            mmc_tensor *ta = fixture_tensor(a, ea->name, MMC_F32), *tb = fixture_tensor(b, ea->name, MMC_F32);
            same = max_abs_diff(ta, tb) <= 1e-6 * max_abs(tb);
            mmc_tensor_free(ta);
            mmc_tensor_free(tb);
        }
        if (!same) fprintf(stderr, "adapter tensor %s differs between %s and %s\n", ea->name, pa, pb);
    }
    mmc_st_close(a);
    mmc_st_close(b);
    return same;
}

/* mmc attaches, saves; PEFT reproduces (gen_lora.py computes PEFT's logits on the committed copy) */
static void test_mmc_adapter(mmc_st *ref) {
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_qwen2 *m = load_base(false);
    if (!m) return;
    mmc_module_list ml = {0};
    mmc_qwen2_linears(m, "model.", &ml);
    const char *t[] = {"k_proj", "model.layers.*.mlp.down_proj", "re:model\\.layers\\.1\\.self_attn\\.o_proj"};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_attach(&ml, &(mmc_lora_config){.r = 2, .alpha = 5, .targets = t, .n_targets = 3, .seed = 11}, &s));
    if (!s) return;
    CHECK(s->n == 5);   /* 2 k_proj + 2 down_proj + 1 o_proj */
    mmc_rng r;
    mmc_rng_init(&r, 12);
    for (int i = 0; i < s->n; i++) mmc_rng_normal(&r, s->adapters[i].B->data, mmc_numel(s->adapters[i].B), 0, 0.2f);
    mmc_tensor *got = logits(ctx, m, ids);
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/mmc_test_lora_%ld", (long)getpid());
    CHECK_OK(mmc_lora_save(s, dir, BASE));
    mmc_lora_free(s);
    /* round trip through the files */
    CHECK_OK(mmc_lora_load(dir, &ml, true, &s));
    if (s) {
        CHECK(s->n == 5 && (s->params[0]->flags & MMC_REQUIRES_GRAD));
        CHECK_CLOSE(logits(ctx, m, ids), got, 0, 0, "save/load round trip (bit-identical)");
        mmc_lora_free(s);
    }
    /* the committed adapter is what mmc writes today, so PEFT's logits for it test this writer */
    bool same = same_adapter(dir, "tests/fixtures/lora/mmc_adapter");
    CHECKF(same, "mmc_lora_save's output differs from tests/fixtures/lora/mmc_adapter: if the change is "
           "intended, copy %s/adapter_* there and rerun tools/ref/gen_lora.py", dir);
    /* PEFT's logits for the committed adapter (on the same base and ids) */
    mmc_st *peft = fixture_open("lora/mmc_adapter/peft_logits.safetensors");
    if (peft && mmc_lora_load("tests/fixtures/lora/mmc_adapter", &ml, false, &s) == MMC_OK) {
        mmc_tensor *want = fixture_tensor(peft, "logits", MMC_F32);
        CHECK_CLOSE(logits(ctx, m, ids), want, 1e-5, 0, "mmc's adapter: logits vs PEFT's (1e-5)");
        CHECK_CLOSE(got, want, 1e-5, 0, "mmc before saving vs PEFT on the saved adapter (1e-5)");
        mmc_tensor_free(want);
        mmc_lora_free(s);
    } else {
        g_fail++;
    }
    mmc_st_close(peft);
    if (same) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
    /* no match -> error naming the targets */
    const char *bad[] = {"qkv"};
    CHECK_ERR(mmc_lora_attach(&ml, &(mmc_lora_config){.r = 2, .alpha = 4, .targets = bad, .n_targets = 1}, &s),
              MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "qkv") != NULL);
    mmc_module_list_free(&ml);
    mmc_qwen2_free(m);
    mmc_ctx_free(ctx);
    mmc_tensor_free(ids);
}

static void test_merge(mmc_st *ref) {
    char out[256];
    snprintf(out, sizeof out, "/tmp/mmc_test_merge_%ld", (long)getpid());
    int n = 0;
    CHECK_OK(mmc_lora_merge_dir(BASE, "tests/fixtures/lora/peft_adapter", out, &n));
    CHECK(n == 6);
    CHECK_OK(mmc_lora_merge_dir(BASE, "tests/fixtures/lora/peft_adapter", out, &n));   /* replaces */
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open(out, &st));
    if (st) {
        const char *names[] = {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate_proj.weight",
                               "model.layers.1.self_attn.k_proj.weight"};
        for (int i = 0; i < 3; i++) {
            char k[160];
            snprintf(k, sizeof k, "merged.%s", names[i]);
            mmc_tensor *want = fixture_tensor(ref, k, MMC_F32), *got = fixture_tensor(st, names[i], MMC_F32);
            CHECK_CLOSE(got, want, 1e-5, 0, names[i]);   /* merge_and_unload within 1e-5 */
            mmc_tensor_free(want); mmc_tensor_free(got);
        }
        mmc_st *base = fixture_open("qwen2/tiny");
        CHECK(base && mmc_st_count(base) == mmc_st_count(st));
        mmc_st_close(base);
        mmc_st_close(st);
    }
    mmc_qwen2 *m = load_dir(out);
    if (m) {
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64), *want = fixture_tensor(ref, "merged_logits", MMC_F32);
        CHECK_CLOSE(logits(ctx, m, ids), want, 1e-4, 0, "merged model logits (1e-4)");
        mmc_tensor_free(ids); mmc_tensor_free(want);
        mmc_ctx_free(ctx);
        mmc_qwen2_free(m);
    }
    char p[400];
    snprintf(p, sizeof p, "%s/config.json", out);
    CHECK(access(p, R_OK) == 0);
    CHECK_ERR(mmc_lora_merge_dir(BASE, "tests/fixtures/lora/missing", out, &n), MMC_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "rm -rf %s", out);
    CHECK(system(p) == 0);
}

/* ------------------------------------------------------------------ NF4 */
static void test_nf4_bnb(void) {
    mmc_st *q = fixture_open("lora/nf4.safetensors");
    if (!q) return;
    mmc_tensor *code = fixture_tensor(q, "nf4_code", MMC_F32), *dyn = fixture_tensor(q, "dynamic_map", MMC_F32);
    int bad = 0;
    for (int i = 0; i < 16; i++) bad += ((float *)code->data)[i] != mmc_nf4_levels()[i];
    CHECKF(bad == 0, "NF4 levels differ from bitsandbytes in %d places", bad);
    bad = 0;
    for (int i = 0; i < 256; i++) bad += ((float *)dyn->data)[i] != mmc_dynamic_map()[i];
    CHECKF(bad == 0, "dynamic map differs from bitsandbytes in %d places", bad);
    const char *mats[] = {"w1", "w2"};
    for (int mi = 0; mi < 2; mi++) {
        char k[64];
        mmc_tensor *w = fixture_tensor(q, mats[mi], MMC_F32);
        int64_t N = w->shape[0], K = w->shape[1];
        for (int dq = 0; dq < 2; dq++) {
            const char *tag = dq ? "dq" : "plain";
            mmc_nf4 *nq = NULL;
            CHECK_OK(mmc_nf4_quantize(w->data, N, K, dq, &nq));
            if (!nq) continue;
            snprintf(k, sizeof k, "%s.%s.codes", mats[mi], tag);
            mmc_tensor *codes = fixture_tensor(q, k, MMC_U8);
            int64_t diff = 0;
            for (int64_t i = 0; i < N * K / 2; i++) diff += ((uint8_t *)codes->data)[i] != nq->codes[i];
            CHECKF(diff == 0, "%s %s: %lld of %lld code bytes differ from bitsandbytes", mats[mi], tag,
                   (long long)diff, (long long)(N * K / 2));
            if (!dq) {
                snprintf(k, sizeof k, "%s.plain.absmax", mats[mi]);
                mmc_tensor *am = fixture_tensor(q, k, MMC_F32);
                diff = 0;
                for (int64_t i = 0; i < nq->n_blocks; i++) diff += ((float *)am->data)[i] != nq->absmax[i];
                CHECK(diff == 0);
                mmc_tensor_free(am);
            } else {
                snprintf(k, sizeof k, "%s.dq.qabsmax", mats[mi]);
                mmc_tensor *qa = fixture_tensor(q, k, MMC_U8);
                snprintf(k, sizeof k, "%s.dq.absmax2", mats[mi]);
                mmc_tensor *a2 = fixture_tensor(q, k, MMC_F32);
                snprintf(k, sizeof k, "%s.dq.offset", mats[mi]);
                mmc_tensor *off = fixture_tensor(q, k, MMC_F32);
                /* The 8-bit stage: mmc takes the nearest dynamic-map entry (as bitsandbytes'
                 * CUDA kernel does); bitsandbytes' CPU kernel uses an approximate table
                 * lookup that picks a neighbouring entry for a few values. At most 2 % may differ. */
                diff = 0;
                int64_t far = 0;
                for (int64_t i = 0; i < nq->n_blocks; i++) {
                    int a = ((uint8_t *)qa->data)[i], c = nq->qabsmax[i];
                    if (a == c) continue;
                    diff++;
                    if (abs(a - c) > 1) far++;
                }
                CHECKF(diff * 50 <= nq->n_blocks, "%s: %lld of %lld double-quant codes differ (%lld not adjacent)",
                       mats[mi], (long long)diff, (long long)nq->n_blocks, (long long)far);
                if (diff) printf("%s: %lld of %lld double-quant absmax codes differ from bitsandbytes' CPU kernel (%lld not adjacent)\n",
                                 mats[mi], (long long)diff, (long long)nq->n_blocks, (long long)far);
                /* bitsandbytes' own parts dequantise bit-exactly through mmc */
                snprintf(k, sizeof k, "%s.dq.dequant", mats[mi]);
                mmc_tensor *bw = fixture_tensor(q, k, MMC_F32);
                mmc_nf4 *pq = NULL;
                CHECK_OK(mmc_nf4_from_parts(N, K, codes->data, NULL, qa->data, a2->data, ((float *)off->data)[0], &pq));
                if (pq) {
                    mmc_tensor *g2 = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(N, K));
                    mmc_nf4_dequantize_rows(pq, NULL, 0, N, g2->data);
                    CHECK_CLOSE(g2, bw, 0, 0, "NF4+DQ dequant of bitsandbytes' parts (exact)");
                    mmc_tensor_free(g2);
                    mmc_nf4_free(pq);
                }
                mmc_tensor_free(bw);
                /* offset: torch's mean vs our f64 mean: equal to the last bit or one ulp */
                CHECK_NEAR(nq->offset, ((float *)off->data)[0], 1e-7 * fabs(((float *)off->data)[0]) + 1e-12);
                for (int64_t i = 0; i < mmc_numel(a2); i++)
                    CHECK_NEAR(nq->absmax2[i], ((float *)a2->data)[i], 1e-6 * fabs(((float *)a2->data)[i]));
                mmc_tensor_free(qa); mmc_tensor_free(a2); mmc_tensor_free(off);
            }
            /* dequantised weights: plain bit-exact; double quant within f32 rounding of the offset */
            snprintf(k, sizeof k, "%s.%s.dequant", mats[mi], tag);
            mmc_tensor *want = fixture_tensor(q, k, MMC_F32), *got = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(N, K));
            mmc_nf4_dequantize_rows(nq, NULL, 0, N, got->data);
            /* plain: bit-exact; double quant: an adjacent 8-bit absmax code moves a block's
             * scale by < 0.2 %, i.e. < 2e-3 relative to max|w| */
            CHECK_CLOSE(got, want, 0, dq ? 2e-3 : 0, dq ? "NF4+DQ dequant vs bitsandbytes (2e-3 rel)" : "NF4 dequant vs bitsandbytes (exact)");
            /* rebuilt from bitsandbytes' own parts: identical dequant */
            mmc_tensor_free(got); mmc_tensor_free(want); mmc_tensor_free(codes);
            mmc_nf4_free(nq);
        }
        mmc_tensor_free(w);
    }
    mmc_tensor_free(code); mmc_tensor_free(dyn);
    mmc_st_close(q);
}

typedef struct { const mmc_nf4 *q; mmc_tensor *b; } nf4_user;
static mmc_tensor *nf4_fn(mmc_ctx *ctx, mmc_tensor **in, void *user) {
    nf4_user *u = user;
    return mmc_nf4_linear(ctx, in[0], u->q, in[1]);
}

static void test_nf4_linear(void) {
    int64_t N = 300, K = 128;   /* 2 tiles, the last partial */
    mmc_tensor *w = randn_param(21, 2, MMC_SHAPE(N, K), 0.05f);
    mmc_tensor *b = randn_param(22, 1, MMC_SHAPE(N), 0.1f);
    mmc_tensor *x = randn_param(23, 3, MMC_SHAPE(2, 5, K), 1.0f);
    for (int dq = 0; dq < 2; dq++) {
        mmc_nf4 *q = NULL;
        CHECK_OK(mmc_nf4_quantize(w->data, N, K, dq, &q));
        mmc_tensor *dw = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(N, K));
        mmc_nf4_dequantize_rows(q, NULL, 0, N, dw->data);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        CHECK_CLOSE(mmc_nf4_linear(ctx, x, q, b), mmc_linear(ctx, x, dw, b), 1e-5, 0,
                    "NF4 linear vs dequantise-then-linear (1e-5)");
        /* quantisation error itself stays small relative to the weights */
        CHECK(max_abs_diff(dw, w) < 0.2 * max_abs(w));
        mmc_ctx_free(ctx);
        nf4_user u = {q, b};
        mmc_tensor *in[2] = {x, b};
        CHECK(gradcheck("nf4 linear (x, b)", nf4_fn, in, 2, &u, 1e-3, 1e-3, 1e-2, 200) == 0);
        printf("NF4 [%lld, %lld]%s: %zu bytes vs f32 %lld, bf16 %lld\n", (long long)N, (long long)K,
               dq ? " +DQ" : "", mmc_nf4_bytes(q), (long long)(4 * N * K), (long long)(2 * N * K));
        mmc_tensor_free(dw);
        mmc_nf4_free(q);
    }
    mmc_tensor_free(w); mmc_tensor_free(b); mmc_tensor_free(x);
}

/* QLoRA end to end on the tiny model: NF4 base + the PEFT adapter, logits near the f32 LoRA
 * logits, adapter gradients flow, the dense weights are gone from params. */
static void test_qlora(mmc_st *ref) {
    mmc_qwen2 *m = load_base(true);
    if (!m) return;
    int before = m->n_params;
    CHECK_OK(mmc_qwen2_quantize_nf4(m, true));
    CHECK(m->n_params == before - 14 && m->layers[0].q.w == NULL && m->layers[0].q.q != NULL);
    mmc_module_list ml = {0};
    mmc_qwen2_linears(m, "model.", &ml);
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_lora_load("tests/fixtures/lora/peft_adapter", &ml, true, &s));
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64), *want = fixture_tensor(ref, "logits", MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    for (int i = 0; i < m->n_params; i++) m->params[i]->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
    mmc_tensor *lg = logits(ctx, m, ids);
    double d = max_abs_diff(lg, want);
    CHECKF(d < 0.2 * max_abs(want), "QLoRA logits far from f32 LoRA: %g", d);
    mmc_tensor *L = mmc_mean(ctx, mmc_mul(ctx, lg, lg));
    mmc_backward(ctx, L);
    CHECK(s && s->params[0]->grad && max_abs(s->params[0]->grad) > 0);
    mmc_ctx_free(ctx);
    mmc_tensor_free(ids); mmc_tensor_free(want);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_qwen2_free(m);
}

int main(void) {
    mmc_st *ref = fixture_open("lora/ref.safetensors");
    if (!ref) return test_done("test_lora");
    test_match();
    test_gradcheck();
    test_dropout();
    test_peft(ref);
    test_mmc_adapter(ref);
    test_merge(ref);
    test_nf4_bnb();
    test_nf4_linear();
    test_qlora(ref);
    mmc_st_close(ref);
    return test_done("test_lora");
}
