"""Fixtures for AutoencoderKLWan, the causal 3D VAE of Wan2.1 (tests/test_wan_vae.c), written by diffusers
itself (the version pinned in requirements.txt):

* f32/: a tiny random AutoencoderKLWan saved with save_pretrained, untouched: base_dim 6, z_dim 4, dim_mult
  (1, 2, 2, 2) (so the 8x spatial and 4x temporal factors of the released VAE), 2 residual blocks per level,
  temperal_downsample (False, True, True), latents_mean / latents_std of its own.
* bf16/: the same weights stored in bfloat16; its expected outputs are diffusers' f32 forward of the rounded
  weights (what mmc computes: it widens them).
* <case>/expected.safetensors:
    decode9_z [1, 4, 3, 2, 3] -> decode9 [1, 3, 9, 16, 24]  (vae.decode(z).sample: clamped to [-1, 1])
    decode17_z [1, 4, 5, 2, 3] -> decode17 [1, 3, 17, 16, 24] (5 latent frames: the chunk cache carried 4 times)
    encode9_x [1, 3, 9, 16, 24] -> encode9_mean, encode9_logvar [1, 4, 3, 2, 3] (latent_dist.mode() and its
    clamped logvar)
  The decoder's inputs are scaled so that some outputs saturate (the clamp is exercised) but most do not.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_wan_vae.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

from diffusers import AutoencoderKLWan

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_vae")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

CFG = dict(base_dim=6, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=2, attn_scales=[],
           temperal_downsample=[False, True, True], dropout=0.0,
           latents_mean=[0.25, -0.5, 0.125, 1.0], latents_std=[2.0, 0.75, 1.5, 3.0])


def init(model, seed):
    """Weights of a usable scale: RMS-norm gammas near 1, biases small, conv weights ~ 1/sqrt(fan_in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)


torch.manual_seed(0)
vae = AutoencoderKLWan(**CFG).eval()
init(vae, 7)
f32_dir = os.path.join(OUT, "f32")
vae.save_pretrained(f32_dir)

g = torch.Generator().manual_seed(123)
inputs = {
    "decode9_z": 1.5 * torch.randn(1, 4, 3, 2, 3, generator=g),
    "decode17_z": 1.5 * torch.randn(1, 4, 5, 2, 3, generator=g),
    "encode9_x": (torch.rand(1, 3, 9, 16, 24, generator=g) * 2 - 1),
}


def run(model):
    exp = dict(inputs)
    with torch.no_grad():
        exp["decode9"] = model.decode(inputs["decode9_z"]).sample
        exp["decode17"] = model.decode(inputs["decode17_z"]).sample
        dist = model.encode(inputs["encode9_x"]).latent_dist
        exp["encode9_mean"] = dist.mode()
        exp["encode9_logvar"] = dist.logvar
    return exp


exp = run(vae)
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(f32_dir, "expected.safetensors"))
print("params", sum(p.numel() for p in vae.parameters()))
for k in ("decode9", "decode17", "encode9_mean", "encode9_logvar"):
    v = exp[k]
    print(k, tuple(v.shape), "max|v|", v.abs().max().item(), "saturated", (v.abs() >= 1).float().mean().item())

# bf16 storage: diffusers' f32 forward of the rounded weights
bf_dir = os.path.join(OUT, "bf16")
AutoencoderKLWan.from_pretrained(f32_dir).to(torch.bfloat16).save_pretrained(bf_dir)
up = AutoencoderKLWan.from_pretrained(bf_dir, torch_dtype=torch.float32).eval()
bexp = run(up)
save_file({k: bexp[k].contiguous() for k in ("decode9_z", "decode9", "encode9_x", "encode9_mean")},
          os.path.join(bf_dir, "expected.safetensors"))
print("bf16 max|decode9 - f32|", (bexp["decode9"] - exp["decode9"]).abs().max().item())
