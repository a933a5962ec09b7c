/* bench_internvl.c — InternVL2.5-8B / InternVL3-8B-like shapes with a Qwen2 language model:
 * InternViT-300M (hidden 1024, 16 heads, MLP 4096, LayerNorm, qkv bias, 448 px tiles in 14 px
 * patches: 1025 tokens) at 4 of 24 layers, pixel shuffle 0.5 + projector 4096 -> 3584 -> 3584, and
 * Qwen2-7B layers (hidden 3584, 28 heads / 4 kv heads, MLP 18944, vocabulary 152064, untied head)
 * at 2 of 28 layers, random f32 weights: image features of one 448x448 tile (tower + shuffle +
 * projector, 256 tokens) and prefill of a prompt holding it (8 + 256 <IMG_CONTEXT> + 16 tokens,
 * last-position logits only, as generation does; the tower included).
 * Peer: bench/peer_internvl.py, transformers' InternVLForConditionalGeneration (sdpa, fp32), same
 * shapes and threads. */
#include "bench_util.h"
#include "mmc_internvl.h"

#include <string.h>

static const char *CFG =
    "{\"model_type\": \"internvl\", \"image_token_id\": 151667, \"projector_hidden_act\": \"gelu\","
    " \"downsample_ratio\": 0.5, \"vision_feature_layer\": -1, \"vision_feature_select_strategy\": \"default\","
    " \"text_config\": {\"model_type\": \"qwen2\", \"vocab_size\": 152064, \"hidden_size\": 3584,"
    " \"intermediate_size\": 18944, \"num_hidden_layers\": 2, \"num_attention_heads\": 28,"
    " \"num_key_value_heads\": 4, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-6,"
    " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false},"
    " \"vision_config\": {\"model_type\": \"internvl_vision\", \"hidden_size\": 1024, \"intermediate_size\": 4096,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 16, \"image_size\": [448, 448], \"patch_size\": [14, 14],"
    " \"attention_bias\": true, \"norm_type\": \"layer_norm\", \"use_qk_norm\": false}}";

typedef struct {
    mmc_ctx *ctx;
    mmc_internvl *m;
    mmc_tensor *px, *ids;
    mmc_kv_cache kv;
} args_t;

static void die(void) {
    fprintf(stderr, "%s\n", mmc_last_error());
    exit(1);
}

static void vision_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    mmc_tensor *f;
    if (mmc_internvl_image_features(a->ctx, a->m, a->px, &f)) die();
}

static void prefill_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    a->kv.len = 0;
    mmc_tensor *h;
    if (mmc_internvl_forward(a->ctx, a->m, a->ids, a->px, &a->kv, &h)) die();
    int64_t T = a->ids->shape[1];
    mmc_internvl_logits(a->ctx, a->m, mmc_contiguous(a->ctx, mmc_narrow(a->ctx, h, 1, T - 1, 1)));
}

int main(void) {
    double base = bench_mem_baseline();
    mmc_json *cfg = NULL;
    if (mmc_json_parse(CFG, strlen(CFG), "bench config", &cfg)) die();
    args_t a = {.ctx = mmc_ctx_new()};
    if (mmc_internvl_new(cfg, "bench config", 1, &a.m)) die();
    mmc_json_free(cfg);
    mmc_set_grad_enabled(a.ctx, false);
    mmc_rng r;
    mmc_rng_init(&r, 3);
    a.px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 3, 448, 448));
    mmc_rng_normal(&r, a.px->data, mmc_numel(a.px), 0, 1);
    bench_reset_peak_rss();
    double sec = bench_time(vision_step, &a, 3.0, 2);
    bench_report("internvl_8b_image_features_vit300m_4of24_448px", 1.0 / sec, "img/s", 1);
    fprintf(stderr, "image features: %.3f s/tile\n", sec);
    const int64_t n_img = mmc_internvl_tile_tokens(a.m, 448), T = 8 + n_img + 16;
    a.ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, T));
    for (int64_t t = 0; t < T; t++)
        ((int32_t *)a.ids->data)[t] = t >= 8 && t < 8 + n_img ? 151667 : (int32_t)(mmc_rng_u64(&r) % 150000);
    const mmc_qwen2_config *tc = &a.m->lm->cfg;
    if (mmc_kv_cache_init(&a.kv, (int)tc->num_layers, 1, tc->num_kv_heads, tc->head_dim, T + 16)) die();
    sec = bench_time(prefill_step, &a, 5.0, 2);
    bench_report("internvl_8b_prefill_qwen2_7b_2of28_image_T280", (double)T / sec, "tok/s", 1);
    fprintf(stderr, "prefill (tower included): %.3f s for %lld tokens\n", sec, (long long)T);
    double peak = bench_peak_rss_mib() - base;
    bench_report("internvl_8b_peak_mem_MiB", peak, "MiB", 0);
    mmc_kv_cache_free(&a.kv);
    mmc_tensor_free(a.ids);
    mmc_tensor_free(a.px);
    mmc_internvl_free(a.m);
    mmc_ctx_free(a.ctx);
    return 0;
}
