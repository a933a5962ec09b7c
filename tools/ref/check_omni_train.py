"""check_omni_train.py — tests/test_omni_train.sh's reference check of mmc's Qwen2.5-Omni training
checkpoints: PEFT loads the LoRA checkpoint onto the fixture thinker, transformers loads the full
checkpoint, and each gives the last logits `mmc forward` gave on the same audio question (within
1e-4).

  python tools/ref/check_omni_train.py LORA_DIR LORA_MMC.safetensors FULL_DIR FULL_MMC.safetensors A.wav
"""
import sys
import wave

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration
from peft import PeftModel

BASE = "tests/fixtures/omni/thinker"


def main():
    lora_dir, lora_out, full_dir, full_out, wav = sys.argv[1:6]
    with wave.open(wav, "rb") as w:
        audio = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
    proc = Qwen2_5OmniProcessor.from_pretrained(BASE)
    msgs = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What colour is the square?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    enc = proc(text=text, audio=[audio], return_tensors="pt")
    ok = True
    for name, model, out in (
            ("PEFT on mmc's LoRA checkpoint",
             PeftModel.from_pretrained(Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(BASE), lora_dir),
             lora_out),
            ("transformers on mmc's full checkpoint",
             Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(full_dir), full_out)):
        model.float().eval()
        with torch.no_grad():
            ref = model(**enc).logits[0, -1]
        got = load_file(out)["last_logits"].flatten()
        d = (ref - got).abs().max().item()
        print("%s: max |logit - mmc forward's| = %.3g" % (name, d))
        ok = ok and d <= 1e-4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
