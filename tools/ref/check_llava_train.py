"""check_llava_train.py — tests/test_llava_train.sh's reference side: mmc's LLaVA training
checkpoints loaded by PEFT (the LoRA adapter directory, on its recorded base) and by
transformers (the full fine-tuning directory); the last-position logits of the test's prompt +
image must equal those `mmc forward` wrote for the same checkpoint within 1e-4.

  python tools/ref/check_llava_train.py LORA_CKPT LORA_FWD.safetensors FULL_CKPT FULL_FWD.safetensors IMAGE
"""
import sys

import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoProcessor, LlavaForConditionalGeneration
from peft import PeftModel

PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"
TOL = 1e-4


def last_logits(model, proc, image):
    enc = proc(text=PROMPT, images=[Image.open(image).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[0, -1]


def main():
    lora, lora_fwd, full, full_fwd, image = sys.argv[1:6]
    ok = True
    import json
    base = json.load(open(lora + "/adapter_config.json"))["base_model_name_or_path"]
    proc = AutoProcessor.from_pretrained(base)
    m = LlavaForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
    pm = PeftModel.from_pretrained(m, lora).eval()
    for name, model, fwd in (("lora", pm, lora_fwd), ("full", None, full_fwd)):
        if model is None:
            model = LlavaForConditionalGeneration.from_pretrained(full, dtype=torch.float32).eval()
            proc = AutoProcessor.from_pretrained(full)
        ref = last_logits(model, proc, image)
        got = load_file(fwd)["last_logits"]
        d = (ref - got).abs().max().item()
        print("%s: max |mmc - reference| = %.3g" % (name, d))
        ok &= d <= TOL
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
