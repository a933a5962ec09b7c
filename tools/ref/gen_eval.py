"""Fixture for `mmc eval` (tests/test_eval.c): a tiny random Qwen2-VL with the test tokenizer, a
few VQA samples with images, and transformers' teacher-forced loss and greedy answers on them.

Writes tests/fixtures/eval/:
  model/              save_pretrained() of a random Qwen2VLForConditionalGeneration (vocab of
                      tests/fixtures/tokenizer, weights scaled up so greedy answers are not
                      constant) + tokenizer.json, tokenizer_config.json
  data/val.jsonl      LLaMA-Factory messages + images (+ type); one LLaVA-style line
  data/images/*.png   small drawn images
  expected.json       per sample: mean NLL over the assistant tokens (content + <|im_end|>,
                      as HF labels), their count, the greedy answer (max 4 new tokens)
The reference renders each sample with the tokenizer's chat template and preprocesses the image
with Qwen2VLImageProcessor (slow, PIL), exactly as transformers' Qwen2VLProcessor does.
"""
import json
import os
import shutil

import torch
from PIL import Image, ImageDraw
from transformers import (AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                          Qwen2VLImageProcessor)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "eval")
TOKDIR = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
torch.manual_seed(11)

cfg = Qwen2VLConfig(
    image_token_id=1389, video_token_id=1390, vision_start_token_id=1386, vision_end_token_id=1387,
    tie_word_embeddings=True,
    text_config=dict(vocab_size=1392, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                     max_position_embeddings=512, bos_token_id=None, eos_token_id=1379,
                     pad_token_id=None, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                      "mrope_section": [2, 3, 3]}),
    vision_config=dict(depth=1, embed_dim=16, num_heads=2, mlp_ratio=2, hidden_size=32,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2))
model = Qwen2VLForConditionalGeneration(cfg).eval()
with torch.no_grad():
    for n, p in model.named_parameters():
        p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.1) + (1.0 if "norm" in n and n.endswith("weight") else 0.0))

shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(os.path.join(OUT, "data", "images"))
mdir = os.path.join(OUT, "model")
model.save_pretrained(mdir)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(TOKDIR, f), mdir)
tok = AutoTokenizer.from_pretrained(mdir)
proc = Qwen2VLImageProcessor()

COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (40, 80, 235)}
samples = []
g = torch.Generator().manual_seed(3)
qa = [("What colour is the square?", "red", "colour", 56), ("What colour is the square?", "blue", "colour", 56),
      ("How many shapes are there?", "one", "count", 84), ("How many shapes are there?", "2", "count", 56),
      ("Is it left or right?", "left", "leftright", 56), ("What colour is the square?", "green", None, 112)]
lines = []
for i, (q, a, t, size) in enumerate(qa):
    img = Image.new("RGB", (size, size))
    d = ImageDraw.Draw(img)
    x, y = [int(v) for v in torch.randint(0, size // 2, (2,), generator=g)]
    d.rectangle([x, y, x + size // 3, y + size // 3], fill=COLOURS.get(a, (200, 200, 40)))
    name = f"images/s{i}.png"
    img.save(os.path.join(OUT, "data", name))
    if i == 4:   # LLaVA style
        rec = {"conversations": [{"from": "human", "value": "<image>\n" + q}, {"from": "gpt", "value": a}],
               "image": name, "type": t}
    else:
        rec = {"messages": [{"role": "user", "content": "<image>" + q}, {"role": "assistant", "content": a}],
               "images": [name]}
        if t:
            rec["type"] = t
    lines.append(json.dumps(rec))
    user_text = "\n" + q if i == 4 else q
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user_text}]},
            {"role": "assistant", "content": [{"type": "text", "text": a}]}]
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(msgs, tokenize=False)
    pv = proc(images=[img], return_tensors="pt")
    ntok = int(pv["image_grid_thw"].prod()) // 4
    prompt = prompt.replace("<|image_pad|>", "<|image_pad|>" * ntok)
    full = full.replace("<|image_pad|>", "<|image_pad|>" * ntok)
    pids = tok(prompt, return_tensors="pt").input_ids
    fids = tok(full, return_tensors="pt").input_ids
    assert torch.equal(fids[0, :pids.shape[1]], pids[0])
    P, N = pids.shape[1], fids.shape[1]
    labels = torch.full_like(fids, -100)
    labels[0, P:N - 1] = fids[0, P:N - 1]          # content + <|im_end|>, not the trailing "\n"
    with torch.no_grad():
        out = model(input_ids=fids, mm_token_type_ids=(fids == 1389).int(), pixel_values=pv["pixel_values"], image_grid_thw=pv["image_grid_thw"],
                    labels=labels)
        gen = model.generate(input_ids=pids, attention_mask=torch.ones_like(pids),
                             mm_token_type_ids=(pids == 1389).int(),
                             pixel_values=pv["pixel_values"], image_grid_thw=pv["image_grid_thw"],
                             max_new_tokens=4, do_sample=False, eos_token_id=[1379, 1377])
    new = gen[0, P:].tolist()
    new = [x for x in new if x not in (1379, 1377)][:4] if not any(x in (1379, 1377) for x in new) else new[:[j for j, x in enumerate(new) if x in (1379, 1377)][0]]
    samples.append({"loss": float(out.loss), "tokens": N - 1 - P,
                    "prediction": tok.decode(new, skip_special_tokens=True), "reference": a})
with open(os.path.join(OUT, "data", "val.jsonl"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump({"samples": samples}, f, indent=1)
print(json.dumps(samples, indent=1))
