"""gen_serve_lora.py — two PEFT LoRA adapters on the tiny chat Qwen2 for tests/test_serve_lora.sh
(per-request adapters of `mmc serve --lora NAME=DIR`), and transformers + PEFT's greedy tokens for
one chat prompt with each adapter and with the base model.

  /work/main/.venv-ref/bin/python tools/ref/gen_serve_lora.py   # writes tests/fixtures/serve_lora/

Base: tests/fixtures/qwen2/chat (tools/ref/gen_qwen2.py). Adapters, written by PEFT's
save_pretrained untouched, init_lora_weights=False (random non-zero B, so each adapter changes
the greedy answer), dropout 0:
  a/  r 4, lora_alpha 8,  q_proj v_proj gate_proj
  b/  r 8, lora_alpha 4,  k_proj o_proj up_proj down_proj   (other modules, another rank and scale)
expected.json: the prompt (a user message, rendered with the model's chat template) and the greedy
new token ids of PeftModel.generate (do_sample False, max_new_tokens 12, stopping at the config's
EOS like `mmc generate`) for "base", "a" and "b".
"""
import json
import os
import subprocess
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # deterministic, as every generator here
    os.environ["PYTHONHASHSEED"] = "0"
    sys.exit(subprocess.call([sys.executable] + sys.argv))

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BASE = "tests/fixtures/qwen2/chat"   # relative: the adapters' base_model_name_or_path, from the repository root
OUT = "tests/fixtures/serve_lora"
PROMPT = "Tell me about the circle."
MAX_NEW = 12
ADAPTERS = {
    "a": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], seed=11),
    "b": dict(r=8, lora_alpha=4, target_modules=["k_proj", "o_proj", "up_proj", "down_proj"], seed=12),
}


def base():
    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()


def greedy(model, ids):
    with torch.no_grad():
        g = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
    return g[0, ids.shape[1]:].tolist()


def main():
    tok = AutoTokenizer.from_pretrained(BASE)
    msgs = [{"role": "user", "content": PROMPT}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out = {"prompt": PROMPT, "prompt_ids": ids[0].tolist(), "max_new_tokens": MAX_NEW, "new_ids": {}}
    out["new_ids"]["base"] = greedy(base(), ids)
    for name, a in ADAPTERS.items():
        torch.manual_seed(a["seed"])
        cfg = LoraConfig(r=a["r"], lora_alpha=a["lora_alpha"], lora_dropout=0.0, target_modules=a["target_modules"],
                         init_lora_weights=False, task_type="CAUSAL_LM")
        pm = get_peft_model(base(), cfg).eval()
        pm.save_pretrained(os.path.join(OUT, name))
        out["new_ids"][name] = greedy(pm, ids)
    got = list(out["new_ids"].values())
    assert len({tuple(g) for g in got}) == len(got), f"two answers are equal: {out['new_ids']}"
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(out, f)
    print("wrote", OUT, out["new_ids"])


if __name__ == "__main__":
    main()
