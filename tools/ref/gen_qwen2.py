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
# a chat-capable tiny model: the fixture tokenizer (tools/ref/gen_tokenizer.py) + its
# vocabulary size, and transformers' greedy completion of a chat prompt for the CLI test
import shutil
from transformers import AutoTokenizer
TOKDIR = os.path.join(OUT, "..", "tokenizer")
tok = AutoTokenizer.from_pretrained(TOKDIR)
torch.manual_seed(1)
cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True, initializer_range=0.3,
                  eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
chat = Qwen2ForCausalLM(cfg).float().eval()
cdir = os.path.join(OUT, "chat")
chat.save_pretrained(cdir, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(TOKDIR, f), os.path.join(cdir, f))
msgs = [{"role": "user", "content": "What colour is the circle?"}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    g = chat.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                      min_new_tokens=16)
json.dump({"prompt": msgs[0]["content"], "prompt_ids": ids[0].tolist(), "new_ids": g[0, ids.shape[1]:].tolist(),
           "text": tok.decode(g[0, ids.shape[1]:], skip_special_tokens=True)},
          open(os.path.join(OUT, "chat_expected.json"), "w"))

for d in ("tiny", "tiny_bf16", "tiny_tied", "chat"):
    p = os.path.join(OUT, d, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)
print("wrote", OUT)
