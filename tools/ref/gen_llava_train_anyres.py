"""gen_llava_train_anyres.py — LLaVA-NeXT and LLaVA-OneVision training parity fixtures for
tests/test_llava_train_anyres.sh (transformers 5.23, PEFT 0.21.2, torch 2.x CPU fp32).

  python tools/ref/gen_llava_train_anyres.py     # writes tests/fixtures/llava_anyres_train/*

Bases (written by tools/ref/gen_llava_next.py with save_pretrained, untouched):
  next  tests/fixtures/llava_next/next         LlavaNextForConditionalGeneration (CLIP tower 30 px tiles,
        strategy "default", layer -2; Mistral LM with GQA; pinpoints 30x60 .. 90x30)
  ov    tests/fixtures/llava_onevision/ov      LlavaOnevisionForConditionalGeneration (SigLIP tower 26 px
        tiles with a patch size that does not divide them; Qwen2 LM; anyres_max_4)
Data: data.jsonl (LLaMA-Factory "messages" + "images" records, one text-only, one with two images)
over non-square PNGs of odd sizes, so that select_best_resolution picks 1x2, 3x1 and 2x2 (NeXT) and
2x2, 2x3, 3x3 grids (OneVision; the larger two past anyres_max_4, so bilinearly downsampled), taken
in file order with batch 1. A sample becomes model inputs as the model's processor makes them
(LlavaNextProcessor / LlavaOnevisionProcessor with the PIL image processor): the rendered
conversation tokenised with the special tokens, each <image> expanded by the processor for its
image (OneVision's two-image record: one padded square each, batch_num_images 2), pixel_values
and image_sizes; labels as in gen_llava_train.py (the tokens starting inside the assistant span).
Loss: transformers' causal-LM loss; optimiser torch.optim.AdamW, constant lr, no weight decay, no
clipping; grads of parameters a step does not reach are zero-filled (gen_llava_train.ZERO_GRADS).

Per model M in (next, ov):
  M_lora_init/       PEFT adapter (r 4, alpha 8, LM q/k/v/o/gate/up/down + projector linear_1/2)
  M_lora_losses.txt  per-step loss of 20 LoRA steps (lr 5e-3) from M_lora_init
  M_lora_ref/        the adapter after them (PEFT save_pretrained)
  M_lora_ref.logits.txt  last-position logits of base + M_lora_ref on wide.png and PROMPT (the chat
                     template with the generation prompt, as `mmc forward --prompt` renders it)
  M_initial_losses.txt  each sample's loss under the base model and its scored label count
  M_full_losses.txt  8 full fine-tuning steps, vision tower frozen (lr 1e-3): the projector,
                     image_newline and the LM trained
  M_full_tower_losses.txt  the same with nothing frozen (the CLIP / SigLIP tower trained too)
"""
import json
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from transformers import (AutoImageProcessor, AutoProcessor, LlavaNextForConditionalGeneration,
                          LlavaOnevisionForConditionalGeneration)
from peft import LoraConfig, get_peft_model

from gen_llava_train import LORA_TARGETS, hf_messages, train, write_data

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests/fixtures/llava_anyres_train")
BASES = {
    "next": ("tests/fixtures/llava_next/next", LlavaNextForConditionalGeneration),
    "ov": ("tests/fixtures/llava_onevision/ov", LlavaOnevisionForConditionalGeneration),
}
SAMPLES = [
    (["wide.png"], "<image>What is in the picture?", "A red square on grey."),
    (["tall.png"], "<image>Describe it briefly.", "Stripes, mostly blue."),
    ([], "Say hello.", "Hello there!"),
    (["big.png", "wide.png"], "<image><image>Compare the two images.", "The first is darker than the second."),
    (["big.png"], "<image>How big is it?", "Quite big."),
]
PROMPT = "What is in the picture?"
SIZES = {"wide.png": (61, 29), "tall.png": (23, 71), "big.png": (80, 67)}   # (width, height)


def encode(proc, imgs, q, a, image_id):
    """The processor's expanded ids, pixel_values, image_sizes; labels from the unexpanded text's offsets."""
    msgs = hf_messages(q, a)
    full = proc.apply_chat_template(msgs, tokenize=False)
    prefix = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix)
    start, end = len(prefix), len(full.rstrip())
    pil = [Image.open(os.path.join(OUT, p)).convert("RGB") for p in imgs]
    # OneVision's processor treats a sample's images as one prompt's (batch_num_images) only when nested
    nest = "Onevision" in type(proc).__name__
    enc = proc(text=full, images=([pil] if nest else pil) if pil else None, return_tensors="pt")
    expanded = enc.input_ids[0].tolist()
    e = proc.tokenizer(full, add_special_tokens=True, return_offsets_mapping=True)
    ids, labels, j = [], [], 0
    for k, (t, (s, _)) in enumerate(zip(e.input_ids, e.offset_mapping)):
        if t == image_id:   # this image's run in the processor's output
            while j < len(expanded) and expanded[j] == image_id:
                ids.append(image_id)
                labels.append(-100)
                j += 1
        else:
            assert expanded[j] == t, (k, t, expanded[j])
            ids.append(t)
            labels.append(t if start <= s < end else -100)
            j += 1
    assert ids == expanded
    kw = {}
    if imgs:
        kw = {"pixel_values": enc.pixel_values, "image_sizes": enc.image_sizes}
        if "batch_num_images" in enc:
            kw["batch_num_images"] = enc.batch_num_images
    return torch.tensor([ids]), torch.tensor([labels]), kw


def run(name):
    base_dir, cls = BASES[name]
    base_path = os.path.join(ROOT, base_dir)
    proc = AutoProcessor.from_pretrained(base_path)
    proc.image_processor = AutoImageProcessor.from_pretrained(base_path, backend="pil")
    assert type(proc.image_processor).__name__.endswith("Pil"), type(proc.image_processor)
    load = lambda: cls.from_pretrained(base_path, dtype=torch.float32)   # noqa: E731
    base = load()
    data = [encode(proc, imgs, q, a, base.config.image_token_id) for imgs, q, a in SAMPLES]
    for ids, _, kw in data:
        print(name, ids.shape[1], "tokens,", (ids == base.config.image_token_id).sum().item(), "image tokens,",
              tuple(kw["pixel_values"].shape) if kw else "no images")

    with torch.no_grad():   # each sample's loss at the start and its scored labels (shifted)
        base.eval()
        with open(os.path.join(OUT, name + "_initial_losses.txt"), "w") as f:
            for ids, labels, kw in data:
                loss = base(input_ids=ids, labels=labels, **kw).loss.item()
                f.write("%.8f %d\n" % (loss, (labels[:, 1:] != -100).sum().item()))
        base.train()

    def steps(model, params, n, lr):
        return train(model, params, data, n, lr)

    # LoRA
    torch.manual_seed(0)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS))
    pm.save_pretrained(os.path.join(OUT, name + "_lora_init"))
    pm.train()
    write_losses(name + "_lora_losses.txt", steps(pm, [p for p in pm.parameters() if p.requires_grad], 20, 5e-3))
    pm.save_pretrained(os.path.join(OUT, name + "_lora_ref"))
    pm.eval()   # base + the trained adapter on the test's prompt (`mmc forward --prompt`: the chat template)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    enc = proc(text=text, images=[Image.open(os.path.join(OUT, "wide.png")).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        lg = pm(**enc).logits[0, -1]
    with open(os.path.join(OUT, name + "_lora_ref.logits.txt"), "w") as f:
        f.write(" ".join("%.8g" % v for v in lg.tolist()) + "\n")
    for d in ("_lora_init", "_lora_ref"):   # a path relative to the repository root
        p = os.path.join(OUT, name + d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = base_dir
        json.dump(j, open(p, "w"), indent=2)

    # full fine-tuning, tower frozen
    model = load()
    model.train()
    for n, p in model.named_parameters():
        p.requires_grad_("vision_tower" not in n)
    write_losses(name + "_full_losses.txt", steps(model, [p for p in model.parameters() if p.requires_grad], 8, 1e-3))
    # everything trained (NeXT's CLIP / OneVision's SigLIP tower too)
    model = load()
    model.train()
    write_losses(name + "_full_tower_losses.txt", steps(model, list(model.parameters()), 8, 1e-3))


def write_losses(name, losses):
    with open(os.path.join(OUT, name), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))


def main():
    os.makedirs(OUT, exist_ok=True)
    write_data(OUT, SAMPLES, SIZES, seed=11)
    for name in sys.argv[1:] or ("next", "ov"):
        run(name)


if __name__ == "__main__":
    main()
