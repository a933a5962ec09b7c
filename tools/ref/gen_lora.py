"""gen_lora.py — LoRA / QLoRA fixtures for tests/test_lora.c (PEFT 0.21.2, bitsandbytes 0.50.2).

  python tools/ref/gen_lora.py            # write tests/fixtures/lora/*


Base: the tiny Qwen2 of tests/fixtures/qwen2/tiny. PEFT adapter: r 4, alpha 8, targets
q_proj, v_proj, gate_proj, init_lora_weights=False (random non-zero B), dropout 0.
NF4: bitsandbytes.functional.quantize_4bit(nf4, blocksize 64) with and without
compress_statistics on fixed matrices, and the dequantised results.
mmc's adapter (tests/fixtures/lora/mmc_adapter: r 2, alpha 5, k_proj + down_proj + one o_proj,
as mmc_lora_save writes it for test_lora.c's recipe; an input here, and test_lora.c checks mmc
still writes exactly it): PEFT loads it onto the base and computes the logits
mmc_adapter/peft_logits.safetensors, the golden for mmc's logits with that adapter.
"""
import os
import torch
from safetensors.torch import save_file, load_file
from transformers import AutoModelForCausalLM
from peft import LoraConfig, PeftModel, get_peft_model

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BASE = os.path.join(ROOT, "tests/fixtures/qwen2/tiny")
OUT = os.path.join(ROOT, "tests/fixtures/lora")


def ids():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 320, (2, 11), generator=g)


def base():
    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()


def gen():
    torch.manual_seed(0)
    x = ids()
    out = {"ids": x}
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "gate_proj"],
                     init_lora_weights=False, task_type="CAUSAL_LM")
    pm = get_peft_model(base(), cfg).eval()
    with torch.no_grad():
        out["logits"] = pm(input_ids=x).logits.contiguous()
    pm.save_pretrained(os.path.join(OUT, "peft_adapter"))
    merged = pm.merge_and_unload()
    with torch.no_grad():
        out["merged_logits"] = merged(input_ids=x).logits.contiguous()
    sd = merged.state_dict()
    for k in ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate_proj.weight",
              "model.layers.1.self_attn.k_proj.weight"]:
        out["merged." + k] = sd[k].contiguous()
    with torch.no_grad():
        out["base_logits"] = base()(input_ids=x).logits.contiguous()
    save_file(out, os.path.join(OUT, "ref.safetensors"))

    import bitsandbytes.functional as F
    q = {}
    g = torch.Generator().manual_seed(3)
    mats = {"w1": torch.randn(24, 128, generator=g) * 0.05,
            "w2": torch.randn(300, 128, generator=g) * 0.02}   # 600 blocks: 3 double-quant blocks
    mats["w2"][5, :64] = 0.0                                      # an all-zero block
    mats["w2"][7, 3] = 1.5                                        # an outlier
    for name, w in mats.items():
        q[name] = w.contiguous()
        for dq in (False, True):
            codes, st = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=dq)
            tag = f"{name}.{'dq' if dq else 'plain'}"
            q[tag + ".codes"] = codes.reshape(-1).contiguous()
            q[tag + ".dequant"] = F.dequantize_4bit(codes, st).contiguous()
            if dq:
                q[tag + ".qabsmax"] = st.absmax.contiguous()
                q[tag + ".absmax2"] = st.state2.absmax.float().contiguous()
                q[tag + ".offset"] = st.offset.reshape(1).float().contiguous()
                q["dynamic_map"] = st.state2.code.float().contiguous()
            else:
                q[tag + ".absmax"] = st.absmax.float().contiguous()
    q["nf4_code"] = F.get_4bit_type("nf4", device="cpu").float().contiguous()
    save_file(q, os.path.join(OUT, "nf4.safetensors"))
    print("wrote", OUT)


def mmc_adapter():
    d = os.path.join(OUT, "mmc_adapter")
    pm = PeftModel.from_pretrained(base(), d).eval()
    n_lora = sum(1 for n, _ in pm.named_modules() if n.endswith("lora_A"))
    assert n_lora == 5, f"PEFT adapted {n_lora} modules of {d}, expected 5"
    x = ids()
    with torch.no_grad():
        logits = pm(input_ids=x).logits.contiguous()
    save_file({"ids": x, "logits": logits}, os.path.join(d, "peft_logits.safetensors"))
    print("wrote", os.path.join(d, "peft_logits.safetensors"), f"({n_lora} adapted modules)")


if __name__ == "__main__":
    gen()
    mmc_adapter()
