"""Tiny random InternVL checkpoints (transformers' HF-native InternVLForConditionalGeneration: InternViT
tower, pixel shuffle + multi_modal_projector, Qwen2 language model) and what transformers computes on
them, for tests/test_internvl.c and tests/test_internvl_cli.sh.

Writes tests/fixtures/internvl/:
  v5/      model.save_pretrained + processor.save_pretrained, untouched. Qwen2 with GQA (4 query heads,
           2 kv heads, head_dim 8), untied head; InternViT with 3 heads of 12, LayerNorm, attention bias,
           3 layers, 56x56 tiles in 14x14 patches (4x4 grid -> 2x2 = 4 tokens per tile after the 0.5
           pixel shuffle), vision_feature_layer -2; processor: crop_to_patches, min 1 / max 6 tiles
           (the 160x120 image -> a 3x2 grid + thumbnail = 7 tiles), bicubic.
  v5_rms/  a second config: norm_type rms_norm, use_qk_norm, no attention bias, use_mean_pooling false
           with vision_feature_layer -1 (the tower's final LayerNorm applies), 84x84 processor tiles on a
           56x56 tower (position embeddings interpolated bicubically, 6x6 grid -> 9 tokens per tile),
           max 2 tiles (a 2x1 grid + thumbnail), bilinear resize, tied head, gelu_pytorch_tanh projector.
  ref.safetensors  per directory: pixel_values (GotOcr2ImageProcessor, PIL backend, of
           tests/fixtures/e2e/shapes_160x120.png), ids (InternVLProcessor's expansion of the templated
           prompt), logits [1, T, V], greedy 8 new tokens.
  expected.json  the prompt, the chat-templated prompt and the greedy text per directory.
  expected.tsv, <dir>.image.logits.txt  the same for the shell test.
The tokenizer is the fixture tokenizer (tests/fixtures/tokenizer, byte-level BPE) with InternVL's <img>,
</img>, <IMG_CONTEXT> and <video> added as special tokens and named in extra_special_tokens, as the
InternVL*-hf tokenizers do.
Run: .venv-ref/bin/python tools/ref/gen_internvl.py
"""
import json
import os
import shutil
import subprocess
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # deterministic set / dict orders in the libraries
    os.environ["PYTHONHASHSEED"] = "0"
    sys.exit(subprocess.call([sys.executable] + sys.argv))

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (AutoImageProcessor, AutoProcessor, AutoTokenizer, GotOcr2ImageProcessor, InternVLConfig,
                          InternVLForConditionalGeneration, InternVLProcessor, InternVLVideoProcessor, Qwen2Config)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "internvl")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(20)

SPECIAL = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
           "video_token": "<video>"}
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
tok.add_special_tokens({"additional_special_tokens": list(SPECIAL.values())})
tok_dir = os.path.join(OUT, "_tok")
tok.save_pretrained(tok_dir)
tok = AutoTokenizer.from_pretrained(tok_dir, extra_special_tokens=SPECIAL)
shutil.rmtree(tok_dir)
IMG = tok.convert_tokens_to_ids("<IMG_CONTEXT>")
V = len(tok)
# OpenGVLab/InternVL3-*-hf's template (a default system message; an image part writes <IMG_CONTEXT>,
# which InternVLProcessor expands to <img><IMG_CONTEXT>*N</img>)
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\n你是InternVL。<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for content in message['content'] %}"
            "{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}{% elif content['type'] == 'video' %}"
            "{{ '<video>\n' }}{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
            "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")


def config(rms):
    text = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       rms_norm_eps=1e-6, tie_word_embeddings=rms, rope_parameters={"rope_type": "default",
                                                                                     "rope_theta": 1000000.0},
                       eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0)
    vision = dict(hidden_size=36, intermediate_size=52, num_hidden_layers=3, num_attention_heads=3,
                  image_size=56, patch_size=14, attention_bias=not rms, use_qk_norm=rms,
                  norm_type="rms_norm" if rms else "layer_norm", use_mean_pooling=not rms,
                  layer_scale_init_value=0.1, layer_norm_eps=1e-6)
    return InternVLConfig(text_config=text.to_dict(), vision_config=vision, image_token_id=IMG,
                          downsample_ratio=0.5, projector_hidden_act="gelu_pytorch_tanh" if rms else "gelu",
                          vision_feature_layer=-1 if rms else -2, vision_feature_select_strategy="default",
                          image_seq_length=9 if rms else 4, tie_word_embeddings=rms)


def model(rms):
    m = InternVLForConditionalGeneration(config(rms)).float().eval()
    g = torch.Generator().manual_seed(21 + 7 * rms)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n or "lambda" in n:   # zero / one / 0.1 at init: make them matter
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if "cls_token" in n or "position_embeddings" in n:       # zero at init
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            if "embed_tokens" in n or "lm_head" in n or "linear_" in n:
                p.mul_(8.0)                                          # logits of magnitude ~1
            if rms and ("o_proj" in n or "down_proj" in n):   # tied head: let the layers move h off the input
                p.mul_(6.0)
    return m


def processor(rms):
    side = 84 if rms else 56
    ip = GotOcr2ImageProcessor(size={"height": side, "width": side}, crop_to_patches=True, min_patches=2 if rms else 1,
                               max_patches=2 if rms else 6, resample=2 if rms else 3,
                               image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    return InternVLProcessor(image_processor=ip, tokenizer=tok, video_processor=InternVLVideoProcessor(), image_seq_length=9 if rms else 4,
                             chat_template=TEMPLATE)


image = Image.open(os.path.join(ROOT, "e2e", "shapes_160x120.png")).convert("RGB")
PROMPT = "What is in the image?"
conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
ref, expected = {}, {}
for name, rms in (("v5", False), ("v5_rms", True)):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    m = model(rms)
    m.generation_config.max_new_tokens = 8
    m.generation_config.do_sample = False
    m.save_pretrained(d)
    processor(rms).save_pretrained(d)
    # everything below from the directory as saved
    proc = AutoProcessor.from_pretrained(d)   # the video processor has no PIL backend: swap the image one
    proc.image_processor = AutoImageProcessor.from_pretrained(d, backend="pil")
    fast = AutoProcessor.from_pretrained(d)
    m = InternVLForConditionalGeneration.from_pretrained(d).float().eval()
    text = proc.apply_chat_template(conv, add_generation_prompt=True)
    inputs = proc(images=image, text=text, return_tensors="pt")
    with torch.no_grad():
        out = m(**inputs, output_hidden_states=False)
        logits = out.logits
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        vis = m.model.vision_tower(pixel_values=inputs["pixel_values"], output_hidden_states=True)
        feats = m.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
    T = inputs["input_ids"].shape[1]
    fin = fast(images=image, text=text, return_tensors="pt")
    assert torch.equal(fin["input_ids"], inputs["input_ids"])
    ref[name + ".ids"] = inputs["input_ids"].to(torch.int64)
    ref[name + ".pixel_values"] = inputs["pixel_values"].float()
    ref[name + ".vision_last"] = vis.hidden_states[-1].float()        # the last layer's output
    ref[name + ".image_features"] = feats.float()                     # [tiles, tokens, C]
    ref[name + ".logits"] = logits.float()
    ref[name + ".greedy"] = g[:, T:].to(torch.int64)
    expected[name] = {"prompt": PROMPT, "templated": text, "n_prompt": T, "n_tiles": int(inputs["pixel_values"].shape[0]),
                      "n_vision_hidden_states": len(vis.hidden_states),
                      "greedy_ids": g[0, T:].tolist(), "greedy_text": tok.decode(g[0, T:]),
                      "image_processor_class": type(proc.image_processor).__name__,
                      "default_image_processor_class": type(fast.image_processor).__name__}

save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
rows = []
for d in ("v5", "v5_rms"):
    lk, gk = d + ".logits", d + ".greedy"
    last = ref[lk][0, -1]
    rows.append("\t".join([d, "image", str(ref[lk].shape[1]), ",".join(str(int(x)) for x in ref[gk][0]),
                           str(int(last.argmax()))]))
    with open(os.path.join(OUT, f"{d}.image.logits.txt"), "w") as f:
        f.write("".join(f"{float(x):.9g}\n" for x in last))
with open(os.path.join(OUT, "expected.tsv"), "w") as f:
    f.write("# dir\tcase\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_internvl.py)\n" + "\n".join(rows) + "\n")
json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=2, ensure_ascii=False)
print({k: list(v.shape) for k, v in ref.items()})
print(json.dumps(expected, indent=1, ensure_ascii=False)[:3000])
