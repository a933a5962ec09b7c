"""check_llava_train.py — tests/test_llava_train.sh's reference side: mmc's LLaVA training
checkpoints loaded by PEFT (the LoRA adapter directory, on its recorded base) and by
transformers (the full fine-tuning directory); the last-position logits of the test's prompt +
image must equal those `mmc forward` wrote for the same checkpoint within 1e-4.

  python tools/ref/check_llava_train.py LORA_CKPT LORA_FWD.safetensors FULL_CKPT FULL_FWD.safetensors IMAGE [--chat]

--chat (tests/test_llava_train_anyres.sh: LLaVA-NeXT / OneVision): the prompt rendered by the
checkpoint's chat template with the generation prompt, as `mmc forward --prompt` renders it, and
the PIL image processor (mmc's); the model class from config.json (AutoModelForImageTextToText).
"""
import sys

import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor
from peft import PeftModel

PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"
CHAT_PROMPT = "What is in the picture?"
TOL = 1e-4


def processor(path, chat):
    proc = AutoProcessor.from_pretrained(path)
    if chat:
        proc.image_processor = AutoImageProcessor.from_pretrained(path, backend="pil")
    return proc


def last_logits(model, proc, image, chat):
    text = PROMPT
    if chat:
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": CHAT_PROMPT}]}]
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    enc = proc(text=text, images=[Image.open(image).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[0, -1]


def main():
    lora, lora_fwd, full, full_fwd, image = sys.argv[1:6]
    chat = "--chat" in sys.argv[6:]
    ok = True
    import json
    base = json.load(open(lora + "/adapter_config.json"))["base_model_name_or_path"]
    proc = processor(base, chat)
    m = AutoModelForImageTextToText.from_pretrained(base, dtype=torch.float32)
    pm = PeftModel.from_pretrained(m, lora).eval()
    for name, model, fwd in (("lora", pm, lora_fwd), ("full", None, full_fwd)):
        if model is None:
            model = AutoModelForImageTextToText.from_pretrained(full, dtype=torch.float32).eval()
            proc = processor(full, chat)
        ref = last_logits(model, proc, image, chat)
        got = load_file(fwd)["last_logits"]
        d = (ref - got).abs().max().item()
        print("%s: max |mmc - reference| = %.3g" % (name, d))
        ok &= d <= TOL
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
