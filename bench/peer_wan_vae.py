"""peer_wan_vae.py — diffusers peer of bench/bench_wan_vae.c: the same case names and shape, AutoencoderKLWan in
its released configuration (diffusers' defaults: base_dim 96, z_dim 16, dim_mult 1/2/4/4, 2 residual blocks,
temperal_downsample F/T/T), f32, torch.inference_mode, same thread count (peer_util):

* wan_vae_decode_<F>x<H>x<W>_ms: vae.decode of a [1, 16, (F-1)/4+1, H/8, W/8] latent (diffusers' _decode: one
  latent frame at a time with its feature cache), one timed call, as the C side (MMC_BENCH_WAN_VAE_FRAMES /
  _H / _W change the shape; default 33 frames at 320 x 192);
* *_peak_MiB / *_rss_baseline_MiB: peak RSS minus the RSS before the model is built (peer_util.mem_baseline).

Weights are diffusers' own initialisation (values do not change the work)."""
import os
import time

import torch
from diffusers import AutoencoderKLWan

from peer_util import mem_baseline, peak_rss_mib, report  # also sets the thread count

F = int(os.environ.get("MMC_BENCH_WAN_VAE_FRAMES", "33"))
H = int(os.environ.get("MMC_BENCH_WAN_VAE_H", "192")) // 8 * 8
W = int(os.environ.get("MMC_BENCH_WAN_VAE_W", "320")) // 8 * 8


def main():
    base = mem_baseline()
    vae = AutoencoderKLWan().float().eval()
    z = torch.randn(1, 16, (F - 1) // 4 + 1, H // 8, W // 8, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = vae.decode(z, return_dict=False)[0]
    sec = time.perf_counter() - t0
    assert out.shape == (1, 3, F, H, W), out.shape
    name = f"wan_vae_decode_{F}x{H}x{W}"
    report(f"{name}_ms", 1e3 * sec, "ms", higher=False)
    report(f"{name}_peak_MiB", peak_rss_mib() - base, "MiB", higher=False)
    print(f'{{"name": "{name}_rss_baseline_MiB", "peer": {base:.6g}, "unit": "MiB", "better": "none"}}', flush=True)


if __name__ == "__main__":
    main()
