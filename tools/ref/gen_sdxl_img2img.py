"""img2img with the tiny SDXL and SD 1.x pipelines and a tiny SDXL refiner (tests/test_sdxl_img2img.c), run by diffusers'
StableDiffusionXLImg2ImgPipeline / StableDiffusionImg2ImgPipeline.

tests/fixtures/sdxl_refiner/: a StableDiffusionXLImg2ImgPipeline as the SDXL refiner is shipped, written by
save_pretrained: no text_encoder / tokenizer (only CLIP-G: tests/fixtures/sdxl's text_encoder_2), a UNet whose
add_embedding takes 12 pooled + 5 x 8 time ids (original size, crop, aesthetic score), requires_aesthetics_score,
force_zeros_for_empty_prompt false, Euler.

tests/fixtures/sdxl_img2img/expected.safetensors: for each case the init image (pixels in [0, 1], [1, 3, 16, 24]), the
two draws the pipeline's seeded generator makes before denoising (vae_noise: latent_dist.sample's randn; noise:
prepare_latents' randn, added at the first timestep by scheduler.add_noise), and the output image (output_type "pt"):
  xl_*    SDXL base (tests/fixtures/sdxl, Euler), strength 0.6, 5 steps (3 run), CFG 5 against zeros
  sd_*    SD 1.x (tests/fixtures/sd15_pipe with scheduler_ddim), strength 0.75, 4 steps (3 run), CFG 7.5 against ""
  ref_*   the refiner, strength 0.5, 4 steps (2 run), CFG 5 against "" with aesthetic scores 6 / 2.5; ref2_*: the same
          with aesthetic_score 7.5, negative_aesthetic_score 1.0 and the DPM-Solver++ scheduler of tests/fixtures/sdxl
  refsf_* the "ref" case on refiner_single.safetensors: the refiner re-drawn and written as a single file (SGM
          layout, its OpenCLIP under conditioner.embedders.0.model.), read by from_single_file(config=sdxl_refiner)

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sdxl_img2img.py (after gen_sdxl.py)
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
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler, StableDiffusionImg2ImgPipeline,
                       StableDiffusionPipeline, StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline,
                       UNet2DConditionModel)
from transformers import CLIPTextModelWithProjection, CLIPTokenizer

from ldm_layout import check_loaded, f16, open_clip_to_ldm, unet_to_ldm, vae_to_ldm
from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
SDXL_DIR, SD_DIR = os.path.join(FIX, "sdxl"), os.path.join(FIX, "sd15_pipe")
REF_DIR, OUT = os.path.join(FIX, "sdxl_refiner"), os.path.join(FIX, "sdxl_img2img")
torch.set_num_threads(2)
torch.manual_seed(0)
for d in (REF_DIR, OUT):
    shutil.rmtree(d, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(31)
exp = {}


def run(pipe, key, seed, lat_shape, **kw):
    img = torch.rand(1, 3, 16, 24, generator=g)
    # the pipeline's generator draws latent_dist.sample()'s noise, then prepare_latents' noise, before denoising
    rec = torch.Generator().manual_seed(seed)
    exp[key + "_init"] = img
    exp[key + "_vae_noise"] = torch.randn(lat_shape, generator=rec)
    exp[key + "_noise"] = torch.randn(lat_shape, generator=rec)
    with torch.no_grad():
        exp[key + "_image"] = pipe(image=img, generator=torch.Generator().manual_seed(seed), output_type="pt",
                                   **kw).images


xl = StableDiffusionXLPipeline.from_pretrained(SDXL_DIR, torch_dtype=torch.float32, add_watermarker=False)
xi = StableDiffusionXLImg2ImgPipeline(**xl.components, add_watermarker=False)
run(xi, "xl", 41, (1, 4, 8, 12), prompt="a photo of a red circle", strength=0.6, num_inference_steps=5,
    guidance_scale=5.0)

sd = StableDiffusionPipeline.from_pretrained(SD_DIR, torch_dtype=torch.float32)
sd.scheduler = DDIMScheduler.from_pretrained(os.path.join(SD_DIR, "scheduler_ddim"))
si = StableDiffusionImg2ImgPipeline(**sd.components)
run(si, "sd", 42, (1, 4, 8, 12), prompt="a photo of a red circle", strength=0.75, num_inference_steps=4,
    guidance_scale=7.5)

# ---------------------------------------------------------------- the refiner
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(8, 16),
                            layers_per_block=1, transformer_layers_per_block=(1, 1), cross_attention_dim=24,
                            attention_head_dim=(2, 2), norm_num_groups=4, use_linear_projection=True,
                            addition_embed_type="text_time", addition_time_embed_dim=8,
                            projection_class_embeddings_input_dim=12 + 5 * 8)
rand_init(unet, 9)
te2 = CLIPTextModelWithProjection.from_pretrained(os.path.join(SDXL_DIR, "text_encoder_2"))
tok2 = CLIPTokenizer.from_pretrained(os.path.join(SDXL_DIR, "tokenizer_2"))
ref = StableDiffusionXLImg2ImgPipeline(vae=xl.vae, text_encoder=None, text_encoder_2=te2.eval(), tokenizer=None,
                                       tokenizer_2=tok2, unet=unet.eval(), scheduler=EulerDiscreteScheduler.from_config(
                                           xl.scheduler.config), requires_aesthetics_score=True,
                                       force_zeros_for_empty_prompt=False, add_watermarker=False)
ref.save_pretrained(REF_DIR)
ref = StableDiffusionXLImg2ImgPipeline.from_pretrained(REF_DIR, torch_dtype=torch.float32, add_watermarker=False)
assert ref.text_encoder is None and ref.config.requires_aesthetics_score
run(ref, "ref", 43, (1, 4, 8, 12), prompt="a photo of a red circle", strength=0.5, num_inference_steps=4,
    guidance_scale=5.0)
ref.scheduler = DPMSolverMultistepScheduler.from_pretrained(os.path.join(SDXL_DIR, "scheduler_dpm"))
run(ref, "ref2", 44, (1, 4, 8, 12), prompt="a blue square on the left", strength=0.7, num_inference_steps=5,
    guidance_scale=4.0, aesthetic_score=7.5, negative_aesthetic_score=1.0)
# the refiner as a single file (conditioner.embedders.0.model.* = its OpenCLIP), weights re-drawn, f16, read by
# from_single_file(config=the refiner folder): refsf_*, the "ref" case on it
ref.scheduler = EulerDiscreteScheduler.from_config(xl.scheduler.config)
for i, m in enumerate((ref.unet, ref.vae, ref.text_encoder_2)):
    rand_init(m, 300 + i)
w = {n: {k: v.half().float() for k, v in getattr(ref, n).state_dict().items()} for n in ("unet", "vae", "text_encoder_2")}
ckpt = {**unet_to_ldm(w["unet"], ref.unet.config), **vae_to_ldm(w["vae"], ref.vae.config),
        **open_clip_to_ldm(w["text_encoder_2"], "conditioner.embedders.0.model.")}
REF_FILE = os.path.join(OUT, "refiner_single.safetensors")
save_file(f16(ckpt), REF_FILE)
rsf = StableDiffusionXLImg2ImgPipeline.from_single_file(REF_FILE, config=REF_DIR, local_files_only=True,
                                                        torch_dtype=torch.float32, add_watermarker=False)
assert rsf.text_encoder is None
for n in w:
    check_loaded(n, getattr(rsf, n), w[n])
run(rsf, "refsf", 45, (1, 4, 8, 12), prompt="a photo of a red circle", strength=0.5, num_inference_steps=4,
    guidance_scale=5.0)
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("img2img fixtures (diffusers %s) in %s, %s" % (diffusers.__version__, OUT, REF_DIR))
