"""Flow-matching LoRA training parity for Wan2.1 text-to-video (tests/test_wan.c, part train_lora), written by
diffusers + PEFT themselves (the versions pinned in requirements.txt); the loops are wan_train_ref.py's, shared
with gen_wan_i2v_train.py:

* wan_train/: 20 steps of LoRA training on tests/fixtures/wan/transformer (the tiny WanTransformer3DModel) as
  diffusers' flow-matching training loops (train_dreambooth_lora_sd3.py, finetrainers' Wan trainer) run it:
  noisy = (1 - sigma) x0 + sigma noise, transformer(noisy, timestep, encoder_hidden_states) with the timestep
  unscaled (0..1000), the velocity target noise - x0, uniform timestep draws u made here (fixed), sigma and
  timestep from FlowMatchEulerDiscreteScheduler(shift=3.0)'s training schedule at floor(u * 1000), no loss
  weighting, the mean of squares per sample then over the batch, clip_grad_norm_(1.0), AdamW lr 1e-3 /
  wd 1e-4. LoRA r 4 (alpha 4, gaussian init) on to_q/to_k/to_v/to_out.0 of attn1 and attn2 and
  ffn.net.0.proj / ffn.net.2. Saved: initial.safetensors (the adapter before training, WanPipeline.save_lora_weights),
  expected.safetensors (every step's inputs, loss and pre-clip grad norm), final.safetensors,
  scheduler_config.json.
* wan_train/data_expected.safetensors: one video's training pixels and normalised latent distribution (below).
* wan_train/full_expected.safetensors: 4 steps of full fine-tuning (below).

Run: .venv-ref/bin/python tools/ref/gen_wan_train.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from safetensors.torch import save_file

from diffusers import AutoencoderKLWan, WanPipeline

from wan_train_ref import ROOT, train_full, train_lora, training_frames

SRC = os.path.join(ROOT, "tests", "fixtures", "wan", "transformer")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
B, C, F, h, w, T = 2, 4, 2, 4, 6, 5


def draw_lora(g, tr):
    emb = torch.randn(B, T, tr.config.text_dim, generator=g)
    emb[1, 3:] = 0                                             # a shorter prompt: zero past its tokens
    return {"prompt_embeds": emb}


train_lora(SRC, OUT, WanPipeline, ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"], 31, 12,
           draw_lora, (B, C, F, h, w))

# ---------------------------------------------------------------- the training data of one video
# data_expected.safetensors: tests/fixtures/video/moving.mp4 as mmc train prepares it (5 frames, 16x16):
# PyAV's rgb24 frames at round(linspace(0, N - 1, 5)) (uniform sampling), PIL bilinear resize of the
# shorter side to 16 (int(16 * long / short)), centre crop (round half even), to [-1, 1]; then
# AutoencoderKLWan (tests/fixtures/wan/pipe/vae) encode: latent_dist mean and std, normalised as the Wan
# pipelines normalise latents: (z - latents_mean) * (1 / latents_std).
FR, RES = 5, 16
crops, idx = training_frames(os.path.join(ROOT, "tests", "fixtures", "video", "moving.mp4"), FR, RES)
x = torch.stack([torch.from_numpy((c.astype(np.float32) / 255.0 - 0.5) / 0.5).permute(2, 0, 1) for c in crops], 1)
vae = AutoencoderKLWan.from_pretrained(os.path.join(ROOT, "tests", "fixtures", "wan", "pipe", "vae"),
                                       torch_dtype=torch.float32)
with torch.no_grad():
    dist = vae.encode(x[None]).latent_dist                      # x: [3, F, RES, RES]
lm = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
ls = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
save_file({"pixels": x.contiguous(), "frame_index": torch.from_numpy(idx).to(torch.int64),
           "mean": ((dist.mean - lm) * ls)[0].contiguous(), "std": (dist.std * ls)[0].contiguous()},
          os.path.join(OUT, "data_expected.safetensors"))
print("data: sampled", idx.tolist())

# ---------------------------------------------------------------- full fine-tuning
# full_expected.safetensors: 4 steps of full fine-tuning of the same transformer (every parameter; AdamW
# lr 1e-4, wd 1e-4, clip 1.0), the draws as above from their own generator; then five parameters.
train_full(SRC, OUT, 32, lambda g, tr: {"prompt_embeds": torch.randn(B, T, tr.config.text_dim, generator=g)},
           (B, C, F, h, w), ("blocks.0.attn1.to_q.weight", "proj_out.weight", "blocks.1.ffn.net.2.bias",
                             "scale_shift_table", "condition_embedder.time_embedder.linear_1.weight"))
print("wan training fixtures in", OUT)
