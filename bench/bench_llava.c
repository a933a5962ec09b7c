/* bench_llava.c — LLaVA-1.5-7B shapes (CLIP ViT-L/14 at 336 px, 577 tokens; projector
 * 1024 -> 4096 -> 4096; Llama-2-7B layers, vocabulary 32064, untied head) with random f32
 * weights and reduced depth (tower 4 of 24 layers, language model 2 of 32): image features of
 * one 336x336 image (tower + projector), prefill of a prompt with that image (576 image tokens +
 * 24 text tokens, last-position logits only, as generation does) and single-token decode after
 * it, plus peak memory over weights + KV cache.
 * Peer: bench/peer_llava.py, transformers' LlavaForConditionalGeneration (sdpa, fp32), same
 * shapes and threads. */
#include "bench_util.h"
#include "mmc_llava.h"

#include <string.h>

static const char *CFG =
    "{\"model_type\": \"llava\", \"image_token_index\": 32000, \"projector_hidden_act\": \"gelu\","
    " \"vision_feature_layer\": -2, \"vision_feature_select_strategy\": \"default\","
    " \"text_config\": {\"model_type\": \"llama\", \"vocab_size\": 32064, \"hidden_size\": 4096,"
    " \"intermediate_size\": 11008, \"num_hidden_layers\": 2, \"num_attention_heads\": 32,"
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

int main(void) {
    double base = bench_mem_baseline();
    mmc_json *cfg = NULL;
    if (mmc_json_parse(CFG, strlen(CFG), "bench config", &cfg)) die();
    args_t a = {.ctx = mmc_ctx_new()};
    if (mmc_llava_new(cfg, "bench config", 1, &a.m)) die();
    mmc_json_free(cfg);
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
    double times[32];
    int32_t tok = 42;
    for (int s = 0; s < 32; s++) {
        double t0 = mmc_now();
        mmc_ctx_reset(a.ctx);
        mmc_tensor *ids = mmc_new(a.ctx, MMC_I32, 2, MMC_SHAPE(1, 1)), *h;
        ((int32_t *)ids->data)[0] = tok;
        if (mmc_llava_forward(a.ctx, a.m, ids, NULL, &a.kv, &h)) die();
        const float *l = mmc_llava_logits(a.ctx, a.m, h)->data;
        int32_t best = 0;
        for (int64_t v = 1; v < tc->vocab_size; v++) if (l[v] > l[best]) best = (int32_t)v;
        tok = best;
        times[s] = mmc_now() - t0;
    }
    qsort(times, 32, sizeof times[0], bench_cmp_);
    bench_report("llava15_7b_decode_lm2of32_after600", 1.0 / times[16], "tok/s", 1);
    g_peak = bench_peak_rss_mib();
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
    return 0;
}
