"""check_train_outputs.py — checks a `mmc train` output directory with the reference tools:
  1. the last checkpoint-<step>/ loads with transformers (AutoModelForCausalLM) and its logits
     on a probe batch equal the logits of the same weights read straight from safetensors
     into a fresh model (names/layout/config round-trip), within 1e-5;
  2. tb/events.out.tfevents.* read by tensorboard's EventAccumulator give the same
     train/loss scalars as metrics.jsonl (float32 rounding).
usage: python tools/ref/check_train_outputs.py OUTPUT_DIR   (tests/test_train_ref.sh runs it)"""
import glob
import json
import os
import sys

import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoConfig, AutoModelForCausalLM

out = sys.argv[1]
ckpts = sorted(glob.glob(os.path.join(out, "checkpoint-*")), key=lambda p: int(p.rsplit("-", 1)[1]))
assert ckpts, "no checkpoint in " + out
ck = ckpts[-1]
model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
sd = load_file(os.path.join(ck, "model.safetensors"))
missing = [n for n, _ in model.named_parameters() if n not in sd and not n.startswith("lm_head")]
assert not missing, f"weights missing from the checkpoint: {missing}"
for n, p in model.named_parameters():
    if n in sd:
        assert torch.equal(p.detach(), sd[n].float()), f"{n} changed on load"
ids = torch.arange(0, 16).unsqueeze(0) % model.config.vocab_size
with torch.no_grad():
    logits = model(input_ids=ids).logits
ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ck), dtype=torch.float32).eval()
ref.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
with torch.no_grad():
    d = (ref(input_ids=ids).logits - logits).abs().max().item()
assert d <= 1e-5, f"logits differ by {d}"
print(f"ok: {ck} loads with transformers ({sum(p.numel() for p in model.parameters())} params), logits agree ({d:.1e})")

files = glob.glob(os.path.join(out, "tb", "events.out.tfevents.*"))
assert files, "no TensorBoard event file"
acc = EventAccumulator(files[-1])
acc.Reload()
tags = acc.Tags()["scalars"]
assert "train/loss" in tags and "train/lr" in tags, tags
tb = {e.step: e.value for e in acc.Scalars("train/loss")}
with open(os.path.join(out, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f if line.strip()]
for m in metrics:
    if m["step"] in tb:
        assert abs(tb[m["step"]] - m["loss"]) <= 1e-6 * max(1.0, abs(m["loss"])), (m, tb[m["step"]])
assert set(tb) <= {m["step"] for m in metrics}
print(f"ok: TensorBoard event file: {len(tb)} train/loss points match metrics.jsonl; tags {sorted(tags)}")
