"""gen_llava_anyres_tower_lora.py — LoRA on the vision towers of LLaVA-OneVision (SigLIP) and LLaVA-NeXT (CLIP)
(and the LM's attention) in transformers 5.23 + PEFT 0.21.2, for tests/test_llava_tower_lora.c (parts "ov",
"next"): the tower's adapters must get their gradients through the tower, every anyres tile of it (mmc runs
the tower with a tape once it carries adapters).

Bases and data as tools/ref/gen_llava_train_anyres.py (imported: its samples, processor encoding and
gen_llava_train's loop) over tests/fixtures/llava_anyres_train/data.jsonl (a wide, a tall, a text-only, a
two-image and a big image record), batch 1 in file order:
  ov    tests/fixtures/llava_onevision/ov (SigLIP tower of 2 layers, 26 px tiles, patch 6,
        vision_feature_layer -1; Qwen2 LM; anyres_max_4: 2x2, 2x3 / 3x3 downsampled grids, the two-image
        record's one padded square tile each)
  next  tests/fixtures/llava_next/next (CLIP tower of 3 layers, 30 px tiles, vision_feature_layer -2, so
        layer 2's adapters get no gradient and stay as they start; Mistral LM; 1x2, 3x1, 2x2 grids) AdamW with eps 1 and lr 1, no
weight decay, as gen_llava_tower_lora.py: with eps far above every |gradient| an update is the running
mean of the gradient, so the adapters after the steps compare the gradients that reached them. Targets
(PEFT's names of the live model): every linear of the tower's layers,
model.vision_tower.encoder.layers.N.{self_attn.{q,k,v,out}_proj, mlp.fc1, mlp.fc2}, and
model.language_model.layers.N.self_attn.{q,v}_proj; r 4, alpha 8, no dropout.

Per model M:
  M_lora_init/   the fresh adapter after torch.manual_seed(0) (mmc starts from it: model.lora.init)
  M_losses.txt   the loss of each of 6 steps
  M_lora_ref/    the adapter after them
  M_merged_tower.safetensors  the tower's adapted weights (ov 12, next 18) after PEFT's merge_and_unload of
                 M_lora_ref, under save_pretrained's names (vision_tower.encoder.layers.N...), for `mmc merge`
Run: /work/main/.venv-ref/bin/python tools/ref/gen_llava_anyres_tower_lora.py [ov] [next]
"""
import json
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoImageProcessor, AutoProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llava_train as lt  # noqa: E402
import gen_llava_train_anyres as la  # noqa: E402

OUT = os.path.join(lt.ROOT, "tests/fixtures/llava_tower_lora")
TARGETS = (r".*vision_tower\.(vision_model\.)?encoder\.layers\.\d+\.(self_attn\.(q|k|v|out)_proj|mlp\.fc(1|2))"
           r"|.*language_model\.layers\.\d+\.self_attn\.(q|v)_proj")
STEPS, LR, EPS = 6, 1.0, 1.0


def adamw_eps(params, **kw):   # gen_llava_train.train's AdamW with eps EPS
    kw["eps"] = EPS
    return ADAMW(params, **kw)


ADAMW = torch.optim.AdamW
torch.optim.AdamW = adamw_eps


def run(name):
    base_dir, cls = la.BASES[name]
    n_layers = {"ov": 2, "next": 3}[name]
    proc = AutoProcessor.from_pretrained(base_dir)
    proc.image_processor = AutoImageProcessor.from_pretrained(base_dir, backend="pil")
    assert type(proc.image_processor).__name__.endswith("Pil"), type(proc.image_processor)
    base = cls.from_pretrained(base_dir, dtype=torch.float32)
    data = [la.encode(proc, imgs, q, a, base.config.image_token_id) for imgs, q, a in la.SAMPLES]
    torch.manual_seed(0)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS))
    tower = [n for n, mod in pm.named_modules() if "vision_tower" in n and hasattr(mod, "lora_A")]
    assert len(tower) == 6 * n_layers, tower   # 6 linears a layer
    pm.save_pretrained(os.path.join(OUT, name + "_lora_init"))
    pm.train()
    losses = lt.train(pm, [p for p in pm.parameters() if p.requires_grad], data, STEPS, LR)
    with open(os.path.join(OUT, name + "_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    pm.save_pretrained(os.path.join(OUT, name + "_lora_ref"))
    for d in ("_lora_init", "_lora_ref"):   # the base's path relative to the repository root
        p = os.path.join(OUT, name + d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = base_dir
        json.dump(j, open(p, "w"), indent=2)
    merged = pm.merge_and_unload()
    sd = {k[len("model."):]: v.detach().contiguous() for k, v in merged.state_dict().items()
          if k.startswith("model.vision_tower.encoder.layers.") and k.endswith(".weight")
          and any(t in k for t in ("_proj.", "fc1.", "fc2."))}
    assert len(sd) == 6 * n_layers, sorted(sd)
    save_file(sd, os.path.join(OUT, name + "_merged_tower.safetensors"))
    print(name, "losses", losses)


def main():
    os.makedirs(OUT, exist_ok=True)
    os.chdir(lt.ROOT)   # the bases by their paths relative to the repository: what the adapters record
    for name in sys.argv[1:] or ("ov", "next"):
        run(name)


if __name__ == "__main__":
    main()
