"""`mmc merge` parity for a HunyuanDiTPipeline folder (tests/test_hunyuan.c part "merge"), written by PEFT itself
(the version pinned in requirements.txt) on the tiny pipeline of tests/fixtures/hunyuan/pipe (tools/ref/gen_hunyuan.py):

* hunyuan_merge/adapter/: PEFT's adapter on the pipeline's HunyuanDiT2DModel (get_peft_model + save_pretrained:
  adapter_config.json + adapter_model.safetensors, the format `mmc train` writes for HunyuanDiT; diffusers 0.42.1
  has no load_lora_weights for HunyuanDiTPipeline), r 4, lora_alpha 8, use_rslora (scale 8 / sqrt(4)), on
  to_q / to_k / to_v / to_out.0 of both attentions, ff.net.0.proj / ff.net.2, skip_linear and norm1.linear, with
  init_lora_weights=False (lora_B random too, so every merged weight moves).
* hunyuan_merge/expected.safetensors: merge_and_unload()'s state dict, the adapted weights only (every other
  tensor is the base's, unchanged).

Run: .venv-ref/bin/python tools/ref/gen_hunyuan_merge.py
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

from diffusers import HunyuanDiT2DModel

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PIPE = os.path.join(ROOT, "tests", "fixtures", "hunyuan", "pipe")
OUT = os.path.join(ROOT, "tests", "fixtures", "hunyuan_merge")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
torch.manual_seed(21)

tr = HunyuanDiT2DModel.from_pretrained(os.path.join(PIPE, "transformer"), torch_dtype=torch.float32)
base = {k: v.clone() for k, v in tr.state_dict().items()}
targets = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2", "skip_linear", "norm1.linear"]
pm = get_peft_model(tr, LoraConfig(r=4, lora_alpha=8, use_rslora=True, init_lora_weights=False,
                                   target_modules=targets))
pm.save_pretrained(os.path.join(OUT, "adapter"))
n = sum(1 for k in pm.state_dict() if "lora_A" in k)
merged = pm.merge_and_unload().state_dict()
assert set(merged) == set(base), set(merged) ^ set(base)
exp = {k: v.contiguous() for k, v in merged.items() if not torch.equal(v, base[k])}
assert len(exp) == n, (len(exp), n)
save_file(exp, os.path.join(OUT, "expected.safetensors"))
print("wrote", OUT, ":", n, "adapted modules")
