/* test_llama.c — the Llama decoder (LlamaForCausalLM through qwen2.c's layers, llama.c's config)
 * against transformers (tools/ref/gen_llama.py): logits of a 14-token forward past
 * max_position_embeddings 8 with dynamic NTK rope scaling, q/k/v/o biases and a tied head, in
 * the 5.x config (rope_parameters) and the 4.4x one (rope_scaling {type: dynamic}, bf16
 * matrices); default rope with MLP biases and an untied head; greedy decoding through the KV
 * cache, token-identical across the point where the dynamic base grows. */
#include "test_util.h"

#include <stdlib.h>
#include "mmc_infer.h"
#include "mmc_models.h"

static mmc_st *ref;

static mmc_qwen2 *load(const char *dir) {
    mmc_json *cfg = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (mmc_json_load(p, &cfg) != MMC_OK) { fprintf(stderr, "%s\n", mmc_last_error()); g_fail++; return NULL; }
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_llama_load(dir, cfg, false, &m);
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load %s: %s\n", dir, mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static void test_dir(const char *name, const char *refname, bool dynamic) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/llama/%s", name);
    mmc_qwen2 *m = load(dir);
    if (!m) return;
    const mmc_qwen2_config *c = &m->cfg;
    CHECKF(c->rope_kind == (dynamic ? MMC_ROPE_DYNAMIC : MMC_ROPE_DEFAULT) && c->qkv_bias == dynamic &&
           c->o_bias == dynamic && c->mlp_bias == !dynamic && (m->lm_head == m->embed) == dynamic,
           "%s: config flags", dir);
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    snprintf(key, sizeof key, "%s.logits", refname);
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    const int64_t T = ids->shape[1];
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, c, pos, &cos, &sin);
    mmc_attn_opts o = {.causal = true};
    mmc_tensor *got = mmc_qwen2_logits(ctx, m, mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &o, NULL));
    printf("llama %-12s logits [%lld, %lld, %lld] max|diff| %.4e\n", name, (long long)got->shape[0],
           (long long)got->shape[1], (long long)got->shape[2], max_abs_diff(got, want));
    CHECK_CLOSE(got, want, 1e-4, 0, dir);
    snprintf(key, sizeof key, "%s.greedy", refname);
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    int32_t prompt[6], out[16];
    for (int i = 0; i < 6; i++) prompt[i] = (int32_t)((int64_t *)ids->data)[i];
    mmc_decoder dec = mmc_qwen2_decoder(m);
    CHECK(dynamic ? dec.max_positions > 1000000 : dec.max_positions == 8);
    dec.max_positions = 64;   /* transformers generates past max_position_embeddings (with a warning) */
    mmc_gen_opts go = {.max_new_tokens = 10};
    mmc_sampler_defaults(&go.sampler);
    int n = 0;
    CHECK_OK(mmc_generate(&dec, prompt, 6, &go, out, &n));
    bool same = n == 10;
    for (int i = 0; i < n && same; i++) same = out[i] == ((int64_t *)greedy->data)[i];
    CHECKF(same, "%s: greedy tokens differ from transformers'", dir);
    mmc_tensor_free(ids);
    mmc_tensor_free(want);
    mmc_tensor_free(greedy);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
}

/* rope_scaling of an unknown type is an error naming the key, not a silent default */
static void test_bad_rope(void) {
    const char *txt = "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 8, "
                      "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"rope_scaling\": {\"type\": \"yarn\", "
                      "\"factor\": 4.0}}";
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_parse(txt, strlen(txt), "test", &j));
    mmc_qwen2_config c;
    CHECK(mmc_llama_config_read(j, &c) == MMC_ERR_UNSUPPORTED && strstr(mmc_last_error(), "rope_scaling.rope_type 'yarn'"));
    mmc_json_free(j);
}

int main(void) {
    ref = fixture_open("llama/ref.safetensors");
    if (!ref) return test_done("test_llama");
    test_dir("dynamic", "dynamic", true);
    test_dir("dynamic_hub", "dynamic", true);
    test_dir("default", "default", false);
    test_bad_rope();
    mmc_st_close(ref);
    return test_done("test_llama");
}
