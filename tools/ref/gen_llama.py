"""Tiny random LlamaForCausalLM checkpoints for tests/test_llama.c (the Llama decoder alone; the
LLaVA fixtures of gen_llava.py cover llama3 and linear rope scaling inside LLaVA).

Writes tests/fixtures/llama/:
  dynamic/      save_pretrained, untouched: dynamic NTK rope scaling (factor 8) with
                max_position_embeddings 8, so a 14-token forward and a generation past position 8
                take the grown base; attention_bias (q/k/v/o biases), tied embeddings, GQA 6/2 heads.
  dynamic_hub/  the same in 4.4x form: flat rope_theta, rope_scaling {"type": "dynamic", "factor": 8.0},
                torch_dtype, bf16 matrices (weights bf16-exact, so lossless).
  default/      default rope, mlp_bias, untied head.
  ref.safetensors  ids [2, 14], logits per directory, greedy continuation of ids[0, :6] (10 tokens).
Run: .venv-ref/bin/python tools/ref/gen_llama.py
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "llama")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(23)


def make(dynamic):
    cfg = LlamaConfig(vocab_size=300, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=8,
                      rms_norm_eps=1e-5, attention_bias=dynamic, mlp_bias=not dynamic,
                      tie_word_embeddings=dynamic,
                      rope_parameters=({"rope_type": "dynamic", "factor": 8.0, "rope_theta": 10000.0} if dynamic
                                       else {"rope_type": "default", "rope_theta": 10000.0}))
    m = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "embed" in n or "lm_head" in n:
                p.mul_(10.0)
            p.copy_(p.to(torch.bfloat16).float())
    return m


ids = torch.randint(0, 300, (2, 14))
ref = {"ids": ids}
for name, dyn in (("dynamic", True), ("default", False)):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    make(dyn).save_pretrained(d)
    m = LlamaForCausalLM.from_pretrained(d).float().eval()
    with torch.no_grad():
        ref[name + ".logits"] = m(input_ids=ids).logits.float()
        g = m.generate(ids[:1, :6], max_new_tokens=10, min_new_tokens=10, do_sample=False, eos_token_id=None,
                       pad_token_id=0)
    ref[name + ".greedy"] = g[:, 6:].to(torch.int64)
# the 4.4x form of dynamic/
src, dst = os.path.join(OUT, "dynamic"), os.path.join(OUT, "dynamic_hub")
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
save_file({k: (v.to(torch.bfloat16) if v.dim() >= 2 else v) for k, v in load_file(os.path.join(src, "model.safetensors")).items()},
          os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
c = json.load(open(os.path.join(src, "config.json")))
rp = c.pop("rope_parameters")
c["rope_theta"] = rp["rope_theta"]
c["rope_scaling"] = {"type": "dynamic", "factor": rp["factor"]}
c.pop("dtype", None)
c["torch_dtype"] = "bfloat16"
json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)
shutil.copy(os.path.join(src, "generation_config.json"), dst)
m = LlamaForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
with torch.no_grad():
    d = (m(input_ids=ids).logits - ref["dynamic.logits"]).abs().max().item()
print("dynamic_hub vs dynamic:", d)
assert d == 0.0
# the grown base matters: the dynamic model's logits differ from its default-rope twin's
cfg = LlamaConfig.from_pretrained(src)
cfg.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
twin = LlamaForCausalLM.from_pretrained(src, config=cfg).float().eval()
with torch.no_grad():
    print("dynamic vs default rope on the same weights:", (twin(input_ids=ids).logits - ref["dynamic.logits"]).abs().max().item())
save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
print({k: list(v.shape) for k, v in ref.items()})
