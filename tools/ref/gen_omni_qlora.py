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

bitsandbytes 0.50's native CPU dequantize_4bit (cdequantize_blockwise_cpu_nf4_fp32, used by
MatMul4Bit's forward and backward) indexes the absmax of row r, column k as r * (K // 64) + k // 64: right
when K is a multiple of 64, wrong otherwise (K = 16 here: every row takes absmax[0], and the 64-element
blocks that quantize_4bit made, which run across 4 rows of the flattened weight, are not the ones it
scales back). Its own pure-torch dequantize_4bit (backends/default, what the CUDA / MPS kernels match and
what its quantize_4bit inverts) is registered for the CPU here instead; the check below shows the two
differ on this fixture's 16-wide weights and agree on 64-wide ones. With the native kernel the first
loss was 7.04207 (mmc: 7.05125, the float LoRA 7.04905): the old fixture measured that CPU bug, not NF4.
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


def use_reference_dequantize():
    """bitsandbytes' CPU dequantize_4bit -> its pure-torch one (see the docstring); checked."""
    import bitsandbytes.functional as bf
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    g = torch.Generator().manual_seed(1)
    w16, w64 = torch.randn(16, 16, generator=g), torch.randn(4, 64, generator=g)
    native = [bf.dequantize_4bit(*bf.quantize_4bit(w, blocksize=64, quant_type="nf4")) for w in (w16, w64)]

    def dequantize(A, absmax, blocksize, quant_type, shape, dtype):
        A = A.view(torch.uint8) if A.dtype != torch.uint8 else A
        return _dequantize_4bit_compute(A.reshape(-1), absmax, _get_4bit_code(quant_type, A.device), blocksize, shape,
                                        dtype)

    torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu", dequantize)
    fixed = [bf.dequantize_4bit(*bf.quantize_4bit(w, blocksize=64, quant_type="nf4")) for w in (w16, w64)]
    assert torch.equal(native[1], fixed[1]), "the pure-torch dequantize_4bit differs from the native one at K = 64"
    assert (native[0] - fixed[0]).abs().max() > 0.1, "bitsandbytes' CPU dequantize_4bit now handles K = 16: drop this"
    assert (fixed[0] - w16).abs().max() <= w16.abs().max() * 0.15, "pure-torch NF4 round trip too far from W"


def main():
    use_reference_dequantize()
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
