"""gen_llava_train.py — LLaVA-1.5 training parity fixtures for tests/test_llava_train.sh
(transformers 5.23, PEFT 0.21.2, torch 2.x CPU fp32).

  python tools/ref/gen_llava_train.py     # writes tests/fixtures/llava_train/*

Base: the tiny LlavaForConditionalGeneration of tests/fixtures/llava/v5 (CLIP tower 3 layers,
Llama 2 layers with GQA and llama3 RoPE scaling). Data: data.jsonl (LLaMA-Factory "messages" +
"images" records, one with two images) over small PNGs of odd sizes, taken in file order with
batch 1. A sample becomes model inputs as LlavaProcessor + the chat template make them: the
rendered conversation tokenised with the tokenizer's special tokens, each <image> expanded to
one token per image feature, pixel_values from CLIPImageProcessor; labels are the tokens that
start inside an assistant span (what the template adds for an assistant turn after the
generation prompt, trailing whitespace stripped), -100 elsewhere. Loss: transformers' causal-LM
loss (mean over label tokens). Optimiser: torch.optim.AdamW, constant lr, no weight decay,
no clipping. Images: the slow CLIPImageProcessor (PIL), as AutoProcessor gives for this folder.

ZERO_GRADS: on the text-only sample no gradient reaches the projector; torch leaves its .grad
None and AdamW then skips it (no moment decay, no step count), while mmc's AdamW steps every
trained tensor with a zero gradient (one global step count). The reference fills such grads
with zeros so that both run the same optimiser; the skipping is a known difference of mmc's
optimizer (it shows from the first step after a text-only batch, ~1e-3 on the loss here).

  lora_init/      PEFT adapter (r 4, alpha 8, LM q/k/v/o/gate/up/down + projector linear_1/2,
                  torch's default init: A kaiming-uniform, B 0) — mmc starts from it
                  (model.lora.init) so both runs start equal
  lora_losses.txt per-step loss of 20 LoRA steps (lr 5e-3)
  lora_ref/       the adapter after those 20 steps (PEFT save_pretrained)
  lora_ref.logits.txt  logits of base + lora_ref on prompt.txt / img0.png (last position)
  full_losses.txt per-step loss of 6 full fine-tuning steps (vision tower frozen, lr 1e-3)
  full_tower_losses.txt  the same with nothing frozen (the CLIP tower trained too)
  hub_lora_init/, hub_lora_losses.txt  8 LoRA steps on tests/fixtures/llava/hub_llama (the Hub's
                  4.4x weight names, Llama's SentencePiece-style tokenizer with <s>)
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
from transformers import AutoProcessor, LlavaForConditionalGeneration
from peft import LoraConfig, get_peft_model, PeftModel

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BASE = os.path.join(ROOT, "tests/fixtures/llava/v5")
OUT = os.path.join(ROOT, "tests/fixtures/llava_train")
LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)|.*multi_modal_projector\.linear_(1|2)"

SAMPLES = [
    (["img0.png"], "<image>What is in the picture?", "A red square on grey."),
    (["img1.png"], "<image>Describe it briefly.", "Stripes, mostly blue."),
    ([], "Say hello.", "Hello there!"),
    (["img2.png", "img0.png"], "<image><image>Compare the two images.", "The first is darker than the second."),
]
SIZES = {"img0.png": (40, 34), "img1.png": (31, 45), "img2.png": (52, 30)}


def write_data(out=OUT, samples=SAMPLES, sizes=SIZES, seed=5):
    """Random-noise PNGs of the given (width, height) and data.jsonl of the samples, into out."""
    rng = np.random.default_rng(seed)
    for name, (w, h) in sizes.items():
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(a).save(os.path.join(out, name))
    with open(os.path.join(out, "data.jsonl"), "w") as f:
        for imgs, q, a in samples:
            rec = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            if imgs:
                rec["images"] = imgs
            f.write(json.dumps(rec) + "\n")


def hf_messages(q, a):
    parts = []
    n = q.count("<image>")
    parts += [{"type": "image"}] * n
    parts.append({"type": "text", "text": q.replace("<image>", "")})
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": a}]}]


def encode(proc, imgs, q, a, n_feat, image_id):
    msgs = hf_messages(q, a)
    full = proc.apply_chat_template(msgs, tokenize=False)
    prefix = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix)
    start, end = len(prefix), len(full.rstrip())
    e = proc.tokenizer(full, add_special_tokens=True, return_offsets_mapping=True)
    ids, labels = [], []
    for t, (s, _) in zip(e.input_ids, e.offset_mapping):
        if t == image_id:
            ids += [t] * n_feat
            labels += [-100] * n_feat
        else:
            ids.append(t)
            labels.append(t if start <= s < end else -100)
    pv = None
    if imgs:
        pil = [Image.open(os.path.join(OUT, p)).convert("RGB") for p in imgs]
        pv = proc.image_processor(pil, return_tensors="pt")["pixel_values"]
    return torch.tensor([ids]), torch.tensor([labels]), pv


def batches(proc, model):
    c = model.config
    g = c.vision_config.image_size // c.vision_config.patch_size
    n_feat = g * g + (1 if c.vision_feature_select_strategy == "full" else 0)
    return [encode(proc, imgs, q, a, n_feat, c.image_token_id) for imgs, q, a in SAMPLES]


def train(model, params, data, steps, lr):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for s in range(steps):
        ids, labels, pv = data[s % len(data)]   # pv: pixel_values, or a dict of the processor's image inputs
        kw = pv if isinstance(pv, dict) else {"pixel_values": pv}
        out = model(input_ids=ids, labels=labels, **kw)
        opt.zero_grad()
        out.loss.backward()
        for p in params:   # see ZERO_GRADS
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        losses.append(out.loss.item())
    return losses


def set_base(d, rel):
    p = os.path.join(OUT, d, "adapter_config.json")
    j = json.load(open(p))
    j["base_model_name_or_path"] = rel
    json.dump(j, open(p, "w"), indent=2)


def hub():
    base_dir = os.path.join(ROOT, "tests/fixtures/llava/hub_llama")
    torch.manual_seed(1)
    proc = AutoProcessor.from_pretrained(base_dir)
    base = LlavaForConditionalGeneration.from_pretrained(base_dir, dtype=torch.float32)
    data = batches(proc, base)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS))
    pm.save_pretrained(os.path.join(OUT, "hub_lora_init"))
    set_base("hub_lora_init", "tests/fixtures/llava/hub_llama")
    pm.train()
    losses = train(pm, [p for p in pm.parameters() if p.requires_grad], data, 8, 5e-3)
    with open(os.path.join(OUT, "hub_lora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    write_data()
    hub()
    torch.manual_seed(0)
    proc = AutoProcessor.from_pretrained(BASE)
    base = LlavaForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    data = batches(proc, base)

    # LoRA
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS)
    pm = get_peft_model(base, cfg)
    pm.save_pretrained(os.path.join(OUT, "lora_init"))
    pm.train()
    losses = train(pm, [p for p in pm.parameters() if p.requires_grad], data, 20, 5e-3)
    with open(os.path.join(OUT, "lora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    pm.save_pretrained(os.path.join(OUT, "lora_ref"))
    pm.eval()
    prompt = "USER: <image>\nWhat is in the picture? ASSISTANT:"
    with open(os.path.join(OUT, "prompt.txt"), "w") as f:
        f.write(prompt)
    enc = proc(text=prompt, images=[Image.open(os.path.join(OUT, "img0.png")).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        lg = pm(**enc).logits[0, -1]
    with open(os.path.join(OUT, "lora_ref.logits.txt"), "w") as f:
        f.write(" ".join("%.8g" % v for v in lg.tolist()) + "\n")
    for d in ("lora_init", "lora_ref"):   # a path relative to the repository root
        p = os.path.join(OUT, d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = "tests/fixtures/llava/v5"
        json.dump(j, open(p, "w"), indent=2)

    # full fine-tuning, tower frozen
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    for n, p in model.named_parameters():
        p.requires_grad_("vision_tower" not in n)
    losses = train(model, [p for p in model.parameters() if p.requires_grad], data, 6, 1e-3)
    with open(os.path.join(OUT, "full_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))

    # full fine-tuning, everything trained
    model = LlavaForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    losses = train(model, list(model.parameters()), data, 6, 1e-3)
    with open(os.path.join(OUT, "full_tower_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))


if __name__ == "__main__":
    main()
