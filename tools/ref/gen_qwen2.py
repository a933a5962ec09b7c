"""Tiny random Qwen2 checkpoints and reference outputs from transformers.

Writes tests/fixtures/qwen2/:
  tiny/            save_pretrained() of a random Qwen2ForCausalLM (f32, untied head)
  tiny_bf16/       the same weights in bf16, tied embeddings variant is tiny_tied/
  ref.safetensors  input ids, logits, loss, selected gradients, greedy continuation
"""
import os
import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

torch.manual_seed(0)
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "qwen2")
os.makedirs(OUT, exist_ok=True)


def make(tied):
    cfg = Qwen2Config(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tied,
                      attn_implementation="eager")
    m = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # biases are zero-initialised by HF: make them non-trivial
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return m


m = make(False)
m.save_pretrained(os.path.join(OUT, "tiny"), safe_serialization=True)
import copy
copy.deepcopy(m).to(torch.bfloat16).save_pretrained(os.path.join(OUT, "tiny_bf16"), safe_serialization=True)
mt = make(True)
mt.save_pretrained(os.path.join(OUT, "tiny_tied"), safe_serialization=True)
# the Hub's (transformers 4.4x) config layout: flat rope_theta and torch_dtype
import json
cp = os.path.join(OUT, "tiny_tied", "config.json")
c = json.load(open(cp))
c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
c["torch_dtype"] = c.pop("dtype")
c.pop("layer_types", None)
json.dump(c, open(cp, "w"), indent=2)

ids = torch.randint(0, 320, (2, 12))
out = {}
out["ids"] = ids.to(torch.int64)
m.zero_grad()
r = m(input_ids=ids, labels=ids)
r.loss.backward()
out["logits"] = r.logits.detach().float()
out["loss"] = r.loss.detach().reshape(1)
for n in ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
          "model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.bias",
          "model.norm.weight", "lm_head.weight"]:
    out["grad." + n] = dict(m.named_parameters())[n].grad.detach().float()
with torch.no_grad():
    out["tied_logits"] = mt(input_ids=ids).logits.float()
    prompt = ids[:1, :7]
    g = m.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                   min_new_tokens=32)
    out["greedy_prompt"] = prompt.to(torch.int64)
    out["greedy_out"] = g[:, 7:].to(torch.int64)
save_file({k: v.contiguous().clone() for k, v in out.items()}, os.path.join(OUT, "ref.safetensors"))
for d in ("tiny", "tiny_bf16", "tiny_tied"):
    p = os.path.join(OUT, d, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)
print("wrote", OUT)
