"""Fixtures for diffusers-format models (tests/test_diffusion.c), written by diffusers itself
(the version pinned in requirements.txt):

* vae_sd/, vae_flux/, vae_sd_bf16/, vae_sd_f16/: tiny random AutoencoderKL saved with
  save_pretrained, untouched. vae_sd: 4 latent channels, quant convs, block_out_channels
  (8, 16), norm_num_groups 4 (SD-style); vae_flux: 16 latent channels, no quant convs,
  shift_factor, three levels, sharded into several safetensors with an
  index (Flux-style); the _bf16 / _f16 copies hold vae_sd's weights in those dtypes.
  vae_*/expected.safetensors: a non-square image x, the encoder's moments (after quant_conv),
  latent_dist.mean / .logvar / .std, a noise tensor and latent_dist.mean + std * noise (what
  sample(generator) computes from that noise), decode(z) of a given z, and the tiled decode / encode
  (enable_tiling with a small tile size) of a larger z / x.
* pipe_flux/: a Flux pipeline directory written by FluxPipeline.save_pretrained (model_index.json,
  scheduler/, vae/ = vae_flux in bf16, tiny f16 transformer/, text_encoder/, text_encoder_2/, tokenizer/,
  tokenizer_2/) for the directory reader and its error tests.
* sched_<case>/scheduler_config.json (FlowMatchEulerDiscreteScheduler.save_config) and
  sched_expected.safetensors: sigmas / timesteps after set_timesteps for 1, 2, 4, 28, 50 steps,
  called as the pipelines call it (SD3: set_timesteps(n) or with mu; Flux: sigmas =
  np.linspace(1, 1/n, n) and mu = calculate_shift(image_seq_len)), several image sizes; mu
  (float64), and a few Euler steps.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_diffusion.py
"""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "diffusion")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)


# ---------------------------------------------------------------- AutoencoderKL
VAES = {
    "vae_sd": dict(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                   sample_size=32, scaling_factor=0.18215),
    "vae_flux": dict(block_out_channels=(8, 8, 16), layers_per_block=1, latent_channels=16,
                     norm_num_groups=4, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
                     use_quant_conv=False, use_post_quant_conv=False),
}


def vae_expected(vae, x, z, z_tiled, x_tiled, noise, tile):
    with torch.no_grad():
        h = vae.encoder(x)
        moments = vae.quant_conv(h) if vae.quant_conv is not None else h
        dist = vae.encode(x).latent_dist
        sample = dist.mean + dist.std * noise
        dec = vae.decode(z).sample
        vae.enable_tiling()
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile // 2 ** (len(vae.config.block_out_channels) - 1)
        tiled = vae.decode(z_tiled).sample
        tiled_moments = vae._encode(x_tiled)             # encode(x).latent_dist's parameters
        vae.disable_tiling()
    return {"x": x, "moments": moments, "mean": dist.mean, "logvar": dist.logvar, "std": dist.std,
            "noise": noise, "sample": sample, "z": z, "decoded": dec, "z_tiled": z_tiled,
            "decoded_tiled": tiled, "x_tiled": x_tiled, "moments_tiled": tiled_moments}


def make_vae(name, cfg, seed, shard=None):
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * len(cfg["block_out_channels"]),
                        up_block_types=("UpDecoderBlock2D",) * len(cfg["block_out_channels"]), **cfg)
    rand_init(vae, seed)
    vae.eval()
    d = os.path.join(OUT, name)
    if shard:
        vae.save_pretrained(d, max_shard_size=shard)
    else:
        vae.save_pretrained(d)
    return vae


g = torch.Generator().manual_seed(0)
vae_sd = make_vae("vae_sd", VAES["vae_sd"], 1)
down = 2 ** (len(VAES["vae_sd"]["block_out_channels"]) - 1)
x = torch.rand(2, 3, 24, 40, generator=g) * 2 - 1
z = torch.randn(2, 4, 6, 10, generator=g)
noise = torch.randn(2, 4, 24 // down, 40 // down, generator=g)
z_tiled = torch.randn(1, 4, 28, 36, generator=g)     # tiles of 16 latents, overlap 4
x_tiled = torch.rand(1, 3, 60, 44, generator=g) * 2 - 1   # tiles of 32 pixels every 24
save_file({k: v.contiguous() for k, v in vae_expected(vae_sd, x, z, z_tiled, x_tiled, noise, 32).items()},
          os.path.join(OUT, "vae_sd", "expected.safetensors"))

# the same weights as bf16 / f16 checkpoints; expected = diffusers running them upcast to f32
for dt, nm in ((torch.bfloat16, "vae_sd_bf16"), (torch.float16, "vae_sd_f16")):
    d = os.path.join(OUT, nm)
    AutoencoderKL.from_pretrained(os.path.join(OUT, "vae_sd")).to(dt).save_pretrained(d)
    v32 = AutoencoderKL.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        save_file({"z": z, "decoded": v32.decode(z).sample.contiguous(),
                   "x": x, "mean": v32.encode(x).latent_dist.mean.contiguous()},
                  os.path.join(d, "expected.safetensors"))

vae_flux = make_vae("vae_flux", VAES["vae_flux"], 2, shard="60KB")
down = 2 ** (len(VAES["vae_flux"]["block_out_channels"]) - 1)
x = torch.rand(1, 3, 16, 24, generator=g) * 2 - 1
z = torch.randn(1, 16, 3, 5, generator=g)
noise = torch.randn(1, 16, 16 // down, 24 // down, generator=g)
z_tiled = torch.randn(1, 16, 13, 11, generator=g)    # tiles of 8 latents, overlap 2; ragged edges
x_tiled = torch.rand(2, 3, 40, 72, generator=g) * 2 - 1
save_file({k: v.contiguous() for k, v in vae_expected(vae_flux, x, z, z_tiled, x_tiled, noise, 32).items()},
          os.path.join(OUT, "vae_flux", "expected.safetensors"))

# ---------------------------------------------------------------- schedulers
SCHED = {
    "sd3": dict(shift=3.0),
    "shift115": dict(shift=1.15),
    "flux": dict(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                 base_image_seq_len=256, max_image_seq_len=4096),
    "linear_terminal": dict(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                            base_image_seq_len=1024, max_image_seq_len=4096, time_shift_type="linear",
                            shift_terminal=0.1),
    "invert": dict(shift=2.5, invert_sigmas=True),
    "karras": dict(shift=3.0, use_karras_sigmas=True),
    "exponential": dict(use_dynamic_shifting=True, use_exponential_sigmas=True),
}
STEPS = [1, 2, 4, 28, 50]
SIZES = [(256, 256), (512, 512), (1024, 1024), (768, 1360), (2048, 2048)]
exp = {}
for name, kw in SCHED.items():
    d = os.path.join(OUT, "sched_" + name)
    FlowMatchEulerDiscreteScheduler(**kw).save_config(d)
    for n in STEPS:
        s = FlowMatchEulerDiscreteScheduler.from_pretrained(d)
        c = s.config
        if not c.use_dynamic_shifting:
            s.set_timesteps(n)                      # StableDiffusion3Pipeline without mu
            exp[f"{name}/{n}/sigmas"] = s.sigmas.clone()
            exp[f"{name}/{n}/timesteps"] = s.timesteps.clone()
            continue
        for h, w in SIZES:
            # Flux: packed 2x2 latents of a VAE with factor 8 -> (h/16) * (w/16) tokens
            seq = (h // 16) * (w // 16)
            mu = calculate_shift(seq, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                                 c.get("base_shift", 0.5), c.get("max_shift", 1.15))
            exp[f"{name}/{n}/{seq}/mu"] = torch.tensor([mu], dtype=torch.float64)
            # FluxPipeline: float sigmas from np.linspace, then shifted by mu
            s.set_timesteps(n, sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
            exp[f"{name}/{n}/{seq}/flux_sigmas"] = s.sigmas.clone()
            exp[f"{name}/{n}/{seq}/flux_timesteps"] = s.timesteps.clone()
            # StableDiffusion3Pipeline with dynamic shifting: no sigmas, mu only
            s.set_timesteps(n, mu=mu)
            exp[f"{name}/{n}/{seq}/sigmas"] = s.sigmas.clone()
            exp[f"{name}/{n}/{seq}/timesteps"] = s.timesteps.clone()

# Euler steps: a 28-step SD3 schedule, three steps from a fixed sample and model outputs
s = FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(OUT, "sched_sd3"))
s.set_timesteps(28)
sample = torch.randn(2, 4, 3, 5, generator=g)
exp["step/sample0"] = sample.clone()
for i in range(3):
    mo = torch.randn(2, 4, 3, 5, generator=g)
    sample = s.step(mo, s.timesteps[i], sample).prev_sample
    exp[f"step/model_output{i}"] = mo
    exp[f"step/sample{i + 1}"] = sample.clone()
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "sched_expected.safetensors"))

# ---------------------------------------------------------------- a Flux pipeline directory
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

tmp = os.path.join(OUT, "_tok")
os.makedirs(tmp)
vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "a</w>": 2, "r": 3, "e": 4, "d</w>": 5, "re": 6,
         "red</w>": 7}
with open(os.path.join(tmp, "vocab.json"), "w") as f:
    json.dump(vocab, f)
with open(os.path.join(tmp, "merges.txt"), "w") as f:
    f.write("#version: 0.2\nr e\nre d</w>\n")
clip_tok = CLIPTokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"))
uni = Tokenizer(models.Unigram([("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581a", -1.0),
                                ("\u2581red", -2.0), ("\u2581", -3.0)], unk_id=2))
uni.pre_tokenizer = pre_tokenizers.Metaspace()
t5_tok = T5TokenizerFast(tokenizer_object=uni, extra_ids=0, pad_token="<pad>", eos_token="</s>",
                         unk_token="<unk>")
torch.manual_seed(3)
clip = CLIPTextModel(CLIPTextConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, max_position_embeddings=16, projection_dim=16))
t5 = T5EncoderModel(T5Config(vocab_size=6, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                     attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                     pooled_projection_dim=16, axes_dims_rope=(2, 2, 4))
# mixed dtypes, as real pipelines ship them: the VAE in bf16, the transformer in f16
vae_flux.to(torch.bfloat16)
transformer.to(torch.float16)
pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(OUT, "sched_flux")),
                    vae=vae_flux, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                    tokenizer_2=t5_tok, transformer=transformer)
pipe.save_pretrained(os.path.join(OUT, "pipe_flux"))
shutil.rmtree(tmp)
print("diffusion fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
