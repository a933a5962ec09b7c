"""Flow-matching training parity for SD3 / SD3.5 (tests/test_sd3.c, train_lora and train_full), written by
diffusers itself (the version pinned in requirements.txt):

* sd3_train/lora/: 20 steps of LoRA training on tests/fixtures/sd3/sd35 (SD3.5-shaped: rms qk norm, a dual
  attention block) exactly as diffusers' train_dreambooth_lora_sd3.py runs its loop: noisy = (1 - sigma) x0 +
  sigma noise, transformer(noisy, timestep, prompt_embeds, pooled) with the timestep unscaled (0..1000),
  precondition_outputs (the script's default 1: pred * (-sigma) + noisy against x0), logit_normal timestep
  draws made here (u fixed), loss weighting "sigma_sqrt", the mean of squares per sample then over the batch,
  clip_grad_norm_(1.0), AdamW lr 1e-3 / wd 1e-4. LoRA on the script's targets (attn.to_q/k/v/out.0,
  attn.add_q/k/v_proj, attn.to_add_out), r 4, gaussian init. Saved: initial.safetensors (the adapter before
  training, StableDiffusion3Pipeline.save_lora_weights), expected.safetensors (every step's inputs, loss and
  grad norm), final.safetensors, scheduler_config.json (shift 3.0).
* sd3_train/full/: 6 steps of full fine-tuning of tests/fixtures/sd3/sd3 (out_channels 6 != in 4 needs a
  6-channel target, so sd35 again) without preconditioning (target = noise - x0), weighting "cosmap";
  expected.safetensors and the final transformer weights of three parameters.

Run: .venv-ref/bin/python tools/ref/gen_sd3_train.py
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

from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from diffusers.training_utils import compute_loss_weighting_for_sd3

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SRC = os.path.join(ROOT, "tests", "fixtures", "sd3", "sd35")
OUT = os.path.join(ROOT, "tests", "fixtures", "sd3_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(21)
sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
B, C, h, w, T = 2, 4, 8, 6, 4


def run(tr, params, steps, precondition, scheme, lr, d):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    cfg = tr.config
    exp = {"prompt_embeds": torch.randn(B, T, cfg.joint_attention_dim, generator=g),
           "pooled": torch.randn(B, cfg.pooled_projection_dim, generator=g)}
    tr.train()
    for step in range(steps):
        x0 = torch.randn(B, C, h, w, generator=g)
        noise = torch.randn(B, C, h, w, generator=g)
        u = torch.sigmoid(torch.randn(B, generator=g))         # logit_normal(0, 1), drawn here
        indices = (u * sched.config.num_train_timesteps).long()
        timesteps = sched.timesteps[indices]
        sigmas = torch.stack([sched.sigmas[(sched.timesteps == t).nonzero().item()] for t in timesteps])
        sig = sigmas.reshape(B, 1, 1, 1)
        noisy = (1.0 - sig) * x0 + sig * noise
        pred = tr(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=exp["prompt_embeds"],
                  pooled_projections=exp["pooled"], return_dict=False)[0]
        if precondition:
            pred = pred * (-sig) + noisy
            target = x0
        else:
            target = noise - x0
        weighting = compute_loss_weighting_for_sd3(weighting_scheme=scheme, sigmas=sig)
        loss = torch.mean((weighting.float() * (pred.float() - target.float()) ** 2).reshape(B, -1), 1).mean()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"sigmas_{step}": sigmas,
                    f"timesteps_{step}": timesteps, f"loss_{step}": loss.detach().reshape(1),
                    f"grad_norm_{step}": gn.detach().reshape(1)})
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
    sched.save_config(d)


# ---------------------------------------------------------------- LoRA
d = os.path.join(OUT, "lora")
os.makedirs(d)
tr = SD3Transformer2DModel.from_pretrained(SRC, torch_dtype=torch.float32)
tr.requires_grad_(False)
torch.manual_seed(12)
tr.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                          target_modules=["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
                                          "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v"]))
StableDiffusion3Pipeline.save_lora_weights(d, transformer_lora_layers=get_peft_model_state_dict(tr))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "initial.safetensors"))
run(tr, [p for p in tr.parameters() if p.requires_grad], 20, True, "sigma_sqrt", 1e-3, d)
StableDiffusion3Pipeline.save_lora_weights(d, transformer_lora_layers=get_peft_model_state_dict(tr))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "final.safetensors"))

# ---------------------------------------------------------------- full fine-tune
d = os.path.join(OUT, "full")
os.makedirs(d)
tr = SD3Transformer2DModel.from_pretrained(SRC, torch_dtype=torch.float32)
params = [p for n, p in tr.named_parameters() if p.requires_grad]
run(tr, params, 6, False, "cosmap", 1e-4, d)
sd = tr.state_dict()
save_file({k: sd[k].contiguous() for k in ("transformer_blocks.0.attn.to_q.weight", "proj_out.weight",
                                              "transformer_blocks.1.ff.net.2.bias")},
          os.path.join(d, "final_params.safetensors"))
print("sd3 training fixtures in", OUT)
