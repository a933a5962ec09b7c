"""Fixtures for Wan2.1 text-to-video (tests/test_wan.c, tests/test_generate_video_cli.sh), written by
diffusers / transformers themselves (the versions pinned in requirements.txt), save_pretrained untouched:

* transformer/: a WanTransformer3DModel (patch (1, 2, 2), 2 heads of 12 so the rope axes are 4 / 4 / 4,
  2 blocks, cross_attn_norm, in = out = 4 channels, text_dim 16); expected.safetensors holds fixed inputs
  (latents [2, 4, 3, 4, 6], integer timesteps, text states [2, 7, 16]) and the output [2, 4, 3, 4, 6].
* transformer_b/: the same family with out_channels 8, no cross-attention norm, 1 block, weights stored
  bf16 (the expected output is diffusers on those weights upcast to f32).
  transformer/grad_expected.safetensors: the gradients of sum(out * W) (W fixed, saved) for a dozen
  parameters of every kind, from torch's autograd.
* lora/: a PEFT LoRA (r 4, alpha 8; attention, FFN and time_proj linears; lora_B randomised) on
  transformer/, as WanPipeline.save_lora_weights writes it, and the output with it.
* transformer_i2v/: an image-to-video WanTransformer3DModel (image_dim 12, added_kv_proj_dim 24,
  in_channels 8) with CLIP-like image states [2, 5, 12] and 512 text tokens, and its output.
* scheduler_expected.safetensors: UniPCMultistepScheduler sigmas / timesteps of set_timesteps(n) for
  the Wan configuration (flow_prediction, use_flow_sigmas, flow_shift 3 and 5, bh2, order 2) and a
  VP one (epsilon, bh1), and a run of step() on fixed model outputs (5 steps each).
* pipe/: a whole WanPipeline folder (tiny UMT5EncoderModel with a per-layer relative attention bias,
  a tiny SentencePiece-Unigram T5TokenizerFast, a tiny AutoencoderKLWan, the UniPC scheduler as the
  Hub's Wan2.1 folders ship it, the transformer); expected.safetensors holds the token ids, UMT5's
  last_hidden_state on them (with the attention mask), encode_prompt's zero-padded prompt_embeds,
  and two runs from injected latents with output_type="latent": (a) 3 steps, CFG 5 with a negative
  prompt, batch 2; (b) 2 steps, guidance 1 (no negative pass); plus (a)'s decoded frames
  (output_type="pt", [B, F, 3, H, W] in [0, 1]). For `mmc generate-video`: (b)'s latents as
  cli_latents.safetensors and its frames as export_to_video gets them (output_type="np", uint8
  truncation) in cli_expected/ (PNGs written by PIL).

Run: .venv-ref/bin/python tools/ref/gen_wan.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

import wan_tiny
from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "wan")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(0)

TEXT_DIM = wan_tiny.TEXT_DIM


# ---------------------------------------------------------------- the transformer alone
def transformer_case(name, cfg, seed, dtype):
    tr = WanTransformer3DModel(**cfg)
    rand_init(tr, seed)
    d = os.path.join(OUT, name)
    tr.to(dtype).save_pretrained(d)
    tr = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    B, F, H, W, T = 2, 3, 4, 6, 7
    inp = {
        "hidden": torch.randn(B, cfg["in_channels"], F, H, W, generator=g),
        "timestep": torch.tensor([999, 250], dtype=torch.int64),
        "encoder": torch.randn(B, T, cfg["text_dim"], generator=g),
    }
    with torch.no_grad():
        out = tr(hidden_states=inp["hidden"], timestep=inp["timestep"], encoder_hidden_states=inp["encoder"],
                 return_dict=False)[0]
    inp["out"] = out
    inp["timestep"] = inp["timestep"].float()
    save_file({k: v.contiguous() for k, v in inp.items()}, os.path.join(d, "expected.safetensors"))


TR_CFG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
              text_dim=TEXT_DIM, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
              qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)
transformer_case("transformer", TR_CFG, 1, torch.float32)
transformer_case("transformer_b", dict(TR_CFG, out_channels=8, cross_attn_norm=False, num_layers=1), 2,
                 torch.bfloat16)

# ---------------------------------------------------------------- gradients and a LoRA on the transformer
# (their own generator, so the draws above and below stay as they were)
g2 = torch.Generator().manual_seed(123)
d = os.path.join(OUT, "transformer")
ref = __import__("safetensors.torch", fromlist=["load_file"]).load_file(os.path.join(d, "expected.safetensors"))
tr = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.float32).train()
wgt = torch.randn(ref["out"].shape, generator=g2)
out = tr(hidden_states=ref["hidden"], timestep=ref["timestep"].long(), encoder_hidden_states=ref["encoder"],
         return_dict=False)[0]
(out * wgt).sum().backward()
GRAD_PARAMS = ["patch_embedding.weight", "condition_embedder.time_embedder.linear_1.weight",
               "condition_embedder.time_proj.bias", "condition_embedder.text_embedder.linear_2.weight",
               "blocks.0.attn1.to_q.weight", "blocks.0.attn1.norm_k.weight", "blocks.0.attn2.to_v.bias",
               "blocks.0.norm2.weight", "blocks.1.ffn.net.0.proj.weight", "blocks.1.scale_shift_table",
               "scale_shift_table", "proj_out.weight"]
grads = {"loss_weight": wgt}
grads.update({"grad." + n: p.grad for n, p in tr.named_parameters() if n in GRAD_PARAMS})
save_file({k: v.contiguous() for k, v in grads.items()}, os.path.join(d, "grad_expected.safetensors"))

from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from diffusers.training_utils import _collate_lora_metadata
tr = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
torch.manual_seed(10)                     # PEFT draws lora_A from the global generator
tr.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights=True,
                          target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2", "time_proj"]))
with torch.no_grad():
    for n, p in tr.named_parameters():
        if "lora_B" in n:
            p.copy_(torch.randn(p.shape, generator=g2) * 0.2)
ld = os.path.join(OUT, "lora")
WanPipeline.save_lora_weights(ld, transformer_lora_layers=get_peft_model_state_dict(tr),
                              **_collate_lora_metadata({"transformer": tr}))
with torch.no_grad():
    out = tr(hidden_states=ref["hidden"], timestep=ref["timestep"].long(), encoder_hidden_states=ref["encoder"],
             return_dict=False)[0]
save_file({"out": out.contiguous()}, os.path.join(ld, "expected.safetensors"))

# ---------------------------------------------------------------- UniPC
sx = {}
WAN_SCHED = wan_tiny.SCHED
cases = {"flow3": WAN_SCHED, "flow5": dict(WAN_SCHED, flow_shift=5.0),
         "vp": dict(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                    prediction_type="epsilon", solver_order=2, solver_type="bh1",
                    final_sigmas_type="sigma_min")}   # bh1 with a zero final sigma is NaN in diffusers too
for cname, cfg in cases.items():
    s = UniPCMultistepScheduler(**cfg)
    s.save_config(os.path.join(OUT, "sched_" + cname))
    for n in (1, 2, 3, 7, 10, 50):
        s.set_timesteps(n)
        sx[f"{cname}_sigmas_{n}"] = s.sigmas.clone()
        sx[f"{cname}_timesteps_{n}"] = s.timesteps.to(torch.float64)
    n = 5
    s.set_timesteps(n)
    x = torch.randn(2, 3, 4, generator=g)
    sx[f"{cname}_x0"] = x.clone()
    for i, t in enumerate(s.timesteps):
        mo = torch.randn(2, 3, 4, generator=g)
        sx[f"{cname}_mo_{i}"] = mo
        x = s.step(mo, t, x, return_dict=False)[0]
        sx[f"{cname}_x_{i}"] = x.clone()
save_file({k: v.contiguous() for k, v in sx.items()}, os.path.join(OUT, "scheduler_expected.safetensors"))

# ---------------------------------------------------------------- a whole pipeline
tok, te = wan_tiny.text_parts(OUT)
vae = wan_tiny.vae()
tr = WanTransformer3DModel(**TR_CFG)
rand_init(tr, 5)
sched = UniPCMultistepScheduler(**WAN_SCHED)
pipe = WanPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=tr.eval(), scheduler=sched)
d = os.path.join(OUT, "pipe")
pipe.save_pretrained(d)
pipe = WanPipeline.from_pretrained(d, torch_dtype=torch.float32)

exp = {}
prompts = ["a red cat walks on the beach", "a  blue dog\truns slowly "]
neg = "green grass"
MAXLEN = 12
H, W, FR = 32, 48, 9          # latents [4, 3, 4, 6]
with torch.no_grad():
    for i, p in enumerate(prompts + [neg, ""]):
        ti = pipe.tokenizer(prompt_clean(p), padding="max_length",
                            max_length=MAXLEN, truncation=True, add_special_tokens=True, return_attention_mask=True,
                            return_tensors="pt")
        exp[f"ids{i}"] = ti.input_ids.to(torch.int32)[0]
        exp[f"mask{i}"] = ti.attention_mask.to(torch.int32)[0]
        exp[f"umt5_hidden{i}"] = pipe.text_encoder(ti.input_ids, ti.attention_mask).last_hidden_state[0]
    pe, ne = pipe.encode_prompt(prompts, negative_prompt=[neg, neg], do_classifier_free_guidance=True,
                                max_sequence_length=MAXLEN)
    exp["prompt_embeds"], exp["negative_prompt_embeds"] = pe, ne
    lat = torch.randn(2, 4, 3, 4, 6, generator=g)
    exp["latents_a"] = lat
    exp["out_a"] = pipe(prompt=prompts, negative_prompt=neg, height=H, width=W, num_frames=FR, num_inference_steps=3,
                        guidance_scale=5.0, latents=lat, max_sequence_length=MAXLEN, output_type="latent").frames
    exp["video_a"] = pipe(prompt=prompts, negative_prompt=neg, height=H, width=W, num_frames=FR, num_inference_steps=3,
                          guidance_scale=5.0, latents=lat, max_sequence_length=MAXLEN, output_type="pt").frames
    lat = torch.randn(1, 4, 3, 4, 6, generator=g)
    exp["latents_b"] = lat
    exp["out_b"] = pipe(prompt=prompts[0], height=H, width=W, num_frames=FR, num_inference_steps=2,
                        guidance_scale=1.0, latents=lat, max_sequence_length=MAXLEN, output_type="latent").frames
    # the CLI case (`mmc generate-video` from these latents into a PNG folder): run b's frames as
    # diffusers' documented path hands them to export_to_video (output_type="np", then
    # (frame * 255).astype(np.uint8): truncated), saved by PIL
    import numpy as np
    from PIL import Image
    save_file({"latents": lat.contiguous()}, os.path.join(d, "cli_latents.safetensors"))
    frames = pipe(prompt=prompts[0], height=H, width=W, num_frames=FR, num_inference_steps=2, guidance_scale=1.0,
                  latents=lat, max_sequence_length=MAXLEN, output_type="np").frames[0]
    os.makedirs(os.path.join(d, "cli_expected"))
    for i, fr in enumerate(frames):
        Image.fromarray((fr * 255).astype(np.uint8)).save(os.path.join(d, "cli_expected", f"frame_{i:05d}.png"))
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
# ---------------------------------------------------------------- image-to-video transformer (Wan2.1 I2V's
# CLIP image branch: image_embedder, add_k_proj / add_v_proj); diffusers splits [image; text] assuming 512
# text tokens, so the text here has 512. Its own generator keeps the draws above unchanged.
g3 = torch.Generator().manual_seed(321)
cfg = dict(TR_CFG, in_channels=8, image_dim=12, added_kv_proj_dim=24)
tr = WanTransformer3DModel(**cfg)
rand_init(tr, 6)
d = os.path.join(OUT, "transformer_i2v")
tr.save_pretrained(d)
tr = WanTransformer3DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
inp = {"hidden": torch.randn(2, 8, 2, 4, 4, generator=g3), "timestep": torch.tensor([700, 30], dtype=torch.int64),
       "encoder": torch.randn(2, 512, TEXT_DIM, generator=g3), "image": torch.randn(2, 5, 12, generator=g3)}
with torch.no_grad():
    inp["out"] = tr(hidden_states=inp["hidden"], timestep=inp["timestep"], encoder_hidden_states=inp["encoder"],
                    encoder_hidden_states_image=inp["image"], return_dict=False)[0]
inp["timestep"] = inp["timestep"].float()
save_file({k: v.contiguous() for k, v in inp.items()}, os.path.join(d, "expected.safetensors"))
print("wrote", OUT)
