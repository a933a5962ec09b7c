"""Flow-matching training parity for Wan2.1 image-to-video (tests/test_wan.c, part train_i2v) and, with --flf2v,
first-last-frame to video (part train_flf2v), written by diffusers + PEFT themselves (the versions pinned in
requirements.txt; the loops are wan_train_ref.py's, shared with gen_wan_train.py), on the tiny
WanImageToVideoPipeline of tests/fixtures/wan_i2v/pipe (tools/ref/gen_wan_i2v.py) or the FLF2V one of
tests/fixtures/wan_flf2v/pipe (tools/ref/gen_wan_flf2v.py: the I2V transformer plus pos_embed_seq_len 34):

* wan_i2v_train/expected.safetensors (wan_flf2v_train/ with --flf2v): 20 steps of LoRA training of the I2V
  WanTransformer3DModel as finetrainers' Wan image-to-video trainer runs it: noisy = (1 - sigma) x0 + sigma noise
  over the z_dim latent channels, transformer(cat([noisy, condition], channels), timestep, encoder_hidden_states,
  encoder_hidden_states_image) with the timestep unscaled (0..1000), the velocity target noise - x0; uniform
  draws u made here (fixed), sigma and timestep from FlowMatchEulerDiscreteScheduler(shift=3.0)'s training
  schedule at floor(u * 1000); the mean of squares per sample then over the batch, clip_grad_norm_(1.0),
  AdamW lr 1e-3 / wd 1e-4. The condition of each sample is built as WanImageToVideoPipeline.prepare_latents
  builds it (4 mask channels: 1 on the first latent frame, FLF2V: and on the last pixel frame; then z_dim
  latent channels: random here), the image states are random [B, 17, 12] (FLF2V: [B, 2 x 17, 12], each sample's
  first and last image side by side, handed to the transformer as the pipeline does for last_image, [2B, 17, 12]),
  the text states [B, 512, 16] (diffusers' I2V attention takes the last 512 encoder states as the text: the
  pipeline's default length). LoRA r 4 (alpha 4, gaussian init) on to_q/to_k/to_v/to_out.0 of attn1 and attn2,
  attn2's add_k_proj / add_v_proj, ffn.net.0.proj / ffn.net.2. initial.safetensors / final.safetensors: the
  adapter before and after (WanImageToVideoPipeline.save_lora_weights).
* full_expected.safetensors: 4 steps of full fine-tuning (AdamW lr 1e-4, wd 1e-4, clip 1.0), then five parameters
  (FLF2V: the image position table condition_embedder.image_embedder.pos_embed among them).
* data_expected.safetensors: what `mmc train` derives from tests/fixtures/video/moving.mp4's training frames (5
  frames sampled uniformly, PIL bilinear resize of the shorter side to 16, centre crop, as gen_wan_train.py): the
  first frame ([16, 16, 3], its uint8 values as f32; FLF2V: the last one too, "last_frame"), pipe.encode_image of
  it ([1, 17, 12]; FLF2V: of [first, last], [2, 17, 12] viewed as [1, 34, 12]) and prepare_latents' condition for
  5 frames of 16x16 ([1, 8, 2, 2, 2]; FLF2V: with last_image).

Run: .venv-ref/bin/python tools/ref/gen_wan_i2v_train.py [--flf2v]
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from safetensors.torch import save_file

from diffusers import WanImageToVideoPipeline

from wan_train_ref import ROOT, train_full, train_lora, training_frames

FLF2V = "--flf2v" in sys.argv[1:]
PIPE = os.path.join(ROOT, "tests", "fixtures", "wan_flf2v" if FLF2V else "wan_i2v", "pipe")
SRC = os.path.join(PIPE, "transformer")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_flf2v_train" if FLF2V else "wan_i2v_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
B, Z, F, h, w, T, S_IMG = 2, 4, 2, 4, 6, 512, 17
PIXEL_FRAMES = 4 * (F - 1) + 1


def draw_inputs(g, tr):
    emb = torch.randn(B, T, tr.config.text_dim, generator=g)
    emb[0, 7:] = 0                                             # the prompts' own tokens, zeros past them
    emb[1, 4:] = 0
    img = torch.randn(B, (2 if FLF2V else 1) * S_IMG, tr.config.image_dim, generator=g)
    if FLF2V:   # prepare_latents' mask for last_image: 1 on the first and last pixel frames, folded 4 per latent frame
        m = torch.ones(B, 1, PIXEL_FRAMES, h, w)
        m[:, :, 1:PIXEL_FRAMES - 1] = 0
        m = torch.cat([torch.repeat_interleave(m[:, :, 0:1], dim=2, repeats=4), m[:, :, 1:]], 2)
        mask = m.view(B, -1, 4, h, w).transpose(1, 2)
    else:
        mask = torch.zeros(B, 4, F, h, w)
        mask[:, :, 0] = 1                                      # the first latent frame is given
    cond = torch.cat([mask, torch.randn(B, Z, F, h, w, generator=g)], 1)
    return {"prompt_embeds": emb, "image_embeds": img, "condition": cond}


train_lora(SRC, OUT, WanImageToVideoPipeline, ["to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj",
                                               "ffn.net.0.proj", "ffn.net.2"],
           51 if FLF2V else 41, 14 if FLF2V else 13, draw_inputs, (B, Z, F, h, w))
train_full(SRC, OUT, 52 if FLF2V else 42, draw_inputs, (B, Z, F, h, w),
           ("blocks.0.attn2.add_k_proj.weight", "proj_out.weight",
            "condition_embedder.image_embedder.pos_embed" if FLF2V else "condition_embedder.image_embedder.ff.net.0.proj.weight",
            "scale_shift_table", "blocks.1.attn2.norm_added_k.weight"))

# ---------------------------------------------------------------- one video's condition and image states
FR, RES = 5, 16
crops, _ = training_frames(os.path.join(ROOT, "tests", "fixtures", "video", "moving.mp4"), FR, RES)
frame, last = Image.fromarray(crops[0]), Image.fromarray(crops[-1])
pipe = WanImageToVideoPipeline.from_pretrained(PIPE, torch_dtype=torch.float32)
with torch.no_grad():
    ie = pipe.encode_image([frame, last] if FLF2V else frame, torch.device("cpu"))
    pre = pipe.video_processor.preprocess(frame, height=RES, width=RES).to(torch.float32)
    pre_last = pipe.video_processor.preprocess(last, height=RES, width=RES).to(torch.float32) if FLF2V else None
    lat = torch.zeros(1, Z, (FR - 1) // 4 + 1, RES // 8, RES // 8)
    _, cnd = pipe.prepare_latents(pre, 1, Z, RES, RES, FR, torch.float32, torch.device("cpu"), None, lat, pre_last)
data = {"frame": torch.from_numpy(crops[0]).to(torch.float32), "image_embeds": ie.reshape(1, -1, ie.shape[-1]).contiguous(),
        "condition": cnd.contiguous()}
if FLF2V:
    data["last_frame"] = torch.from_numpy(crops[-1]).to(torch.float32)
save_file(data, os.path.join(OUT, "data_expected.safetensors"))
print("wrote", OUT)
