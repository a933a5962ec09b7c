"""Fixtures for Wan2.1 first-last-frame to video (FLF2V: WanImageToVideoPipeline with last_image; tests/test_wan_i2v.c
part flf2v, tests/test_generate_video_cli.sh), written by diffusers / transformers themselves (the versions pinned in
requirements.txt), save_pretrained untouched:

* pipe/: a whole WanImageToVideoPipeline folder, the components of tools/ref/gen_wan_i2v.py (wan_tiny's tokenizer,
  UMT5 and AutoencoderKLWan, the same tiny CLIPVisionModel / CLIPImageProcessor, the UniPC scheduler) with a
  first-last-frame WanTransformer3DModel: the I2V one plus pos_embed_seq_len 34 (two images' 17 CLIP states,
  condition_embedder.image_embedder.pos_embed [1, 34, 12]).
* pipe/first.png (50x37) and pipe/last.png (44x30): the two frames (not the output size: the pipeline resizes them
  with Pillow's lanczos, the CLIP processor with its own resize and center crop).
* pipe/expected.safetensors: encode_image([first, last]) [2, 17, 12]; prepare_latents' condition with last_image
  [1, 4 + 4, 3, 4, 6] (mask 1 on the first and last pixel frames); two runs from injected latents with
  output_type="latent": (a) 3 steps, CFG 5 with a negative prompt; (b) 2 steps, guidance 1. Text padded to 512.
  For `mmc generate-video --image --last-image`: (b)'s latents as cli_latents.safetensors and its frames as
  export_to_video gets them (output_type="np", uint8 truncation) in cli_expected/.

Run: .venv-ref/bin/python tools/ref/gen_wan_flf2v.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline

import wan_tiny

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_flf2v")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(1)

tok, te = wan_tiny.text_parts(OUT)
vae = wan_tiny.vae()
enc, proc = wan_tiny.clip_parts()
tr = wan_tiny.i2v_transformer(6, pos_embed_seq_len=34)
pipe = WanImageToVideoPipeline(tokenizer=tok, text_encoder=te, vae=vae, scheduler=UniPCMultistepScheduler(**wan_tiny.SCHED),
                               image_processor=proc, image_encoder=enc, transformer=tr)
d = os.path.join(OUT, "pipe")
pipe.save_pretrained(d)
pipe = WanImageToVideoPipeline.from_pretrained(d, torch_dtype=torch.float32)

rng = np.random.default_rng(12)
yy, xx = np.mgrid[0:37, 0:50]
img = np.stack([(xx * 5) % 256, (yy * 7) % 256, rng.integers(0, 256, (37, 50))], -1).astype(np.uint8)
Image.fromarray(img).save(os.path.join(d, "first.png"))
yy, xx = np.mgrid[0:30, 0:44]
img = np.stack([rng.integers(0, 256, (30, 44)), (xx * 3 + yy * 2) % 256, 255 - (yy * 8) % 256], -1).astype(np.uint8)
Image.fromarray(img).save(os.path.join(d, "last.png"))
first = Image.open(os.path.join(d, "first.png")).convert("RGB")
last = Image.open(os.path.join(d, "last.png")).convert("RGB")

exp = {}
prompt, neg = "a red cat walks on the beach", "green grass"
H, W, FR = 32, 48, 9          # latents [4, 3, 4, 6]
with torch.no_grad():
    exp["image_embeds"] = pipe.encode_image([first, last], torch.device("cpu"))
    pre = pipe.video_processor.preprocess(first, height=H, width=W).to(torch.float32)
    pre_last = pipe.video_processor.preprocess(last, height=H, width=W).to(torch.float32)
    lat = torch.randn(1, 4, 3, 4, 6, generator=g)
    _, cond = pipe.prepare_latents(pre, 1, 4, H, W, FR, torch.float32, torch.device("cpu"), None, lat.clone(), pre_last)
    exp["condition"] = cond
    exp["latents_a"] = lat
    exp["out_a"] = pipe(image=first, last_image=last, prompt=prompt, negative_prompt=neg, height=H, width=W,
                        num_frames=FR, num_inference_steps=3, guidance_scale=5.0, latents=lat.clone(),
                        output_type="latent").frames
    lat = torch.randn(1, 4, 3, 4, 6, generator=g)
    exp["latents_b"] = lat
    exp["out_b"] = pipe(image=first, last_image=last, prompt=prompt, height=H, width=W, num_frames=FR,
                        num_inference_steps=2, guidance_scale=1.0, latents=lat.clone(), output_type="latent").frames
    save_file({"latents": lat.contiguous()}, os.path.join(d, "cli_latents.safetensors"))
    frames = pipe(image=first, last_image=last, prompt=prompt, height=H, width=W, num_frames=FR, num_inference_steps=2,
                  guidance_scale=1.0, latents=lat.clone(), output_type="np").frames[0]
    os.makedirs(os.path.join(d, "cli_expected"))
    for i, fr in enumerate(frames):
        Image.fromarray((fr * 255).astype(np.uint8)).save(os.path.join(d, "cli_expected", f"frame_{i:05d}.png"))
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
print("wrote", OUT)
