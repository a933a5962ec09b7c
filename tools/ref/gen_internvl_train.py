"""gen_internvl_train.py — InternVL training parity fixtures for tests/test_internvl_train.sh
(transformers 5.23, PEFT 0.21.2, torch 2.x CPU fp32).

  .venv-ref/bin/python tools/ref/gen_internvl_train.py   # writes tests/fixtures/internvl_train/*

Base: the tiny InternVLForConditionalGeneration of tests/fixtures/internvl/v5 (InternViT 3 layers,
56x56 tiles -> 4 tokens each after the pixel shuffle, min 1 / max 6 tiles + thumbnail; Qwen2 2
layers with GQA). Data: data.jsonl (LLaMA-Factory "messages" + "images"), three samples taken in
file order with batch 1: a wide image (a 3x1 tile grid + thumbnail), a tall one (1x2 +
thumbnail) and a text-only turn. A sample becomes model inputs as InternVLProcessor + the chat
template make them: the rendered conversation tokenised, each <IMG_CONTEXT> of the template
expanded to <img> <IMG_CONTEXT> x (4 * tiles) </img> (checked equal to the processor's own
input_ids), pixel_values from GotOcr2ImageProcessor (PIL backend, crop_to_patches); labels are
the tokens that start inside an assistant span (what the template adds for an assistant turn
after the generation prompt, trailing whitespace stripped), -100 elsewhere. Loss: transformers'
causal-LM loss. Optimiser: torch.optim.AdamW, constant lr, no weight decay, no clipping; grads
that no step reaches (the projector on the text-only sample) are filled with zeros, as mmc's
AdamW steps every trained tensor (see gen_llava_train.py's ZERO_GRADS).

  lora_init/       PEFT adapter (r 4, alpha 8, LM q/k/v/o/gate/up/down + projector linear_1/2,
                   torch's default init) — mmc starts from it (model.lora.init)
  lora_losses.txt  per-step loss of 20 LoRA steps (lr 5e-3)
  lora_ref/        the adapter after those 20 steps (PEFT save_pretrained)
  full_losses.txt  per-step loss of 6 full fine-tuning steps (vision tower frozen, lr 1e-3)
  tower_lora_init/, tower_lora_losses.txt, tower_lora_ref/  the same LoRA with the InternViT tower's
                   attention.{q,k,v}_proj / projection_layer / mlp.fc1 / fc2 adapted too: 10 steps
  full_tower_losses.txt  the same with nothing frozen (the InternViT tower trained too)
  full_tower_weights.safetensors  TOWER_KEYS after those 6 steps (the names mmc's checkpoint
                   gives them: save_pretrained's, without "model.")
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
from transformers import AutoProcessor, GotOcr2ImageProcessor, InternVLForConditionalGeneration
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BASE = os.path.join(ROOT, "tests/fixtures/internvl/v5")
OUT = os.path.join(ROOT, "tests/fixtures/internvl_train")
TOWER_KEYS = ["model.vision_tower.embeddings.cls_token", "model.vision_tower.embeddings.position_embeddings",
              "model.vision_tower.embeddings.patch_embeddings.projection.weight",
              "model.vision_tower.encoder.layer.0.attention.q_proj.weight",
              "model.vision_tower.encoder.layer.0.lambda_1", "model.vision_tower.encoder.layer.1.mlp.fc2.weight",
              "model.vision_tower.encoder.layer.1.layernorm_after.bias"]
TOWER_LORA_TARGETS = (r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
                      r"|.*multi_modal_projector\.linear_(1|2)"
                      r"|.*vision_tower\.encoder\.layer\.\d+\.(attention\.(q_proj|k_proj|v_proj|projection_layer)|mlp\.fc(1|2))")
LORA_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)|.*multi_modal_projector\.linear_(1|2)"

SAMPLES = [
    (["wide.png"], "What is in the picture?", "A red square on grey."),
    (["tall.png"], "Describe it briefly.", "Stripes, mostly blue."),
    ([], "Say hello.", "Hello there!"),
]
SIZES = {"wide.png": (150, 47), "tall.png": (45, 97)}


def write_data():
    rng = np.random.default_rng(7)
    for name, (w, h) in SIZES.items():
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(a).save(os.path.join(OUT, name))
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        for imgs, q, a in SAMPLES:
            rec = {"messages": [{"role": "user", "content": "<image>" * len(imgs) + q},
                                {"role": "assistant", "content": a}]}
            if imgs:
                rec["images"] = imgs
            f.write(json.dumps(rec) + "\n")


def hf_messages(imgs, q, a):
    parts = [{"type": "image"}] * len(imgs) + [{"type": "text", "text": q}]
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": a}]}]


def encode(proc, ip, imgs, q, a, model):
    c = model.config
    image_id = c.image_token_id
    tok = proc.tokenizer
    start_id, end_id = tok.convert_tokens_to_ids("<img>"), tok.convert_tokens_to_ids("</img>")
    msgs = hf_messages(imgs, q, a)
    full = proc.apply_chat_template(msgs, tokenize=False)
    prefix = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix)
    start, end = len(prefix), len(full.rstrip())
    pv, tiles = None, []
    pil = [Image.open(os.path.join(OUT, p)).convert("RGB") for p in imgs]
    if imgs:
        r = ip(pil, crop_to_patches=True, return_tensors="pt")
        pv, tiles = r["pixel_values"], [int(n) for n in r["num_patches"]]
    e = tok(full, add_special_tokens=True, return_offsets_mapping=True)
    ids, labels, k = [], [], 0
    for t, (s, _) in zip(e.input_ids, e.offset_mapping):
        if t == image_id:
            n = proc.image_seq_length * tiles[k]
            k += 1
            ids += [start_id] + [t] * n + [end_id]
            labels += [-100] * (n + 2)
        else:
            ids.append(t)
            labels.append(t if start <= s < end else -100)
    # the processor's own expansion gives the same ids
    ref = proc(text=full, images=pil or None, return_tensors="pt")
    assert ref["input_ids"][0].tolist() == ids, "InternVLProcessor expands differently"
    return torch.tensor([ids]), torch.tensor([labels]), pv


def train(model, params, data, steps, lr):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for s in range(steps):
        ids, labels, pv = data[s % len(data)]
        out = model(input_ids=ids, pixel_values=pv, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        for p in params:   # see ZERO_GRADS in gen_llava_train.py
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
    write_data()
    proc = AutoProcessor.from_pretrained(BASE)
    ip = GotOcr2ImageProcessor.from_pretrained(BASE)   # the PIL backend (mmc's data.image_backend: pil)
    proc.image_processor = ip
    base = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    data = [encode(proc, ip, imgs, q, a, base) for imgs, q, a in SAMPLES]
    print("tiles per sample:", [0 if d[2] is None else d[2].shape[0] for d in data],
          "lengths:", [d[0].shape[1] for d in data])

    # LoRA
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS)
    pm = get_peft_model(base, cfg)
    pm.save_pretrained(os.path.join(OUT, "lora_init"))
    pm.train()
    write_losses("lora_losses.txt", train(pm, [p for p in pm.parameters() if p.requires_grad], data, 20, 5e-3))
    pm.save_pretrained(os.path.join(OUT, "lora_ref"))
    for d in ("lora_init", "lora_ref"):   # a path relative to the repository root
        p = os.path.join(OUT, d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = "tests/fixtures/internvl/v5"
        json.dump(j, open(p, "w"), indent=2)

    # LoRA on the InternViT tower's linears too (PEFT's module names under model.vision_tower)
    torch.manual_seed(0)
    base = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TOWER_LORA_TARGETS))
    pm.save_pretrained(os.path.join(OUT, "tower_lora_init"))
    pm.train()
    write_losses("tower_lora_losses.txt", train(pm, [p for p in pm.parameters() if p.requires_grad], data, 10, 5e-3))
    pm.save_pretrained(os.path.join(OUT, "tower_lora_ref"))
    for d in ("tower_lora_init", "tower_lora_ref"):
        p = os.path.join(OUT, d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = "tests/fixtures/internvl/v5"
        json.dump(j, open(p, "w"), indent=2)

    # full fine-tuning, tower frozen
    torch.manual_seed(0)
    model = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    for n, p in model.named_parameters():
        p.requires_grad_("vision_tower" not in n)
    write_losses("full_losses.txt", train(model, [p for p in model.parameters() if p.requires_grad], data, 6, 1e-3))

    # full fine-tuning with the InternViT tower trained too; some of its weights after the 6 steps
    model = InternVLForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    model.train()
    write_losses("full_tower_losses.txt", train(model, list(model.parameters()), data, 6, 1e-3))
    sd = model.state_dict()
    save_file({k.replace("model.", "", 1): sd[k].detach().contiguous() for k in TOWER_KEYS},
              os.path.join(OUT, "full_tower_weights.safetensors"))


if __name__ == "__main__":
    main()
