"""gen_llava_tower_lora.py — LoRA on LLaVA-1.5's CLIP vision tower (and the LM's attention) in
transformers 5.23 + PEFT 0.21.2, for tests/test_llava_tower_lora.c: the tower's adapters must get
their gradients through the tower (mmc runs it with a tape once it carries adapters).

Base and data as tools/ref/gen_llava_train.py (imported: its samples, encoding and training loop):
tests/fixtures/llava/v5 (CLIP tower of 3 layers, vision_feature_layer -2, so layer 2's adapters get
no gradient and stay as they start) over tests/fixtures/llava_train/data.jsonl, batch 1 in file order,
AdamW with eps 1 and lr 1, no weight decay: with eps far above every |gradient| an update is lr times
the (bias-corrected) first moment, i.e. the gradient itself, so the adapters after 6 steps compare the
gradients that reached them (with eps 1e-8 Adam divides tiny tower gradients by their own size and
the last float bits of a gradient flip whole updates). Targets (PEFT's names of the live model):
model.vision_tower.encoder.layers.N.{self_attn.q_proj, self_attn.v_proj, mlp.fc1} (5.x: no vision_model.) and
model.language_model.layers.N.self_attn.{q,v}_proj; r 4, alpha 8, no dropout.

  lora_init/   the fresh adapter after torch.manual_seed(0) (mmc starts from it: model.lora.init)
  losses.txt   the loss of each of 6 steps
  lora_ref/    the adapter after them
Run: /work/main/.venv-ref/bin/python tools/ref/gen_llava_tower_lora.py
"""
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoProcessor, LlavaForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llava_train as lt  # noqa: E402

OUT = os.path.join(lt.ROOT, "tests/fixtures/llava_tower_lora")
BASE = "tests/fixtures/llava/v5"
TARGETS = (r".*vision_tower\.(vision_model\.)?encoder\.layers\.\d+\.(self_attn\.(q|v)_proj|mlp\.fc1)"
           r"|.*language_model\.layers\.\d+\.self_attn\.(q|v)_proj")
STEPS, LR, EPS = 6, 1.0, 1.0


def adamw_eps(params, **kw):   # gen_llava_train.train's AdamW with eps EPS
    kw["eps"] = EPS
    return ADAMW(params, **kw)


ADAMW = torch.optim.AdamW
torch.optim.AdamW = adamw_eps


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    os.chdir(lt.ROOT)   # the base by its path relative to the repository: what the adapters record
    proc = AutoProcessor.from_pretrained(BASE)
    base = LlavaForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    data = lt.batches(proc, base)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS))
    pm.save_pretrained(os.path.join(OUT, "lora_init"))
    pm.train()
    losses = lt.train(pm, [p for p in pm.parameters() if p.requires_grad], data, STEPS, LR)
    with open(os.path.join(OUT, "losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    pm.save_pretrained(os.path.join(OUT, "lora_ref"))
    print("losses", losses)


if __name__ == "__main__":
    main()
