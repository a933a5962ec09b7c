/* bench_sdxl.c — one denoising step of an SDXL-shaped UNet at 1024² against diffusers
 * (bench/peer_sdxl.py builds the same UNet2DConditionModel and prints the same case names): f32
 * weights, inference (no tape here, torch.inference_mode there), batch 1, ms per call (lower is
 * better), and the peak memory.
 *
 *   sdxl_unet_step_1024_ms: one UNet2DConditionModel forward on the 128 x 128 x 4 latent of a 1024²
 *       image, 77 text states of 2048 channels (the two CLIP encoders' penultimate states), the pooled
 *       1280 and the six add_time_ids (text_time micro-conditioning), integer timestep. The model keeps
 *       SDXL base's widths and block kinds (320 / 640 / 1280 channels, DownBlock2D then two
 *       CrossAttnDownBlock2D and the mirror up, heads of 64 channels, linear projections, 2 ResNets a
 *       down block and 3 an up block, a cross-attention mid block) and cuts the transformer depth
 *       from 1 / 2 / 10 (mid 10) to 1 / 1 / 1 (mid 1): ~1.3 TFLOP a step, the convolutions at
 *       128² and the self-attention over 64² = 4096 tokens most of it. A real SDXL step is ~2.6x that.
 *   sdxl_unet_step_1024_peak_MiB: peak RSS minus the RSS before the model is built (bench_mem_baseline;
 *       weights count on both sides); *_rss_baseline_MiB says what was subtracted.
 *
 * Weights are random (mmc_unet_new: torch's nn.Linear-style init; the values do not change the work).
 * The VAE decode at 1024² is bench_diffusion's vae case with MMC_BENCH_VAE_PX=1024 (the SDXL VAE has
 * the same widths; 4 latent channels instead of 16). MMC_BENCH_FILTER=sdxl runs this and its peer. */
#include "bench_util.h"
#include "mmc_diffusion.h"

#include <string.h>

static const char CONFIG[] =
    "{\"sample_size\": 128, \"in_channels\": 4, \"out_channels\": 4, \"center_input_sample\": false,"
    " \"down_block_types\": [\"DownBlock2D\", \"CrossAttnDownBlock2D\", \"CrossAttnDownBlock2D\"],"
    " \"up_block_types\": [\"CrossAttnUpBlock2D\", \"CrossAttnUpBlock2D\", \"UpBlock2D\"],"
    " \"mid_block_type\": \"UNetMidBlock2DCrossAttn\", \"block_out_channels\": [320, 640, 1280],"
    " \"layers_per_block\": 2, \"transformer_layers_per_block\": [1, 1, 1], \"attention_head_dim\": [5, 10, 20],"
    " \"cross_attention_dim\": 2048, \"use_linear_projection\": true, \"norm_num_groups\": 32,"
    " \"flip_sin_to_cos\": true, \"freq_shift\": 0, \"addition_embed_type\": \"text_time\","
    " \"addition_time_embed_dim\": 256, \"projection_class_embeddings_input_dim\": 2816}";

typedef struct {
    mmc_ctx *ctx;
    mmc_unet *m;
    mmc_unet_inputs in;
} ucase;

static void run_step(void *arg) {
    ucase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_tensor *out;
    MMC_CHECK(mmc_unet_forward(c->ctx, c->m, &c->in, &out) == MMC_OK, "%s", mmc_last_error());
}

int main(void) {
    const double base = bench_mem_baseline();
    mmc_json *cfg = NULL;
    MMC_CHECK(mmc_json_parse(CONFIG, strlen(CONFIG), "bench_sdxl config", &cfg) == MMC_OK, "%s", mmc_last_error());
    ucase c = {.ctx = mmc_ctx_new()};
    mmc_set_grad_enabled(c.ctx, false);
    MMC_CHECK(mmc_unet_new(cfg, "bench_sdxl config", 1, &c.m) == MMC_OK, "%s", mmc_last_error());
    mmc_json_free(cfg);
    mmc_tensor *x = bench_rand_param(2, 4, MMC_SHAPE(1, 4, 128, 128), 1.0f);
    mmc_tensor *enc = bench_rand_param(3, 3, MMC_SHAPE(1, 77, 2048), 1.0f);
    mmc_tensor *pooled = bench_rand_param(4, 2, MMC_SHAPE(1, 1280), 1.0f);
    x->flags = enc->flags = pooled->flags = 0;
    static const float t = 500.0f, time_ids[6] = {1024, 1024, 0, 0, 1024, 1024};
    c.in = (mmc_unet_inputs){.sample = x, .timestep = &t, .encoder = enc, .text_embeds = pooled, .time_ids = time_ids,
                             .n_time_ids = 6};
    bench_report("sdxl_unet_step_1024_ms", 1e3 * bench_time(run_step, &c, 0.0, 1), "ms", 0);
    bench_report("sdxl_unet_step_1024_peak_MiB", bench_peak_rss_mib() - base, "MiB", 0);
    bench_report_info("sdxl_unet_step_1024_rss_baseline_MiB", base, "MiB");
    mmc_tensor_free(x), mmc_tensor_free(enc), mmc_tensor_free(pooled);
    mmc_unet_free(c.m);
    mmc_ctx_free(c.ctx);
    return 0;
}
