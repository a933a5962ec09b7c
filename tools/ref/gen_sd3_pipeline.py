"""A whole StableDiffusion3Pipeline folder for `mmc generate-image` (tests/test_sd3_pipeline.c), written
by diffusers' save_pretrained untouched: two CLIPTextModelWithProjection (hidden 16 and 24, projections
8 and 12: pooled 20), a T5 encoder (d_model 48 = joint_attention_dim), their tokenizers, an
AutoencoderKL with 4 latent channels and a shift factor, the scheduler with shift 3.0, and a tiny
SD3Transformer2DModel (patch 2, 2 heads of 8, 2 blocks). expected.safetensors: encode_prompt's
prompt_embeds / pooled for a prompt and the empty negative prompt, the injected latents, and the
images (output_type="pt") of (a) CFG 4.5, 3 steps, batch 2 and (b) no CFG (guidance 1), 2 steps, and
(b) again with a LoRA that StableDiffusion3Pipeline.save_lora_weights wrote (lora/).

Run: .venv-ref/bin/python tools/ref/gen_sd3_pipeline.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # set order reaches the files: keep them byte-stable
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

from ref_common import rand_init, tiny_tokenizers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "sd3_pipe")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(1)

tmp = os.path.join(OUT, "_tok")
os.makedirs(tmp)
words = ["a", "red", "blue", "green", "circle", "square", "on", "the", "left", "right", "photo", "of"]
clip_tok, t5_tok, n_vocab, n_pieces = tiny_tokenizers(tmp, words, pad_token="<|endoftext|>")


def clip(hidden, proj, heads, seed):
    m = CLIPTextModelWithProjection(CLIPTextConfig(vocab_size=n_vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                                   num_hidden_layers=2, num_attention_heads=heads,
                                                   max_position_embeddings=77, projection_dim=proj, eos_token_id=1,
                                                   bos_token_id=0, pad_token_id=1))
    rand_init(m, seed)
    return m.eval()


t5 = T5EncoderModel(T5Config(vocab_size=n_pieces, d_model=48, d_kv=8, d_ff=64, num_layers=2, num_heads=3,
                             feed_forward_proj="gated-gelu"))
rand_init(t5, 5)
vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                    sample_size=32, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                    use_post_quant_conv=False)
rand_init(vae, 6)
tr = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, out_channels=4, num_layers=2,
                           attention_head_dim=8, num_attention_heads=2, joint_attention_dim=48,
                           caption_projection_dim=16, pooled_projection_dim=20, pos_embed_max_size=16)
rand_init(tr, 7)
pipe = StableDiffusion3Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae.eval(),
                                text_encoder=clip(16, 8, 2, 3), tokenizer=clip_tok, text_encoder_2=clip(24, 12, 3, 4),
                                tokenizer_2=clip_tok, text_encoder_3=t5.eval(), tokenizer_3=t5_tok,
                                transformer=tr.eval())
pipe.save_pretrained(OUT)
shutil.rmtree(tmp)
pipe = StableDiffusion3Pipeline.from_pretrained(OUT, torch_dtype=torch.float32)
exp = {}
prompts = ["a photo of a red circle", "a blue square on the left"]
H, W, MAXLEN = 32, 48, 12       # latents 16 x 24 (vae factor 2)
with torch.no_grad():
    pe, npe, pp, npp = pipe.encode_prompt(prompts, None, None, do_classifier_free_guidance=True,
                                          negative_prompt=["", ""], max_sequence_length=MAXLEN)
    exp.update(prompt_embeds=pe, negative_prompt_embeds=npe, pooled=pp, negative_pooled=npp)
    lat = torch.randn(2, 4, 16, 24, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = pipe(prompt=prompts, height=H, width=W, num_inference_steps=3, guidance_scale=4.5, latents=lat,
                          max_sequence_length=MAXLEN, output_type="pt").images
    lat = torch.randn(1, 4, 16, 24, generator=g)
    exp["latents_b"] = lat
    exp["image_b"] = pipe(prompt=prompts[0], height=H, width=W, num_inference_steps=2, guidance_scale=1.0,
                          latents=lat, max_sequence_length=MAXLEN, output_type="pt").images
    # a LoRA on the transformer as diffusers' SD3 scripts save it (metadata included), and run (b) with it
    from diffusers.training_utils import _collate_lora_metadata
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    torch.manual_seed(12)
    pipe.transformer.add_adapter(LoraConfig(r=4, lora_alpha=8, init_lora_weights=True,
                                            target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_q_proj"]))
    for n, prm in pipe.transformer.named_parameters():
        if "lora_B" in n:
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.3)
    ld = os.path.join(OUT, "lora")
    StableDiffusion3Pipeline.save_lora_weights(ld, transformer_lora_layers=get_peft_model_state_dict(pipe.transformer),
                                               **_collate_lora_metadata({"transformer": pipe.transformer}))
    exp["image_b_lora"] = pipe(prompt=prompts[0], height=H, width=W, num_inference_steps=2, guidance_scale=1.0,
                               latents=exp["latents_b"], max_sequence_length=MAXLEN, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("sd3 pipeline fixture (diffusers %s) in %s" % (diffusers.__version__, OUT))
