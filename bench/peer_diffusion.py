"""peer_diffusion.py — diffusers peer of bench/bench_diffusion.c: the same case names and shapes, f32,
torch.inference_mode, diffusers' default attention (its native backend: torch's
scaled_dot_product_attention, the fastest on CPU), same thread count (peer_util), median of a few
calls after one warm-up:

* flux_step_512_ms / flux_step_1024_ms: one FluxTransformer2DModel forward (8 heads of 128, 1 double-
  and 2 single-stream blocks, joint_attention_dim 4096, pooled 768, guidance embedder, rope axes
  16/56/56) on 1024 / 4096 packed image tokens of 64 channels and 512 T5 tokens;
* vae_decode_256_ms: AutoencoderKL (FLUX.1's VAE configuration) decode of a [1, 16, 32, 32] latent
  (vae_decode_512_ms, [1, 16, 64, 64], with MMC_BENCH_VAE_PX=512; MMC_BENCH_VAE_ITERS=0: one call);
* *_peak_MiB / *_rss_baseline_MiB: peak RSS minus the RSS before the model is built, as the C side
  (peer_util.mem_baseline); the 1024² step's peak after resetting VmHWM with the model resident;
  each model in its own subprocess, as the C side forks per model.

Weights are diffusers' own initialisation (values do not change the work)."""
import gc
import os
import subprocess
import sys
import time

import torch
from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

from peer_util import mem_baseline, median_time, peak_rss_mib, report  # also sets the thread count

VAE_PX = int(os.environ.get("MMC_BENCH_VAE_PX", "256")) // 16 * 16   # the decoded image side, as bench_diffusion.c


def report_mem(name, base):
    report(f"{name}_peak_MiB", peak_rss_mib() - base, "MiB", higher=False)
    print(f'{{"name": "{name}_rss_baseline_MiB", "peer": {base:.6g}, "unit": "MiB", "better": "none"}}', flush=True)


def flux_step(model, px, min_s):
    h = px // 8
    S = (px // 16) ** 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, S, 64, generator=g)
    enc = torch.randn(1, 512, 4096, generator=g)
    pooled = torch.randn(1, 768, generator=g)
    img_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, h // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(512, 3)
    t, guid = torch.tensor([0.5]), torch.tensor([3.5])

    def step():
        with torch.inference_mode():
            model(hidden_states=x, encoder_hidden_states=enc, pooled_projections=pooled, timestep=t,
                  img_ids=img_ids, txt_ids=txt_ids, guidance=guid, return_dict=False)

    report(f"flux_step_{px}_ms", 1e3 * median_time(step, min_s, 3), "ms", higher=False)


def bench_flux():
    base = mem_baseline()
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, out_channels=None, num_layers=1,
                                   num_single_layers=2, attention_head_dim=128, num_attention_heads=8,
                                   joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                                   axes_dims_rope=(16, 56, 56)).float().eval()
    flux_step(model, 512, 3.0)
    report_mem("flux_step_512", base)
    mem_baseline()   # reset VmHWM only: the baseline stays the one before the model
    flux_step(model, 1024, 0.0)
    report_mem("flux_step_1024", base)
    del model
    gc.collect()


def bench_vae():
    base = mem_baseline()
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                        layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32,
                        sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                        use_post_quant_conv=False, mid_block_add_attention=True).float().eval()
    z = torch.randn(1, 16, VAE_PX // 8, VAE_PX // 8, generator=torch.Generator().manual_seed(0))

    def decode():
        with torch.inference_mode():
            vae.decode(z, return_dict=False)

    iters = int(os.environ.get("MMC_BENCH_VAE_ITERS", "3"))   # 0: one call, timed (as bench_diffusion.c)
    if iters > 0:
        ms = 1e3 * median_time(decode, 0.0, iters)
    else:
        t0 = time.perf_counter()
        decode()
        ms = 1e3 * (time.perf_counter() - t0)
    report(f"vae_decode_{VAE_PX}_ms", ms, "ms", higher=False)
    report_mem(f"vae_decode_{VAE_PX}", base)
    del vae
    gc.collect()


def main():
    only = os.environ.get("MMC_BENCH_DIFFUSION_CASES")
    if only is None:   # each model in its own process, as bench_diffusion.c forks per model
        for part in ("flux", "vae"):
            subprocess.run([sys.executable, __file__], env=dict(os.environ, MMC_BENCH_DIFFUSION_CASES=part),
                           check=True)
        return
    if "flux" in only:
        bench_flux()
    if "vae" in only:
        bench_vae()


if __name__ == "__main__":
    main()
