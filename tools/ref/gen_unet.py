"""Fixtures for UNet2DConditionModel (tests/test_unet.c), written by diffusers itself (the version pinned in
requirements.txt):

* sdxl/: an SDXL-shaped tiny random UNet saved with save_pretrained, untouched: DownBlock2D then two
  CrossAttnDownBlock2D (and the mirrored up blocks), layers_per_block 2, transformer_layers_per_block
  (1, 1, 2), attention_head_dim (2, 2, 3) that diffusers reads as head counts, linear projections,
  addition_embed_type "text_time" (add_time_ids through Timesteps(addition_time_embed_dim) concatenated
  after the pooled text_embeds), GroupNorm of 4 groups.
* sd15/: an SD 1.5-shaped one: CrossAttnDownBlock2D x2 then DownBlock2D, one int attention_head_dim,
  1x1-conv projections (use_linear_projection false), no addition embedding, flip_sin_to_cos false and
  freq_shift 1 (to exercise both settings), mid_block_scale_factor 0.5.
* sdxl_f16/, sdxl_bf16/: sdxl's weights stored in float16 (SDXL's fp16 variant) and bfloat16; their expected
  output is diffusers' f32 forward of the rounded weights.
* <case>/expected.safetensors: a non-square latent sample, per-sample timesteps, encoder_hidden_states,
  (text_embeds, time_ids), and the noise prediction unet(...).sample.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_unet.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

from diffusers import UNet2DConditionModel

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "unet")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

TEXT_EMBEDS = 24
CASES = {
    "sdxl": dict(sample_size=8, in_channels=4, out_channels=4,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                 block_out_channels=(8, 16, 24), layers_per_block=2, transformer_layers_per_block=(1, 1, 2),
                 cross_attention_dim=20, attention_head_dim=(2, 2, 3), norm_num_groups=4,
                 use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=TEXT_EMBEDS + 6 * 8, upcast_attention=False),
    "sd15": dict(sample_size=8, in_channels=4, out_channels=4,
                 down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                 block_out_channels=(8, 16, 16), layers_per_block=1, cross_attention_dim=12,
                 attention_head_dim=2, norm_num_groups=4, use_linear_projection=False,
                 flip_sin_to_cos=False, freq_shift=1, mid_block_scale_factor=0.5),
}

for i, (name, cfg) in enumerate(CASES.items()):
    torch.manual_seed(i)
    unet = UNet2DConditionModel(**cfg).eval()
    rand_init(unet, 10 + i)
    d = os.path.join(OUT, name)
    unet.save_pretrained(d)
    g = torch.Generator().manual_seed(100 + i)
    B, H, W, T = 2, 8, 12, 7
    sample = torch.randn(B, 4, H, W, generator=g)
    timestep = torch.tensor([999.0, 451.5])
    enc = torch.randn(B, T, cfg["cross_attention_dim"], generator=g)
    exp = {"sample": sample, "timestep": timestep, "encoder_hidden_states": enc}
    kw = {}
    if cfg.get("addition_embed_type") == "text_time":
        text_embeds = torch.randn(B, TEXT_EMBEDS, generator=g)
        # (original size, crop top-left, target size) per sample, as SDXL's _get_add_time_ids builds them
        time_ids = torch.tensor([[64.0, 96.0, 0.0, 0.0, 64.0, 96.0], [1024.0, 768.0, 16.0, 8.0, 1024.0, 1024.0]])
        kw["added_cond_kwargs"] = {"text_embeds": text_embeds, "time_ids": time_ids}
        exp.update(text_embeds=text_embeds, time_ids=time_ids)
    with torch.no_grad():
        out = unet(sample, timestep, encoder_hidden_states=enc, **kw).sample
    exp["out"] = out
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
    print(name, "params", sum(p.numel() for p in unet.parameters()), "max|out|", out.abs().max().item())
    if name != "sdxl":
        continue
    # the same UNet stored in f16 (SDXL's fp16 variant) and bf16: the expected output is the f32 forward
    # of the rounded weights (what diffusers computes after upcasting, and what mmc computes)
    for dt, tag in ((torch.float16, "sdxl_f16"), (torch.bfloat16, "sdxl_bf16")):
        half = UNet2DConditionModel.from_pretrained(d).to(dt)
        half.save_pretrained(os.path.join(OUT, tag))
        up = UNet2DConditionModel.from_pretrained(os.path.join(OUT, tag), torch_dtype=torch.float32).eval()
        with torch.no_grad():
            o = up(sample, timestep, encoder_hidden_states=enc, **kw).sample
        save_file({k: v.contiguous() for k, v in dict(exp, out=o).items()},
                  os.path.join(OUT, tag, "expected.safetensors"))
        print(tag, "max|out - f32 out|", (o - out).abs().max().item())
