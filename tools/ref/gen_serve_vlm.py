"""gen_serve_vlm.py — PEFT LoRA adapters on the tiny LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision and InternVL
fixtures for tests/test_serve_vlm.sh (`mmc serve`'s image prefix cache and per-request LoRA on every VLM family
it serves), and transformers + PEFT's greedy tokens for one image chat with each adapter and with the base.

  /work/main/.venv-ref/bin/python tools/ref/gen_serve_vlm.py   # writes tests/fixtures/serve_vlm/

Bases (as their own generators wrote them): tests/fixtures/llava/v5 (tools/ref/gen_llava.py),
llava_next/next and llava_onevision/ov (gen_llava_next.py), internvl/v5 (gen_internvl.py). Per family
<name>/lora: written by PEFT's save_pretrained untouched, r 4, lora_alpha 8, dropout 0, init_lora_weights=False
(random non-zero B, so the adapter changes the greedy answer), on the language model's q_proj, v_proj and
gate_proj and the projector's linear_1 (so the image features differ with the adapter too).
expected.json: per family the base directory, the question, the image (tests/fixtures/e2e/shapes_160x120.png)
and the greedy new token ids of generate (do_sample False, max_new_tokens 10; the processor's PIL backend, the
chat template of the directory) for "base" and "lora".
"""
import json
import os
import subprocess
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # deterministic, as every generator here
    os.environ["PYTHONHASHSEED"] = "0"
    sys.exit(subprocess.call([sys.executable] + sys.argv))

import torch
from peft import LoraConfig, get_peft_model
from PIL import Image
from transformers import (AutoImageProcessor, AutoProcessor, InternVLForConditionalGeneration,
                          LlavaForConditionalGeneration, LlavaNextForConditionalGeneration,
                          LlavaOnevisionForConditionalGeneration)

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = "tests/fixtures/serve_vlm"
IMAGE = "tests/fixtures/e2e/shapes_160x120.png"
QUESTION = "What colour is the square?"
MAX_NEW = 10
FAMILIES = {   # name: (base directory, class)
    "llava": ("tests/fixtures/llava/v5", LlavaForConditionalGeneration),
    "llava_next": ("tests/fixtures/llava_next/next", LlavaNextForConditionalGeneration),
    "llava_onevision": ("tests/fixtures/llava_onevision/ov", LlavaOnevisionForConditionalGeneration),
    "internvl": ("tests/fixtures/internvl/v5", InternVLForConditionalGeneration),
}
TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|v)_proj|mlp\.gate_proj)|.*multi_modal_projector\.linear_1"


def greedy(model, inputs):
    with torch.no_grad():
        g = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    return g[0, inputs["input_ids"].shape[1]:].tolist()


def main():
    image = Image.open(IMAGE).convert("RGB")
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    out = {"image": IMAGE, "question": QUESTION, "max_new_tokens": MAX_NEW, "families": {}}
    for seed, (name, (base, cls)) in enumerate(FAMILIES.items()):
        proc = AutoProcessor.from_pretrained(base)
        proc.image_processor = AutoImageProcessor.from_pretrained(base, backend="pil")   # mmc's processors
        text = proc.apply_chat_template(conv, add_generation_prompt=True)
        inputs = proc(images=[image], text=text, return_tensors="pt")
        load = lambda: cls.from_pretrained(base, dtype=torch.float32).eval()
        fam = {"base_dir": base, "n_prompt": int(inputs["input_ids"].shape[1]), "new_ids": {}}
        fam["new_ids"]["base"] = greedy(load(), inputs)
        torch.manual_seed(100 + seed)
        cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
        pm = get_peft_model(load(), cfg).eval()
        pm.save_pretrained(os.path.join(OUT, name, "lora"))
        fam["new_ids"]["lora"] = greedy(pm, inputs)
        assert fam["new_ids"]["lora"] != fam["new_ids"]["base"], f"{name}: the adapter leaves the answer: {fam}"
        out["families"][name] = fam
        print(name, fam)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
