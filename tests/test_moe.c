/* test_moe.c — Qwen2-MoE (qwen2_moe.c over qwen2.c's decoder) against transformers 5.23's
 * Qwen2MoeForCausalLM (tools/ref/gen_moe.py), on save_pretrained folders as written:
 *  - logits of a [2, 14] forward within 1e-4 of transformers' (float32) for tiny/ (sparse, dense
 *    and sparse layers: mlp_only_layers, top-2 of 4, no renormalisation, untied head),
 *    tiny_norm/ (decoder_sparse_step 2, top-3 of 8 renormalised, tied embeddings) and tiny_norm_hub/
 *    (the same as the Hub's 4.4x folders hold it: flat rope_theta, torch_dtype, bf16 matrices);
 *  - the auxiliary load-balancing loss of that forward (router_aux_loss_coef * aux) within 1e-6;
 *  - greedy decoding through the KV cache: the 10 tokens transformers' generate picks;
 *  - malformed configs and checkpoints: an error naming the key / the missing weights;
 *  - expert parallelism that does not divide num_experts: an error listing the sizes that do. */
#include "test_util.h"

#include <stdlib.h>
#include "mmc_ep.h"
#include "mmc_infer.h"
#include "mmc_models.h"

static mmc_st *ref;

static mmc_qwen2 *load(const char *dir) {
    mmc_json *cfg = NULL;
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (mmc_json_load(p, &cfg) != MMC_OK) { fprintf(stderr, "%s\n", mmc_last_error()); g_fail++; return NULL; }
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_moe_load(dir, cfg, false, NULL, &m);
    mmc_json_free(cfg);
    if (st) { fprintf(stderr, "load %s: %s\n", dir, mmc_last_error()); g_fail++; return NULL; }
    return m;
}

static mmc_tensor *logits(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *ids) {
    const int64_t T = ids->shape[1];
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);
    mmc_attn_opts o = {.causal = true};
    return mmc_qwen2_logits(ctx, m, mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &o, NULL));
}

static void test_dir(const char *name, const char *refname) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/moe/%s", name);
    mmc_qwen2 *m = load(dir);
    if (!m) return;
    mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64);
    snprintf(key, sizeof key, "%s.logits", refname);
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    /* inference form (no autograd) */
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *got = logits(ctx, m, ids);
    printf("moe %-10s logits max|diff| %.3e (inference form)\n", name, max_abs_diff(got, want));
    CHECK_CLOSE(got, want, 1e-4, 0, dir);
    mmc_ctx_reset(ctx);
    /* training form, with the auxiliary loss of the forward */
    mmc_set_grad_enabled(ctx, true);
    mmc_moe_aux_set_weight(m->moe, 1.0);
    mmc_moe_aux_begin(m->moe);
    got = logits(ctx, m, ids);
    double aux = mmc_moe_aux_end(m->moe);
    snprintf(key, sizeof key, "%s.aux_loss", refname);
    mmc_tensor *want_aux = fixture_tensor(ref, key, MMC_F64);
    double wa = mmc_moe_aux_coef(m->moe) * mmc_get_flat(want_aux, 0);
    printf("moe %-10s logits max|diff| %.3e (autograd form), coef * aux %.9f vs %.9f\n", name,
           max_abs_diff(got, want), aux, wa);
    CHECK_CLOSE(got, want, 1e-4, 0, dir);
    CHECKF(fabs(aux - wa) <= 1e-6 && wa > 0, "%s: aux loss %.9f vs transformers' %.9f", dir, aux, wa);
    int64_t ns, ne, routed;
    const int64_t *tok = mmc_moe_expert_tokens(m->moe, &ns, &ne, &routed);
    int64_t sum = 0;
    for (int64_t i = 0; i < ns * ne; i++) sum += tok[i];
    CHECKF(sum == routed && routed == 28 * ns * (int64_t)(!strcmp(name, "tiny") ? 2 : 3),
           "%s: capacity statistics count %lld of %lld routings", dir, (long long)sum, (long long)routed);
    mmc_ctx_reset(ctx);
    mmc_set_grad_enabled(ctx, false);
    /* greedy decoding */
    snprintf(key, sizeof key, "%s.greedy", refname);
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    int32_t prompt[6], out[16];
    for (int i = 0; i < 6; i++) prompt[i] = (int32_t)((int64_t *)ids->data)[i];
    mmc_decoder dec = mmc_qwen2_decoder(m);
    mmc_gen_opts go = {.max_new_tokens = 10};
    mmc_sampler_defaults(&go.sampler);
    int n = 0;
    CHECK_OK(mmc_generate(&dec, prompt, 6, &go, out, &n));
    bool same = n == 10;
    for (int i = 0; i < n && same; i++) same = out[i] == ((int64_t *)greedy->data)[i];
    CHECKF(same, "%s: greedy tokens differ from transformers'", dir);
    mmc_tensor_free(ids);
    mmc_tensor_free(want);
    mmc_tensor_free(want_aux);
    mmc_tensor_free(greedy);
    mmc_ctx_free(ctx);
    mmc_qwen2_free(m);
}

/* config.json with one key changed (or removed: value NULL) -> the read's status and message */
static void bad_config(const char *key, const char *value, mmc_status want, const char *needle) {
    char *txt = NULL;
    size_t len = 0;
    CHECK_OK(mmc_read_file("tests/fixtures/moe/tiny/config.json", &txt, &len));
    if (!txt) return;
    char pat[96], *buf = malloc(len + 256);
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *at = strstr(txt, pat), *end = at ? strpbrk(at + strlen(pat), ",}") : NULL;
    CHECKF(at && end, "fixture config lacks %s", key);
    if (!at || !end || !buf) { free(txt); free(buf); return; }
    if (*end == ',' && !value) end++;
    snprintf(buf, len + 256, "%.*s%s%s%s%s", (int)(at - txt), txt, value ? pat : "", value ? " " : "", value ? value : "", end);
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_parse(buf, strlen(buf), "config.json", &j));
    mmc_qwen2_config c;
    mmc_status st = mmc_qwen2_moe_config_read(j, &c);
    CHECKF(st == want && strstr(mmc_last_error(), needle), "%s=%s: status %d, message '%s' (want '%s')", key,
           value ? value : "(removed)", st, st ? mmc_last_error() : "", needle);
    if (!st) mmc_moe_free(c.moe);
    mmc_json_free(j);
    free(txt);
    free(buf);
}

/* a config promising more experts than the weights hold: every missing tensor is named */
static void missing_weights(void) {
    char *txt = NULL;
    size_t len = 0;
    CHECK_OK(mmc_read_file("tests/fixtures/moe/tiny/config.json", &txt, &len));
    if (!txt) return;
    char *at = strstr(txt, "\"num_experts\": 4");
    CHECK(at != NULL);
    if (at) at[strlen("\"num_experts\": ")] = '5';
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_parse(txt, len, "config.json", &j));
    mmc_qwen2 *m = NULL;
    mmc_status st = mmc_qwen2_moe_load("tests/fixtures/moe/tiny", j, false, NULL, &m);
    CHECKF(st != MMC_OK && strstr(mmc_last_error(), "layers.0.mlp.experts.4.gate_proj.weight") &&
           strstr(mmc_last_error(), "layers.2.mlp.experts.4.down_proj.weight") &&
           strstr(mmc_last_error(), "layers.0.mlp.gate.weight"),   /* [4, C] where 5 rows are expected */
           "missing experts: %s", mmc_last_error());
    mmc_qwen2_free(m);
    mmc_json_free(j);
    free(txt);
}

int main(void) {
    ref = fixture_open("moe/ref.safetensors");
    if (!ref) return test_done("test_moe");
    test_dir("tiny", "tiny");
    test_dir("tiny_norm", "tiny_norm");
    test_dir("tiny_norm_hub", "tiny_norm");   /* the 4.4x Hub form: flat rope_theta, bf16 matrices */
    bad_config("num_experts", NULL, MMC_ERR_FORMAT, "'num_experts' is missing");
    bad_config("moe_intermediate_size", NULL, MMC_ERR_FORMAT, "'moe_intermediate_size' is missing");
    bad_config("num_experts_per_tok", "9", MMC_ERR_FORMAT, "num_experts_per_tok 9 exceeds num_experts 4");
    bad_config("num_experts", "0", MMC_ERR_FORMAT, "'num_experts' 0 must be");
    bad_config("mlp_only_layers", "[7]", MMC_ERR_FORMAT, "mlp_only_layers holds 7");
    bad_config("decoder_sparse_step", "0", MMC_ERR_FORMAT, "decoder_sparse_step 0");
    bad_config("hidden_act", "\"gelu\"", MMC_ERR_UNSUPPORTED, "hidden_act 'gelu'");
    bad_config("use_sliding_window", "true", MMC_ERR_UNSUPPORTED, "use_sliding_window");
    bad_config("num_experts", "\"four\"", MMC_ERR_FORMAT, "num_experts");
    missing_weights();
    CHECK(mmc_ep_check(60, 4) == MMC_OK);
    CHECKF(mmc_ep_check(4, 3) == MMC_ERR_INVALID &&
           strstr(mmc_last_error(), "expert_parallel 3 does not divide num_experts 4") &&
           strstr(mmc_last_error(), "use expert_parallel 1, 2, 4"), "ep message: %s", mmc_last_error());
    mmc_st_close(ref);
    return test_done("test_moe");
}
