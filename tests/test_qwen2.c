/* test_qwen2.c — the Qwen2 decoder against transformers (tools/ref/gen_qwen2.py):
 * logits (f32, bf16 weights, tied head with the Hub's flat config layout), training loss and
 * parameter gradients (with and without activation recompute), and greedy decoding with the
 * KV cache, token-identical for 32 new tokens. */
#include "backend/cpu/gemm.h"
#include "test_util.h"

#include <stdlib.h>
#include "mmc_models.h"

static mmc_qwen2 *load(const char *dir, bool trainable) {
    mmc_json *cfg = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (mmc_json_load(p, &cfg) != MMC_OK) { fprintf(stderr, "%s\n", mmc_last_error()); g_fail++; return NULL; }
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_load(dir, cfg, trainable, &m);
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load %s: %s\n", dir, mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static mmc_tensor *positions(mmc_ctx *ctx, int64_t start, int64_t T) {
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = start + t;
    return pos;
}

/* logits [B, T, V] for ids [B, T] without cache */
static mmc_tensor *full_logits(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *ids) {
    int64_t T = ids->shape[1];
    mmc_tensor *cos, *sin;
    mmc_rope_table_1d(ctx, positions(ctx, 0, T), (int)m->cfg.head_dim, m->cfg.rope_theta, &cos, &sin);
    mmc_attn_opts o = {.causal = true};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &o, NULL);
    return mmc_qwen2_logits(ctx, m, h);
}

static void test_logits(mmc_st *ref) {
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    mmc_tensor *want = fixture_tensor(ref, "logits", MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_qwen2 *m = load("tests/fixtures/qwen2/tiny", false);
    if (m) {
        CHECK(m->cfg.num_layers == 2 && m->cfg.num_kv_heads == 2 && !m->cfg.tie_word_embeddings);
        mmc_tensor *got = full_logits(ctx, m, ids);
        CHECK_CLOSE(got, want, 1e-4, 0, "f32 logits vs transformers (1e-4 max-abs)");
        mmc_qwen2_free(m);
    }
    mmc_ctx_reset(ctx);
    m = load("tests/fixtures/qwen2/tiny_bf16", false);
    if (m) {
        mmc_tensor *got = full_logits(ctx, m, ids);
        /* bf16 weights widened to f32: the HF f32 model differs by the bf16 rounding of the
         * weights only, so compare loosely (5e-2 max-abs on logits of magnitude ~1) */
        CHECK_CLOSE(got, want, 5e-2, 0, "bf16-weight logits vs f32 transformers");
        /* --bf16-matmul (mmc_gemm_set_bf16_dot): the weight GEMMs on bf16 products (AMX or
         * AVX512_BF16, whichever this CPU has; the prompt's 8+ tokens take the packed path),
         * activations rounded to bf16: the same loose bound against transformers, and within
         * 2e-2 of the exact bf16-weight logits */
        if (mmc_gemm_set_bf16_dot(true) == 0) {
            mmc_gemm_info gi;
            mmc_gemm_describe(&gi);
            mmc_tensor *fast = full_logits(ctx, m, ids);
            mmc_gemm_set_bf16_dot(false);
            CHECK_CLOSE(fast, want, 5e-2, 0, "bf16-matmul logits vs f32 transformers");
            CHECK_CLOSE(fast, got, 2e-2, 0, "bf16-matmul logits vs the exact bf16-weight path");
            printf("test_qwen2: bf16-matmul on the %s kernel\n", gi.bf16_infer.kernel);
        } else {
            printf("test_qwen2: no bf16-product kernel on this CPU: --bf16-matmul not checked here\n");
        }
        mmc_qwen2_free(m);
    }
    mmc_ctx_reset(ctx);
    m = load("tests/fixtures/qwen2/tiny_tied", false);   /* Hub config layout, tied head */
    if (m) {
        CHECK(m->cfg.tie_word_embeddings && m->lm_head == m->embed);
        mmc_tensor *tw = fixture_tensor(ref, "tied_logits", MMC_F32);
        CHECK_CLOSE(full_logits(ctx, m, ids), tw, 1e-4, 0, "tied logits vs transformers");
        mmc_tensor_free(tw);
        mmc_qwen2_free(m);
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(ids);
    mmc_tensor_free(want);
}

static mmc_tensor *find_param(mmc_qwen2 *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->param_names[i], name) == 0) return m->params[i];
    return NULL;
}

static void test_train_grads(mmc_st *ref, bool recompute) {
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    mmc_qwen2 *m = load("tests/fixtures/qwen2/tiny", true);
    if (!m) return;
    m->recompute = recompute;
    mmc_ctx *ctx = mmc_ctx_new();
    int64_t B = ids->shape[0], T = ids->shape[1], V = m->cfg.vocab_size;
    mmc_tensor *logits = full_logits(ctx, m, ids);                  /* [B, T, V] */
    /* HF shifts: logits[:, :-1] predict ids[:, 1:] */
    mmc_tensor *lg = mmc_narrow(ctx, logits, 1, 0, T - 1);
    lg = mmc_reshape(ctx, mmc_contiguous(ctx, lg), 2, MMC_SHAPE(B * (T - 1), V));
    mmc_tensor *tg = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(B * (T - 1)));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T - 1; t++)
            ((int64_t *)tg->data)[b * (T - 1) + t] = ((int64_t *)ids->data)[b * T + t + 1];
    mmc_tensor *loss = mmc_cross_entropy(ctx, lg, tg, -100);
    mmc_tensor *want_loss = fixture_tensor(ref, "loss", MMC_F32);
    CHECK_NEAR(((float *)loss->data)[0], ((float *)want_loss->data)[0], 1e-5);
    mmc_backward(ctx, loss);
    const char *names[] = {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
                           "layers.1.mlp.down_proj.weight", "layers.0.self_attn.k_proj.bias",
                           "norm.weight", "lm_head.weight"};
    const char *hf[] = {"grad.model.embed_tokens.weight", "grad.model.layers.0.self_attn.q_proj.weight",
                        "grad.model.layers.1.mlp.down_proj.weight", "grad.model.layers.0.self_attn.k_proj.bias",
                        "grad.model.norm.weight", "grad.lm_head.weight"};
    for (int i = 0; i < 6; i++) {
        mmc_tensor *p = find_param(m, names[i]);
        CHECKF(p && p->grad, "%s has a gradient", names[i]);
        if (!p || !p->grad) continue;
        mmc_tensor *w = fixture_tensor(ref, hf[i], MMC_F32);
        char what[160];
        snprintf(what, sizeof what, "grad %s (recompute %d) vs torch (1e-5 + 1e-3 rel)", names[i], recompute);
        CHECK_CLOSE(p->grad, w, 1e-5, 1e-3, what);
        mmc_tensor_free(w);
    }
    mmc_tensor_free(want_loss);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
    mmc_tensor_free(ids);
}

static void test_greedy(mmc_st *ref) {
    mmc_tensor *prompt = fixture_tensor(ref, "greedy_prompt", MMC_I64);
    mmc_tensor *want = fixture_tensor(ref, "greedy_out", MMC_I64);
    mmc_qwen2 *m = load("tests/fixtures/qwen2/tiny", false);
    if (!m) return;
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_kv_cache kv;
    CHECK_OK(mmc_kv_cache_init(&kv, (int)m->cfg.num_layers, 1, m->cfg.num_kv_heads, m->cfg.head_dim, 8));
    mmc_tensor *ids = prompt;
    int n_new = (int)want->shape[1], same = 0;
    for (int step = 0; step < n_new; step++) {
        int64_t T = ids->shape[1];
        CHECK_OK(mmc_kv_cache_reserve(&kv, kv.len + T));
        mmc_tensor *cos, *sin;
        mmc_rope_table_1d(ctx, positions(ctx, kv.len, T), (int)m->cfg.head_dim, m->cfg.rope_theta, &cos, &sin);
        mmc_attn_opts o = {.causal = true};
        mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &o, &kv);
        mmc_tensor *last = mmc_narrow(ctx, h, 1, T - 1, 1);
        mmc_tensor *lg = mmc_qwen2_logits(ctx, m, mmc_contiguous(ctx, last));
        const float *l = lg->data;
        int64_t best = 0;
        for (int64_t v = 1; v < m->cfg.vocab_size; v++) if (l[v] > l[best]) best = v;
        same += best == ((int64_t *)want->data)[step];
        mmc_ctx_reset(ctx);
        ids = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, 1));
        ((int64_t *)ids->data)[0] = best;
    }
    CHECKF(same == n_new, "greedy tokens identical: %d of %d", same, n_new);
    mmc_kv_cache_free(&kv);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
    mmc_tensor_free(prompt);
    mmc_tensor_free(want);
}

static void test_bad_weights(void) {
    /* a config whose shapes disagree with the weights: every problem is named */
    mmc_json *cfg = NULL;
    const char *text = "{\"vocab_size\": 320, \"hidden_size\": 64, \"intermediate_size\": 128,"
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2}";
    CHECK_OK(mmc_json_parse(text, strlen(text), "bad-config", &cfg));
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_load("tests/fixtures/qwen2/tiny", cfg, false, &m);
    CHECK(st == MMC_ERR_FORMAT && m == NULL);
    CHECKF(strstr(mmc_last_error(), "mlp.gate_proj.weight': expected shape [128, 64], found [160, 64]") != NULL,
           "message: %s", mmc_last_error());
    CHECKF(strstr(mmc_last_error(), "6 problems") != NULL, "counts all problems: %s", mmc_last_error());
    mmc_json_free(cfg);
}

int main(void) {
    mmc_st *ref = fixture_open("qwen2/ref.safetensors");
    if (!ref) return test_done("test_qwen2");
    test_logits(ref);
    test_train_grads(ref, false);
    test_train_grads(ref, true);
    test_greedy(ref);
    /* again with the inference forward's row chunks capped at 3 rows, so that the chunked
     * MLP crosses chunk boundaries on these short prompts */
    setenv("MMC_INFER_CHUNK_ROWS", "3", 1);
    test_logits(ref);
    test_greedy(ref);
    unsetenv("MMC_INFER_CHUNK_ROWS");
    test_bad_weights();
    mmc_st_close(ref);
    return test_done("test_qwen2");
}
