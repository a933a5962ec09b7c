"""check_internvl_train.py — tests/test_internvl_train.sh's reference side.

  python tools/ref/check_internvl_train.py LORA_CKPT LORA_REF FULL_CKPT FULL_FWD.safetensors IMAGE [MERGED_FWD]

LoRA: PEFT loads mmc's adapter checkpoint (LORA_CKPT, after the 20 steps) on its recorded base;
every lora_A / lora_B tensor is compared with PEFT's own 20-step adapter (LORA_REF, trained on
the same data by gen_internvl_train.py): max |diff| <= 2e-3 (AdamW amplifies float rounding
in early steps; measured 1e-4), and the two adapted models' logits on FULL_FWD's prompt + IMAGE
within 2e-3. Full: transformers loads mmc's full fine-tuning checkpoint (FULL_CKPT); its logits
on the input_ids `mmc forward` used (FULL_FWD, with IMAGE's tiles from GotOcr2ImageProcessor,
PIL backend) must equal mmc's within 1e-4 at the text positions. MERGED_FWD: `mmc forward` of
LORA_REF merged by `mmc merge` (same prompt and image) — PEFT's logits with LORA_REF within 1e-4
at the text positions.

TEXT_ROWS: the logits at the <IMG_CONTEXT> positions themselves (never scored in training) differ
by up to 4e-3 on this tiny random model for the upscaled 150x47 image, the text positions after
it by 5e-5 — the same with the base model (mmc forward's inference path), so not a property of
the checkpoint.
"""
import json
import sys

import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import GotOcr2ImageProcessor, InternVLForConditionalGeneration
from peft import PeftModel

TOL_W, TOL_LORA, TOL_FULL = 2e-3, 2e-3, 1e-4


def logits(model, ids, pv):
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pv).logits[0]


def main():
    lora, lora_ref, full, full_fwd, image = sys.argv[1:6]
    ok = True
    fwd = load_file(full_fwd)
    ids = fwd["input_ids"].long()[None]
    ip = GotOcr2ImageProcessor.from_pretrained(full)
    pv = ip([Image.open(image).convert("RGB")], crop_to_patches=True, return_tensors="pt")["pixel_values"]

    model = InternVLForConditionalGeneration.from_pretrained(full, dtype=torch.float32).eval()
    text = ids[0] != model.config.image_token_id   # (see TEXT_ROWS)
    d = (logits(model, ids, pv) - fwd["logits"])[text].abs().max().item()
    print("full checkpoint in transformers: max |logit - mmc's| (text positions) = %.3g" % d)
    ok &= d <= TOL_FULL

    base = json.load(open(lora + "/adapter_config.json"))["base_model_name_or_path"]
    got = load_file(lora + "/adapter_model.safetensors")
    ref = load_file(lora_ref + "/adapter_model.safetensors")
    if sorted(got) != sorted(ref):
        print("adapter tensor names differ: %s" % sorted(set(got) ^ set(ref)))
        ok = False
    else:
        d = max((got[k] - ref[k]).abs().max().item() for k in ref)
        print("LoRA weights after 20 steps: max |mmc - PEFT| = %.3g" % d)
        ok &= d <= TOL_W
    out = []
    for a in (lora, lora_ref):
        m = InternVLForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
        out.append(logits(PeftModel.from_pretrained(m, a).eval(), ids, pv))
    d = (out[0] - out[1]).abs().max().item()
    print("mmc's adapter in PEFT vs PEFT's adapter: max |logit diff| = %.3g" % d)
    ok &= d <= TOL_LORA
    if len(sys.argv) > 6:
        mg = load_file(sys.argv[6])
        if not torch.equal(mg["input_ids"].long(), ids[0]):
            print("the merged forward used other input_ids")
            ok = False
        else:
            d = (out[1] - mg["logits"])[text].abs().max().item()
            print("mmc merge of PEFT's adapter in mmc forward vs PEFT: max |logit diff| (text positions) = %.3g" % d)
            ok &= d <= TOL_FULL
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
