"""Fixtures for Wan2.1 image-to-video (tests/test_wan_i2v.c, tests/test_generate_video_cli.sh), written by
diffusers / transformers themselves (the versions pinned in requirements.txt), save_pretrained untouched:

* pipe/: a whole WanImageToVideoPipeline folder — a tiny UMT5EncoderModel and SentencePiece-Unigram
  T5TokenizerFast, a tiny AutoencoderKLWan (z_dim 4, latents_mean / latents_std set), the UniPC scheduler
  as the Hub's Wan2.1 I2V folders ship it, image_encoder/ a tiny CLIPVisionModel (3 layers, 32 px in
  patches of 8: 17 states of width 12), image_processor/ a CLIPImageProcessor (shortest edge 32, crop 32;
  transformers 5's default torchvision backend), and an I2V WanTransformer3DModel (image_dim 12,
  added_kv_proj_dim 24, in_channels 4 + 4 + 4 = 12, out_channels 4).
* image_encoder_hub/: the same CLIPVisionModel with its tensors under vision_model. (the layout of the Hub's
  Wan2.1 I2V folders, written by transformers 4.x; 5.x saves the names bare).
* pipe/input.png: a 50x37 RGB image (not the output size: the pipeline resizes it with Pillow's lanczos,
  the CLIP processor with its own resize and center crop).
* pipe/expected.safetensors: encode_image's hidden_states[-2] [1, 17, 12]; the preprocessed image
  [1, 3, H, W]; prepare_latents' condition [1, 4 + 4, 3, 4, 6] (mask channels, then the normalised
  latents of vae.encode([image, zeros]).mode()); two runs from injected latents with output_type="latent":
  (a) 3 steps, CFG 5 with a negative prompt; (b) 2 steps, guidance 1; and (a)'s decoded frames
  (output_type="pt"). Text is padded to 512 tokens as the pipeline's default (diffusers' I2V attention
  takes the last 512 encoder states as the text).
  For `mmc generate-video --image`: (b)'s latents as cli_latents.safetensors and its frames as
  export_to_video gets them (output_type="np", uint8 truncation) in cli_expected/.

Run: .venv-ref/bin/python tools/ref/gen_wan_i2v.py
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
OUT = os.path.join(ROOT, "tests", "fixtures", "wan_i2v")

torch.set_num_threads(2)
for sub in ("pipe", "image_encoder_hub"):   # (prompt_clean.json there is gen_wan_prompts.py's)
    shutil.rmtree(os.path.join(OUT, sub), ignore_errors=True)
os.makedirs(OUT, exist_ok=True)
g = torch.Generator().manual_seed(0)

tok, te = wan_tiny.text_parts(OUT)
vae = wan_tiny.vae()
enc, proc = wan_tiny.clip_parts()
tr = wan_tiny.i2v_transformer(5)
sched = UniPCMultistepScheduler(**wan_tiny.SCHED)
pipe = WanImageToVideoPipeline(tokenizer=tok, text_encoder=te, vae=vae, scheduler=sched,
                               image_processor=proc, image_encoder=enc, transformer=tr)
d = os.path.join(OUT, "pipe")
pipe.save_pretrained(d)
pipe = WanImageToVideoPipeline.from_pretrained(d, torch_dtype=torch.float32)

rng = np.random.default_rng(11)
yy, xx = np.mgrid[0:37, 0:50]
img = np.stack([(xx * 5) % 256, (yy * 7) % 256, rng.integers(0, 256, (37, 50))], -1).astype(np.uint8)
Image.fromarray(img).save(os.path.join(d, "input.png"))
image = Image.open(os.path.join(d, "input.png")).convert("RGB")

exp = {}
prompt, neg = "a red cat walks on the beach", "green grass"
H, W, FR = 32, 48, 9          # latents [4, 3, 4, 6]
with torch.no_grad():
    exp["image_embeds"] = pipe.encode_image(image, torch.device("cpu"))
    pre = pipe.video_processor.preprocess(image, height=H, width=W).to(torch.float32)
    exp["image_pre"] = pre
    lat = torch.randn(1, 4, 3, 4, 6, generator=g)
    _, cond = pipe.prepare_latents(pre, 1, 4, H, W, FR, torch.float32, torch.device("cpu"), None, lat.clone())
    exp["condition"] = cond
    exp["latents_a"] = lat
    exp["out_a"] = pipe(image=image, prompt=prompt, negative_prompt=neg, height=H, width=W, num_frames=FR,
                        num_inference_steps=3, guidance_scale=5.0, latents=lat.clone(), output_type="latent").frames
    exp["video_a"] = pipe(image=image, prompt=prompt, negative_prompt=neg, height=H, width=W, num_frames=FR,
                          num_inference_steps=3, guidance_scale=5.0, latents=lat.clone(), output_type="pt").frames
    lat = torch.randn(1, 4, 3, 4, 6, generator=g)
    exp["latents_b"] = lat
    exp["out_b"] = pipe(image=image, prompt=prompt, height=H, width=W, num_frames=FR, num_inference_steps=2,
                        guidance_scale=1.0, latents=lat.clone(), output_type="latent").frames
    save_file({"latents": lat.contiguous()}, os.path.join(d, "cli_latents.safetensors"))
    frames = pipe(image=image, prompt=prompt, height=H, width=W, num_frames=FR, num_inference_steps=2,
                  guidance_scale=1.0, latents=lat.clone(), output_type="np").frames[0]
    os.makedirs(os.path.join(d, "cli_expected"))
    for i, fr in enumerate(frames):
        Image.fromarray((fr * 255).astype(np.uint8)).save(os.path.join(d, "cli_expected", f"frame_{i:05d}.png"))
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
# the image encoder in the Hub's layout (Wan2.1-I2V-14B-*-Diffusers/image_encoder, written by transformers 4.x:
# the tower's tensors under vision_model.), the same weights
from safetensors.torch import load_file
hub = os.path.join(OUT, "image_encoder_hub")
os.makedirs(hub)
shutil.copy(os.path.join(d, "image_encoder", "config.json"), hub)
sd = load_file(os.path.join(d, "image_encoder", "model.safetensors"))
save_file({"vision_model." + k: v for k, v in sd.items()}, os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
print("wrote", OUT)
