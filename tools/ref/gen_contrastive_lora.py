"""LoRA contrastive training of the tiny CLIPModel and SiglipModel fixtures with PEFT, the run
`mmc train examples/clip_contrastive_lora.yaml` makes (src/train/trainer_contrastive.c), for
tests/test_contrastive_lora.c and tests/test_contrastive_lora.sh.

Per family: get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0, target_modules=TARGETS))
after torch.manual_seed(0); the fresh adapter saved with save_pretrained as <fam>_init/ (mmc starts from
it with model.lora.init: PEFT's kaiming-uniform A drawn by torch cannot be redrawn in C); then the
10-step loop of gen_contrastive_train.py (the same batches, AdamW lr 1e-3 (LoRA's usual tenfold), weight decay 0.01 on 2-D
tensors, i.e. on every lora_A / lora_B) over the adapters only (PEFT freezes the base, logit_scale and
logit_bias included); the trained adapter saved as <fam>_final/; then merge_and_unload() and, in eval
mode on the 4 pairs' images and first captions (the processor as in training), logits_per_image.
Targets: CLIP ["q_proj", "v_proj", "out_proj", "fc1", "text_model.encoder.layers.0.mlp.fc2",
"visual_projection"]; SigLIP ["k_proj", "fc2"] (fc2 also reaches vision_model.head.mlp.fc2).
Writes tests/fixtures/contrastive_lora/{clip,siglip}_{init,final}/ and expected_{clip,siglip}.json:
{"losses": [10], "logits_per_image": [4][4]}.
Run: /work/main/.venv-ref/bin/python tools/ref/gen_contrastive_lora.py
"""
import json
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from peft import LoraConfig, get_peft_model
from transformers import CLIPModel, CLIPProcessor, SiglipModel, SiglipProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_contrastive_train as ct  # noqa: E402  (the loop and the pairs)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.chdir(REPO)   # base_model_name_or_path relative to the repository, as the tests run
OUT = os.path.join("tests", "fixtures", "contrastive_lora")
ct.LR = 1e-3
TARGETS = {
    "clip": ["q_proj", "v_proj", "out_proj", "fc1", "text_model.encoder.layers.0.mlp.fc2", "visual_projection"],
    "siglip": ["k_proj", "fc2"],
}


def run(fam, cls, pcls, kw):
    d = os.path.join("tests", "fixtures", fam + "_model", "model")
    model = cls.from_pretrained(d, dtype=torch.float32).train()
    proc = pcls.from_pretrained(d, backend="pil")
    torch.manual_seed(0)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS[fam]))
    pm.save_pretrained(os.path.join(OUT, fam + "_init"))
    losses = ct.train(fam, pm, proc, kw)
    pm.save_pretrained(os.path.join(OUT, fam + "_final"))
    merged = pm.merge_and_unload().eval()
    pairs = ct.load_pairs()
    inp = proc(text=[c for _, c in pairs], images=[Image.open(p) for p, _ in pairs], truncation=True,
               return_tensors="pt", **kw)
    with torch.no_grad():
        lpi = merged(**inp).logits_per_image
    with open(os.path.join(OUT, "expected_%s.json" % fam), "w") as f:
        json.dump({"losses": losses, "logits_per_image": lpi.tolist()}, f, indent=1)


os.makedirs(OUT, exist_ok=True)
run("clip", CLIPModel, CLIPProcessor, {"padding": True})
run("siglip", SiglipModel, SiglipProcessor, {"padding": "max_length"})
print("wrote", OUT)
