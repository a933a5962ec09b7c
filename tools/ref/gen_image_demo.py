"""The text side of the image-generation demo's pipeline (`make run-image`, scripts/demo_image.sh):
examples/image_demo/pipe/ — a FluxPipeline folder written by diffusers' save_pretrained: its CLIP
and T5 (and their tokenizers over the demo's words), the scheduler, the untrained DiT (diffusers'
init, bf16) and the VAE's config.json only. The demo trains both the VAE and the DiT from scratch
(`mmc train-vae`; `mmc train` with model.init = transformer/config.json) and writes a copy of this
folder with their weights in its run folder.

The text encoders are frozen random token embeddings in Flux's layout: a CLIPTextModel and a
T5EncoderModel whose blocks' output projections (attention out_proj / o, MLP fc2 / wo) are zero, so
each block is the identity and
  * T5's states are its final RMS norm of each token's own embedding (no mixing between tokens: the
    DiT's joint attention must find "blue" and "square" in the caption itself);
  * CLIP's pooled output is the final layer norm of the EOS token's embedding plus its position's,
    the same for captions of one length (no caption hash in the DiT's adaLN conditioning, which a
    tiny DiT would otherwise memorise caption by caption, failing on held-out captions).
With the fixture pipeline's fully random encoders the DiT reached 0.69 colour agreement on held-out
captions; see README "Two commands".

Run: .venv-ref/bin/python tools/ref/gen_image_demo.py
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch

from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from ref_common import rand_init, tiny_tokenizers

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EX = os.path.join(ROOT, "examples", "image_demo")
OUT = os.environ.get("IMAGE_DEMO_PIPE", os.path.join(EX, "pipe"))

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
tmp = OUT + "_tok"
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
words = ["a", "red", "green", "blue", "yellow", "circle", "square", "triangle", "on", "the", "left", "right"]
clip_tok, t5_tok, n_vocab, n_pieces = tiny_tokenizers(tmp, words)

torch.manual_seed(0)
clip = CLIPTextModel(CLIPTextConfig(vocab_size=n_vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, max_position_embeddings=77, projection_dim=32,
                                    eos_token_id=1, bos_token_id=0, pad_token_id=1))
rand_init(clip, 1)
t5 = T5EncoderModel(T5Config(vocab_size=n_pieces, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                             feed_forward_proj="gated-gelu"))
rand_init(t5, 2)
with torch.no_grad():
    for name, p in list(clip.named_parameters()) + list(t5.named_parameters()):
        if any(k in name for k in ("self_attn.out_proj", "mlp.fc2", "SelfAttention.o.", "DenseReluDense.wo")):
            p.zero_()
        if "final_layer_norm" in name or "layer_norm" in name:
            p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
        if "embed" in name or "shared" in name:
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))

with open(os.path.join(EX, "vae_config.json")) as f:
    vcfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
with open(os.path.join(EX, "transformer_config.json")) as f:
    tcfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
with open(os.path.join(EX, "scheduler_config.json")) as f:
    scfg = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
vae = AutoencoderKL(**vcfg)
tr = FluxTransformer2DModel(**tcfg)
assert tcfg["joint_attention_dim"] == t5.config.d_model and tcfg["pooled_projection_dim"] == clip.config.hidden_size
sched = FlowMatchEulerDiscreteScheduler(**scfg)
pipe = FluxPipeline(scheduler=sched, vae=vae, text_encoder=clip.eval(), tokenizer=clip_tok,
                    text_encoder_2=t5.eval(), tokenizer_2=t5_tok, transformer=tr)
tr.to(torch.bfloat16)   # the untrained DiT, in bf16 to keep the folder small (a placeholder: see below)
pipe.save_pretrained(OUT)
shutil.rmtree(tmp)
# the demo trains the VAE: keep its config, not diffusers' random init. The transformer's untrained
# weights stay: `mmc train` with model.init builds the DiT from the config and reads nothing of
# them, but the pipeline folder it encodes the captions with must be complete and consistent
os.remove(os.path.join(OUT, "vae", "diffusion_pytorch_model.safetensors"))

# a check: tokens stay apart (T5 states of one token do not depend on the others)
with torch.no_grad():
    a = t5(**t5_tok(["a blue square on the left"], return_tensors="pt")).last_hidden_state
    b = t5(**t5_tok(["a red square on the left"], return_tensors="pt")).last_hidden_state
    assert torch.allclose(a[0, 2:], b[0, 2:]) and not torch.allclose(a[0, 1], b[0, 1])
print("wrote", OUT)
