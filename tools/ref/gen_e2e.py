"""End-to-end fixtures (issue 17 item 8): tiny random Qwen2-VL and Qwen2.5-VL checkpoints as
transformers 5.x writes them (model.save_pretrained + processor.save_pretrained, untouched) and
the same checkpoints rewritten into the Hub's 4.4x layout, with what transformers computes on them
as loaded back from disk (AutoProcessor / AutoModelForImageTextToText.from_pretrained), for
tests/test_e2e_cli.sh (`mmc generate` / `mmc forward` on the directories as saved).

Writes tests/fixtures/e2e/:
  shapes_160x120.png  a small RGB image (above the fixtures' max_pixels: smart_resize shrinks it)
  q2_v5/, q25_v5/     save_pretrained output, untouched: config.json, generation_config.json,
                      model.safetensors (f32), processor_config.json (nested image_processor and
                      video_processor), tokenizer.json, tokenizer_config.json, chat_template.jinja
  q2_hub/, q25_hub/   the same weights and settings in the 4.4x layout: un-nested config.json
                      (rope_scaling, torch_dtype bfloat16, vision in_chans), checkpoint keys
                      visual.* / model.* / lm_head.* with bf16 matrices (the weights are bf16-exact,
                      so lossless), preprocessor_config.json (image settings; the area as top-level
                      min_pixels / max_pixels, as the Hub has it), video_preprocessor_config.json,
                      chat_template.json; no processor_config.json
  expected.json       per directory and case (image, video): prompt token count, greedy new
                      tokens (transformers generate, the directory's generation_config), and the
                      last position's logits of one forward pass over the prompt
The video is tests/fixtures/video/moving.mkv (FFV1, lossless: decoders agree to the byte), sampled
as the saved video processor says (fps 2), read with transformers' pyav reader (see video_ref.py's
read_pyav: Matroska has no frame count in its header).

Image backends: transformers 5.x's AutoImageProcessor picks the torchvision ("fast") backend
whenever torchvision is installed, whatever image_processor_type says; its uint8 antialiased
bicubic resize differs from Pillow's by a grey level here and there. mmc's default image path
mirrors the PIL backend (backend="pil"), as the rest of the fixtures do; `--image-backend
torchvision` mirrors the other. expected.json holds both: "image" (the image processor from
AutoImageProcessor.from_pretrained(dir, backend="pil")) and "image_torchvision" (the default load). Videos have one backend
(Qwen2VLVideoProcessor is torchvision-only; mmc mirrors it).
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image
from hub_layout import model_to_hub
from video_ref import read_pyav
from safetensors.torch import load_file, save_file
from transformers import (AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer, Qwen2VLConfig,
                          Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor,
                          Qwen2VLVideoProcessor, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                          Qwen2_5_VLProcessor)
from functools import partial

sys.path.insert(0, os.path.dirname(__file__))
ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "e2e")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(17)

tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                  "<|vision_end|>", "<|im_end|>")}
TOKS = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
TEXT = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
IMG_MIN, IMG_MAX = 28 * 28 * 4, 28 * 28 * 16
VSIZE = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 8}


def make(arch):
    if arch == "q2":
        cfg = Qwen2VLConfig(vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                                               patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                                               in_channels=3),
                            text_config=dict(TEXT), tie_word_embeddings=True, eos_token_id=ids["<|im_end|>"], **TOKS)
        m = Qwen2VLForConditionalGeneration(cfg)
    else:
        cfg = Qwen2_5_VLConfig(vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48,
                                                  out_hidden_size=64, patch_size=14, temporal_patch_size=2,
                                                  spatial_merge_size=2, in_channels=3, window_size=56,
                                                  fullatt_block_indexes=[1], tokens_per_second=2),
                               text_config=dict(TEXT), tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"],
                               **TOKS)
        m = Qwen2_5_VLForConditionalGeneration(cfg)
    m = m.float().eval()
    with torch.no_grad():   # non-trivial biases and norms; every value bf16-exact (the Hub copy is bf16)
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.05)
            elif "norm" in n or "ln_q" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
            p.copy_(p.bfloat16().float())
    return m


def to_hub(src, dst, arch):
    """The 5.x directory src rewritten into the Hub's 4.4x layout (hub_layout.model_to_hub, plus the
    processor files)."""
    shutil.rmtree(dst, ignore_errors=True)
    c = model_to_hub(src, dst, arch)
    json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)
    pc = json.load(open(os.path.join(src, "processor_config.json")))
    ip = dict(pc.pop("image_processor"))
    size = ip.pop("size")   # the Hub files (e.g. Qwen/Qwen2-VL-7B-Instruct) give the area as top-level
    ip["min_pixels"], ip["max_pixels"] = size["shortest_edge"], size["longest_edge"]   # min/max_pixels
    ip["processor_class"] = pc["processor_class"]
    json.dump(ip, open(os.path.join(dst, "preprocessor_config.json"), "w"), indent=2)
    vp = dict(pc.pop("video_processor"))
    vp["processor_class"] = pc["processor_class"]
    json.dump(vp, open(os.path.join(dst, "video_preprocessor_config.json"), "w"), indent=2)
    json.dump({"chat_template": open(os.path.join(src, "chat_template.jinja")).read()},
              open(os.path.join(dst, "chat_template.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))


# the image: gradient, a square and a disc; 160x120 = 19200 pixels > IMG_MAX (smart_resize shrinks it)
y, x = np.mgrid[0:120, 0:160]
img = np.zeros((120, 160, 3), np.uint8)
img[..., 0] = (x * 3) % 256
img[..., 1] = (y * 2 + 40) % 256
img[..., 2] = 120
img[20:60, 30:70] = [250, 30, 20]
img[(x - 115) ** 2 + (y - 70) ** 2 < 600] = [20, 220, 60]
IMAGE = os.path.join(OUT, "shapes_160x120.png")
Image.fromarray(img).save(IMAGE)
VIDEO = os.path.join(ROOT, "video", "moving.mkv")
PROMPT_IMG, PROMPT_VID = "What colour is the square?", "What moves?"
NEW = 8

expected = {"image": "tests/fixtures/e2e/shapes_160x120.png", "video": "tests/fixtures/video/moving.mkv",
            "prompt_image": PROMPT_IMG, "prompt_video": PROMPT_VID, "max_new_tokens": NEW}


def run(d, proc, kind):
    m = AutoModelForImageTextToText.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    content = [{"type": "image" if kind.startswith("image") else "video"},
               {"type": "text", "text": PROMPT_VID if kind == "video" else PROMPT_IMG}]
    text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=False)
    if kind == "video":
        frames, meta = read_pyav(VIDEO, proc.video_processor.sample_frames)
        enc = proc(text=[text], videos=[frames], videos_kwargs=dict(video_metadata=[meta], do_sample_frames=False),
                   return_tensors="pt")
    else:
        enc = proc(text=[text], images=[Image.open(IMAGE).convert("RGB")], return_tensors="pt")
    with torch.no_grad():
        logits = m(**enc).logits[0, -1]
        g = m.generate(**enc, max_new_tokens=NEW, do_sample=False)
    n = enc["input_ids"].shape[1]
    grid = (enc.get("video_grid_thw") if kind == "video" else enc["image_grid_thw"])[0].tolist()
    return dict(prompt_tokens=n, new_ids=g[0, n:].tolist(), grid=grid,
                last_logits=[float(v) for v in logits], argmax_last=int(logits.argmax()))


for arch in ("q2", "q25"):
    d = os.path.join(OUT, arch + "_v5")
    shutil.rmtree(d, ignore_errors=True)
    m = make(arch)
    m.save_pretrained(d)
    pcls = Qwen2VLProcessor if arch == "q2" else Qwen2_5_VLProcessor
    proc = pcls(image_processor=Qwen2VLImageProcessor(min_pixels=IMG_MIN, max_pixels=IMG_MAX), tokenizer=tok,
                video_processor=Qwen2VLVideoProcessor(size=VSIZE, fps=2, do_sample_frames=True, min_frames=2,
                                                      max_frames=64),
                chat_template=tok.chat_template)
    proc.save_pretrained(d)
    print(arch, "saved", sorted(os.listdir(d)))
    assert os.path.exists(os.path.join(d, "processor_config.json"))
    to_hub(d, os.path.join(OUT, arch + "_hub"), arch)
    for layout in ("v5", "hub"):
        dd = os.path.join(OUT, f"{arch}_{layout}")
        res = {}
        tv = AutoProcessor.from_pretrained(dd)   # as saved: the default (torchvision) image backend
        pil = AutoProcessor.from_pretrained(dd)
        pil.image_processor = AutoImageProcessor.from_pretrained(dd, backend="pil")
        assert type(pil.image_processor).__name__ == "Qwen2VLImageProcessorPil", type(pil.image_processor)
        assert type(tv.image_processor).__name__ == "Qwen2VLImageProcessor", type(tv.image_processor)
        assert tv.video_processor.fps == 2 and tv.image_processor.size["longest_edge"] == IMG_MAX, (dd, tv)
        res["image"] = run(dd, pil, "image")
        res["image_torchvision"] = run(dd, tv, "image")
        res["video"] = run(dd, tv, "video")
        for k, v in res.items():
            print(arch, layout, k, v["prompt_tokens"], v["grid"], v["new_ids"], v["argmax_last"])
        expected[f"{arch}_{layout}"] = res
    for k in ("image", "video"):   # the two layouts are the same model and settings
        assert expected[f"{arch}_v5"][k]["new_ids"] == expected[f"{arch}_hub"][k]["new_ids"], (arch, k)

json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=1)
# one line per (dir, case) for the shell test: dir case prompt_tokens new_ids(comma) ; logits in a side file
with open(os.path.join(OUT, "expected.tsv"), "w") as f:
    f.write("# dir case prompt_tokens grid_thw new_ids argmax_last (tools/ref/gen_e2e.py)\n")
    for key in sorted(k for k in expected if k.endswith(("_v5", "_hub"))):
        for case in ("image", "image_torchvision", "video"):
            r = expected[key][case]
            f.write(f"{key}\t{case}\t{r['prompt_tokens']}\t{','.join(map(str, r['grid']))}\t"
                    f"{','.join(map(str, r['new_ids']))}\t{r['argmax_last']}\n")
            with open(os.path.join(OUT, f"{key}.{case}.logits.txt"), "w") as lf:
                lf.write("\n".join(f"{v:.9g}" for v in r["last_logits"]) + "\n")
tot = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
print("wrote", OUT, f"{tot / 1e3:.0f} KB")
