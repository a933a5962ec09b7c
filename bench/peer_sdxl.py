"""peer_sdxl.py — diffusers peer of bench/bench_sdxl.c: the same case names and shapes, f32,
torch.inference_mode, diffusers' default attention (torch's scaled_dot_product_attention), same thread
count (peer_util), median of a few calls after one warm-up:

* sdxl_unet_step_1024_ms: one UNet2DConditionModel forward with SDXL base's widths and block kinds and
  transformer depth 1 / 1 / 1 (mid 1) on the 128 x 128 x 4 latent of a 1024² image, 77 x 2048 text
  states, pooled 1280 and the six add_time_ids;
* *_peak_MiB / *_rss_baseline_MiB: peak RSS minus the RSS before the model is built, as the C side.

Weights are diffusers' own initialisation (values do not change the work)."""
import torch
from diffusers import UNet2DConditionModel

from peer_util import mem_baseline, median_time, peak_rss_mib, report  # also sets the thread count


def main():
    base = mem_baseline()
    model = UNet2DConditionModel(
        sample_size=128, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        mid_block_type="UNetMidBlock2DCrossAttn", block_out_channels=(320, 640, 1280), layers_per_block=2,
        transformer_layers_per_block=(1, 1, 1), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
        use_linear_projection=True, norm_num_groups=32, flip_sin_to_cos=True, freq_shift=0,
        addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816).float().eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 128, 128, generator=g)
    enc = torch.randn(1, 77, 2048, generator=g)
    cond = {"text_embeds": torch.randn(1, 1280, generator=g),
            "time_ids": torch.tensor([[1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0]])}
    t = torch.tensor([500])

    def step():
        with torch.inference_mode():
            model(x, t, encoder_hidden_states=enc, added_cond_kwargs=cond, return_dict=False)

    report("sdxl_unet_step_1024_ms", 1e3 * median_time(step, 0.0, 1), "ms", higher=False)
    report("sdxl_unet_step_1024_peak_MiB", peak_rss_mib() - base, "MiB", higher=False)
    print(f'{{"name": "sdxl_unet_step_1024_rss_baseline_MiB", "peer": {base:.6g}, "unit": "MiB", "better": "none"}}',
          flush=True)


if __name__ == "__main__":
    main()
