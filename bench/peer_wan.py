"""peer_wan.py — diffusers peer of bench/bench_wan.c: the same case names and shapes, f32,
torch.inference_mode, diffusers' default attention (torch's scaled_dot_product_attention), same
thread count (peer_util), median of a few calls after one warm-up:

* wan_step_33f_320x192_ms: one WanTransformer3DModel forward (12 heads of 128, FFN 8960, text_dim 4096,
  freq_dim 256, cross-attention norm, 2 blocks) on latents [1, 16, 9, 24, 40] (33 frames at 320x192)
  with 512 text tokens;
* *_peak_MiB / *_rss_baseline_MiB: peak RSS minus the RSS before the model is built, as the C side.

Weights are diffusers' own initialisation (values do not change the work)."""
import torch
from diffusers import WanTransformer3DModel

from peer_util import mem_baseline, median_time, peak_rss_mib, report  # also sets the thread count


def main():
    base = mem_baseline()
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=2,
                                  cross_attn_norm=True, eps=1e-6).float().eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 9, 24, 40, generator=g)
    enc = torch.randn(1, 512, 4096, generator=g)
    t = torch.tensor([500])

    def step():
        with torch.inference_mode():
            model(hidden_states=x, timestep=t, encoder_hidden_states=enc, return_dict=False)

    report("wan_step_33f_320x192_ms", 1e3 * median_time(step, 0.0, 3), "ms", higher=False)
    report("wan_step_33f_320x192_peak_MiB", peak_rss_mib() - base, "MiB", higher=False)
    print(f'{{"name": "wan_step_33f_320x192_rss_baseline_MiB", "peer": {base:.6g}, "unit": "MiB", "better": "none"}}',
          flush=True)


if __name__ == "__main__":
    main()
