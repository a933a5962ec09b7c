/* bench_internvl.c — InternVL2.5-8B shapes: InternViT-300M (hidden 1024, 16 heads, MLP 4096,
 * LayerNorm, qkv bias, 448 px tiles in 14 px patches: 1025 tokens) at 4 of 24 layers, pixel
 * shuffle 0.5 + mlp1 (LayerNorm 4096, 4096 -> 4096 -> 4096), and InternLM2-7B layers
 * (internlm2_5-7b-chat: hidden 4096, 32 heads / 8 kv heads, MLP 14336, vocabulary 92553, untied
 * head, rope_theta 1e6 with dynamic x2 scaling) at 2 of 32 layers, random f32 weights, in
 * OpenGVLab's remote-code layout (model_type internvl_chat, llm_config internlm2: the packed
 * wqkv read onto mmc's Llama decoder, internvl.c). Cases: image features of one 448x448 tile
 * (tower + shuffle + projector, 256 tokens), prefill of a 512-token prompt holding it (8 +
 * 256 <IMG_CONTEXT> + 248 tokens, last-position logits only, as generation does; the tower
 * included), single-token decode after it (tok/s, and the GB/s it streams: the decoder layers'
 * and the lm_head's weights and the KV cache once per token, against the host's read bandwidth
 * measured in the same process) and peak memory.
 * Training (bench_vlm7b.h, in forked children before the inference cases): one step on a
 * 512-token row (8 text, 256 <IMG_CONTEXT>, 248 text tokens, labels on those 248), tower 4 of 24
 * frozen, language model 1 of 32 layers; LoRA r=16 on the LM projections by default, full
 * (projector + LM, AdamW: ~16 GB per side with the 92553-row embedding and head) with
 * MMC_BENCH_VLM7B_TRAIN=full,lora. mmc trains InternVL in the HF-native layout only (the
 * remote-code layout's training is another issue's), so the training model is
 * InternVLForConditionalGeneration's with a Qwen2-type text config at InternLM2-7B's shapes: the
 * same decoder mmc runs InternLM2 on, plus Qwen2's q/k/v biases (6144 values a layer).
 * Peer: bench/peer_internvl.py, OpenGVLab's remote code (InternVisionModel + InternLM2ForCausalLM
 * as xtuner 0.2.0 ships them, transformers 4.44.2 in .venv-internlm2, sdpa, fp32; PEFT for LoRA),
 * same shapes, sequences and threads. */
#include "bench_vlm7b.h"
#include "mmc_internvl.h"
#include "mmc_trainer.h"

#include <string.h>

#define IMG_CONTEXT 92546   /* InternVL2.5-8B's <IMG_CONTEXT> */

static const char *CFG =
    "{\"model_type\": \"internvl_chat\", \"img_context_token_id\": 92546, \"select_layer\": -1,"
    " \"downsample_ratio\": 0.5, \"ps_version\": \"v2\","
    " \"llm_config\": {\"model_type\": \"internlm2\", \"vocab_size\": 92553, \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"num_hidden_layers\": 2, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 8, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-5, \"bias\": false,"
    " \"rope_theta\": 1000000, \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0},"
    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"},"
    " \"vision_config\": {\"model_type\": \"intern_vit_6b\", \"hidden_size\": 1024, \"intermediate_size\": 4096,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 16, \"image_size\": 448, \"patch_size\": 14,"
    " \"qkv_bias\": true, \"qk_normalization\": false, \"norm_type\": \"layer_norm\", \"layer_norm_eps\": 1e-6,"
    " \"hidden_act\": \"gelu\"}}";

/* training: HF-native InternVL, Qwen2-type text config at InternLM2-7B's shapes, 1 layer */
static const char *TRAIN_CFG =
    "{\"model_type\": \"internvl\", \"image_token_id\": 92546, \"projector_hidden_act\": \"gelu\","
    " \"downsample_ratio\": 0.5, \"vision_feature_layer\": -1, \"vision_feature_select_strategy\": \"default\","
    " \"text_config\": {\"model_type\": \"qwen2\", \"vocab_size\": 92553, \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"num_hidden_layers\": 1, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 8, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-5,"
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

/* vlm7b_decode_s's step: one token through the LM with the cache, then the lm_head */
static mmc_tensor *decode_step(mmc_ctx *ctx, void *m, mmc_kv_cache *kv, mmc_tensor *ids) {
    mmc_tensor *h;
    return mmc_internvl_forward(ctx, m, ids, NULL, kv, &h) ? NULL : mmc_internvl_logits(ctx, m, h);
}

static mmc_internvl *new_model(const char *json) {
    mmc_json *cfg = NULL;
    mmc_internvl *m = NULL;
    if (mmc_json_parse(json, strlen(json), "bench config", &cfg) || mmc_internvl_new(cfg, "bench config", 1, &m)) die();
    mmc_json_free(cfg);
    return m;
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

static mmc_status internvl_loss(mmc_ctx *ctx, void *m, const mmc_batch *b, double scale, mmc_tensor **l, int64_t *n) {
    return mmc_internvl_batch_loss(ctx, m, b, scale, l, n);
}

#define TRAIN_T 512
static void train_case(bool lora) {
    double base = bench_mem_baseline();
    mmc_internvl *m = new_model(TRAIN_CFG);
    vlm7b_model vm = {.model = m, .loss = internvl_loss, .tower_prefix = "vision_tower."};
    mmc_module_list ml = {0};
    if (mmc_internvl_params(m, &vm.params, &vm.names, &vm.n) || mmc_internvl_linears(m, &ml)) die();
    vm.linears = &ml;
    const int64_t S = 448, n_img = mmc_internvl_tile_tokens(m, S);
    static int32_t ids[TRAIN_T], lab[TRAIN_T];
    mmc_rng r;
    mmc_rng_init(&r, 5);
    mmc_batch b = {.B = 1, .T = TRAIN_T, .input_ids = ids, .labels = lab, .n_seqs = 1, .n_images = 1, .n_patches = 1,
                   .patch_dim = 3 * S * S, .n_tokens = TRAIN_T};
    for (int64_t t = 0; t < TRAIN_T; t++) {
        ids[t] = t >= 8 && t < 8 + n_img ? IMG_CONTEXT : (int32_t)(mmc_rng_u64(&r) % 92000);
        lab[t] = t >= 8 + n_img ? ids[t] : MMC_IGNORE_INDEX;
        b.n_label_tokens += t > 0 && lab[t] != MMC_IGNORE_INDEX;
    }
    b.pixel_values = malloc((size_t)b.patch_dim * sizeof(float));
    mmc_rng_normal(&r, b.pixel_values, b.patch_dim, 0, 1);
    int64_t grid[3] = {1, 1, 1};
    b.image_grid_thw = grid;
    vlm7b_train_case(&vm, lora, &b, "internvl_8b_train_v4l1_T512", base);
    free(b.pixel_values);
    vlm7b_model_free(&vm);
    mmc_internvl_free(m);
}

int main(void) {
    vlm7b_train_cases("bench_internvl", "lora", train_case);
    double base = bench_mem_baseline();
    args_t a = {.ctx = mmc_ctx_new()};
    a.m = new_model(CFG);
    mmc_set_grad_enabled(a.ctx, false);
    mmc_rng r;
    mmc_rng_init(&r, 3);
    a.px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 3, 448, 448));
    mmc_rng_normal(&r, a.px->data, mmc_numel(a.px), 0, 1);
    bench_reset_peak_rss();
    double sec = bench_time(vision_step, &a, 3.0, 2);
    bench_report("internvl_8b_image_features_vit300m_4of24_448px", 1.0 / sec, "img/s", 1);
    fprintf(stderr, "image features: %.3f s/tile\n", sec);
    const int64_t n_img = mmc_internvl_tile_tokens(a.m, 448), T = 512;
    a.ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, T));
    for (int64_t t = 0; t < T; t++)
        ((int32_t *)a.ids->data)[t] = t >= 8 && t < 8 + n_img ? IMG_CONTEXT : (int32_t)(mmc_rng_u64(&r) % 92000);
    const mmc_qwen2_config *tc = &a.m->lm->cfg;
    if (mmc_kv_cache_init(&a.kv, (int)tc->num_layers, 1, tc->num_kv_heads, tc->head_dim, T + 64)) die();
    sec = bench_time(prefill_step, &a, 5.0, 2);
    bench_report("internvl_8b_prefill_internlm2_7b_2of32_image_T512", (double)T / sec, "tok/s", 1);
    fprintf(stderr, "prefill (tower included): %.3f s for %lld tokens\n", sec, (long long)T);
    prefill_step(&a);
    const double step_s = vlm7b_decode_s(a.ctx, a.m, &a.kv, decode_step, tc->vocab_size);
    bench_report("internvl_8b_decode_internlm2_7b_2of32_after512", 1.0 / step_s, "tok/s", 1);
    double dec_bytes = 0;   /* decoder weights + lm_head (the embedding is gathered) + the KV cache at its mean length */
    for (int i = 0; i < a.m->lm->n_params; i++)
        if (a.m->lm->params[i] != a.m->lm->embed) dec_bytes += (double)mmc_nbytes(a.m->lm->params[i]);
    dec_bytes += 2.0 * (double)tc->num_layers * (double)(T + 16) * (double)(tc->num_kv_heads * tc->head_dim) * 4.0;
    bench_report("internvl_8b_decode_GBps", dec_bytes / step_s / 1e9, "GB/s", 1);
    double peak = bench_peak_rss_mib() - base;
    bench_report("internvl_8b_peak_mem_MiB", peak, "MiB", 0);
    mmc_kv_cache_free(&a.kv);
    mmc_tensor_free(a.ids);
    mmc_tensor_free(a.px);
    mmc_internvl_free(a.m);
    mmc_ctx_free(a.ctx);
    double bw = vlm7b_read_bw();
    bench_report_info("internvl_8b_host_read_GBps", bw, "GB/s");
    bench_report_info("internvl_8b_decode_frac_read_bw", dec_bytes / step_s / 1e9 / bw, "fraction");
    fprintf(stderr, "decode: %.1f ms/token, %.2f GB per token = %.1f GB/s, %.2f of the read bandwidth %.1f GB/s\n",
            step_s * 1e3, dec_bytes / 1e9, dec_bytes / step_s / 1e9, dec_bytes / step_s / 1e9 / bw, bw);
    return 0;
}
