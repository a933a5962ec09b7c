/* bench_llava.c — LLaVA-1.5-7B shapes (CLIP ViT-L/14 at 336 px, 577 tokens; projector
 * 1024 -> 4096 -> 4096; Llama-2-7B layers, vocabulary 32064, untied head) with random f32
 * weights and reduced depth (tower 4 of 24 layers, language model 2 of 32): image features of
 * one 336x336 image (tower + projector), prefill of a prompt with that image (576 image tokens +
 * 24 text tokens, last-position logits only, as generation does), prefill of 512 text tokens,
 * single-token decode after the image prompt (tok/s, and the GB/s it streams: the decoder
 * layers' and lm_head's weights plus the KV cache once per token, against the host's read
 * bandwidth measured in the same process), plus peak memory over weights + KV cache.
 * Training (bench_vlm7b.h, each mode in a forked child, before the inference cases): one step
 * on a 640-token row (8 text, 576 <image>, 56 text tokens, labels on those 56) with the tower
 * (4 of 24) frozen and the language model at 1 of 32 layers (full vocabulary: memory), full
 * (projector + language model, AdamW) and LoRA r=16 on the LM projections.
 * MMC_BENCH_VLM7B_TRAIN=full,lora|none picks them.
 * Peer: bench/peer_llava.py, transformers' LlavaForConditionalGeneration (sdpa, fp32; PEFT for
 * LoRA), same shapes, sequences and threads. */
#include "bench_vlm7b.h"
#include "mmc_llava.h"
#include "mmc_trainer.h"

#include <string.h>

static const char *CFG =
    "{\"model_type\": \"llava\", \"image_token_index\": 32000, \"projector_hidden_act\": \"gelu\","
    " \"vision_feature_layer\": -2, \"vision_feature_select_strategy\": \"default\","
    " \"text_config\": {\"model_type\": \"llama\", \"vocab_size\": 32064, \"hidden_size\": 4096,"
    " \"intermediate_size\": 11008, \"num_hidden_layers\": %d, \"num_attention_heads\": 32,"
    " \"num_key_value_heads\": 32, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-5},"
    " \"vision_config\": {\"model_type\": \"clip_vision_model\", \"hidden_size\": 1024, \"intermediate_size\": 4096,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 16, \"image_size\": 336, \"patch_size\": 14}}";

static double g_peak;
typedef struct {
    mmc_ctx *ctx;
    mmc_llava *m;
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
    return mmc_llava_forward(ctx, m, ids, NULL, kv, &h) ? NULL : mmc_llava_logits(ctx, m, h);
}

static void vision_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    mmc_tensor *f;
    if (mmc_llava_image_features(a->ctx, a->m, a->px, &f)) die();
}

static void prefill_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    a->kv.len = 0;
    mmc_tensor *h;
    if (mmc_llava_forward(a->ctx, a->m, a->ids, a->px, &a->kv, &h)) die();
    int64_t T = a->ids->shape[1];
    mmc_llava_logits(a->ctx, a->m, mmc_contiguous(a->ctx, mmc_narrow(a->ctx, h, 1, T - 1, 1)));
}

static mmc_llava *new_model(int lm_layers) {
    char buf[2048];
    snprintf(buf, sizeof buf, CFG, lm_layers);
    mmc_json *cfg = NULL;
    mmc_llava *m = NULL;
    if (mmc_json_parse(buf, strlen(buf), "bench config", &cfg) || mmc_llava_new(cfg, "bench config", 1, &m)) die();
    mmc_json_free(cfg);
    return m;
}

static mmc_status llava_loss(mmc_ctx *ctx, void *m, const mmc_batch *b, double scale, mmc_tensor **l, int64_t *n) {
    return mmc_llava_batch_loss(ctx, m, b, scale, l, n);
}

/* one training mode in this (forked) process: the row of the header, pixels N(0, 1) */
#define TRAIN_T 640
static void train_case(bool lora) {
    double base = bench_mem_baseline();
    mmc_llava *m = new_model(1);
    vlm7b_model vm = {.model = m, .loss = llava_loss, .tower_prefix = "vision_tower."};
    mmc_module_list ml = {0};
    if (mmc_llava_params(m, &vm.params, &vm.names, &vm.n) || mmc_llava_linears(m, &ml)) die();
    vm.linears = &ml;
    const int64_t n_img = mmc_llava_image_tokens(m), S = 336;
    static int32_t ids[TRAIN_T], lab[TRAIN_T];
    mmc_rng r;
    mmc_rng_init(&r, 5);
    mmc_batch b = {.B = 1, .T = TRAIN_T, .input_ids = ids, .labels = lab, .n_seqs = 1, .n_images = 1, .n_patches = 1,
                   .patch_dim = 3 * S * S};
    for (int64_t t = 0; t < TRAIN_T; t++) {
        ids[t] = t >= 8 && t < 8 + n_img ? 32000 : (int32_t)(mmc_rng_u64(&r) % 31000);
        lab[t] = t >= 8 + n_img ? ids[t] : MMC_IGNORE_INDEX;
        b.n_label_tokens += t > 0 && lab[t] != MMC_IGNORE_INDEX;
    }
    b.n_tokens = TRAIN_T;
    b.pixel_values = malloc((size_t)b.patch_dim * sizeof(float));
    mmc_rng_normal(&r, b.pixel_values, b.patch_dim, 0, 1);
    int64_t grid[3] = {1, S, S};
    b.image_grid_thw = grid;
    vlm7b_train_case(&vm, lora, &b, "llava15_7b_train_t4l1_T640", base);
    free(b.pixel_values);
    vlm7b_model_free(&vm);
    mmc_llava_free(m);
}

int main(void) {
    vlm7b_train_cases("bench_llava", "full,lora", train_case);
    double base = bench_mem_baseline();
    args_t a = {.ctx = mmc_ctx_new()};
    a.m = new_model(2);
    mmc_set_grad_enabled(a.ctx, false);
    mmc_rng r;
    mmc_rng_init(&r, 3);
    a.px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 3, 336, 336));
    mmc_rng_normal(&r, a.px->data, mmc_numel(a.px), 0, 1);
    bench_reset_peak_rss();
    double sec = bench_time(vision_step, &a, 3.0, 2);
    bench_report("llava15_7b_image_features_tower4of24_336px", 1.0 / sec, "img/s", 1);
    fprintf(stderr, "image features: %.3f s/image\n", sec);
    /* prompt: 8 text tokens, 576 <image>, 16 text tokens */
    const int64_t n_img = mmc_llava_image_tokens(a.m), T = 8 + n_img + 16;
    a.ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, T));
    for (int64_t t = 0; t < T; t++)
        ((int32_t *)a.ids->data)[t] = t >= 8 && t < 8 + n_img ? 32000 : (int32_t)(mmc_rng_u64(&r) % 31000);
    const mmc_qwen2_config *tc = &a.m->lm->cfg;
    if (mmc_kv_cache_init(&a.kv, (int)tc->num_layers, 1, tc->num_kv_heads, tc->head_dim, T + 64)) die();
    sec = bench_time(prefill_step, &a, 5.0, 2);
    bench_report("llava15_7b_prefill_lm2of32_image_T600", (double)T / sec, "tok/s", 1);
    fprintf(stderr, "prefill (tower included): %.3f s for %lld tokens\n", sec, (long long)T);
    prefill_step(&a);
    const double step_s = vlm7b_decode_s(a.ctx, a.m, &a.kv, decode_step, tc->vocab_size);
    bench_report("llava15_7b_decode_lm2of32_after600", 1.0 / step_s, "tok/s", 1);
    /* what a decode step streams: every decoder weight and the lm_head (the embedding is gathered), and the KV
     * cache at its mean length */
    double dec_bytes = 0;
    for (int i = 0; i < a.m->lm->n_params; i++)
        if (a.m->lm->params[i] != a.m->lm->embed) dec_bytes += (double)mmc_nbytes(a.m->lm->params[i]);
    if (a.m->lm->lm_head == a.m->lm->embed) dec_bytes += (double)mmc_nbytes(a.m->lm->embed);
    dec_bytes += 2.0 * (double)tc->num_layers * (double)(T + 16) * (double)(tc->num_kv_heads * tc->head_dim) * 4.0;
    bench_report("llava15_7b_decode_GBps", dec_bytes / step_s / 1e9, "GB/s", 1);
    g_peak = bench_peak_rss_mib();
    /* prefill of 512 text tokens (no image), last-position logits */
    mmc_tensor *img_ids = a.ids, *img_px = a.px;
    a.ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, 512));
    for (int64_t t = 0; t < 512; t++) ((int32_t *)a.ids->data)[t] = (int32_t)(mmc_rng_u64(&r) % 31000);
    a.px = NULL;
    sec = bench_time(prefill_step, &a, 5.0, 2);
    bench_report("llava15_7b_prefill_lm2of32_T512", 512.0 / sec, "tok/s", 1);
    fprintf(stderr, "prefill of 512 text tokens: %.3f s\n", sec);
    mmc_tensor_free(a.ids);
    a.ids = img_ids, a.px = img_px;
    if (bench_peak_rss_mib() > g_peak) g_peak = bench_peak_rss_mib();
    double w = 0, kv = 0;
    for (int i = 0; i < a.m->lm->n_params; i++) w += (double)mmc_nbytes(a.m->lm->params[i]);
    const mmc_clip_vision_config *vc = mmc_clip_vision_cfg(a.m->vision);
    /* tower + projector parameters, counted from the config */
    int64_t Cv = vc->hidden_size, Fv = vc->intermediate_size, g = vc->image_size / vc->patch_size;
    w += 4.0 * (double)(vc->num_hidden_layers * (4 * (Cv * Cv + Cv) + 2 * Cv * Fv + Fv + Cv + 4 * Cv) +
                        Cv * 3 * vc->patch_size * vc->patch_size + Cv + (1 + g * g) * Cv + 4 * Cv);
    w += 4.0 * (double)(tc->hidden_size * Cv + tc->hidden_size * tc->hidden_size + 2 * tc->hidden_size);
    for (int l = 0; l < a.kv.n_layers; l++) kv += (double)(mmc_nbytes(a.kv.k[l]) + mmc_nbytes(a.kv.v[l]));
    const double MiB = 1048576.0;
    double peak = g_peak - base;
    bench_report("llava15_7b_peak_mem_MiB", peak, "MiB", 0);
    bench_report_info("llava15_7b_rss_baseline_MiB", base, "MiB");
    bench_report("llava15_7b_peak_mem_over_weights_kv", peak * MiB / (w + kv), "x", 0);
    fprintf(stderr, "peak RSS %.1f MiB - baseline %.1f MiB = %.1f MiB = %.3f x (weights %.1f MiB + KV %.1f MiB)\n", g_peak,
            base, peak, peak * MiB / (w + kv), w / MiB, kv / MiB);
    mmc_kv_cache_free(&a.kv);
    mmc_tensor_free(a.ids);
    mmc_tensor_free(a.px);
    mmc_llava_free(a.m);
    mmc_ctx_free(a.ctx);
    /* after the peak: the host's read bandwidth, and decode's share of it */
    double bw = vlm7b_read_bw();
    bench_report_info("llava15_7b_host_read_GBps", bw, "GB/s");
    bench_report_info("llava15_7b_decode_frac_read_bw", dec_bytes / step_s / 1e9 / bw, "fraction");
    fprintf(stderr, "decode: %.1f ms/token, %.2f GB per token = %.1f GB/s, %.2f of the read bandwidth %.1f GB/s\n",
            step_s * 1e3, dec_bytes / 1e9, dec_bytes / step_s / 1e9, dec_bytes / step_s / 1e9 / bw, bw);
    return 0;
}
