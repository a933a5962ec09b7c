"""Fixtures for the SD3 / SD3.5 transformer (tests/test_sd3.c), written by diffusers itself (the version
pinned in requirements.txt), save_pretrained untouched:

* sd3/: an SD3Transformer2DModel shaped like SD3-medium (no qk norm, no dual attention) with odd sizes:
  3 heads of 8 (inner 24), 2 blocks (the last one context_pre_only), patch 2, in_channels 4 but
  out_channels 6, joint_attention_dim 20, pooled_projection_dim 12, pos_embed_max_size 8 with
  sample_size 12 (so the sin-cos grid is scaled by base_size / max_size = 6 / 8); f32.
  Inputs: non-square latents [2, 4, 6, 10] (3 x 5 patches, cropped from the 8 x 8 table off centre).
* sd35/: SD3.5-medium-shaped: qk_norm "rms_norm" and dual_attention_layers (0,) (attn2 and
  SD35AdaLayerNormZeroX in block 0), 2 heads of 12, latents [2, 4, 8, 6]; also the output with
  skip_layers=[0] (the pipeline's skip-layer guidance).
* sd3_bf16/: one block that is both dual-attention and context_pre_only, rms qk norm, weights stored
  bf16 (the pos_embed buffer too); the expected output is diffusers running it upcast to f32.

expected.safetensors per model: hidden [B, C, H, W], encoder [B, T, joint_attention_dim], pooled,
timestep [B] (as the pipeline passes it: sigma * 1000) and out [B, out_channels, H, W].

Run: .venv-ref/bin/python tools/ref/gen_sd3.py
"""
import os
import shutil

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import SD3Transformer2DModel

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "sd3")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(0)


def case(name, cfg, seed, dtype, H, W, T=5, skip=None):
    tr = SD3Transformer2DModel(**cfg)
    rand_init(tr, seed)
    d = os.path.join(OUT, name)
    tr.to(dtype).save_pretrained(d)
    tr = SD3Transformer2DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    B = 2
    inp = {
        "hidden": torch.randn(B, cfg["in_channels"], H, W, generator=g),
        "encoder": torch.randn(B, T, cfg["joint_attention_dim"], generator=g),
        "pooled": torch.randn(B, cfg["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([900.0, 250.5]),
    }
    with torch.no_grad():
        run = lambda **kw: tr(hidden_states=inp["hidden"], encoder_hidden_states=inp["encoder"],
                              pooled_projections=inp["pooled"], timestep=inp["timestep"], return_dict=False,
                              **kw)[0]
        inp["out"] = run()
        if skip is not None:
            inp["out_skip"] = run(skip_layers=skip)
    save_file({k: v.contiguous() for k, v in inp.items()}, os.path.join(d, "expected.safetensors"))


case("sd3", dict(sample_size=12, patch_size=2, in_channels=4, out_channels=6, num_layers=2, attention_head_dim=8,
                 num_attention_heads=3, joint_attention_dim=20, caption_projection_dim=24, pooled_projection_dim=12,
                 pos_embed_max_size=8), 1, torch.float32, 6, 10)
case("sd35", dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=12,
                  num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=24, pooled_projection_dim=10,
                  pos_embed_max_size=6, dual_attention_layers=(0,), qk_norm="rms_norm"), 2, torch.float32, 8, 6,
     T=4, skip=[0])
case("sd3_bf16", dict(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
                      num_attention_heads=2, joint_attention_dim=12, caption_projection_dim=16,
                      pooled_projection_dim=8, pos_embed_max_size=5, dual_attention_layers=(0,), qk_norm="rms_norm"),
     3, torch.bfloat16, 6, 4)
print("sd3 fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
