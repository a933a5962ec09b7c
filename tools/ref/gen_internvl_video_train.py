"""gen_internvl_video_train.py — InternVL training on videos: parity fixtures for
tests/test_internvl_video_train.sh (transformers 5.23, PEFT 0.21, torch CPU fp32).

  .venv-ref/bin/python tools/ref/gen_internvl_video_train.py   # writes tests/fixtures/internvl_video_train/*

Base: tests/fixtures/internvl/video (gen_internvl_video.py: v5's weights, a video processor of 56x56
frames, do_sample_frames with num_frames 5). Data: data.jsonl in LLaMA-Factory's ShareGPT style
("messages" with <video> / <image> tags, "videos", "images"), taken in file order with batch 1:
  1. tests/fixtures/video/moving.mkv (FFV1, 24 frames at 8 fps; 5 sampled: 2 7 12 16 21)
  2. an image (shapes_160x120.png, 7 tiles) and a folder of 3 PNG frames (every frame)
  3. a text-only turn
Each sample is what InternVLProcessor makes of the chat template's text with the decoded frames
(do_sample_frames=False after sample_frames, the frames from PyAV as transformers' pyav backend
gives them): input_ids, pixel_values (the image's tiles and the frames in placeholder order);
labels are the tokens of the assistant turn (the tokens that start inside it, as in
gen_internvl_train.py; its tokens are the same at the end of the expanded ids). Loss: transformers'
causal-LM loss; torch.optim.AdamW, constant lr, no weight decay, zero grads where no step reaches.
  lora_init/       PEFT adapter (r 4, alpha 8, LM q/k/v/o/gate/up/down + projector linear_1/2)
  lora_losses.txt  10 LoRA steps (lr 5e-3)
  full_losses.txt  4 full steps (vision tower frozen, lr 1e-3)
"""
import json
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from PIL import Image
from peft import LoraConfig, get_peft_model
from transformers import AutoImageProcessor, AutoProcessor, InternVLForConditionalGeneration
from video_ref import read_pyav

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BASE = os.path.join(ROOT, "tests/fixtures/internvl/video")
OUT = os.path.join(ROOT, "tests/fixtures/internvl_video_train")
LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)|.*multi_modal_projector\.linear_(1|2)"
SAMPLES = [   # (images, videos, question, answer), paths relative to OUT
    ([], ["../video/moving.mkv"], "What happens in the video?", "Shapes move across."),
    (["../e2e/shapes_160x120.png"], ["../llava_onevision/video"], "Compare the picture and the clip.",
     "The clip is smaller."),
    ([], [], "Say hello.", "Hello there!"),
]


def frames_of(proc, rel):
    p = os.path.join(OUT, rel)
    if os.path.isdir(p):
        return np.stack([np.asarray(Image.open(os.path.join(p, f)).convert("RGB")) for f in sorted(os.listdir(p))
                         if f.endswith(".png")]), None
    frames, meta = read_pyav(p, proc.video_processor.sample_frames)
    return frames, [int(i) for i in meta.frames_indices]


def encode(proc, imgs, vids, q, a):
    tok = proc.tokenizer
    parts = [{"type": "image"}] * len(imgs) + [{"type": "video"}] * len(vids) + [{"type": "text", "text": q}]
    msgs = [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": a}]}]
    full = proc.apply_chat_template(msgs, tokenize=False)
    prefix = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix)
    start, end = len(prefix), len(full.rstrip())
    e = tok(full, add_special_tokens=True, return_offsets_mapping=True)
    first = next(i for i, (s, _) in enumerate(e.offset_mapping) if s >= start)
    tail_ids = e.input_ids[first:]
    tail_labels = [t if start <= s < end else -100 for t, (s, _) in zip(tail_ids, e.offset_mapping[first:])]
    pil = [Image.open(os.path.join(OUT, p)).convert("RGB") for p in imgs]
    videos = [frames_of(proc, v) for v in vids]
    r = proc(text=full, images=pil or None, videos=[f for f, _ in videos] or None, do_sample_frames=False,
             return_tensors="pt")
    ids = r["input_ids"][0].tolist()
    assert ids[-len(tail_ids):] == tail_ids, "the assistant turn tokenises differently after the expansion"
    labels = [-100] * (len(ids) - len(tail_ids)) + tail_labels
    print("sample:", len(imgs), "images", [len(f) for f, _ in videos], "frames", [i for _, i in videos],
          "tokens", len(ids), "pixel rows", None if r.get("pixel_values") is None else r["pixel_values"].shape[0])
    return torch.tensor([ids]), torch.tensor([labels]), r.get("pixel_values")


def train(model, params, data, steps, lr):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for s in range(steps):
        ids, labels, pv = data[s % len(data)]
        out = model(input_ids=ids, pixel_values=pv, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        losses.append(out.loss.item())
    return losses


def write_losses(name, losses):
    with open(os.path.join(OUT, name), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        for imgs, vids, q, a in SAMPLES:
            rec = {"messages": [{"role": "user", "content": "<image>" * len(imgs) + "<video>" * len(vids) + q},
                                {"role": "assistant", "content": a}]}
            if imgs:
                rec["images"] = imgs
            if vids:
                rec["videos"] = vids
            f.write(json.dumps(rec) + "\n")
    proc = AutoProcessor.from_pretrained(BASE)
    proc.image_processor = AutoImageProcessor.from_pretrained(BASE, backend="pil")   # data.image_backend: pil
    data = [encode(proc, *s) for s in SAMPLES]

    base = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS))
    pm.save_pretrained(os.path.join(OUT, "lora_init"))
    p = os.path.join(OUT, "lora_init", "adapter_config.json")
    j = json.load(open(p))
    j["base_model_name_or_path"] = "tests/fixtures/internvl/video"
    json.dump(j, open(p, "w"), indent=2)
    pm.train()
    write_losses("lora_losses.txt", train(pm, [p for p in pm.parameters() if p.requires_grad], data, 10, 5e-3))

    torch.manual_seed(0)
    model = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    for n, p in model.named_parameters():
        p.requires_grad_("vision_tower" not in n)
    write_losses("full_losses.txt", train(model, [p for p in model.parameters() if p.requires_grad], data, 4, 1e-3))


if __name__ == "__main__":
    main()
