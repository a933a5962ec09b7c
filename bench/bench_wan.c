/* bench_wan.c — one denoising step of a Wan2.1-shaped video DiT against diffusers
 * (bench/peer_wan.py builds the same WanTransformer3DModel and prints the same case names): f32
 * weights, inference (no tape here, torch.inference_mode there), batch 1, ms per call (lower is
 * better), and the peak memory.
 *
 *   wan_step_33f_320x192_ms: one WanTransformer3DModel forward for a 33-frame 320x192 clip: the
 *       latent [16, 9, 24, 40] patched (1, 2, 2) into 9 x 12 x 20 = 2160 tokens, and 512 UMT5 tokens of
 *       4096 channels, integer timestep. The model keeps Wan2.1-T2V-1.3B's widths (12 heads of 128 =
 *       1536, FFN 8960, freq_dim 256, cross-attention norm, 3-axis rope 44/42/42) and cuts its depth
 *       to 2 of 30 blocks: ~0.45 TFLOP a step (FFN half, self-attention over 2160 tokens a sixth); a
 *       real 1.3B step costs ~15x that, CFG doubles it.
 *   wan_step_33f_320x192_peak_MiB: peak RSS minus the RSS before the model is built
 *       (bench_mem_baseline; weights count on both sides); *_rss_baseline_MiB says what was subtracted.
 *
 * Weights are random (mmc_wan_new, torch's nn.Linear init; the values do not change the work). The
 * VAE decode of the same clip is the causal VAE's own benchmark. MMC_BENCH_FILTER=wan runs this and its
 * peer. */
#include "bench_util.h"
#include "mmc_wan_t2v.h"

enum { W_HEADS = 12, W_HEAD_DIM = 128, W_FFN = 8960, W_TEXT = 4096, W_TXT = 512, W_LAYERS = 2,
       W_CH = 16, W_F = 9, W_H = 24, W_W = 40 };

typedef struct {
    mmc_ctx *ctx;
    mmc_wan *m;
    mmc_wan_inputs in;
} wcase;

static void run_step(void *arg) {
    wcase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *out;
    MMC_CHECK(mmc_wan_forward(c->ctx, c->m, &c->in, &out) == MMC_OK, "%s", mmc_last_error());
}

int main(void) {
    const double base = bench_mem_baseline();
    mmc_wan_config cfg = {.patch_size = {1, 2, 2}, .num_attention_heads = W_HEADS, .attention_head_dim = W_HEAD_DIM,
                          .in_channels = W_CH, .out_channels = W_CH, .text_dim = W_TEXT, .freq_dim = 256,
                          .ffn_dim = W_FFN, .num_layers = W_LAYERS, .cross_attn_norm = true, .eps = 1e-6,
                          .rope_max_seq_len = 1024, .rope_dims = {44, 42, 42}};
    wcase c = {.ctx = mmc_ctx_new()};
    mmc_set_grad_enabled(c.ctx, false);
    MMC_CHECK(mmc_wan_new(&cfg, 1, &c.m) == MMC_OK, "%s", mmc_last_error());
    mmc_tensor *hidden = bench_rand_param(2, 5, MMC_SHAPE(1, W_CH, W_F, W_H, W_W), 1.0f);
    mmc_tensor *enc = bench_rand_param(3, 3, MMC_SHAPE(1, W_TXT, W_TEXT), 1.0f);
    hidden->flags = enc->flags = 0;
    static const float t = 500.0f;
    c.in = (mmc_wan_inputs){.hidden = hidden, .timestep = &t, .encoder = enc};
    bench_report("wan_step_33f_320x192_ms", 1e3 * bench_time(run_step, &c, 0.0, 3), "ms", 0);
    bench_report("wan_step_33f_320x192_peak_MiB", bench_peak_rss_mib() - base, "MiB", 0);
    bench_report_info("wan_step_33f_320x192_rss_baseline_MiB", base, "MiB");
    mmc_tensor_free(hidden);
    mmc_tensor_free(enc);
    mmc_wan_free(c.m);
    mmc_ctx_free(c.ctx);
    return 0;
}
