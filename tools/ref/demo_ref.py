"""PyTorch reference of the built-in demo's recipe (for tuning and as the peer): the tiny
Qwen2-VL of examples/demo_model.json trained from scratch with transformers + torch AdamW on
the `mmc synth` dataset in curriculum order, then per-type accuracy on the val split (the
first answer token decides every question type; it is scored by argmax after the prompt).

usage: python tools/ref/demo_ref.py DATA_DIR [--minutes 5] [--lr 2e-3] [--batch 32]
       [--steps 600] [--threads 2] [--file train_curriculum.jsonl]
"""
import argparse
import json
import math
import os
import time

import torch
from PIL import Image
from transformers import (AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                          Qwen2VLImageProcessor)

ap = argparse.ArgumentParser()
ap.add_argument("data")
ap.add_argument("--minutes", type=float, default=5)
ap.add_argument("--lr", type=float, default=2e-3)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--file", default="train_curriculum.jsonl")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
root = os.path.join(os.path.dirname(__file__), "..", "..")
tok = AutoTokenizer.from_pretrained(os.path.join(root, "tests", "fixtures", "tokenizer"))
proc = Qwen2VLImageProcessor()
IMG = 1389


def load(path, limit=None):
    out = []
    for ln in open(path):
        r = json.loads(ln)
        q = r["messages"][0]["content"].replace("<image>", "")
        ans = r["messages"][1]["content"]
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
        p = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        p = p.replace("<|image_pad|>", "<|image_pad|>" * 4)
        pid = tok(p).input_ids
        aid = tok(ans + "<|im_end|>").input_ids
        pv = proc(images=[Image.open(os.path.join(a.data, r["images"][0])).convert("RGB")],
                  return_tensors="pt")["pixel_values"]
        out.append((pid, aid, pv, r["type"]))
        if limit and len(out) >= limit:
            break
    return out


def collate(items, with_answer=True):
    seqs = [p + (x if with_answer else []) for p, x, _, _ in items]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(items), T), 1377)
    lab = torch.full((len(items), T), -100)
    att = torch.zeros((len(items), T), dtype=torch.long)
    for i, ((p, x, _, _), s) in enumerate(zip(items, seqs)):
        ids[i, :len(s)] = torch.tensor(s)
        att[i, :len(s)] = 1
        if with_answer:
            lab[i, len(p):len(s)] = torch.tensor(x)
    pv = torch.cat([it[2] for it in items])
    grid = torch.tensor([[1, 4, 4]] * len(items))
    return dict(input_ids=ids, attention_mask=att, labels=lab if with_answer else None,
                mm_token_type_ids=(ids == IMG).int(), pixel_values=pv, image_grid_thw=grid)


t0 = time.time()
train = load(os.path.join(a.data, a.file), a.steps * a.batch)
val = load(os.path.join(a.data, "val.jsonl"))
print(f"data: {len(train)} train, {len(val)} val ({time.time() - t0:.0f} s)", flush=True)
cfg = Qwen2VLConfig(**json.load(open(os.path.join(root, "examples", "demo_model.json"))))
model = Qwen2VLForConditionalGeneration(cfg)
print("params", sum(p.numel() for p in model.parameters()), flush=True)
decay = [p for n, p in model.named_parameters() if p.ndim > 1]
nodecay = [p for n, p in model.named_parameters() if p.ndim <= 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": nodecay, "weight_decay": 0.0}], lr=a.lr)
warm, total, min_lr = 30, a.steps, 1e-4


def lr_at(s):
    if s < warm:
        return a.lr * (s + 1) / warm
    pr = (s - warm) / max(1, total - warm)
    return min_lr + (a.lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, pr)))


def evaluate():
    model.eval()
    hit, cnt = {}, {}
    with torch.no_grad():
        for i in range(0, len(val), 64):
            items = val[i:i + 64]
            b = collate(items, with_answer=False)
            b.pop("labels")
            lg = model(**b).logits
            L = b["attention_mask"].sum(1) - 1
            pred = lg[torch.arange(len(items)), L].argmax(-1)
            for it, p in zip(items, pred.tolist()):
                t = it[3]
                cnt[t] = cnt.get(t, 0) + 1
                hit[t] = hit.get(t, 0) + int(p == it[1][0])
    model.train()
    return {t: round(hit[t] / cnt[t], 3) for t in cnt}


t0 = time.time()
step = 0
while step < a.steps and time.time() - t0 < a.minutes * 60:
    items = train[(step * a.batch) % len(train):][:a.batch]
    if len(items) < a.batch:
        items = items + train[:a.batch - len(items)]
    for g in opt.param_groups:
        g["lr"] = lr_at(step)
    loss = model(**collate(items)).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    step += 1
    if step % 25 == 0:
        print(f"step {step} loss {loss.item():.4f} lr {lr_at(step):.2e} {time.time() - t0:.0f} s "
              f"({step * a.batch / (time.time() - t0):.1f} samples/s)", flush=True)
    if step % 150 == 0:
        print("val", evaluate(), flush=True)
print(f"done: {step} steps in {time.time() - t0:.0f} s; val {evaluate()}", flush=True)
