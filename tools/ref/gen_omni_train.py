"""gen_omni_train.py — Qwen2.5-Omni thinker training parity fixtures for tests/test_omni_train.sh
(transformers 5.23, PEFT 0.21, torch CPU fp32).

  python tools/ref/gen_omni_train.py     # writes tests/fixtures/omni_train/*

Base: the tiny Qwen2_5OmniThinkerForConditionalGeneration of tests/fixtures/omni/thinker (audio
encoder 2 layers with n_window 8, Qwen2.5-VL vision tower, Qwen2 LM 2 layers with M-RoPE).
Data: data.jsonl (LLaMA-Factory "messages" + "audios" / "images" records: two audio questions,
one image + audio, one text only), taken in file order with batch 1. A sample becomes model
inputs as Qwen2_5OmniProcessor + the chat template make them (processor(text=conversation,
audio=..., images=...) expands <|AUDIO|> / <|IMAGE|>); labels are the tokens after the
generation prompt of the last user turn (the assistant content and its <|im_end|>, not the
trailing newline), -100 elsewhere. Loss: the thinker's causal-LM loss (mean over label tokens).
Optimiser: torch.optim.AdamW, constant lr, no weight decay, no clipping. The audio encoder and
the vision tower are frozen (requires_grad False) unless a run below says otherwise.

  lora_init/      PEFT adapter (r 4, alpha 8, the LM's q/k/v/o/gate/up/down; torch's default
                  init: A kaiming-uniform, B 0) — mmc starts from it (model.lora.init)
  lora_losses.txt per-step loss of 20 LoRA steps (lr 5e-3)
  lora_ref/       the adapter after those 20 steps (PEFT save_pretrained)
  lora_ref.logits.txt  logits of base + lora_ref on a0.wav + "What colour is the square?" with the
                  generation prompt (last position)
  full_losses.txt per-step loss of 6 full fine-tuning steps of the LM (lr 1e-3)
  full_audio_losses.txt   8 full fine-tuning steps (lr 1e-3) with the audio encoder trainable too
                  (vision tower and merger frozen: mmc's model.freeze: [vision_tower, merger])
  full_all_losses.txt     8 full fine-tuning steps (lr 1e-3) of everything: LM, audio encoder, vision
                  tower and merger (model.freeze: []); step 7 is the image record again, after the
                  tower's update at step 3
"""
import json
import os
import shutil
import sys
import wave

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration
from peft import LoraConfig, get_peft_model

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BASE = os.path.join(ROOT, "tests/fixtures/omni/thinker")
OUT = os.path.join(ROOT, "tests/fixtures/omni_train")
LORA_TARGETS = r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
SR = 16000

# (audios, images, question, answer): the question's <audio> / <image> tags become parts in order
SAMPLES = [
    (["a0.wav"], [], "<audio>What colour is the square?", "Red."),
    (["a1.wav"], [], "<audio>What shape is it?", "A circle, blue."),
    (["a0.wav"], ["img0.png"], "<image><audio>Answer the spoken question.", "It is green."),
    ([], [], "Say hello.", "Hello there!"),
]


def write_wav(path, pcm):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.astype("<i2").tobytes())


def write_data():
    rng = np.random.default_rng(7)
    for name, secs, f0 in (("a0.wav", 0.7, 440.0), ("a1.wav", 1.3, 250.0)):
        t = np.arange(int(SR * secs)) / SR
        x = 0.3 * np.sin(2 * np.pi * f0 * t) + 0.05 * rng.standard_normal(t.size)
        write_wav(os.path.join(OUT, name), np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16))
    Image.fromarray(rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)).save(os.path.join(OUT, "img0.png"))
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        for auds, imgs, q, a in SAMPLES:
            rec = {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            if auds:
                rec["audios"] = auds
            if imgs:
                rec["images"] = imgs
            f.write(json.dumps(rec) + "\n")


def read_wav(name):
    with wave.open(os.path.join(OUT, name), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def hf_messages(q, a):
    parts, rest = [], q
    while rest.startswith("<audio>") or rest.startswith("<image>"):
        parts.append({"type": "audio" if rest.startswith("<audio>") else "image"})
        rest = rest[7:]
    parts.append({"type": "text", "text": rest})
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": a}]}]


def encode(proc, auds, imgs, q, a):
    msgs = hf_messages(q, a)
    full = proc.apply_chat_template(msgs, tokenize=False)
    prefix = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix) and full.endswith("<|im_end|>\n")
    kw = dict(return_tensors="pt")
    if auds:
        kw["audio"] = [read_wav(p) for p in auds]
    if imgs:
        kw["images"] = [Image.open(os.path.join(OUT, p)).convert("RGB") for p in imgs]
    e = proc(text=full, **kw)
    p = proc(text=prefix, **kw)
    ids, pids = e["input_ids"][0], p["input_ids"][0]
    assert torch.equal(ids[:len(pids)], pids)
    nl = proc.tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert ids[-1].item() == nl[-1]
    labels = ids.clone()
    labels[:len(pids)] = -100
    labels[-1] = -100   # the newline after <|im_end|>
    # (the attention mask goes in too, as a trainer's collator passes it: without one the thinker
    # falls back to plain 0..T-1 positions instead of TMRoPE's image positions)
    inputs = dict(e)
    inputs["labels"] = labels[None]
    return inputs


def train(model, params, data, steps, lr):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for s in range(steps):
        out = model(**data[s % len(data)])
        opt.zero_grad()
        out.loss.backward()
        for p in params:   # a step with no gradient for a tensor: zeros, as mmc's AdamW steps every tensor
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        losses.append(out.loss.item())
    return losses


def load_base(audio=False, vision=False):
    m = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32)
    m.train()
    for n, p in m.named_parameters():   # (live names: model.audio_tower.*, model.visual.*)
        p.requires_grad_(("audio_tower." not in n or audio) and ("visual." not in n or vision))
    return m


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    write_data()
    proc = Qwen2_5OmniProcessor.from_pretrained(BASE)
    data = [encode(proc, *s) for s in SAMPLES]
    for d, s in zip(data, SAMPLES):
        print(s[2], "T", d["input_ids"].shape[1], "labels", int((d["labels"] != -100).sum()))

    torch.manual_seed(0)
    base = load_base()
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS))
    pm.save_pretrained(os.path.join(OUT, "lora_init"))
    pm.train()
    losses = train(pm, [p for p in pm.parameters() if p.requires_grad], data, 20, 5e-3)
    with open(os.path.join(OUT, "lora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    pm.save_pretrained(os.path.join(OUT, "lora_ref"))
    # base + lora_ref on the first question with the generation prompt: the last position's logits
    pm.eval()
    msgs = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What colour is the square?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    enc = proc(text=text, audio=[read_wav("a0.wav")], return_tensors="pt")
    with torch.no_grad():
        lg = pm(**enc).logits[0, -1]
    with open(os.path.join(OUT, "lora_ref.logits.txt"), "w") as f:
        f.write(" ".join("%.8g" % v for v in lg.tolist()) + "\n")
    for d in ("lora_init", "lora_ref"):   # a path relative to the repository root
        p = os.path.join(OUT, d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = "tests/fixtures/omni/thinker"
        json.dump(j, open(p, "w"), indent=2)
    print("lora", losses)

    torch.manual_seed(0)
    model = load_base()
    losses = train(model, [p for p in model.parameters() if p.requires_grad], data, 6, 1e-3)
    with open(os.path.join(OUT, "full_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    print("full", losses)

    for name, kw in (("full_audio", dict(audio=True)), ("full_all", dict(audio=True, vision=True))):
        torch.manual_seed(0)
        model = load_base(**kw)
        losses = train(model, [p for p in model.parameters() if p.requires_grad], data, 8, 1e-3)
        with open(os.path.join(OUT, name + "_losses.txt"), "w") as f:
            f.write("".join("%.8f\n" % v for v in losses))
        print(name, losses)


if __name__ == "__main__":
    main()
