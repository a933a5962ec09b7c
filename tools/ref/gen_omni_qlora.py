"""gen_omni_qlora.py — the Qwen2.5-Omni thinker's QLoRA training reference for tests/test_omni_train.sh
(transformers 5.23, PEFT 0.21, bitsandbytes 0.50, torch CPU fp32).

  python tools/ref/gen_omni_qlora.py     # writes tests/fixtures/omni_train/qlora_losses.txt

The same base, data, samples and optimiser as gen_omni_train.py's LoRA run (whose fixtures it reads:
data.jsonl, a0/a1.wav, img0.png, lora_init/), with the base loaded through transformers'
BitsAndBytesConfig: the LM's decoder projections (q/k/v/o/gate/up/down of every layer) as
bitsandbytes Linear4bit in NF4 (blocks of 64, fp32 absmax, no double quantisation, fp32 compute) —
what mmc's `model.quantization: {method: nf4}` quantises; the audio encoder, the vision tower and
lm_head stay dense (llm_int8_skip_modules). PEFT's LoRA (r 4, alpha 8, the LM's seven projections)
starts from lora_init/ and trains 20 steps at lr 5e-3 in file order.

  qlora_losses.txt   per-step loss of those 20 QLoRA steps

Status: not yet a test. mmc's QLoRA on the same run (`model.quantization.method: nf4`, lora_init) does
not match it: first loss 7.05125 against 7.04207 here (float LoRA: 7.04905), max difference over the
20 steps 0.105. The reference itself is checked: the LM projections replaced by
dequantize_4bit(quantize_4bit(W, 64, nf4)) in a float thinker give its first loss exactly (7.0420709),
and the same with W transposed gives 7.05221 (not mmc's either). The fixture's LM is 16 wide, so each
64-element NF4 block spans 4 rows of W — a case real checkpoints (K a multiple of 64) never meet;
where mmc departs from bitsandbytes for it is open.
"""
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from peft import PeftModel
from transformers import BitsAndBytesConfig, Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_omni_train import BASE, OUT, SAMPLES, encode, train  # noqa: E402


def main():
    proc = Qwen2_5OmniProcessor.from_pretrained(BASE)
    data = [encode(proc, *s) for s in SAMPLES]
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False,
                           bnb_4bit_compute_dtype=torch.float32,
                           llm_int8_skip_modules=["model.audio_tower", "model.visual", "lm_head"])
    torch.manual_seed(0)
    base = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32, quantization_config=q,
                                                                      device_map="cpu")
    n4 = [n for n, m in base.named_modules() if type(m).__name__ == "Linear4bit"]
    assert len(n4) == 7 * base.config.text_config.num_hidden_layers and all(".language_model.layers." in n for n in n4), n4
    for n, p in base.named_parameters():   # frozen base: only the adapter trains
        p.requires_grad_(False)
    pm = PeftModel.from_pretrained(base, os.path.join(OUT, "lora_init"), is_trainable=True)
    pm.train()
    losses = train(pm, [p for p in pm.parameters() if p.requires_grad], data, 20, 5e-3)
    with open(os.path.join(OUT, "qlora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    print("qlora", losses)


if __name__ == "__main__":
    main()
