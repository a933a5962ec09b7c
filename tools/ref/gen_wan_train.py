"""Flow-matching LoRA training parity for Wan2.1 text-to-video (tests/test_wan.c, part train_lora), written by
diffusers + PEFT themselves (the versions pinned in requirements.txt):

* wan_train/: 12 steps of LoRA training on tests/fixtures/wan/transformer (the tiny WanTransformer3DModel) as
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

import torch
from safetensors.torch import save_file
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SRC = os.path.join(ROOT, "tests", "fixtures", "wan", "transformer")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(31)
sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
B, C, F, h, w, T = 2, 4, 2, 4, 6, 5
STEPS = 12

tr = WanTransformer3DModel.from_pretrained(SRC, torch_dtype=torch.float32)
tr.requires_grad_(False)
torch.manual_seed(12)
tr.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                          target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]))
WanPipeline.save_lora_weights(OUT, transformer_lora_layers=get_peft_model_state_dict(tr))
os.rename(os.path.join(OUT, "pytorch_lora_weights.safetensors"), os.path.join(OUT, "initial.safetensors"))
params = [p for p in tr.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
emb = torch.randn(B, T, tr.config.text_dim, generator=g)
emb[1, 3:] = 0                                                 # a shorter prompt: zero past its tokens
exp = {"prompt_embeds": emb}
tr.train()
for step in range(STEPS):
    x0 = torch.randn(B, C, F, h, w, generator=g)
    noise = torch.randn(B, C, F, h, w, generator=g)
    u = torch.rand(B, generator=g)
    indices = (u * sched.config.num_train_timesteps).long()
    timesteps = sched.timesteps[indices]
    sigmas = sched.sigmas[indices]
    sig = sigmas.reshape(B, 1, 1, 1, 1)
    noisy = (1.0 - sig) * x0 + sig * noise
    pred = tr(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=emb, return_dict=False)[0]
    target = noise - x0
    loss = torch.mean(((pred.float() - target.float()) ** 2).reshape(B, -1), 1).mean()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
    exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"sigmas_{step}": sigmas,
                f"timesteps_{step}": timesteps, f"loss_{step}": loss.detach().reshape(1),
                f"grad_norm_{step}": gn.detach().reshape(1)})
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
sched.save_config(OUT)
WanPipeline.save_lora_weights(OUT, transformer_lora_layers=get_peft_model_state_dict(tr))
os.rename(os.path.join(OUT, "pytorch_lora_weights.safetensors"), os.path.join(OUT, "final.safetensors"))
print("wan training fixtures in", OUT, [f"{exp[f'loss_{s}'].item():.5f}" for s in range(STEPS)])

# ---------------------------------------------------------------- the training data of one video
# data_expected.safetensors: tests/fixtures/video/moving.mp4 as mmc train prepares it (5 frames, 16x16):
# PyAV's rgb24 frames at round(linspace(0, N - 1, 5)) (uniform sampling), PIL bilinear resize of the
# shorter side to 16 (int(16 * long / short)), centre crop (round half even), to [-1, 1]; then
# AutoencoderKLWan (tests/fixtures/wan/pipe/vae) encode: latent_dist mean and std, normalised as the Wan
# pipelines normalise latents: (z - latents_mean) * (1 / latents_std).
import av
import numpy as np
from PIL import Image
from diffusers import AutoencoderKLWan

F, RES = 5, 16
with av.open(os.path.join(ROOT, "tests", "fixtures", "video", "moving.mp4")) as c:
    frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
idx = np.round(np.linspace(0, len(frames) - 1, F)).astype(int)
px = []
for i in idx:
    im = Image.fromarray(frames[i])
    W, H = im.size
    nh, nw = (RES, int(RES * W / H)) if H <= W else (int(RES * H / W), RES)
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = round((nh - RES) / 2), round((nw - RES) / 2)
    a = np.asarray(im, dtype=np.float32)[top:top + RES, left:left + RES] / 255.0
    px.append(torch.from_numpy((a - 0.5) / 0.5).permute(2, 0, 1))
x = torch.stack(px, 1)                                          # [3, F, RES, RES]
vae = AutoencoderKLWan.from_pretrained(os.path.join(ROOT, "tests", "fixtures", "wan", "pipe", "vae"),
                                       torch_dtype=torch.float32)
with torch.no_grad():
    dist = vae.encode(x[None]).latent_dist
lm = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
ls = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
save_file({"pixels": x.contiguous(), "frame_index": torch.from_numpy(idx).to(torch.int64),
           "mean": ((dist.mean - lm) * ls)[0].contiguous(), "std": (dist.std * ls)[0].contiguous()},
          os.path.join(OUT, "data_expected.safetensors"))
print("data:", len(frames), "frames, sampled", idx.tolist())

# ---------------------------------------------------------------- full fine-tuning
# full_expected.safetensors: 4 steps of full fine-tuning of the same transformer (every parameter; AdamW
# lr 1e-4, wd 1e-4, clip 1.0), the draws as above from their own generator; then three parameters.
g = torch.Generator().manual_seed(32)
tr = WanTransformer3DModel.from_pretrained(SRC, torch_dtype=torch.float32)
params = [p for p in tr.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
emb = torch.randn(B, T, tr.config.text_dim, generator=g)
full = {"prompt_embeds": emb}
tr.train()
for step in range(4):
    x0 = torch.randn(B, C, 2, h, w, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    u = torch.rand(B, generator=g)
    indices = (u * sched.config.num_train_timesteps).long()
    timesteps, sigmas = sched.timesteps[indices], sched.sigmas[indices]
    sig = sigmas.reshape(B, 1, 1, 1, 1)
    pred = tr(hidden_states=(1.0 - sig) * x0 + sig * noise, timestep=timesteps, encoder_hidden_states=emb,
              return_dict=False)[0]
    loss = torch.mean(((pred - (noise - x0)) ** 2).reshape(B, -1), 1).mean()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
    full.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"loss_{step}": loss.detach().reshape(1),
                 f"grad_norm_{step}": gn.detach().reshape(1)})
sd = tr.state_dict()
for k in ("blocks.0.attn1.to_q.weight", "proj_out.weight", "blocks.1.ffn.net.2.bias", "scale_shift_table",
          "condition_embedder.time_embedder.linear_1.weight"):
    full["final." + k] = sd[k]
save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(OUT, "full_expected.safetensors"))
print("full:", [f"{full[f'loss_{s}'].item():.5f}" for s in range(4)])
