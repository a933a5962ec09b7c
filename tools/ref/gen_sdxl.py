"""A whole StableDiffusionXLPipeline folder for `mmc generate-image` (tests/test_sdxl_pipeline.c), written
by diffusers' save_pretrained untouched: a CLIPTextModel (hidden 16) and a CLIPTextModelWithProjection
(hidden 24, projection 12) with their tokenizers, a tiny SDXL-shaped UNet2DConditionModel (cross_attention_dim
16 + 24, text_time micro-conditioning over 12 + 6 x 8 inputs), an AutoencoderKL (factor 2, force_upcast) and
SDXL's EulerDiscreteScheduler config; force_zeros_for_empty_prompt as SDXL base sets it, no watermarker.
expected.safetensors: encode_prompt's prompt_embeds / pooled text_embeds for two prompts, and for a negative
prompt; the injected latents and the images (output_type="pt") of (a) CFG 5.0 with no negative prompt (zeroed
negative conditioning), 3 steps, batch 2, (b) no CFG, 2 steps, (c) CFG 3.0 with a negative prompt, 3 steps.
cli_latents.safetensors / cli_expected.png: (c)'s initial noise as `mmc generate-image --latents` reads it, and
the PNG diffusers saves from it (tests/test_sdxl_cli.sh). scheduler_dpm/: a DPMSolverMultistepScheduler (2M Karras)
from the pipeline's scheduler config, and image_d: (d) the pipeline with it, CFG 4 (zero negative), 4 steps.

tests/fixtures/sd15_pipe/: a StableDiffusionPipeline (SD 1.x shape: one CLIPTextModel, a UNet without addition
embedding, conv projections) shipped with SD 1.5's PNDMScheduler config, scheduler_ddim/ a DDIMScheduler from it
(clip_sample off), and expected.safetensors: encode_prompt's prompt_embeds and the "" negative; (p) with the
folder's PNDM, CFG 7.5, 4 steps; and with DDIM: (a) CFG 7.5, 3 steps, batch 2, (b) no CFG, 2 steps, (c) CFG 4 against a negative prompt.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sdxl.py
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
from diffusers import (AutoencoderKL, DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler,
                       PNDMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from ref_common import rand_init, tiny_tokenizers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "sdxl")
OUT_SD = os.path.join(ROOT, "tests", "fixtures", "sd15_pipe")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
shutil.rmtree(OUT_SD, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(1)

tmp = os.path.join(OUT, "_tok")
os.makedirs(tmp)
words = ["a", "red", "blue", "green", "circle", "square", "on", "the", "left", "right", "photo", "of"]
clip_tok, _, n_vocab, _ = tiny_tokenizers(tmp, words, pad_token="<|endoftext|>")


def clip_cfg(hidden, heads, proj=None):
    kw = dict(vocab_size=n_vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
              num_attention_heads=heads, max_position_embeddings=77, eos_token_id=1, bos_token_id=0, pad_token_id=1)
    if proj:
        kw["projection_dim"] = proj
    return CLIPTextConfig(**kw)


te1 = CLIPTextModel(clip_cfg(16, 2))
rand_init(te1, 3)
te2 = CLIPTextModelWithProjection(clip_cfg(24, 3, proj=12))
rand_init(te2, 4)
vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                    sample_size=32, scaling_factor=0.13025, force_upcast=True)
rand_init(vae, 5)
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(8, 16),
                            layers_per_block=1, transformer_layers_per_block=(1, 2), cross_attention_dim=40,
                            attention_head_dim=(2, 2), norm_num_groups=4, use_linear_projection=True,
                            addition_embed_type="text_time", addition_time_embed_dim=8,
                            projection_class_embeddings_input_dim=12 + 6 * 8)
rand_init(unet, 6)
unet_sd = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                               down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(8, 16),
                               layers_per_block=1, cross_attention_dim=16, attention_head_dim=2, norm_num_groups=4)
rand_init(unet_sd, 7)
te_sd = CLIPTextModel(clip_cfg(16, 2))
rand_init(te_sd, 8)
sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                               timestep_spacing="leading", interpolation_type="linear", prediction_type="epsilon")
pipe = StableDiffusionXLPipeline(vae=vae.eval(), text_encoder=te1.eval(), text_encoder_2=te2.eval(),
                                 tokenizer=clip_tok, tokenizer_2=clip_tok, unet=unet.eval(), scheduler=sched,
                                 force_zeros_for_empty_prompt=True, add_watermarker=False)
pipe.save_pretrained(OUT)
shutil.rmtree(tmp)
pipe = StableDiffusionXLPipeline.from_pretrained(OUT, torch_dtype=torch.float32, add_watermarker=False)
exp = {}
prompts = ["a photo of a red circle", "a blue square on the left"]
H, W = 16, 24       # latents 8 x 12 (vae factor 2)
with torch.no_grad():
    pe, _, pp, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False)
    exp.update(prompt_embeds=pe, pooled=pp)
    npe, _, npp, _ = pipe.encode_prompt(["green left", "green left"], do_classifier_free_guidance=False)
    exp.update(negative_prompt_embeds=npe, negative_pooled=npp)
    lat = torch.randn(2, 4, 8, 12, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = pipe(prompt=prompts, height=H, width=W, num_inference_steps=3, guidance_scale=5.0, latents=lat,
                          output_type="pt").images
    lat = torch.randn(1, 4, 8, 12, generator=g)
    exp["latents_b"] = lat
    exp["image_b"] = pipe(prompt=prompts[0], height=H, width=W, num_inference_steps=2, guidance_scale=1.0,
                          latents=lat, output_type="pt").images
    exp["image_c"] = pipe(prompt=prompts[0], negative_prompt="green left", height=H, width=W, num_inference_steps=3,
                          guidance_scale=3.0, latents=lat, output_type="pt").images
    # the same run as `mmc generate-image --latents` takes it, and the PNG diffusers saves
    save_file({"latents": lat.contiguous()}, os.path.join(OUT, "cli_latents.safetensors"))
    pipe(prompt=prompts[0], negative_prompt="green left", height=H, width=W, num_inference_steps=3,
         guidance_scale=3.0, latents=lat).images[0].save(os.path.join(OUT, "cli_expected.png"))
    # (d) the scheduler swapped as users do (pipe.scheduler = ...from_config): DPM-Solver++ 2M Karras, its
    # config saved beside the pipeline in scheduler_dpm/
    dpm = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True,
                                                  algorithm_type="dpmsolver++")
    dpm.save_config(os.path.join(OUT, "scheduler_dpm"))
    pipe.scheduler = DPMSolverMultistepScheduler.from_pretrained(os.path.join(OUT, "scheduler_dpm"))
    exp["image_d"] = pipe(prompt=prompts[0], height=H, width=W, num_inference_steps=4, guidance_scale=4.0,
                          latents=lat, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))

# ---------------------------------------------------------------- StableDiffusionPipeline (SD 1.x shape)
# shipped with SD 1.5's PNDMScheduler settings; image (p) with it, the others with DDIM from that config, saved
# in scheduler_ddim/, as users swap it in
os.makedirs(os.path.join(OUT_SD, "_tok"))
sd_tok, _, _, _ = tiny_tokenizers(os.path.join(OUT_SD, "_tok"), words, pad_token="<|endoftext|>")
pndm = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                     skip_prk_steps=True, set_alpha_to_one=False)
sd = StableDiffusionPipeline(vae=vae.eval(), text_encoder=te_sd.eval(), tokenizer=sd_tok, unet=unet_sd.eval(),
                             scheduler=pndm, safety_checker=None, feature_extractor=None,
                             requires_safety_checker=False)
sd.save_pretrained(OUT_SD)
shutil.rmtree(os.path.join(OUT_SD, "_tok"))
sd = StableDiffusionPipeline.from_pretrained(OUT_SD, torch_dtype=torch.float32)
with torch.no_grad():   # (p) the folder's own PNDM (PLMS) scheduler, CFG 7.5 against "", 4 steps
    lat_p = torch.randn(1, 4, 8, 12, generator=g)
    image_p = sd(prompt="a photo of a red circle", height=16, width=24, num_inference_steps=4, guidance_scale=7.5,
                 latents=lat_p, output_type="pt").images
DDIMScheduler.from_config(sd.scheduler.config, clip_sample=False).save_config(os.path.join(OUT_SD, "scheduler_ddim"))
sd.scheduler = DDIMScheduler.from_pretrained(os.path.join(OUT_SD, "scheduler_ddim"))
exp = {"latents_p": lat_p, "image_p": image_p}
with torch.no_grad():
    pe, npe = sd.encode_prompt(prompts, "cpu", 1, True, None)
    exp.update(prompt_embeds=pe, negative_prompt_embeds=npe)
    lat = torch.randn(2, 4, 8, 12, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = sd(prompt=prompts, height=H, width=W, num_inference_steps=3, guidance_scale=7.5, latents=lat,
                        output_type="pt").images
    lat = torch.randn(1, 4, 8, 12, generator=g)
    exp["latents_b"] = lat
    exp["image_b"] = sd(prompt=prompts[0], height=H, width=W, num_inference_steps=2, guidance_scale=1.0, latents=lat,
                        output_type="pt").images
    exp["image_c"] = sd(prompt=prompts[0], negative_prompt="green left", height=H, width=W, num_inference_steps=3,
                        guidance_scale=4.0, latents=lat, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT_SD, "expected.safetensors"))
print("sdxl pipeline fixture (diffusers %s) in %s" % (diffusers.__version__, OUT))
