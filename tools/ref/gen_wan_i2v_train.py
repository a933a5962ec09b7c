"""Flow-matching training parity for Wan2.1 image-to-video (tests/test_wan_i2v.c, part train), written by
diffusers + PEFT themselves (the versions pinned in requirements.txt), on the tiny WanImageToVideoPipeline of
tests/fixtures/wan_i2v/pipe (tools/ref/gen_wan_i2v.py):

* wan_i2v_train/expected.safetensors: 12 steps of LoRA training of the I2V WanTransformer3DModel as
  finetrainers' Wan image-to-video trainer runs it: noisy = (1 - sigma) x0 + sigma noise over the z_dim
  latent channels, transformer(cat([noisy, condition], channels), timestep, encoder_hidden_states,
  encoder_hidden_states_image) with the timestep unscaled (0..1000), the velocity target noise - x0; uniform
  draws u made here (fixed), sigma and timestep from FlowMatchEulerDiscreteScheduler(shift=3.0)'s training
  schedule at floor(u * 1000); the mean of squares per sample then over the batch, clip_grad_norm_(1.0),
  AdamW lr 1e-3 / wd 1e-4. The condition of each sample is built as WanImageToVideoPipeline.prepare_latents
  builds it (4 mask channels: 1 on the first latent frame; then z_dim latent channels: random here), the
  image states are random [B, 17, 12], the text states [B, 512, 16] (diffusers' I2V attention takes the
  last 512 encoder states as the text: the pipeline's default length). LoRA r 4 (alpha 4, gaussian init) on
  to_q/to_k/to_v/to_out.0 of attn1 and attn2, attn2's add_k_proj / add_v_proj, ffn.net.0.proj / ffn.net.2.
  initial.safetensors / final.safetensors: the adapter before and after (WanImageToVideoPipeline.save_lora_weights).
* full_expected.safetensors: 4 steps of full fine-tuning (AdamW lr 1e-4, wd 1e-4, clip 1.0), then five parameters.
* data_expected.safetensors: what `mmc train` derives from tests/fixtures/video/moving.mp4's first training
  frame (5 frames sampled uniformly, PIL bilinear resize of the shorter side to 16, centre crop, as
  gen_wan_train.py): the frame ([16, 16, 3], its uint8 values as f32), pipe.encode_image of it (CLIP hidden_states[-2],
  [1, 17, 12]) and prepare_latents' condition for 5 frames of 16x16 ([1, 8, 2, 2, 2]).

Run: .venv-ref/bin/python tools/ref/gen_wan_i2v_train.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import av
import numpy as np
import torch
from PIL import Image
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file

from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PIPE = os.path.join(ROOT, "tests", "fixtures", "wan_i2v", "pipe")
SRC = os.path.join(PIPE, "transformer")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_i2v_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
B, Z, F, h, w, T, S_IMG = 2, 4, 2, 4, 6, 512, 17
STEPS = 12


def draw_inputs(g, dim_text, dim_img):
    emb = torch.randn(B, T, dim_text, generator=g)
    emb[0, 7:] = 0                                             # the prompts' own tokens, zeros past them
    emb[1, 4:] = 0
    img = torch.randn(B, S_IMG, dim_img, generator=g)
    mask = torch.zeros(B, 4, F, h, w)
    mask[:, :, 0] = 1                                          # the first latent frame is given
    cond = torch.cat([mask, torch.randn(B, Z, F, h, w, generator=g)], 1)
    return emb, img, cond


def step_loss(tr, x0, noise, u, emb, img, cond):
    indices = (u * sched.config.num_train_timesteps).long()
    timesteps, sigmas = sched.timesteps[indices], sched.sigmas[indices]
    sig = sigmas.reshape(B, 1, 1, 1, 1)
    noisy = (1.0 - sig) * x0 + sig * noise
    pred = tr(hidden_states=torch.cat([noisy, cond], 1), timestep=timesteps, encoder_hidden_states=emb,
              encoder_hidden_states_image=img, return_dict=False)[0]
    loss = torch.mean(((pred.float() - (noise - x0).float()) ** 2).reshape(B, -1), 1).mean()
    return loss, sigmas, timesteps


# ---------------------------------------------------------------- LoRA
g = torch.Generator().manual_seed(41)
tr = WanTransformer3DModel.from_pretrained(SRC, torch_dtype=torch.float32)
tr.requires_grad_(False)
torch.manual_seed(13)
tr.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                          target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj",
                                          "ffn.net.0.proj", "ffn.net.2"]))


def save_adapter(name):
    WanImageToVideoPipeline.save_lora_weights(OUT, transformer_lora_layers=get_peft_model_state_dict(tr))
    os.rename(os.path.join(OUT, "pytorch_lora_weights.safetensors"), os.path.join(OUT, name))


save_adapter("initial.safetensors")
params = [p for p in tr.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
emb, img, cond = draw_inputs(g, tr.config.text_dim, tr.config.image_dim)
exp = {"prompt_embeds": emb, "image_embeds": img, "condition": cond}
tr.train()
for step in range(STEPS):
    x0 = torch.randn(B, Z, F, h, w, generator=g)
    noise = torch.randn(B, Z, F, h, w, generator=g)
    u = torch.rand(B, generator=g)
    loss, sigmas, timesteps = step_loss(tr, x0, noise, u, emb, img, cond)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
    exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"sigmas_{step}": sigmas,
                f"timesteps_{step}": timesteps, f"loss_{step}": loss.detach().reshape(1),
                f"grad_norm_{step}": gn.detach().reshape(1)})
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
sched.save_config(OUT)
save_adapter("final.safetensors")
print("lora:", [f"{exp[f'loss_{s}'].item():.5f}" for s in range(STEPS)])

# ---------------------------------------------------------------- full fine-tuning
g = torch.Generator().manual_seed(42)
tr = WanTransformer3DModel.from_pretrained(SRC, torch_dtype=torch.float32)
params = [p for p in tr.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
emb, img, cond = draw_inputs(g, tr.config.text_dim, tr.config.image_dim)
full = {"prompt_embeds": emb, "image_embeds": img, "condition": cond}
tr.train()
for step in range(4):
    x0 = torch.randn(B, Z, F, h, w, generator=g)
    noise = torch.randn(B, Z, F, h, w, generator=g)
    u = torch.rand(B, generator=g)
    loss, _, _ = step_loss(tr, x0, noise, u, emb, img, cond)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
    full.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"loss_{step}": loss.detach().reshape(1),
                 f"grad_norm_{step}": gn.detach().reshape(1)})
sd = tr.state_dict()
for k in ("blocks.0.attn2.add_k_proj.weight", "proj_out.weight", "condition_embedder.image_embedder.ff.net.0.proj.weight",
          "scale_shift_table", "blocks.1.attn2.norm_added_k.weight"):
    full["final." + k] = sd[k]
save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(OUT, "full_expected.safetensors"))
print("full:", [f"{full[f'loss_{s}'].item():.5f}" for s in range(4)])

# ---------------------------------------------------------------- one video's condition and image states
FR, RES = 5, 16
with av.open(os.path.join(ROOT, "tests", "fixtures", "video", "moving.mp4")) as c:
    frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
im = Image.fromarray(frames[0])                                # round(linspace(0, N - 1, 5))[0] = 0
W0, H0 = im.size
nh, nw = (RES, int(RES * W0 / H0)) if H0 <= W0 else (int(RES * H0 / W0), RES)
im = im.resize((nw, nh), Image.BILINEAR)
top, left = round((nh - RES) / 2), round((nw - RES) / 2)
first = np.ascontiguousarray(np.asarray(im)[top:top + RES, left:left + RES])
frame = Image.fromarray(first)
pipe = WanImageToVideoPipeline.from_pretrained(PIPE, torch_dtype=torch.float32)
with torch.no_grad():
    ie = pipe.encode_image(frame, torch.device("cpu"))
    pre = pipe.video_processor.preprocess(frame, height=RES, width=RES).to(torch.float32)
    lat = torch.zeros(1, Z, (FR - 1) // 4 + 1, RES // 8, RES // 8)
    _, cnd = pipe.prepare_latents(pre, 1, Z, RES, RES, FR, torch.float32, torch.device("cpu"), None, lat)
save_file({"frame": torch.from_numpy(first).to(torch.float32), "image_embeds": ie.contiguous(), "condition": cnd.contiguous()},
          os.path.join(OUT, "data_expected.safetensors"))
print("wrote", OUT)
