/* test_internlm2.c — a text-only InternLM2ForCausalLM folder (model_type internlm2, the InternLM team's remote-code
 * names: tok_embeddings, attention.wqkv, attention.wo, feed_forward.w1/w3/w2, attention_norm, ffn_norm, output) read
 * onto mmc's Llama decoder (text/internlm2.c), against the reference modeling_internlm2.py (xtuner 0.2.0's copy, on
 * transformers 4.44.2; tools/ref/gen_internvl_internlm2.py text_only() -> tests/fixtures/internlm2/): the flags the
 * InternVL fixture leaves off — bias true (wqkv's bias split with its rows, wo's), rope_scaling linear x2, 6 query
 * heads over 2 key/value heads (3 per wqkv row group) —
 *   - logits of a random 21-token prompt within 1e-4 of the reference's at every position;
 *   - 8 greedy tokens through mmc_generate (KV cache) equal to the reference's (full forwards);
 *   - the config as read: GQA, biases, linear rope factor 2; trainable loads are not offered (mmc_internlm2_load has
 *     no such flag), and a folder without the packed wqkv is refused naming it;
 *   - --adapter at inference: tests/fixtures/internlm2_train's PEFT adapter (over the packed wqkv, wo, w1/w2/w3) on
 *     the packed layout (mmc_internlm2_load_packed, not trainable) gives PeftModel's logits within 1e-4
 *     (tools/ref/gen_internvl_chat_train.py text_internlm2). */
#include "test_util.h"
#include "greedy_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmc_io.h"
#include "mmc_models.h"

#define DIR_ "tests/fixtures/internlm2/tiny"

int main(void) {
    mmc_st *ref = fixture_open("internlm2/ref.safetensors");
    mmc_json *cfg = NULL;
    if (!ref || mmc_json_load(DIR_ "/config.json", &cfg) != MMC_OK) {
        CHECKF(false, "fixture: %s", mmc_last_error());
        mmc_st_close(ref);
        return test_done("test_internlm2");
    }
    mmc_qwen2 *m = NULL;
    CHECK_OK(mmc_internlm2_load(DIR_, cfg, &m));
    if (m) {
        const mmc_qwen2_config *c = &m->cfg;
        CHECK(c->num_heads == 6 && c->num_kv_heads == 2 && c->head_dim == 8 && c->qkv_bias && c->o_bias &&
              !c->mlp_bias && c->rope_kind == MMC_ROPE_LINEAR && c->rope_factor == 2.0 && !c->tie_word_embeddings);
        mmc_tensor *ids = fixture_tensor(ref, "ids", MMC_I64), *want = fixture_tensor(ref, "logits", MMC_F32),
                   *greedy = fixture_tensor(ref, "greedy", MMC_I64);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        mmc_tensor *h = NULL;
        CHECK_OK(mmc_qwen2_forward_embeds(ctx, m, mmc_qwen2_embed(ctx, m, ids), NULL, &h));
        if (h) {
            mmc_tensor *got = mmc_qwen2_logits(ctx, m, h);
            printf("internlm2 tiny logits [%lld, %lld, %lld] max|diff| %.4e (modeling_internlm2.py)\n",
                   (long long)got->shape[0], (long long)got->shape[1], (long long)got->shape[2], max_abs_diff(got, want));
            CHECK_CLOSE(got, want, 1e-4, 0, DIR_);
        }
        mmc_ctx_reset(ctx);
        mmc_decoder dec = mmc_qwen2_decoder(m);
        check_greedy(&dec, ids, greedy, DIR_);
        mmc_tensor_free(ids), mmc_tensor_free(want), mmc_tensor_free(greedy);
        mmc_ctx_free(ctx);
        mmc_qwen2_free(m);
    }
    /* --adapter at inference (mmc generate / forward load the packed layout when given one): PEFT's trained adapter
     * of tests/fixtures/internlm2_train (one lora_A / lora_B over the packed wqkv, wo, w1, w2, w3) on its base, against
     * PeftModel's logits (tools/ref/gen_internvl_chat_train.py text_internlm2, xtuner's modeling_internlm2.py) */
    mmc_st *lref = fixture_open("internlm2_train/lora_logits.safetensors");
    mmc_json *tcfg = NULL;
    if (lref && mmc_json_load("tests/fixtures/internlm2_train/tiny/config.json", &tcfg) == MMC_OK) {
        mmc_qwen2 *pm = NULL;
        CHECK_OK(mmc_internlm2_load_packed("tests/fixtures/internlm2_train/tiny", tcfg, "", false, &pm));
        mmc_tensor *ids = fixture_tensor(lref, "ids", MMC_I64), *want = fixture_tensor(lref, "logits", MMC_F32);
        mmc_ctx *ctx = mmc_ctx_new();
        mmc_set_grad_enabled(ctx, false);
        for (int with = 0; pm && ids && want && with < 2; with++) {
            if (with) CHECK_OK(mmc_qwen2_attach_adapter(pm, "tests/fixtures/internlm2_train/lora_ref"));
            mmc_tensor *h = NULL;
            CHECK_OK(mmc_qwen2_forward_embeds(ctx, pm, mmc_qwen2_embed(ctx, pm, ids), NULL, &h));
            if (!h) break;
            mmc_tensor *got = mmc_qwen2_logits(ctx, pm, h);
            double d = max_abs_diff(got, want);
            printf("internlm2 packed %s: max|logits - PeftModel's| %.4e\n", with ? "+ PEFT adapter" : "base (no adapter)", d);
            if (with) CHECK_CLOSE(got, want, 1e-4, 0, "internlm2 --adapter");
            else CHECKF(d > 1e-2, "the adapter should move the logits (base differs from PEFT's by only %g)", d);
            mmc_ctx_reset(ctx);
        }
        mmc_tensor_free(ids), mmc_tensor_free(want);
        mmc_ctx_free(ctx);
        mmc_qwen2_free(pm);
    } else CHECKF(false, "internlm2_train/lora_logits.safetensors / tiny/config.json: %s", mmc_last_error());
    mmc_json_free(tcfg);
    mmc_st_close(lref);
    /* a Llama folder's names are not InternLM2's: refused, naming the packed projection it looked for */
    mmc_json *lc = NULL;
    if (mmc_json_load("tests/fixtures/llava/v5/config.json", &lc) == MMC_OK) {
        m = NULL;
        mmc_status st = mmc_internlm2_load("tests/fixtures/llava/v5", lc, &m);
        CHECKF(st == MMC_ERR_FORMAT && strstr(mmc_last_error(), "model.layers.0.attention.wqkv.weight: missing"),
               "a folder without wqkv: %s", st ? mmc_last_error() : "loaded");
        mmc_qwen2_free(m);
        mmc_json_free(lc);
    } else CHECKF(false, "tests/fixtures/llava/v5/config.json: %s", mmc_last_error());
    mmc_json_free(cfg);
    mmc_st_close(ref);
    return test_done("test_internlm2");
}
