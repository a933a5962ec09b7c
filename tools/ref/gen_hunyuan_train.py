"""DDPM training parity for HunyuanDiT2DModel (tests/test_hunyuan.c part "train"), written by diffusers and PEFT
themselves (the versions pinned in requirements.txt). diffusers ships no HunyuanDiT training script, so the loop
is train_text_to_image(_lora).py's (as tools/ref/gen_sdxl_train.py writes it for the UNets) with the
conditioning HunyuanDiTPipeline gives the transformer:

  noise = randn + noise_offset * randn(B, C, 1, 1); timesteps = randint(0, num_train_timesteps);
  noisy = DDPMScheduler.add_noise(x0, noise, timesteps);
  pred = transformer(noisy, timesteps (as float, the pipeline's t_expand), encoder_hidden_states=BERT states, text_embedding_mask,
                     encoder_hidden_states_t5=T5 states, text_embedding_mask_t5, image_meta_size, style=0,
                     image_rotary_emb=get_2d_rotary_pos_embed over get_resize_crop_region_for_grid(grid,
                     512 // 8 // patch)).chunk(2, dim=1)[0]   (learn_sigma: the variance half dropped)
  target = noise (epsilon) | get_velocity (v_prediction); F.mse_loss, min-SNR weights with snr_gamma;
  loss.backward(); clip_grad_norm_(1.0); AdamW(wd 1e-2).step().

* hunyuan_train/lora/: 20 steps on tests/fixtures/hunyuan/v11 (6 blocks: the long skips, size and style
  conditioning) with PEFT LoRA (get_peft_model; r 4, alpha 8, gaussian init) on to_q, to_k, to_v, to_out.0,
  ff.net.0.proj, ff.net.2 (both attentions), the scheduler's v_prediction, snr_gamma 5, noise_offset 0.1,
  AdamW lr 1e-3. initial/ and final/: PeftModel.save_pretrained (adapter_config.json +
  adapter_model.safetensors) before and after. diffusers 0.42.1 has no load_lora_weights for HunyuanDiTPipeline
  (HunyuanDiT2DModel is no PeftAdapterMixin), so PEFT's adapter on the transformer is the format.
* hunyuan_train/full/: 6 steps of full fine-tuning of tests/fixtures/hunyuan/v12 (no size / style
  conditioning) with prediction_type epsilon (register_to_config), no min-SNR, AdamW lr 1e-4; final.safetensors
  holds every parameter after the last step.
expected.safetensors per case: the text inputs, every step's x0, noise, timesteps, image_meta_size, loss and
clipped grad norm. scheduler/: the hunyuan pipe fixture's DDPMScheduler config.

Run: .venv-ref/bin/python tools/ref/gen_hunyuan_train.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file
from peft import LoraConfig, get_peft_model

import diffusers
from diffusers import DDPMScheduler, HunyuanDiT2DModel
from diffusers.models.embeddings import get_2d_rotary_pos_embed
from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

from ref_common import ddpm_loss

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
HY = os.path.join(ROOT, "tests", "fixtures", "hunyuan")
OUT = os.path.join(ROOT, "tests", "fixtures", "hunyuan_train")
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
shutil.copytree(os.path.join(HY, "pipe", "scheduler"), os.path.join(OUT, "scheduler"))
g = torch.Generator().manual_seed(41)
B, C, h, w = 2, 4, 8, 6


def run(tr, params, steps, lr, pred_type, snr_gamma, noise_offset, d):
    sched = DDPMScheduler.from_pretrained(OUT, subfolder="scheduler")
    if pred_type is not None:
        sched.register_to_config(prediction_type=pred_type)
    cfg = tr.config
    L, L5 = cfg.text_len, cfg.text_len_t5
    mask = torch.ones(B, L, dtype=torch.int32)
    mask[0, 3:] = 0
    mask5 = torch.ones(B, L5, dtype=torch.int32)
    mask5[1, 4:] = 0
    exp = {"encoder": torch.randn(B, L, cfg.cross_attention_dim, generator=g), "mask": mask,
           "encoder_t5": torch.randn(B, L5, cfg.cross_attention_dim_t5, generator=g), "mask_t5": mask5}
    p = cfg.patch_size
    crops = get_resize_crop_region_for_grid((h // p, w // p), 512 // 8 // p)
    rope = get_2d_rotary_pos_embed(cfg.attention_head_dim, crops, (h // p, w // p))
    style = torch.zeros(B, dtype=torch.int64)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    tr.train()
    for step in range(steps):
        x0 = torch.randn(B, C, h, w, generator=g)
        noise = torch.randn(B, C, h, w, generator=g)
        if noise_offset:
            noise += noise_offset * torch.randn((B, C, 1, 1), generator=g)
        timesteps = torch.randint(0, sched.config.num_train_timesteps, (B,), generator=g).long()
        noisy = sched.add_noise(x0, noise, timesteps)
        # (original size, target size, crop top-left) per image
        meta = torch.cat([torch.randint(32, 200, (B, 2), generator=g), torch.full((B, 2), 8 * h),
                          torch.randint(0, 20, (B, 2), generator=g)], dim=1).float()
        meta[:, 3] = 8 * w
        out = tr(noisy, timestep=timesteps.float(), encoder_hidden_states=exp["encoder"], text_embedding_mask=mask,
                 encoder_hidden_states_t5=exp["encoder_t5"], text_embedding_mask_t5=mask5,
                 image_meta_size=meta if cfg.use_style_cond_and_image_meta_size else None,
                 style=style if cfg.use_style_cond_and_image_meta_size else None, image_rotary_emb=rope,
                 return_dict=False)[0]
        pred = out.chunk(2, dim=1)[0] if cfg.learn_sigma else out
        loss = ddpm_loss(sched, pred, x0, noise, timesteps, snr_gamma)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"timesteps_{step}": timesteps.float(),
                    f"meta_{step}": meta, f"loss_{step}": loss.detach().reshape(1),
                    f"grad_norm_{step}": gn.detach().reshape(1)})
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))


# ---------------------------------------------------------------- LoRA (v1.1-shaped), v_prediction + min-SNR
d = os.path.join(OUT, "lora")
os.makedirs(d)
tr = HunyuanDiT2DModel.from_pretrained(os.path.join(HY, "v11"), torch_dtype=torch.float32)
tr.requires_grad_(False)
torch.manual_seed(13)
pm = get_peft_model(tr, LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                   target_modules=["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]))
pm.save_pretrained(os.path.join(d, "initial"))
run(pm, [p for p in pm.parameters() if p.requires_grad], 20, 1e-3, None, 5.0, 0.1, d)
pm.save_pretrained(os.path.join(d, "final"))

# ---------------------------------------------------------------- full fine-tune (v1.2-shaped), epsilon
d = os.path.join(OUT, "full")
os.makedirs(d)
tr = HunyuanDiT2DModel.from_pretrained(os.path.join(HY, "v12"), torch_dtype=torch.float32)
run(tr, [p for p in tr.parameters() if p.requires_grad], 6, 1e-4, "epsilon", None, 0.0, d)
save_file({k: v.contiguous() for k, v in tr.state_dict().items()}, os.path.join(d, "final.safetensors"))
print("hunyuan training fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
