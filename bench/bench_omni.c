/* bench_omni.c — Qwen2.5-Omni-7B thinker shapes at reduced depth: the Whisper-like audio encoder
 * (d_model 1280, 20 heads, FFN 5120, 128 mel bins, n_window 100) at 4 of 32 layers, the Qwen2.5-VL
 * vision tower (1280 wide, 16 heads, SwiGLU 3420, window 112, last block full attention) at 4 of 32
 * blocks, and Qwen2-7B layers (hidden 3584, 28 heads / 4 kv heads, MLP 18944, M-RoPE [16, 24, 24])
 * at 2 of 28; random f32 weights. The vocabulary is cut to 32768 (the real 152064 would add 3.5 GB of
 * embedding and head on each side and no measurable time: prefill looks up one row per token and
 * scores the last position only), so the special tokens take ids 32001.. (<|AUDIO|> 32001, <|IMAGE|>
 * 32002, <|vision_bos|> 32004, <|vision_eos|> 32005, <|audio_bos|> 32006, <|audio_eos|> 32007).
 * Case: prefill of a prompt with one 448x448 image (1024 patches, 256 tokens) and 10 s of audio (1000 feature frames of a 30 s window, 250 tokens), as
 * Qwen2_5OmniProcessor lays it out (<|vision_bos|> image <|vision_eos|><|audio_bos|> audio
 * <|audio_eos|> between text): 534 tokens, both encoders, TMRoPE, last-position logits only, from
 * the features / pixel values (the feature extraction is bench_audio's).
 * Peer: bench/peer_omni.py, transformers' Qwen2_5OmniThinkerForConditionalGeneration (sdpa, fp32),
 * same shapes and threads. */
#include "bench_util.h"
#include "mmc_omni.h"

#include <string.h>

static const char *CFG =
    "{\"model_type\": \"qwen2_5_omni_thinker\", \"audio_token_index\": 32001, \"image_token_index\": 32002,"
    " \"video_token_index\": 32003, \"vision_start_token_id\": 32004, \"audio_start_token_id\": 32006,"
    " \"audio_end_token_id\": 32007, \"position_id_per_seconds\": 25, \"seconds_per_chunk\": 2,"
    " \"text_config\": {\"model_type\": \"qwen2_5_omni_text\", \"vocab_size\": 32768, \"hidden_size\": 3584,"
    " \"intermediate_size\": 18944, \"num_hidden_layers\": 2, \"num_attention_heads\": 28,"
    " \"num_key_value_heads\": 4, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-6,"
    " \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, \"mrope_section\": [16, 24, 24]}},"
    " \"audio_config\": {\"model_type\": \"qwen2_5_omni_audio_encoder\", \"d_model\": 1280, \"encoder_layers\": 4,"
    " \"encoder_attention_heads\": 20, \"encoder_ffn_dim\": 5120, \"num_mel_bins\": 128, \"max_source_positions\": 1500,"
    " \"n_window\": 100, \"output_dim\": 3584, \"activation_function\": \"gelu\", \"scale_embedding\": false},"
    " \"vision_config\": {\"model_type\": \"qwen2_5_omni_vision_encoder\", \"depth\": 4, \"hidden_size\": 1280,"
    " \"intermediate_size\": 3420, \"num_heads\": 16, \"in_channels\": 3, \"out_hidden_size\": 3584, \"patch_size\": 14,"
    " \"spatial_merge_size\": 2, \"temporal_patch_size\": 2, \"window_size\": 112, \"fullatt_block_indexes\": [3],"
    " \"hidden_act\": \"silu\"}}";

enum { N_IMG = 256, N_AUD = 250, FRAMES = 1000, STRIDE = 3000, MELS = 128 };

typedef struct {
    mmc_ctx *ctx;
    mmc_omni *m;
    int32_t *ids;
    int64_t T;
    mmc_omni_media media;
    mmc_kv_cache kv;
} args_t;

static void die(void) {
    fprintf(stderr, "%s\n", mmc_last_error());
    exit(1);
}

static void prefill_step(void *p) {
    args_t *a = p;
    mmc_ctx_reset(a->ctx);
    a->kv.len = 0;
    int64_t delta;
    mmc_tensor *h;
    if (mmc_omni_forward(a->ctx, a->m, a->ids, a->T, &a->media, &a->kv, &delta, &h)) die();
    mmc_qwen2_logits(a->ctx, a->m->lm, mmc_contiguous(a->ctx, mmc_narrow(a->ctx, h, 1, a->T - 1, 1)));
}

int main(void) {
    double base = bench_mem_baseline();
    mmc_json *cfg = NULL;
    if (mmc_json_parse(CFG, strlen(CFG), "bench config", &cfg)) die();
    args_t a = {.ctx = mmc_ctx_new()};
    if (mmc_omni_new(cfg, "bench config", 1, &a.m)) die();
    mmc_json_free(cfg);
    mmc_set_grad_enabled(a.ctx, false);
    mmc_rng r;
    mmc_rng_init(&r, 3);
    /* one image: grid (1, 32, 32) of 2x3x14x14 patches; 10 s of log-mel features in a 30 s window */
    static const int64_t grid[3] = {1, 32, 32};
    mmc_tensor *px = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(1024, 3 * 2 * 14 * 14));
    mmc_rng_normal(&r, px->data, mmc_numel(px), 0, 1);
    float *feats = calloc((size_t)MELS * STRIDE, sizeof(float));
    if (!px || !feats) die();
    for (int64_t c = 0; c < MELS; c++) mmc_rng_normal(&r, feats + c * STRIDE, FRAMES, 0, 0.5f);
    mmc_omni_audio_in ain = {.feats = feats, .stride = STRIDE, .frames = FRAMES};
    a.media = (mmc_omni_media){.audios = &ain, .n_audios = 1, .pixel_values = px, .image_grid_thw = grid, .n_images = 1};
    /* 8 text, <|vision_bos|> 256 x <|IMAGE|> <|vision_eos|> <|audio_bos|> 250 x <|AUDIO|> <|audio_eos|>, 16 text */
    a.T = 8 + 1 + N_IMG + 1 + 1 + N_AUD + 1 + 16;
    a.ids = malloc(sizeof(int32_t) * (size_t)a.T);
    int64_t t = 0;
    for (int i = 0; i < 8; i++) a.ids[t++] = (int32_t)(mmc_rng_u64(&r) % 30000);
    a.ids[t++] = 32004;
    for (int i = 0; i < N_IMG; i++) a.ids[t++] = 32002;
    a.ids[t++] = 32005;
    a.ids[t++] = 32006;
    for (int i = 0; i < N_AUD; i++) a.ids[t++] = 32001;
    a.ids[t++] = 32007;
    for (int i = 0; i < 16; i++) a.ids[t++] = (int32_t)(mmc_rng_u64(&r) % 30000);
    const mmc_qwen2_config *tc = &a.m->lm->cfg;
    if (mmc_kv_cache_init(&a.kv, (int)tc->num_layers, 1, tc->num_kv_heads, tc->head_dim, a.T + 16)) die();
    bench_reset_peak_rss();
    double sec = bench_time(prefill_step, &a, 5.0, 2);
    bench_report("omni_7b_prefill_thinker_2of28_audio10s_image448_T534", (double)a.T / sec, "tok/s", 1);
    fprintf(stderr, "omni prefill (audio encoder 4/32, vision 4/32, LM 2/28): %.3f s for %lld tokens\n", sec,
            (long long)a.T);
    double peak = bench_peak_rss_mib() - base;
    bench_report("omni_7b_v32k_peak_mem_MiB", peak, "MiB", 0);
    mmc_kv_cache_free(&a.kv);
    free(a.ids);
    free(feats);
    mmc_tensor_free(px);
    mmc_omni_free(a.m);
    mmc_ctx_free(a.ctx);
    return 0;
}
