"""Fixtures for the Flux transformer and pipeline (tests/test_flux.c), written by diffusers itself
(the version pinned in requirements.txt), save_pretrained untouched:

* transformer_g/: a FluxTransformer2DModel with a guidance embedder (FLUX.1-dev-shaped), odd shapes:
  3 heads of 12 (rope axes 2 / 4 / 6), 2 double- and 2 single-stream blocks, in_channels 16 but
  out_channels 8, joint_attention_dim 20, pooled_projection_dim 12; f32, random weights of a usable
  scale. expected.safetensors: inputs (packed latents [2, 6, 16], T5-like states [2, 5, 20], pooled
  [2, 12], timestep, guidance, img_ids [6, 3], txt_ids [5, 3]) and the output [2, 6, 8].
* transformer_s/: FLUX.1-schnell-shaped (no guidance embedder), 1 + 1 blocks, weights stored bf16;
  the expected output is diffusers running those weights upcast to f32.
* lora_s/: a LoRA on transformer_s as FluxPipeline.save_lora_weights writes it (with the adapter metadata
  the training scripts attach), and the transformer's output with it at weight 1 and 0.5.
* train_lora/: 20 steps of flow-matching LoRA training on transformer_s as diffusers' Flux LoRA script
  runs them (fixed latents, noise and timestep draws; cosmap weighting; gradient clipping 1.0; AdamW):
  initial.safetensors / final.safetensors adapters, every step's inputs, loss and grad norm.
* pipe/: a whole FluxPipeline directory (tiny CLIP, T5, AutoencoderKL with 4 latent channels,
  the scheduler with dynamic shifting, a guidance-distilled transformer); expected.safetensors holds
  prompt_embeds / pooled_prompt_embeds from encode_prompt (and the negative prompt's), the injected packed latents, and the images
  (output_type="pt", [B, 3, H, W] in [0, 1]) of two runs: (a) 3 steps, guidance 3.5, batch 2;
  (b) 2 steps, true CFG 1.5 with a negative prompt; plus the token ids of both tokenizers. Run (b) also as
  the PNG diffusers saves (cli_expected.png) from cli_latents.safetensors, for `mmc generate-image`.

Run: .venv-ref/bin/python tools/ref/gen_flux.py
"""
import json
import os
import shutil
import sys

# set iteration order reaches the files (PEFT's target_modules, diffusers' _use_default_values):
# fix the hash seed so a regeneration is byte-identical
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from ref_common import rand_init, tiny_tokenizers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "flux")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(0)


def img_ids(h, w):
    return FluxPipeline._prepare_latent_image_ids(1, h, w, "cpu", torch.float32)


# ---------------------------------------------------------------- the transformer alone
def transformer_case(name, cfg, seed, dtype, guidance):
    tr = FluxTransformer2DModel(**cfg)
    rand_init(tr, seed)
    d = os.path.join(OUT, name)
    tr.to(dtype).save_pretrained(d)
    tr = FluxTransformer2DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    B, h, w, T = 2, 3, 2, 5
    inp = {
        "hidden": torch.randn(B, h * w, cfg["in_channels"], generator=g),
        "encoder": torch.randn(B, T, cfg["joint_attention_dim"], generator=g),
        "pooled": torch.randn(B, cfg["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([0.9, 0.25]),
        "img_ids": img_ids(h, w),
        "txt_ids": torch.stack([torch.zeros(T), torch.arange(T) % 2, torch.arange(T) * 0.5], 1).float(),
    }
    if guidance:
        inp["guidance"] = torch.tensor([3.5, 1.0])
    with torch.no_grad():
        out = tr(hidden_states=inp["hidden"], encoder_hidden_states=inp["encoder"],
                 pooled_projections=inp["pooled"], timestep=inp["timestep"], img_ids=inp["img_ids"],
                 txt_ids=inp["txt_ids"], guidance=inp.get("guidance"), return_dict=False)[0]
    inp["out"] = out
    save_file({k: v.contiguous() for k, v in inp.items()}, os.path.join(d, "expected.safetensors"))


transformer_case("transformer_g", dict(patch_size=1, in_channels=16, out_channels=8, num_layers=2,
                                       num_single_layers=2, attention_head_dim=12, num_attention_heads=3,
                                       joint_attention_dim=20, pooled_projection_dim=12, guidance_embeds=True,
                                       axes_dims_rope=(2, 4, 6)), 1, torch.float32, True)
transformer_case("transformer_s", dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                       attention_head_dim=8, num_attention_heads=2, joint_attention_dim=20,
                                       pooled_projection_dim=12, guidance_embeds=False, axes_dims_rope=(2, 2, 4)),
                 2, torch.bfloat16, False)

# ---------------------------------------------------------------- a LoRA as diffusers saves it
# transformer_s with a PEFT adapter (r 4, alpha 8, on attention and MLP projections of both block
# kinds), lora_B randomised so it acts; written by FluxPipeline.save_lora_weights with its metadata.
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict

tr = FluxTransformer2DModel.from_pretrained(os.path.join(OUT, "transformer_s"), torch_dtype=torch.float32).eval()
targets = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "proj_mlp", "proj_out", "ff.net.2"]
torch.manual_seed(10)                     # PEFT draws lora_A from the global generator
tr.add_adapter(LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=True))
with torch.no_grad():
    for n, p in tr.named_parameters():
        if "lora_B" in n:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
d = os.path.join(OUT, "lora_s")
from diffusers.training_utils import _collate_lora_metadata  # noqa: E402 (the metadata the training scripts write)
FluxPipeline.save_lora_weights(d, transformer_lora_layers=get_peft_model_state_dict(tr),
                               **_collate_lora_metadata({"transformer": tr}))
ref = {k: v for k, v in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
    os.path.join(OUT, "transformer_s", "expected.safetensors")).items()}
with torch.no_grad():
    out = tr(hidden_states=ref["hidden"], encoder_hidden_states=ref["encoder"], pooled_projections=ref["pooled"],
             timestep=ref["timestep"], img_ids=ref["img_ids"], txt_ids=ref["txt_ids"], return_dict=False)[0]
    tr.set_adapters(["default_0"] if "default_0" in tr.peft_config else list(tr.peft_config), weights=[0.5])
    half = tr(hidden_states=ref["hidden"], encoder_hidden_states=ref["encoder"], pooled_projections=ref["pooled"],
              timestep=ref["timestep"], img_ids=ref["img_ids"], txt_ids=ref["txt_ids"], return_dict=False)[0]
save_file({"out": out.contiguous(), "out_half": half.contiguous()}, os.path.join(d, "expected.safetensors"))

# ---------------------------------------------------------------- flow-matching training parity
# 20 steps of LoRA training on transformer_s (bf16 base weights, upcast) exactly as train_dreambooth_lora_flux.py's loop runs
# them (pack, transformer(t / 1000), cosmap weighting, mean of squares, clip_grad_norm_
# 1.0, AdamW lr 1e-3 / wd 1e-4), with the timestep draws u, the noise and the latents fixed here;
# sigmas from the scheduler's __init__ schedule through get_sigmas' lookup. Saved: the initial
# adapter (save_lora_weights), every step's inputs, its loss and grad norm, and the final adapter.
import math
from diffusers.training_utils import compute_loss_weighting_for_sd3

tr = FluxTransformer2DModel.from_pretrained(os.path.join(OUT, "transformer_s"), torch_dtype=torch.float32)
tr.requires_grad_(False)
torch.manual_seed(11)
tr.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                          target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "to_add_out", "proj_mlp"]))
d = os.path.join(OUT, "train_lora")
FluxPipeline.save_lora_weights(d, transformer_lora_layers=get_peft_model_state_dict(tr),
                               **_collate_lora_metadata({"transformer": tr}))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "initial.safetensors"))
sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)   # SD3-style: shifted sigmas
params = [p for p in tr.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
B, C, h, w, T, STEPS = 2, 4, 4, 6, 5, 20
cond = {"prompt_embeds": torch.randn(B, T, 20, generator=g), "pooled": torch.randn(B, 12, generator=g)}
tr_exp = dict(cond)
text_ids = torch.zeros(T, 3)
img = FluxPipeline._prepare_latent_image_ids(B, h // 2, w // 2, "cpu", torch.float32)
tr.train()
for step in range(STEPS):
    x0 = torch.randn(B, C, h, w, generator=g)
    noise = torch.randn(B, C, h, w, generator=g)
    u = torch.rand(B, generator=g)
    indices = (u * sched.config.num_train_timesteps).long()
    timesteps = sched.timesteps[indices]
    sigmas = torch.stack([sched.sigmas[(sched.timesteps == t).nonzero().item()] for t in timesteps])
    sig = sigmas.reshape(B, 1, 1, 1)
    noisy = (1.0 - sig) * x0 + sig * noise
    packed = FluxPipeline._pack_latents(noisy, B, C, h, w)
    pred = tr(hidden_states=packed, timestep=timesteps / 1000, guidance=None,
              pooled_projections=cond["pooled"], encoder_hidden_states=cond["prompt_embeds"], txt_ids=text_ids,
              img_ids=img, return_dict=False)[0]
    pred = FluxPipeline._unpack_latents(pred, height=h * 8, width=w * 8, vae_scale_factor=8)
    weighting = compute_loss_weighting_for_sd3(weighting_scheme="cosmap", sigmas=sig)
    target = noise - x0
    loss = torch.mean((weighting.float() * (pred.float() - target.float()) ** 2).reshape(B, -1), 1).mean()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad()
    tr_exp.update({f"x0_{step}": x0, f"noise_{step}": noise, f"u_{step}": u, f"sigmas_{step}": sigmas,
                   f"timesteps_{step}": timesteps, f"loss_{step}": loss.detach().reshape(1),
                   f"grad_norm_{step}": gn.detach().reshape(1)})
save_file({k: v.contiguous() for k, v in tr_exp.items()}, os.path.join(d, "expected.safetensors"))
FluxPipeline.save_lora_weights(d, transformer_lora_layers=get_peft_model_state_dict(tr))
os.rename(os.path.join(d, "pytorch_lora_weights.safetensors"), os.path.join(d, "final.safetensors"))
sched.save_config(d)

# ---------------------------------------------------------------- a whole pipeline
tmp = os.path.join(OUT, "_tok")
os.makedirs(tmp)
words = ["a", "red", "blue", "green", "circle", "square", "on", "the", "left", "right", "small", "big"]
clip_tok, t5_tok, n_vocab, n_pieces = tiny_tokenizers(tmp, words)

torch.manual_seed(3)
clip = CLIPTextModel(CLIPTextConfig(vocab_size=n_vocab, hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, max_position_embeddings=77, projection_dim=24,
                                    eos_token_id=1, bos_token_id=0, pad_token_id=1))
rand_init(clip, 4)
t5 = T5EncoderModel(T5Config(vocab_size=n_pieces, d_model=20, d_kv=8, d_ff=40, num_layers=2, num_heads=2,
                             feed_forward_proj="gated-gelu"))
rand_init(t5, 5)
vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                    sample_size=32, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                    use_post_quant_conv=False)
rand_init(vae, 6)
tr = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=8,
                            num_attention_heads=2, joint_attention_dim=20, pooled_projection_dim=24,
                            guidance_embeds=True, axes_dims_rope=(2, 2, 4))
rand_init(tr, 7)
sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                        base_image_seq_len=256, max_image_seq_len=4096)
pipe = FluxPipeline(scheduler=sched, vae=vae.eval(), text_encoder=clip.eval(), tokenizer=clip_tok,
                    text_encoder_2=t5.eval(), tokenizer_2=t5_tok, transformer=tr.eval())
d = os.path.join(OUT, "pipe")
pipe.save_pretrained(d)
shutil.rmtree(tmp)
pipe = FluxPipeline.from_pretrained(d, torch_dtype=torch.float32)

exp = {}
prompts = ["a red circle on the left", "a big blue square"]
neg = "green"
H, W = 32, 48               # pixels: latents 16 x 24 (vae factor 2), packed 8 x 12 = 96 tokens
MAXLEN = 16                 # max_sequence_length (T5)
with torch.no_grad():
    for i, p in enumerate(prompts + [neg]):
        exp[f"clip_ids{i}"] = torch.tensor(clip_tok(p, padding="max_length", max_length=77, truncation=True)
                                           .input_ids, dtype=torch.int32)
        exp[f"t5_ids{i}"] = torch.tensor(t5_tok(p, padding="max_length", max_length=MAXLEN, truncation=True)
                                         .input_ids, dtype=torch.int32)
    pe, ppe, _ = pipe.encode_prompt(prompts, prompt_2=None, max_sequence_length=MAXLEN)
    exp["prompt_embeds"], exp["pooled_prompt_embeds"] = pe, ppe
    pe, ppe, _ = pipe.encode_prompt([neg], prompt_2=None, max_sequence_length=MAXLEN)
    exp["neg_prompt_embeds"], exp["neg_pooled_prompt_embeds"] = pe, ppe
    lat = torch.randn(2, 16 * 24 // 4, 16, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = pipe(prompt=prompts, height=H, width=W, num_inference_steps=3, guidance_scale=3.5,
                          latents=lat, max_sequence_length=MAXLEN, output_type="pt").images
    lat = torch.randn(1, 16 * 24 // 4, 16, generator=g)
    exp["latents_b"] = lat
    exp["image_b"] = pipe(prompt=prompts[0], negative_prompt=neg, true_cfg_scale=1.5, height=H, width=W,
                          num_inference_steps=2, guidance_scale=2.0, latents=lat, max_sequence_length=MAXLEN,
                          output_type="pt").images
    # img2img (FluxImg2ImgPipeline) from given image latents (a latent-channel tensor skips the VAE, so
    # the generator draws only the noise, which is saved too): strength 0.6 of 4 steps starts at step 1
    from diffusers import FluxImg2ImgPipeline
    from diffusers.utils.torch_utils import randn_tensor
    i2i = FluxImg2ImgPipeline.from_pipe(pipe)
    img_lat = torch.randn(1, 4, 16, 24, generator=g)
    exp["i2i_image_latents"] = img_lat
    exp["i2i_noise"] = randn_tensor((1, 4, 16, 24), generator=torch.Generator().manual_seed(7))
    exp["i2i_image"] = i2i(prompt=prompts[0], image=img_lat, strength=0.6, height=H, width=W, num_inference_steps=4,
                           guidance_scale=3.5, max_sequence_length=MAXLEN, output_type="pt",
                           generator=torch.Generator().manual_seed(7)).images
    # VaeImageProcessor.preprocess of a non-square PNG to 48 x 32 (Pillow's lanczos, then [-1, 1])
    from PIL import Image
    src = Image.fromarray((torch.rand(40, 56, 3, generator=g) * 255).to(torch.uint8).numpy())
    src.save(os.path.join(d, "init.png"))
    exp["init_preprocessed"] = i2i.image_processor.preprocess(src, height=H, width=W)
    # the CLI case: run b as a PNG (output_type="pil", saved by PIL), its latents in their own file
    save_file({"latents": lat.contiguous()}, os.path.join(d, "cli_latents.safetensors"))
    pipe(prompt=prompts[0], negative_prompt=neg, true_cfg_scale=1.5, height=H, width=W, num_inference_steps=2,
         guidance_scale=2.0, latents=lat, max_sequence_length=MAXLEN).images[0].save(os.path.join(d, "cli_expected.png"))
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
# ---------------------------------------------------------------- a tiny training set
# an HF imagefolder (PNG files + metadata.jsonl with file_name / text), non-square images so the
# resize + centre crop runs, for `mmc train` on pipe/ (tests/test_flux_cli.sh)
from PIL import Image, ImageDraw

d = os.path.join(OUT, "imagefolder")
os.makedirs(d)
rows = []
for i, (colour, shape, side) in enumerate([("red", "circle", "left"), ("blue", "square", "right"),
                                           ("green", "circle", "right"), ("red", "square", "left"),
                                           ("blue", "circle", "left"), ("green", "square", "right")]):
    im = Image.new("RGB", (48, 40), "white")
    dr = ImageDraw.Draw(im)
    x0 = 6 if side == "left" else 26
    box = (x0, 12, x0 + 16, 28)
    (dr.ellipse if shape == "circle" else dr.rectangle)(box, fill=colour)
    name = f"{i:02d}.png"
    im.save(os.path.join(d, name))
    rows.append({"file_name": name, "text": f"a {colour} {shape} on the {side}"})
with open(os.path.join(d, "metadata.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print("flux fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
