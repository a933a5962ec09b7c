"""Tiny random LLaVA-1.5 checkpoints (LlavaForConditionalGeneration: CLIP vision tower, Llama
language model) and what transformers computes on them, for tests/test_llava.c and
tests/test_llava_cli.sh.

Writes tests/fixtures/llava/:
  v5/        model.save_pretrained + processor.save_pretrained, untouched. Note: transformers 5.23 saves
             LLaVA under its legacy names (vision_tower.* without vision_model., multi_modal_projector.*,
             language_model.model.*, language_model.lm_head.*, config image_token_index), with a
             nested text_config and rope_parameters. Llama with GQA (6 query heads, 2 kv heads,
             head_dim 8), llama3 rope scaling; CLIP tower with 3 heads of 10, 30x30 images in 6x6
             patches, vision_feature_layer -2, strategy "default"; untied head.
  v5_full/   a second config: vision_feature_layer [-3, -1] (a list), strategy "full",
             attention_bias and mlp_bias, linear rope scaling, tied embeddings, gelu_pytorch_tanh
             projector.
  v452/      v5's checkpoint as transformers 4.52-4.57 write it: model.vision_tower.vision_model.*,
             model.multi_modal_projector.*, model.language_model.*, lm_head.*, config image_token_id.
  hub_llama/ the Hub layout with Llama's SentencePiece BPE tokenizer (see hub_llama() below).
  hub/       v5's weights and settings in the Hub's 4.4x layout: vision_tower.vision_model.* /
             multi_modal_projector.* / language_model.model.* / language_model.lm_head.*, bf16
             matrices (the weights are rounded to bf16 first, so the copy is lossless), config with
             image_token_index, text rope_scaling + rope_theta, torch_dtype; preprocessor_config.json
             and chat_template.json instead of processor_config.json / chat_template.jinja.
  ref.safetensors  pixel_values (CLIPImageProcessor, PIL backend, of tests/fixtures/e2e/shapes_160x120.png),
             pixel_values_torchvision (the default "fast" backend), ids (the processor's expansion of
             one <image> + text), logits [1, T, V] per directory, greedy new tokens per directory.
  expected.json  the prompt, the chat-templated prompt and the greedy text per directory.
  expected.tsv, <dir>.<case>.logits.txt  the same for the shell test (cases image and, for v5,
             image_torchvision: the default torchvision processor's pixels).
The tokenizer is the fixture tokenizer (tests/fixtures/tokenizer, byte-level BPE) with <image> added.
Run: .venv-ref/bin/python tools/ref/gen_llava.py
"""
import json
import os
import shutil

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AutoImageProcessor, AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig,
                          LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, AutoProcessor)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "llava")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(19)

tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
IMG = tok.convert_tokens_to_ids("<image>")
V = len(tok)
# llava-hf/llava-1.5-7b-hf's template without the {% generation %} markers (training-only)
TEMPLATE = ("{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
            "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
            "{{ '<image>\n' }}{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', "
            "'text') %}{{ content['text'] + ' '}}{% endfor %}{% endfor %}{% if add_generation_prompt %}"
            "{{ 'ASSISTANT:' }}{% endif %}")


def config(full):
    text = LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                       rms_norm_eps=1e-5, attention_bias=full, mlp_bias=full, tie_word_embeddings=full,
                       rope_parameters=({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0} if full else
                                        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                         "rope_theta": 500000.0}),
                       eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0)
    vision = CLIPVisionConfig(hidden_size=30, intermediate_size=52, num_hidden_layers=3, num_attention_heads=3,
                              image_size=30, patch_size=6, hidden_act="quick_gelu", layer_norm_eps=1e-5)
    return LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=IMG,
                       projector_hidden_act="gelu_pytorch_tanh" if full else "gelu",
                       vision_feature_layer=[-3, -1] if full else -2,
                       vision_feature_select_strategy="full" if full else "default",
                       tie_word_embeddings=full)


def model(full):
    m = LlavaForConditionalGeneration(config(full)).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n or "layrnorm" in n:   # zero / one at init: make them matter
                p.add_(torch.randn_like(p) * 0.1)
            if "embed" in n or "lm_head" in n or "linear_" in n:
                p.mul_(8.0)                                           # logits of magnitude ~1
            p.copy_(p.to(torch.bfloat16).float())                     # bf16-exact: the hub copy is lossless
    return m


def processor(full):
    ip = CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
    return LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=6, chat_template=TEMPLATE,
                          vision_feature_select_strategy="full" if full else "default",
                          num_additional_image_tokens=1)


image = Image.open(os.path.join(ROOT, "e2e", "shapes_160x120.png")).convert("RGB")
PROMPT = "What is in the image?"
conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
ref, expected = {}, {}
for name, full in (("v5", False), ("v5_full", True)):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    m = model(full)
    m.generation_config.max_new_tokens = 8
    m.generation_config.do_sample = False
    m.save_pretrained(d)
    processor(full).save_pretrained(d)
    # everything below from the directory as saved
    proc = AutoProcessor.from_pretrained(d, backend="pil")
    m = LlavaForConditionalGeneration.from_pretrained(d).float().eval()
    text = proc.apply_chat_template(conv, add_generation_prompt=True)
    inputs = proc(images=image, text=text, return_tensors="pt")
    with torch.no_grad():
        logits = m(**inputs).logits
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    T = inputs["input_ids"].shape[1]
    ref[name + ".ids"] = inputs["input_ids"].to(torch.int64)
    ref[name + ".pixel_values"] = inputs["pixel_values"].float()
    ref[name + ".logits"] = logits.float()
    ref[name + ".greedy"] = g[:, T:].to(torch.int64)
    fast = AutoProcessor.from_pretrained(d)   # transformers 5's default backend (torchvision when installed)
    fin = fast(images=image, text=text, return_tensors="pt")
    ref[name + ".pixel_values_torchvision"] = fin["pixel_values"].float()
    if name == "v5":   # the CLI's --image-backend torchvision case
        with torch.no_grad():
            ref["v5.tv_logits"] = m(**fin).logits.float()
            ref["v5.tv_greedy"] = m.generate(**fin, max_new_tokens=8, min_new_tokens=8, do_sample=False)[:, T:]
    expected[name] = {"prompt": PROMPT, "templated": text, "n_prompt": T,
                      "greedy_ids": g[0, T:].tolist(), "greedy_text": tok.decode(g[0, T:]),
                      "image_processor_class": type(proc.image_processor).__name__,
                      "default_image_processor_class": type(fast.image_processor).__name__}



def convert(dst, layout):
    """v5's checkpoint renamed: layout "hub" (4.4x: vision_tower.vision_model.*, bf16 matrices) or "v452"
    (what transformers 4.52-4.57 write: model.vision_tower.vision_model.*, model.multi_modal_projector.*,
    model.language_model.*, lm_head.*)."""
    src = os.path.join(OUT, "v5")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    out = {}
    for k, v in load_file(os.path.join(src, "model.safetensors")).items():
        if k.startswith("vision_tower."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        if layout == "v452":
            if k.startswith("language_model.model."):
                k = "model.language_model." + k[len("language_model.model."):]
            elif k.startswith("language_model.lm_head."):
                k = k[len("language_model."):]
            else:
                k = "model." + k
        out[k] = v.to(torch.bfloat16) if layout == "hub" and v.dim() >= 2 else v
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    c = json.load(open(os.path.join(src, "config.json")))
    t = c["text_config"]
    if layout == "hub":
        c.pop("dtype", None)
        c["torch_dtype"] = "bfloat16"
        rp = t.pop("rope_parameters")
        t["rope_theta"] = rp.pop("rope_theta")
        t["rope_scaling"] = rp
        t.pop("dtype", None)
        t["torch_dtype"] = "bfloat16"
        c["vision_config"].pop("dtype", None)
    else:
        c["image_token_id"] = c.pop("image_token_index")
    json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    if layout == "hub":
        pc = json.load(open(os.path.join(src, "processor_config.json")))
        ipc = pc.pop("image_processor")
        ipc["processor_class"] = "LlavaProcessor"
        json.dump(ipc, open(os.path.join(dst, "preprocessor_config.json"), "w"), indent=2)
        json.dump({"chat_template": TEMPLATE}, open(os.path.join(dst, "chat_template.json"), "w"), indent=2)
    else:
        for f in ("processor_config.json", "chat_template.jinja"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    # transformers reads the copy back to the same logits
    m = LlavaForConditionalGeneration.from_pretrained(dst, dtype=torch.float32).eval()
    with torch.no_grad():
        lg = m(input_ids=ref["v5.ids"], pixel_values=ref["v5.pixel_values"]).logits
    d = (lg - ref["v5.logits"]).abs().max().item()
    print(layout, "logits vs v5:", d)
    assert d == 0.0, d


for layout in ("hub", "v452"):
    convert(os.path.join(OUT, layout), layout)
    ref[layout + ".logits"] = ref["v5.logits"]
    ref[layout + ".greedy"] = ref["v5.greedy"]
    expected[layout] = expected["v5"]

# hub_llama/: what users download (llava-hf/llava-1.5-7b-hf): the Hub layout with Llama's SentencePiece
# BPE tokenizer (tests/fixtures/llama_tokenizer/llama_tok_hub: byte fallback, legacy Prepend/Replace
# normalizer, tokenizer_class LlamaTokenizer, <image> 640, <pad> 641), eos </s>. Built as v5 is, then
# renamed and cast like hub/; the references from the converted directory as transformers reads it.
def hub_llama():
    global tok, IMG, V
    saved = (tok, IMG, V)
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "llama_tokenizer", "llama_tok_hub"))
    IMG, V = tok.convert_tokens_to_ids("<image>"), len(tok)
    tmp = os.path.join(OUT, "_v5_llama")
    shutil.rmtree(tmp, ignore_errors=True)
    c = config(False)
    c.text_config.eos_token_id = tok.eos_token_id
    c.text_config.pad_token_id = tok.pad_token_id
    m = LlavaForConditionalGeneration(c).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n or "layrnorm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "embed" in n or "lm_head" in n or "linear_" in n:
                p.mul_(8.0)
            p.copy_(p.to(torch.bfloat16).float())
    m.generation_config.max_new_tokens = 8
    m.generation_config.do_sample = False
    m.generation_config.eos_token_id = tok.eos_token_id
    m.save_pretrained(tmp)
    processor(False).save_pretrained(tmp)
    dst = os.path.join(OUT, "hub_llama")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    out = {}
    for k, v in load_file(os.path.join(tmp, "model.safetensors")).items():
        if k.startswith("vision_tower."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        out[k] = v.to(torch.bfloat16) if v.dim() >= 2 else v
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cj = json.load(open(os.path.join(tmp, "config.json")))
    t = cj["text_config"]
    cj.pop("dtype", None)
    cj["torch_dtype"] = "bfloat16"
    rp = t.pop("rope_parameters")
    t["rope_theta"] = rp.pop("rope_theta")
    t["rope_scaling"] = rp
    t.pop("dtype", None)
    t["torch_dtype"] = "bfloat16"
    cj["vision_config"].pop("dtype", None)
    json.dump(cj, open(os.path.join(dst, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(tmp, "generation_config.json"), dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):   # the Hub's files, not transformers 5's rewrite
        shutil.copy(os.path.join(ROOT, "llama_tokenizer", "llama_tok_hub", f), dst)
    pc = json.load(open(os.path.join(tmp, "processor_config.json")))
    ipc = pc.pop("image_processor")
    ipc["processor_class"] = "LlavaProcessor"
    json.dump(ipc, open(os.path.join(dst, "preprocessor_config.json"), "w"), indent=2)
    json.dump({"chat_template": TEMPLATE}, open(os.path.join(dst, "chat_template.json"), "w"), indent=2)
    pc.pop("chat_template", None)   # the Hub's processor_config.json: patch_size, strategy, extra tokens
    json.dump(pc, open(os.path.join(dst, "processor_config.json"), "w"), indent=2)
    shutil.rmtree(tmp)
    proc = AutoProcessor.from_pretrained(dst, backend="pil")
    m = LlavaForConditionalGeneration.from_pretrained(dst, dtype=torch.float32).eval()
    text = proc.apply_chat_template(conv, add_generation_prompt=True)
    inputs = proc(images=image, text=text, return_tensors="pt")
    with torch.no_grad():
        logits = m(**inputs).logits
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    T = inputs["input_ids"].shape[1]
    ref["hub_llama.ids"] = inputs["input_ids"].to(torch.int64)
    ref["hub_llama.logits"] = logits.float()
    ref["hub_llama.greedy"] = g[:, T:].to(torch.int64)
    expected["hub_llama"] = {"prompt": PROMPT, "templated": text, "n_prompt": T, "greedy_ids": g[0, T:].tolist(),
                             "greedy_text": proc.tokenizer.decode(g[0, T:], skip_special_tokens=True),
                             "image_processor_class": type(proc.image_processor).__name__}
    with open(os.path.join(OUT, "hub_llama.greedy_text.txt"), "w", encoding="utf-8") as f:
        f.write(expected["hub_llama"]["greedy_text"])
    tok, IMG, V = saved


hub_llama()
save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
# for tests/test_llava_cli.sh (no Python there): dir, case, prompt tokens, greedy ids, last-position
# argmax, and the last position's logits one per line in <dir>.<case>.logits.txt
rows = []
for d, case, lk, gk in (("v5", "image", "v5.logits", "v5.greedy"), ("v452", "image", "v452.logits", "v452.greedy"),
                        ("hub", "image", "hub.logits", "hub.greedy"),
                        ("hub_llama", "image", "hub_llama.logits", "hub_llama.greedy"),
                        ("v5_full", "image", "v5_full.logits", "v5_full.greedy"),
                        ("v5", "image_torchvision", "v5.tv_logits", "v5.tv_greedy")):
    last = ref[lk][0, -1]
    rows.append("\t".join([d, case, str(ref[lk].shape[1]), ",".join(str(int(x)) for x in ref[gk][0]),
                           str(int(last.argmax()))]))
    with open(os.path.join(OUT, f"{d}.{case}.logits.txt"), "w") as f:
        f.write("".join(f"{float(x):.9g}\n" for x in last))
with open(os.path.join(OUT, "expected.tsv"), "w") as f:
    f.write("# dir\tcase\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_llava.py)\n" + "\n".join(rows) + "\n")
json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=2)
print({k: list(v.shape) for k, v in ref.items()})
print(json.dumps(expected, indent=1)[:1500])
