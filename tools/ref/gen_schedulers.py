"""Fixtures for the DDPM-family schedulers (tests/test_schedulers.c), written by diffusers itself (the
version pinned in requirements.txt):

* <case>/scheduler_config.json: EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
  DPMSolverMultistepScheduler, DDIMScheduler and PNDMScheduler (skip_prk_steps) configs as save_config writes them (SDXL's and SD 1.5's
  own settings, and variants over beta_schedule, prediction_type, timestep_spacing, Karras sigmas,
  final_sigmas_type, zero-terminal-SNR rescaling, SDE / Heun / euler_at_final DPM-Solver).
* expected.safetensors: per case and step count N, set_timesteps(N)'s timesteps and sigmas (as float32),
  init_noise_sigma; and a whole sampling loop per case from a fixed sample with fixed "model outputs"
  per step (set_begin_index(0): step i at the i-th timestep): scale_model_input's output, the noise the step drew (EulerAncestral's generator draw, the SDE
  variance_noise, DDIM's variance_noise for eta > 0), and prev_sample after each step.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_schedulers.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # deterministic dict / set order in what diffusers writes
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler, PNDMScheduler)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "schedulers")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

SDXL = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)
CASES = {
    # EulerDiscreteScheduler: SDXL base's scheduler/ as shipped (leading, steps_offset 1)
    "euler_sdxl": (EulerDiscreteScheduler, dict(SDXL, timestep_spacing="leading", interpolation_type="linear")),
    "euler_trailing_v_zsnr": (EulerDiscreteScheduler, dict(timestep_spacing="trailing", prediction_type="v_prediction",
                                                           rescale_betas_zero_snr=True)),
    "euler_karras_cos": (EulerDiscreteScheduler, dict(beta_schedule="squaredcos_cap_v2", use_karras_sigmas=True,
                                                      final_sigmas_type="sigma_min")),
    "euler_karras_range": (EulerDiscreteScheduler, dict(SDXL, use_karras_sigmas=True, sigma_min=0.05, sigma_max=10.0)),
    "euler_loglinear_sample": (EulerDiscreteScheduler, dict(SDXL, interpolation_type="log_linear",
                                                            prediction_type="sample")),
    "ea_sdxl": (EulerAncestralDiscreteScheduler, dict(SDXL, timestep_spacing="leading")),
    "ea_trailing_v_zsnr": (EulerAncestralDiscreteScheduler, dict(SDXL, timestep_spacing="trailing",
                                                                 prediction_type="v_prediction",
                                                                 rescale_betas_zero_snr=True)),
    "ea_linspace": (EulerAncestralDiscreteScheduler, dict(beta_schedule="linear")),
    # DPM-Solver++ 2M: plain, Karras ("DPM++ 2M Karras"), SDE Karras, Heun + euler_at_final + sigma_min
    "dpm_2m": (DPMSolverMultistepScheduler, dict(SDXL)),
    "dpm_2m_karras": (DPMSolverMultistepScheduler, dict(SDXL, use_karras_sigmas=True, timestep_spacing="leading")),
    "dpm_sde_karras_v": (DPMSolverMultistepScheduler, dict(SDXL, algorithm_type="sde-dpmsolver++",
                                                           use_karras_sigmas=True, prediction_type="v_prediction")),
    "dpm_heun_final": (DPMSolverMultistepScheduler, dict(solver_type="heun", euler_at_final=True,
                                                         final_sigmas_type="sigma_min", timestep_spacing="trailing",
                                                         lower_order_final=False)),
    "dpm_cos_karras_clip": (DPMSolverMultistepScheduler, dict(beta_schedule="squaredcos_cap_v2", use_karras_sigmas=True,
                                                              lambda_min_clipped=-5.1, prediction_type="sample")),
    "dpm_order1_zsnr": (DPMSolverMultistepScheduler, dict(SDXL, solver_order=1, rescale_betas_zero_snr=True,
                                                          timestep_spacing="trailing", prediction_type="v_prediction")),
    # DDIM: SD 1.5's scheduler settings; trailing v-prediction zero-SNR (eta > 0 too); linspace with clipping
    "ddim_sd15": (DDIMScheduler, dict(SDXL, clip_sample=False, set_alpha_to_one=False)),
    "ddim_trailing_v_zsnr": (DDIMScheduler, dict(SDXL, clip_sample=False, timestep_spacing="trailing",
                                                 prediction_type="v_prediction", rescale_betas_zero_snr=True)),
    "ddim_linspace_clip": (DDIMScheduler, dict(timestep_spacing="linspace", prediction_type="sample",
                                               clip_sample=True, clip_sample_range=0.8)),
    # PNDM (PLMS) as SD 1.5 ships it; linspace v-prediction with set_alpha_to_one; trailing
    "pndm_sd15": (PNDMScheduler, dict(SDXL, skip_prk_steps=True, set_alpha_to_one=False)),
    "pndm_linspace_v": (PNDMScheduler, dict(skip_prk_steps=True, set_alpha_to_one=True, timestep_spacing="linspace",
                                            prediction_type="v_prediction")),
    "pndm_trailing": (PNDMScheduler, dict(SDXL, skip_prk_steps=True, timestep_spacing="trailing")),
}
STEPS = [1, 2, 3, 7, 10, 13, 20, 25, 30, 50]
LOOP_STEPS = {"default": 8, "dpm_2m": 16, "dpm_2m_karras": 16, "pndm_trailing": 3}
SHAPE = (1, 4, 4, 5)

exp = {}
for name, (cls, kw) in CASES.items():
    d = os.path.join(OUT, name)
    cls(**kw).save_config(d)
    s = cls.from_pretrained(d)
    for n in STEPS:
        s.set_timesteps(n)
        exp[f"{name}/{n}/timesteps"] = s.timesteps.float().clone()
        if cls not in (DDIMScheduler, PNDMScheduler):
            exp[f"{name}/{n}/sigmas"] = s.sigmas.float().clone()
        exp[f"{name}/{n}/init_noise_sigma"] = torch.tensor([float(s.init_noise_sigma)], dtype=torch.float32)

    loops = [("loop", 0.0)] + ([("loop_eta", 0.6)] if cls is DDIMScheduler else [])
    for key, eta in loops:
        n = LOOP_STEPS.get(name, LOOP_STEPS["default"])
        s = cls.from_pretrained(d)
        s.set_timesteps(n)
        if hasattr(s, "set_begin_index"):
            s.set_begin_index(0)   # step i is the i-th timestep even where Karras rounding repeats one
        g = torch.Generator().manual_seed(len(name))
        x = torch.randn(SHAPE, generator=g) * float(s.init_noise_sigma)
        exp[f"{name}/{key}/n"] = torch.tensor([n], dtype=torch.int32)
        exp[f"{name}/{key}/x"] = x.clone()
        for i, t in enumerate(s.timesteps):
            xin = s.scale_model_input(x, t)
            mo = torch.randn(SHAPE, generator=g)
            noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1000 + i))
            if cls is EulerAncestralDiscreteScheduler:
                out = s.step(mo, t, x, generator=torch.Generator().manual_seed(1000 + i)).prev_sample
            elif cls is DPMSolverMultistepScheduler:
                out = s.step(mo, t, x, variance_noise=noise).prev_sample
            elif cls is DDIMScheduler:
                out = s.step(mo, t, x, eta=eta, variance_noise=noise if eta > 0 else None).prev_sample
            else:
                out = s.step(mo, t, x).prev_sample
            exp[f"{name}/{key}/{i}/scaled"] = xin.clone()
            exp[f"{name}/{key}/{i}/model_output"] = mo
            exp[f"{name}/{key}/{i}/noise"] = noise
            exp[f"{name}/{key}/{i}/prev_sample"] = out.clone()
            x = out

# training arithmetic: each config loaded into a DDPMScheduler, as the training scripts do
from diffusers import DDPMScheduler
from diffusers.training_utils import compute_snr
g = torch.Generator().manual_seed(7)
x0, noise = torch.randn(4, 3, 2, 5, generator=g), torch.randn(4, 3, 2, 5, generator=g)
tt = torch.tensor([0, 17, 500, 999])
exp["train/x0"], exp["train/noise"], exp["train/t"] = x0, noise, tt.to(torch.int32)
for name in ("euler_sdxl", "euler_trailing_v_zsnr", "ddim_linspace_clip", "dpm_cos_karras_clip"):
    ddpm = DDPMScheduler.from_pretrained(os.path.join(OUT, name))
    exp[f"train/{name}/add_noise"] = ddpm.add_noise(x0, noise, tt)
    exp[f"train/{name}/velocity"] = ddpm.get_velocity(x0, noise, tt)
    exp[f"train/{name}/snr"] = compute_snr(ddpm, tt)
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("wrote", OUT, len(exp), "tensors")
