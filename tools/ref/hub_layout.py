"""The Hub's 4.4x layout of a Qwen2-VL / Qwen2.5-VL checkpoint, written from a transformers 5.x
save_pretrained directory: checkpoint keys visual.* / model.* / lm_head.* (bf16 matrices, f32
vectors, as the Hub has them), and an un-nested config.json (text fields at the top,
rope_scaling {type: mrope}, torch_dtype bfloat16, vision in_chans). Shared by gen_qwen2_vl.py and
gen_e2e.py, which add their own files (architectures, processor configs)."""
import json
import os

import torch
from safetensors.torch import load_file, save_file


def model_to_hub(src, dst, arch):
    """Weights and config.json of src (5.x layout) into dst (4.4x layout); arch: q2 or q25."""
    os.makedirs(dst, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            k = k[len("model."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        assert k.startswith(("visual.", "model.", "lm_head.")), k
        out[k] = v.to(torch.bfloat16) if v.dim() >= 2 else v
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    c = json.load(open(os.path.join(src, "config.json")))
    t = c.pop("text_config")
    rp = t.pop("rope_parameters")
    for k in ["model_type", "layer_types", "dtype"]:
        t.pop(k, None)
    c.update(t)
    c["rope_theta"] = rp["rope_theta"]
    c["rope_scaling"] = {"type": "mrope", "mrope_section": rp["mrope_section"]}
    c.pop("dtype", None)
    c["torch_dtype"] = "bfloat16"   # as on the Hub (matrices are bf16 here; vectors f32)
    vc = c["vision_config"]
    vc["in_chans"] = vc.pop("in_channels")
    vc.pop("rope_parameters", None)
    vc["model_type"] = "qwen2_vl" if arch == "q2" else "qwen2_5_vl"
    if arch == "q25":
        vc["spatial_patch_size"] = vc["patch_size"]
    return c
