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
           prompt), logits [1, T, V], greedy 8 new tokens; for v5 also pixel_values_torchvision (transformers 5's
           default GotOcr2ImageProcessor) with its last-position logits and greedy tokens (tv_logits, tv_greedy).
  expected.json  the prompt, the chat-templated prompt and the greedy text per directory.
  remote/, remote_v1/  OpenGVLab's remote-code layout (InternVLChatModel) made from v5 (see remote() below).
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
from safetensors.torch import load_file, save_file
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
    if name == "v5":   # transformers 5's default (torchvision) image processor: the CLI's --image-backend torchvision
        ref["v5.pixel_values_torchvision"] = fin["pixel_values"].float()
        with torch.no_grad():
            ref["v5.tv_logits"] = m(**fin).logits[:, -1:].float()   # the last position: [1, 1, V]
            ref["v5.tv_greedy"] = m.generate(**fin, max_new_tokens=8, min_new_tokens=8, do_sample=False)[:, T:]
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



# remote/: v5's weights and settings in OpenGVLab's remote-code layout (InternVLChatModel, what most InternVL
# checkpoints on the Hub are): vision_model.* with the fused attn.qkv, mlp1.{0,1,3}, language_model.*; config.json
# with llm_config (4.4x style: flat rope_theta, torch_dtype), vision_config (intern_vit_6b: qkv_bias,
# qk_normalization), select_layer, downsample_ratio, ps_version, template, force_image_size and the tiling keys;
# the text-only chat template inside tokenizer_config.json (REMOTE_TEMPLATE). The same computation as v5, so v5's references apply
# (OpenGVLab's ToTensor divides by 255 in float32: pixel differences of one float32 ulp at most).
# remote_v1/: the same with ps_version "v1" (no final permute in pixel_shuffle; model.safetensors a link to
# remote's); its references from transformers' InternVL with pixel_shuffle patched to v1's (logits of the last
# position). Both link tokenizer.json to v5's.
VIS = {"embeddings.cls_token": "embeddings.class_embedding",
       "embeddings.patch_embeddings.projection.": "embeddings.patch_embedding.",
       "embeddings.position_embeddings": "embeddings.position_embedding",
       "attention.projection_layer.": "attn.proj.", "attention.q_norm.": "attn.q_norm.",
       "attention.k_norm.": "attn.k_norm.", "lambda_1": "ls1", "lambda_2": "ls2", "layernorm_before.": "norm1.",
       "layernorm_after.": "norm2.", "encoder.layer.": "encoder.layers."}


# OpenGVLab's repos ship a text-only ChatML template in tokenizer_config.json (string content): chat() writes
# "<image>\n" into the question and expands it in the text; with the system message of TEMPLATE the expanded
# prompt is v5's, token for token.
REMOTE_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                   "{{ '<|im_start|>system\n你是InternVL。<|im_end|>\n' }}{% endif %}"
                   "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def remote(dst, ps_version):
    src = os.path.join(OUT, "v5")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    c = json.load(open(os.path.join(src, "config.json")))
    if ps_version == "v2":
        w = load_file(os.path.join(src, "model.safetensors"))
        out = {}
        for k, v in w.items():
            if k.startswith("vision_tower."):
                if ".attention.k_proj." in k or ".attention.v_proj." in k:
                    continue
                if ".attention.q_proj." in k:
                    kind = k.rsplit(".", 1)[1]
                    qkv = torch.cat([w[k], w[k.replace("q_proj", "k_proj")], w[k.replace("q_proj", "v_proj")]], 0)
                    k = k.replace("attention.q_proj." + kind, "attn.qkv." + kind)
                    v = qkv
                k = "vision_model." + k[len("vision_tower."):]
                for a, b in VIS.items():
                    k = k.replace(a, b)
            elif k.startswith("multi_modal_projector."):
                k = k.replace("multi_modal_projector.layer_norm.", "mlp1.0.").replace(
                    "multi_modal_projector.linear_1.", "mlp1.1.").replace("multi_modal_projector.linear_2.", "mlp1.3.")
            out[k] = v.contiguous()
        save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    else:
        os.symlink(os.path.join("..", "remote", "model.safetensors"), os.path.join(dst, "model.safetensors"))
    t = dict(c["text_config"])
    rp = t.pop("rope_parameters")
    t["rope_theta"] = rp["rope_theta"]
    t.pop("dtype", None)
    t.update(architectures=["Qwen2ForCausalLM"], torch_dtype="float32")
    vc = c["vision_config"]
    vision = {"architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": vc["hidden_size"],
              "intermediate_size": vc["intermediate_size"], "num_hidden_layers": vc["num_hidden_layers"],
              "num_attention_heads": vc["num_attention_heads"], "image_size": vc["image_size"][0],
              "patch_size": vc["patch_size"][0], "num_channels": 3, "qkv_bias": vc["attention_bias"],
              "qk_normalization": vc["use_qk_norm"], "norm_type": vc["norm_type"], "layer_norm_eps": vc["layer_norm_eps"],
              "hidden_act": "gelu", "drop_path_rate": 0.0, "dropout": 0.0, "attention_dropout": 0.0,
              "initializer_factor": 1.0, "initializer_range": 0.02, "use_flash_attn": False}
    pc = json.load(open(os.path.join(src, "processor_config.json")))["image_processor"]
    rc = {"architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "torch_dtype": "float32",
          "auto_map": {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
                       "AutoModel": "modeling_internvl_chat.InternVLChatModel"},
          "downsample_ratio": c["downsample_ratio"], "ps_version": ps_version, "select_layer": c["vision_feature_layer"],
          "template": "internvl2_5", "force_image_size": pc["size"]["height"], "dynamic_image_size": True,
          "min_dynamic_patch": pc["min_patches"], "max_dynamic_patch": pc["max_patches"], "use_thumbnail": True,
          "use_backbone_lora": 0, "use_llm_lora": 0, "llm_config": t, "vision_config": vision}
    json.dump(rc, open(os.path.join(dst, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)
    os.symlink(os.path.join("..", "v5", "tokenizer.json"), os.path.join(dst, "tokenizer.json"))   # fixture size
    tc = json.load(open(os.path.join(src, "tokenizer_config.json")))
    tc["chat_template"] = REMOTE_TEMPLATE
    json.dump(tc, open(os.path.join(dst, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)


remote(os.path.join(OUT, "remote"), "v2")
# the prompt as InternVLChatModel.chat() builds it from the remote directory's tokenizer: v5's ids
rt = AutoTokenizer.from_pretrained(os.path.join(OUT, "remote"))
q = rt.apply_chat_template([{"role": "user", "content": "<image>\n" + PROMPT}], tokenize=False, add_generation_prompt=True)
q = q.replace("<image>", "<img>" + "<IMG_CONTEXT>" * (4 * expected["v5"]["n_tiles"]) + "</img>", 1)
assert rt(q, return_tensors="pt")["input_ids"].tolist() == ref["v5.ids"].tolist(), q
remote(os.path.join(OUT, "remote_v1"), "v1")
for k in ("ids", "pixel_values", "logits", "greedy"):
    ref["remote." + k] = ref["v5." + k]
expected["remote"] = expected["v5"]


def pixel_shuffle_v1(self, x, scale_factor=0.5):   # OpenGVLab's ps_version "v1": the last permute left out
    n, w, h, c = x.size()
    x = x.view(n, w, int(h * scale_factor), int(c / scale_factor)).permute(0, 2, 1, 3).contiguous()
    return x.view(n, int(h * scale_factor), int(w * scale_factor), int(c / (scale_factor * scale_factor)))


from transformers.models.internvl import modeling_internvl  # noqa: E402
modeling_internvl.InternVLModel.pixel_shuffle = pixel_shuffle_v1
m = InternVLForConditionalGeneration.from_pretrained(os.path.join(OUT, "v5")).float().eval()
with torch.no_grad():
    lg = m(input_ids=ref["v5.ids"], pixel_values=ref["v5.pixel_values"]).logits
    g = m.generate(input_ids=ref["v5.ids"], pixel_values=ref["v5.pixel_values"], max_new_tokens=8, min_new_tokens=8,
                   do_sample=False)
T = ref["v5.ids"].shape[1]
ref["remote_v1.logits"] = lg[:, -1:].float()   # the last position only (fixture size): [1, 1, V]
ref["remote_v1.greedy"] = g[:, T:].to(torch.int64)
print("v1 vs v2 logits differ by", (lg - ref["v5.logits"]).abs().max().item())
expected["remote_v1"] = dict(expected["v5"], greedy_ids=g[0, T:].tolist(), greedy_text=tok.decode(g[0, T:]))

save_file({k: v.contiguous().clone() for k, v in ref.items() if not k.startswith("remote.")},
          os.path.join(OUT, "ref.safetensors"))
rows = []
for d, case, lk, gk in (("v5", "image", "v5.logits", "v5.greedy"), ("v5_rms", "image", "v5_rms.logits", "v5_rms.greedy"),
                        ("remote", "image", "remote.logits", "remote.greedy"),
                        ("remote_v1", "image", "remote_v1.logits", "remote_v1.greedy"),
                        ("v5", "image_torchvision", "v5.tv_logits", "v5.tv_greedy")):
    last = ref[lk][0, -1]
    rows.append("\t".join([d, case, str(expected[d]["n_prompt"]), ",".join(str(int(x)) for x in ref[gk][0]),
                           str(int(last.argmax()))]))
    with open(os.path.join(OUT, f"{d}.{case}.logits.txt"), "w") as f:
        f.write("".join(f"{float(x):.9g}\n" for x in last))
with open(os.path.join(OUT, "expected.tsv"), "w") as f:
    f.write("# dir\tcase\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_internvl.py)\n" + "\n".join(rows) + "\n")
json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=2, ensure_ascii=False)
print({k: list(v.shape) for k, v in ref.items()})
print(json.dumps(expected, indent=1, ensure_ascii=False)[:3000])
