"""Ten steps of contrastive fine-tuning of tests/fixtures/clip_model in transformers, the loop
`mmc train examples/clip_contrastive.yaml` runs (src/train/trainer_contrastive.c), for
tests/test_contrastive_train.sh: CLIPModel.from_pretrained (f32, train mode: the tiny CLIP has no
dropout), each step the next 4 lines of retrieval.jsonl in file order (the file has 4: every step
the same batch) with each image's first caption, CLIPProcessor(text, images, padding=True,
truncation=True, backend="pil"), model(**inputs, return_loss=True).loss.backward(), then
torch.optim.AdamW(lr 1e-4, betas (0.9, 0.999), eps 1e-8) with weight_decay 0.01 on the tensors of
two or more dims and 0 on the rest (biases, norms, logit_scale: mmc's AdamW groups, as the HF
Trainer's no-decay group does for biases and norms), no clipping, constant lr.

The same for tests/fixtures/siglip_model with SiglipModel (the sigmoid loss, logit_bias trained too)
and SiglipProcessor(padding="max_length"). Writes tests/fixtures/contrastive_train/expected.json
(CLIP) and expected_siglip.json: {"losses": [10 floats], "logit_scale": the parameter after the 10
updates}.
Run: /work/main/.venv-ref/bin/python tools/ref/gen_contrastive_train.py
"""
import json
import os
import sys

if __name__ == "__main__" and os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from transformers import CLIPModel, CLIPProcessor, SiglipModel, SiglipProcessor

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "contrastive_train")
torch.set_num_threads(2)
STEPS, BATCH, LR, WD = 10, 4, 1e-4, 0.01


def load_pairs():
    """retrieval.jsonl's (image path, first caption) pairs, in file order"""
    jsonl = os.path.join(ROOT, "clip_model", "retrieval.jsonl")
    pairs = []
    for line in open(jsonl):
        if not line.strip():
            continue
        o = json.loads(line)
        cap = o["caption"] if "caption" in o else o["captions"][0]
        pairs.append((os.path.join(os.path.dirname(jsonl), o["image"]), cap))
    return pairs


def make_opt(model):
    """AdamW over the trainable tensors, weight decay on those of two or more dims (mmc's groups)"""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.999), eps=1e-8)


def train(fam, model, proc, kw, steps=STEPS):
    """steps of the loop; returns the per-step losses"""
    pairs = load_pairs()
    opt = make_opt(model)
    losses = []
    for step in range(steps):
        batch = [pairs[(step * BATCH + b) % len(pairs)] for b in range(BATCH)]
        imgs = [Image.open(p) for p, _ in batch]
        inp = proc(text=[c for _, c in batch], images=imgs, truncation=True, return_tensors="pt", **kw)
        opt.zero_grad()
        loss = model(**inp, return_loss=True).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(fam, step + 1, losses[-1])
    return losses


def run(fam, cls, pcls, kw):
    d = os.path.join(ROOT, fam + "_model", "model")
    model = cls.from_pretrained(d, dtype=torch.float32).train()
    proc = pcls.from_pretrained(d, backend="pil")
    losses = train(fam, model, proc, kw)
    out = {"losses": losses, "logit_scale": model.logit_scale.item()}
    name = "expected.json" if fam == "clip" else "expected_%s.json" % fam
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    run("clip", CLIPModel, CLIPProcessor, {"padding": True})
    run("siglip", SiglipModel, SiglipProcessor, {"padding": "max_length"})
    print("wrote", OUT)
