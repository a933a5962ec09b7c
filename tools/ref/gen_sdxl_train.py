"""DDPM training parity for SDXL / SD 1.x UNets (tests/test_unet.c part "train"), written by diffusers itself
(the version pinned in requirements.txt):

* sdxl_train/lora/: 20 steps of LoRA training on tests/fixtures/unet/sdxl (SDXL-shaped, text_time) exactly as
  diffusers' train_text_to_image_lora_sdxl.py runs its loop: noise = randn + noise_offset (0.1) * randn(B, C, 1,
  1), timesteps = randint(0, num_train_timesteps), noisy = DDPMScheduler.add_noise, add_time_ids from each
  image's (original size, crop top-left) and the target size (compute_time_ids), unet(noisy, timesteps,
  prompt_embeds, added_cond_kwargs={text_embeds, time_ids}), target = noise (epsilon), F.mse_loss(mean),
  clip_grad_norm_(1.0), AdamW lr 1e-3 / wd 1e-2. LoRA on the script's targets (to_k, to_q, to_v, to_out.0),
  r 4, gaussian init. Saved: initial.safetensors (the adapter before training,
  StableDiffusionXLPipeline.save_lora_weights: "unet.<module>.lora_A.weight"), expected.safetensors (every
  step's drawn inputs, loss and grad norm), final.safetensors, scheduler/scheduler_config.json (the sdxl
  fixture's EulerDiscreteScheduler config, loaded into a DDPMScheduler as the script does).
* sdxl_train/full/: 6 steps of full fine-tuning of tests/fixtures/unet/sd15 (SD 1.5-shaped: conv projections,
  no added conditioning) as train_text_to_image.py with --prediction_type v_prediction (register_to_config)
  and --snr_gamma 5 (mse_loss_weights = min(snr, 5) / (snr + 1), per-sample means weighted), AdamW lr 1e-4 /
  wd 1e-2; expected.safetensors and three final parameters.

Run: .venv-ref/bin/python tools/ref/gen_sdxl_train.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

from diffusers import DDPMScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

from ref_common import ddpm_loss

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
UNETS = os.path.join(ROOT, "tests", "fixtures", "unet")
OUT = os.path.join(ROOT, "tests", "fixtures", "sdxl_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "sdxl", "scheduler"), os.path.join(OUT, "scheduler"))
sched = DDPMScheduler.from_pretrained(OUT, subfolder="scheduler")
g = torch.Generator().manual_seed(31)
B, C, h, w, T = 2, 4, 8, 12, 5
RES = (64, 96)   # the target size (args.resolution as (h, w))


def compute_time_ids(original_size, crops_coords_top_left):
    return torch.tensor([list(original_size + crops_coords_top_left + RES)], dtype=torch.float32)


def run(unet, params, steps, lr, pred_type, snr_gamma, noise_offset, d):
    if pred_type is not None:
        sched.register_to_config(prediction_type=pred_type)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    cfg = unet.config
    exp = {"prompt_embeds": torch.randn(B, T, cfg.cross_attention_dim, generator=g)}
    sdxl = cfg.addition_embed_type == "text_time"
    if sdxl:
        exp["text_embeds"] = torch.randn(B, cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim,
                                         generator=g)
    unet.train()
    for step in range(steps):
        x0 = torch.randn(B, C, h, w, generator=g)
        noise = torch.randn(B, C, h, w, generator=g)
        if noise_offset:
            noise += noise_offset * torch.randn((B, C, 1, 1), generator=g)
        timesteps = torch.randint(0, sched.config.num_train_timesteps, (B,), generator=g).long()
        noisy = sched.add_noise(x0, noise, timesteps)
        kw = {}
        if sdxl:
            orig = [(int(torch.randint(32, 200, (1,), generator=g)), int(torch.randint(32, 200, (1,), generator=g)))
                    for _ in range(B)]
            crops = [(int(torch.randint(0, 20, (1,), generator=g)), int(torch.randint(0, 20, (1,), generator=g)))
                     for _ in range(B)]
            time_ids = torch.cat([compute_time_ids(o, c) for o, c in zip(orig, crops)])
            kw["added_cond_kwargs"] = {"text_embeds": exp["text_embeds"], "time_ids": time_ids}
            exp[f"time_ids_{step}"] = time_ids
        pred = unet(noisy, timesteps, exp["prompt_embeds"], return_dict=False, **kw)[0]
        loss = ddpm_loss(sched, pred, x0, noise, timesteps, snr_gamma)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"timesteps_{step}": timesteps.float(),
                    f"loss_{step}": loss.detach().reshape(1), f"grad_norm_{step}": gn.detach().reshape(1)})
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))


# ---------------------------------------------------------------- LoRA (SDXL)
d = os.path.join(OUT, "lora")
os.makedirs(d)
unet = UNet2DConditionModel.from_pretrained(os.path.join(UNETS, "sdxl"), torch_dtype=torch.float32)
unet.requires_grad_(False)
torch.manual_seed(13)
unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                            target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
StableDiffusionXLPipeline.save_lora_weights(d, unet_lora_layers=get_peft_model_state_dict(unet))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "initial.safetensors"))
run(unet, [p for p in unet.parameters() if p.requires_grad], 20, 1e-3, None, None, 0.1, d)
StableDiffusionXLPipeline.save_lora_weights(d, unet_lora_layers=get_peft_model_state_dict(unet))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "final.safetensors"))

# ---------------------------------------------------------------- full fine-tune (SD 1.5-shaped), v_prediction
d = os.path.join(OUT, "full")
os.makedirs(d)
unet = UNet2DConditionModel.from_pretrained(os.path.join(UNETS, "sd15"), torch_dtype=torch.float32)
params = [p for p in unet.parameters() if p.requires_grad]
run(unet, params, 6, 1e-4, "v_prediction", 5.0, 0.0, d)
sd = unet.state_dict()
save_file({k: sd[k].contiguous() for k in ("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight",
                                              "conv_out.weight", "up_blocks.1.resnets.0.conv1.bias")},
          os.path.join(d, "final_params.safetensors"))
print("sdxl training fixtures in", OUT)
