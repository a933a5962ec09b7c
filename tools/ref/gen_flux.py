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
* pipe/: a whole FluxPipeline directory (tiny CLIP, T5, AutoencoderKL with 4 latent channels,
  the scheduler with dynamic shifting, a guidance-distilled transformer); expected.safetensors holds
  prompt_embeds / pooled_prompt_embeds from encode_prompt (and the negative prompt's), the injected packed latents, and the images
  (output_type="pt", [B, 3, H, W] in [0, 1]) of two runs: (a) 3 steps, guidance 3.5, batch 2;
  (b) 2 steps, true CFG 1.5 with a negative prompt; plus the token ids of both tokenizers.

Run: .venv-ref/bin/python tools/ref/gen_flux.py
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer, T5Config, T5EncoderModel
from transformers import CLIPTextModel, T5TokenizerFast

from ref_common import rand_init

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

# ---------------------------------------------------------------- a whole pipeline
tmp = os.path.join(OUT, "_tok")
os.makedirs(tmp)
words = ["a", "red", "blue", "green", "circle", "square", "on", "the", "left", "right", "small", "big"]
vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
for wd in words:
    vocab[wd + "</w>"] = len(vocab)
for ch in "abcdefghijklmnopqrstuvwxyz":
    vocab.setdefault(ch, len(vocab))
    vocab.setdefault(ch + "</w>", len(vocab))
with open(os.path.join(tmp, "vocab.json"), "w") as f:
    json.dump(vocab, f)
with open(os.path.join(tmp, "merges.txt"), "w") as f:
    f.write("#version: 0.2\n")
clip_tok = CLIPTokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"), model_max_length=77)
pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
pieces += [("\u2581" + wd, -1.0 - 0.1 * i) for i, wd in enumerate(words)]
pieces += [(ch, -5.0) for ch in "abcdefghijklmnopqrstuvwxyz"]
uni = Tokenizer(models.Unigram(pieces, unk_id=2))
uni.pre_tokenizer = pre_tokenizers.Metaspace()
t5_tok = T5TokenizerFast(tokenizer_object=uni, extra_ids=0, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")

torch.manual_seed(3)
clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=24, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=3, max_position_embeddings=77, projection_dim=24,
                                    eos_token_id=1, bos_token_id=0, pad_token_id=1))
rand_init(clip, 4)
t5 = T5EncoderModel(T5Config(vocab_size=len(pieces), d_model=20, d_kv=8, d_ff=40, num_layers=2, num_heads=2,
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
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))
print("flux fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
