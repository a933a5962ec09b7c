"""Single-file checkpoints of the tiny SDXL and SD 1.x pipelines (tests/test_sdxl_single_file.c): one .safetensors
each in the original SGM / LDM layout that users download from Civitai and the Hub, read back by diffusers' own
`from_single_file(..., config=<the fixture pipeline folder>, local_files_only=True)`, which supplies the configs and
tokenizers offline (diffusers would otherwise fetch them from the Hub repo it infers from the keys).

diffusers ships only the LDM -> diffusers direction (loaders/single_file_utils.py); the reverse written here follows
scripts/convert_diffusers_to_original_sdxl.py of its repository (not installed) and is checked by loading the file
back through from_single_file and comparing every tensor with the weights it was written from (exact, f16).

The weights are the fixture pipelines' (tests/fixtures/sdxl, sd15_pipe) re-drawn with other seeds, so a loader that
read the folder's own weights instead of the file's could not pass. Stored in f16, as the files users download are.

tests/fixtures/sdxl_single/
  sdxl.safetensors   model.diffusion_model.*, first_stage_model.*, conditioner.embedders.0.transformer.* (CLIP-L in
                     transformers' layout), conditioner.embedders.1.model.* (OpenCLIP: resblocks, fused in_proj,
                     text_projection [hidden, proj]), plus keys diffusers ignores (logit_scale, position_ids)
  sd15.safetensors   model.diffusion_model.*, first_stage_model.*, cond_stage_model.transformer.*
  expected.safetensors
    unet_x / unet_t / unet_ctx / unet_text_embeds / unet_time_ids / unet_out: the SDXL UNet as loaded by
        from_single_file on one input; sd_unet_*: the same for SD 1.x
    prompt_embeds / pooled: SDXL encode_prompt of two prompts; latents_a / image_a: the SDXL pipeline, CFG 5 (zero
        negative), 3 steps, batch 2; sd_prompt_embeds, sd_latents / sd_image: SD 1.x with its DDIM scheduler_ddim,
        CFG 7.5, 3 steps

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sdxl_single_file.py (after gen_sdxl.py)
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
from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

from ldm_layout import check_loaded, f16, hf_clip_to_ldm, open_clip_to_ldm, unet_to_ldm, vae_to_ldm
from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
SDXL_DIR, SD_DIR = os.path.join(FIX, "sdxl"), os.path.join(FIX, "sd15_pipe")
OUT = os.path.join(FIX, "sdxl_single")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

# ---------------------------------------------------------------- SDXL
xl = StableDiffusionXLPipeline.from_pretrained(SDXL_DIR, torch_dtype=torch.float32, add_watermarker=False)
for i, m in enumerate((xl.unet, xl.vae, xl.text_encoder, xl.text_encoder_2)):
    rand_init(m, 100 + i)
w = {n: {k: v.half().float() for k, v in getattr(xl, n).state_dict().items()}
     for n in ("unet", "vae", "text_encoder", "text_encoder_2")}
ckpt = {}
ckpt.update(unet_to_ldm(w["unet"], xl.unet.config))
ckpt.update(vae_to_ldm(w["vae"], xl.vae.config))
ckpt.update(hf_clip_to_ldm(w["text_encoder"], "conditioner.embedders.0.transformer."))
ckpt.update(open_clip_to_ldm(w["text_encoder_2"], "conditioner.embedders.1.model."))
XL_FILE = os.path.join(OUT, "sdxl.safetensors")
save_file(f16(ckpt), XL_FILE)
del xl

pipe = StableDiffusionXLPipeline.from_single_file(XL_FILE, config=SDXL_DIR, local_files_only=True,
                                                  torch_dtype=torch.float32, add_watermarker=False)
for n in w:
    check_loaded(n, getattr(pipe, n), w[n])
exp = {}
g = torch.Generator().manual_seed(11)
prompts = ["a photo of a red circle", "a blue square on the left"]
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    t = torch.tensor([999.0, 421.0])
    ctx = torch.randn(2, 5, 40, generator=g)
    te = torch.randn(2, 12, generator=g)
    ids = torch.tensor([[16.0, 24.0, 0.0, 0.0, 16.0, 24.0], [32.0, 32.0, 4.0, 2.0, 16.0, 24.0]])
    out = pipe.unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": ids}).sample
    exp.update(unet_x=x, unet_t=t, unet_ctx=ctx, unet_text_embeds=te, unet_time_ids=ids, unet_out=out)
    pe, _, pp, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False)
    exp.update(prompt_embeds=pe, pooled=pp)
    lat = torch.randn(2, 4, 8, 12, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = pipe(prompt=prompts, height=16, width=24, num_inference_steps=3, guidance_scale=5.0, latents=lat,
                          output_type="pt").images

# ---------------------------------------------------------------- SD 1.x
sd = StableDiffusionPipeline.from_pretrained(SD_DIR, torch_dtype=torch.float32)
for i, m in enumerate((sd.unet, sd.vae, sd.text_encoder)):
    rand_init(m, 200 + i)
w = {n: {k: v.half().float() for k, v in getattr(sd, n).state_dict().items()} for n in ("unet", "vae", "text_encoder")}
ckpt = {}
ckpt.update(unet_to_ldm(w["unet"], sd.unet.config))
ckpt.update(vae_to_ldm(w["vae"], sd.vae.config))
ckpt.update(hf_clip_to_ldm(w["text_encoder"], "cond_stage_model.transformer."))
SD_FILE = os.path.join(OUT, "sd15.safetensors")
save_file(f16(ckpt), SD_FILE)
del sd
sd = StableDiffusionPipeline.from_single_file(SD_FILE, config=SD_DIR, local_files_only=True, torch_dtype=torch.float32,
                                              safety_checker=None, requires_safety_checker=False)
for n in w:
    check_loaded(n, getattr(sd, n), w[n])
sd.scheduler = DDIMScheduler.from_pretrained(os.path.join(SD_DIR, "scheduler_ddim"))
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    ctx = torch.randn(2, 5, 16, generator=g)
    out = sd.unet(x, t, encoder_hidden_states=ctx).sample
    exp.update(sd_unet_x=x, sd_unet_ctx=ctx, sd_unet_out=out)
    pe, _ = sd.encode_prompt(prompts, "cpu", 1, False, None)
    exp["sd_prompt_embeds"] = pe
    lat = torch.randn(1, 4, 8, 12, generator=g)
    exp["sd_latents"] = lat
    exp["sd_image"] = sd(prompt=prompts[0], height=16, width=24, num_inference_steps=3, guidance_scale=7.5,
                         latents=lat, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("single-file fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
