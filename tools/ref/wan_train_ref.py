"""wan_train_ref.py — the flow-matching training loops the Wan2.1 training fixtures share (imported, not run):
gen_wan_train.py (text to video), gen_wan_i2v_train.py (image to video and, with --flf2v, first-last-frame to
video). Everything here is diffusers + PEFT + torch as the pinned versions run it:

* step_loss: noisy = (1 - sigma) x0 + sigma noise, transformer(noisy [cat the condition], timestep,
  encoder_hidden_states [, encoder_hidden_states_image]) with the timestep unscaled (0..1000), the velocity
  target noise - x0, sigma and timestep from FlowMatchEulerDiscreteScheduler(shift=3.0)'s training schedule at
  floor(u * 1000), the mean of squares per sample then over the batch. The image states are stored as mmc's
  transformer takes them, [B, S, D]; a first-last-frame transformer (pos_embed_seq_len) gets them as the
  pipeline hands them over, [2B, S / 2, D] (first then last of each sample), which it views back to [B, S, D].
* train_lora: LoRA r 4 (alpha 4, gaussian init) on the given modules; every step's draws, loss and pre-clip
  gradient norm; clip_grad_norm_(1.0), AdamW lr 1e-3 / wd 1e-4; the adapter before and after
  (<pipeline>.save_lora_weights) as initial.safetensors / final.safetensors, expected.safetensors,
  scheduler_config.json.
* train_full: full fine-tuning (AdamW lr 1e-4, wd 1e-4, clip 1.0), then the named final parameters.
* training_frames: a video's frames as `mmc train` samples them (PyAV rgb24 at round(linspace(0, N - 1, F)),
  PIL bilinear resize of the shorter side to RES, centre crop with round half even).
"""
import os

import av
import numpy as np
import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from PIL import Image
from safetensors.torch import save_file

from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sched = FlowMatchEulerDiscreteScheduler(shift=3.0)


def step_loss(tr, x0, noise, u, inp):
    """inp: prompt_embeds and, for image to video, condition and image_embeds (as drawn)."""
    B = x0.shape[0]
    indices = (u * sched.config.num_train_timesteps).long()
    timesteps, sigmas = sched.timesteps[indices], sched.sigmas[indices]
    sig = sigmas.reshape(B, 1, 1, 1, 1)
    noisy = (1.0 - sig) * x0 + sig * noise
    kw = {}
    if "condition" in inp:
        noisy = torch.cat([noisy, inp["condition"]], 1)
        img = inp["image_embeds"]
        if tr.config.pos_embed_seq_len:                         # the pipeline's [2B, S_img, D]
            img = img.reshape(-1, img.shape[1] // 2, img.shape[2])
        kw["encoder_hidden_states_image"] = img
    pred = tr(hidden_states=noisy, timestep=timesteps, encoder_hidden_states=inp["prompt_embeds"], return_dict=False,
              **kw)[0]
    loss = torch.mean(((pred.float() - (noise - x0).float()) ** 2).reshape(B, -1), 1).mean()
    return loss, sigmas, timesteps


def _run(tr, params, opt, g, inp, shape, steps, out, keep_schedule):
    tr.train()
    for step in range(steps):
        x0 = torch.randn(*shape, generator=g)
        noise = torch.randn(*shape, generator=g)
        u = torch.rand(shape[0], generator=g)
        loss, sigmas, timesteps = step_loss(tr, x0, noise, u, inp)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        out.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"loss_{step}": loss.detach().reshape(1),
                    f"grad_norm_{step}": gn.detach().reshape(1)})
        if keep_schedule:
            out.update({f"sigmas_{step}": sigmas, f"timesteps_{step}": timesteps})


def train_lora(src, out_dir, pipeline_cls, targets, seed, init_seed, draw, shape, steps=20):
    """draw(g, tr) -> the fixed inputs (dict), drawn after the adapter and the optimizer are made."""
    g = torch.Generator().manual_seed(seed)
    tr = WanTransformer3DModel.from_pretrained(src, torch_dtype=torch.float32)
    tr.requires_grad_(False)
    torch.manual_seed(init_seed)
    tr.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=targets))

    def save_adapter(name):
        pipeline_cls.save_lora_weights(out_dir, transformer_lora_layers=get_peft_model_state_dict(tr))
        os.rename(os.path.join(out_dir, "pytorch_lora_weights.safetensors"), os.path.join(out_dir, name))

    save_adapter("initial.safetensors")
    params = [p for p in tr.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    exp = dict(draw(g, tr))
    _run(tr, params, opt, g, exp, shape, steps, exp, True)
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(out_dir, "expected.safetensors"))
    sched.save_config(out_dir)
    save_adapter("final.safetensors")
    print("lora:", [f"{exp[f'loss_{s}'].item():.5f}" for s in range(steps)])


def train_full(src, out_dir, seed, draw, shape, keep, steps=4):
    """Every parameter trainable; keep: the parameters saved as final.<name> afterwards."""
    g = torch.Generator().manual_seed(seed)
    tr = WanTransformer3DModel.from_pretrained(src, torch_dtype=torch.float32)
    params = [p for p in tr.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
    full = dict(draw(g, tr))
    _run(tr, params, opt, g, full, shape, steps, full, False)
    sd = tr.state_dict()
    for k in keep:
        full["final." + k] = sd[k]
    save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(out_dir, "full_expected.safetensors"))
    print("full:", [f"{full[f'loss_{s}'].item():.5f}" for s in range(steps)])


def training_frames(path, F, RES):
    """(the F sampled frames' [RES, RES, 3] uint8 crops, their indices)."""
    with av.open(path) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    idx = np.round(np.linspace(0, len(frames) - 1, F)).astype(int)
    crops = []
    for i in idx:
        im = Image.fromarray(frames[i])
        W, H = im.size
        nh, nw = (RES, int(RES * W / H)) if H <= W else (int(RES * H / W), RES)
        im = im.resize((nw, nh), Image.BILINEAR)
        top, left = round((nh - RES) / 2), round((nw - RES) / 2)
        crops.append(np.ascontiguousarray(np.asarray(im)[top:top + RES, left:left + RES]))
    return crops, idx
