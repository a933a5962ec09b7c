"""img2img with the tiny SD3 pipeline (tests/fixtures/sd3_pipe, tools/ref/gen_sd3_pipeline.py) run by diffusers'
StableDiffusion3Img2ImgPipeline (tests/test_sd3_pipeline.c, part "img2img").

tests/fixtures/sd3_img2img/expected.safetensors: for each case the init image (pixels in [0, 1], [1, 3, 32, 48], given
to the pipeline as a tensor: VaeImageProcessor.preprocess normalises it to 2x - 1, no resize at this size), the two
draws the pipeline's seeded generator makes before denoising (vae_noise: latent_dist.sample's randn in
retrieve_latents, sample_mode "sample"; noise: prepare_latents' randn, mixed in by scheduler.scale_noise at
timesteps[t_start]), and the output image (output_type "pt"):
  a_*  CFG 4.5 against "", strength 0.6 of 5 steps (3 run)
  b_*  no CFG (guidance 1), strength 0.75 of 4 steps (3 run), the other prompt
  c_*  CFG 3, strength 1.0 of 3 steps (all run: pure noise at sigma 1)

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sd3_img2img.py (after gen_sd3_pipeline.py)
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import StableDiffusion3Img2ImgPipeline, StableDiffusion3Pipeline

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PIPE = os.path.join(ROOT, "tests", "fixtures", "sd3_pipe")
OUT = os.path.join(ROOT, "tests", "fixtures", "sd3_img2img")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(51)
exp = {}
H, W, MAXLEN, LAT = 32, 48, 12, (1, 4, 16, 24)

base = StableDiffusion3Pipeline.from_pretrained(PIPE, torch_dtype=torch.float32)
pipe = StableDiffusion3Img2ImgPipeline(**base.components)


def run(key, seed, **kw):
    img = torch.rand(1, 3, H, W, generator=g)
    # the generator draws latent_dist.sample()'s noise, then prepare_latents' noise, before denoising
    rec = torch.Generator().manual_seed(seed)
    exp[key + "_init"] = img
    exp[key + "_vae_noise"] = torch.randn(LAT, generator=rec)
    exp[key + "_noise"] = torch.randn(LAT, generator=rec)
    with torch.no_grad():
        exp[key + "_image"] = pipe(image=img, height=H, width=W, generator=torch.Generator().manual_seed(seed),
                                   max_sequence_length=MAXLEN, output_type="pt", **kw).images


run("a", 61, prompt="a photo of a red circle", strength=0.6, num_inference_steps=5, guidance_scale=4.5)
run("b", 62, prompt="a blue square on the left", strength=0.75, num_inference_steps=4, guidance_scale=1.0)
run("c", 63, prompt="a photo of a red circle", strength=1.0, num_inference_steps=3, guidance_scale=3.0)
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("sd3 img2img fixture (diffusers %s) in %s" % (diffusers.__version__, OUT))
