"""Tiny random LLaVA-NeXT and LLaVA-OneVision checkpoints and what transformers computes on them, for
tests/test_llava_next.c and tests/test_llava_cli.sh.

Writes
  tests/fixtures/llava_onevision/ov/  LlavaOnevisionForConditionalGeneration (SigLIP tower with the attention-pooling
      head and, like siglip-so400m-patch14-384, an image_size (26) that is not a multiple of its patch_size (6),
      Qwen2 LM with GQA, anyres grid pinpoints of 26-pixel tiles, vision_aspect_ratio anyres_max_4 so that
      both test images are downsampled, strategy "full", vision_feature_layer -1): model.save_pretrained +
      processor.save_pretrained (LlavaOnevisionProcessor, PIL image processor), untouched.
  tests/fixtures/llava_next/next/    LlavaNextForConditionalGeneration (CLIP tower, Mistral LM with GQA and a sliding
      window longer than any prompt, pinpoints of 30-pixel tiles, strategy "default", vision_feature_layer -2),
      the same way.
  tests/fixtures/llava_next/tall_97x151.png  the second test image (odd sizes, portrait), made from
      tests/fixtures/e2e/shapes_160x120.png (landscape, the first).
  <fixture>/ref.safetensors  per case (<dir>.<case>): ids, pixel_values [P, 3, S, S] (PIL backend; the patches of
      each image in order, batch padding removed), image_sizes [n, 2], features (the packed image features
      transformers splices in, [n_features, C]), logits [1, len(logits_pos), V] at positions logits_pos (every
      6th and the last), greedy (8 new tokens); for ov also
      <case>.pooler (SiglipVisionModel's pooler_output of the pixel_values).
  <fixture>/expected.tsv, <dir>.<case>.logits.txt  for the shell test (as gen_llava.py writes them).
  tests/fixtures/llava_onevision/ov_hub/, tests/fixtures/llava_next/next_v452/  the same checkpoints in the Hub's
      4.4x files and in transformers 4.52-4.57's weight names (bf16 matrices; see layout_copy).
  tests/fixtures/siglip/  SiglipImageProcessor configs (bicubic, bilinear; 26 x 30) and their pixel_values of both test
      images, PIL and torchvision backends (siglip_processors()).
Cases: image_wide (shapes_160x120), image_tall (tall_97x151) and, for ov, two_images (both in one prompt: no
tiling, pad_to_square, one newline each) and video (tests/fixtures/llava_onevision/video/: 3 frames of 45 x 34 through
LlavaOnevisionVideoProcessor, torchvision as transformers requires; ov.video.pixel_values_videos [F, 3, S, S],
features = get_video_features' pooler_output [F * ceil(g/2)^2 + 1, C]).
Run: .venv-ref/bin/python tools/ref/gen_llava_next.py
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (AutoImageProcessor, AutoProcessor, AutoTokenizer, CLIPVisionConfig, LlavaNextConfig,
                          LlavaNextForConditionalGeneration, LlavaNextImageProcessorPil, LlavaNextProcessor,
                          LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                          LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor, MistralConfig, Qwen2Config,
                          SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
torch.manual_seed(1919)

tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
IMG, VID = tok.convert_tokens_to_ids("<image>"), tok.convert_tokens_to_ids("<video>")
V = len(tok)
EOS = tok.convert_tokens_to_ids("<|im_end|>")
# ChatML with one "<image>\n" per image before the text (llava-onevision-qwen2's template, shortened)
TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
            "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
            "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\n' }}"
            "{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
            "{{ content['text'] }}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

wide = Image.open(os.path.join(ROOT, "e2e", "shapes_160x120.png")).convert("RGB")
NEXT_DIR = os.path.join(ROOT, "llava_next")
OV_DIR = os.path.join(ROOT, "llava_onevision")
os.makedirs(NEXT_DIR, exist_ok=True)
os.makedirs(OV_DIR, exist_ok=True)
TALL = os.path.join(NEXT_DIR, "tall_97x151.png")
wide.transpose(Image.Transpose.ROTATE_90).resize((97, 151), Image.Resampling.BICUBIC).save(TALL)
tall = Image.open(TALL).convert("RGB")
PROMPT = "What is in the image?"
# a 3-frame video of odd-sized frames (45 x 34), cut from the landscape image
VIDEO_DIR = os.path.join(OV_DIR, "video")
os.makedirs(VIDEO_DIR, exist_ok=True)
frames = []
for i in range(3):
    fr = wide.crop((10 + 30 * i, 5 + 20 * i, 100 + 30 * i, 73 + 20 * i)).resize((45, 34), Image.Resampling.BILINEAR)
    fr.save(os.path.join(VIDEO_DIR, f"frame_{i:02d}.png"))
    frames.append(Image.open(os.path.join(VIDEO_DIR, f"frame_{i:02d}.png")).convert("RGB"))


def scramble(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n or "layrnorm" in n or "probe" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "embed_tokens" in n or "lm_head" in n or "linear_" in n or "image_newline" in n:
                p.mul_(8.0)                                           # logits of magnitude ~1
            p.copy_(p.to(torch.bfloat16).float())                     # bf16-exact: the bf16 copies are lossless


def ov_model():
    text = Qwen2Config(vocab_size=V, hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=EOS, pad_token_id=0)
    vision = SiglipVisionConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
                                image_size=26, patch_size=6, vision_use_head=True)   # 26 // 6 = 4, as 384 // 14
    pins = [[26, 26], [26, 52], [52, 26], [52, 52], [52, 78], [78, 52], [78, 78]]
    cfg = LlavaOnevisionConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=IMG,
                               video_token_index=VID, image_grid_pinpoints=pins, vision_aspect_ratio="anyres_max_4",
                               vision_feature_layer=-1, vision_feature_select_strategy="full")
    m = LlavaOnevisionForConditionalGeneration(cfg).float().eval()
    scramble(m)
    ip = LlavaOnevisionImageProcessorPil(size={"height": 26, "width": 26}, image_grid_pinpoints=pins)
    vp = LlavaOnevisionVideoProcessor(size={"height": 26, "width": 26})
    proc = LlavaOnevisionProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, num_image_tokens=16,
                                   vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_4",
                                   chat_template=TEMPLATE)
    return m, proc, LlavaOnevisionForConditionalGeneration


def next_model():
    text = MistralConfig(vocab_size=V, hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                         rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False, eos_token_id=EOS,
                         pad_token_id=0)
    vision = CLIPVisionConfig(hidden_size=30, intermediate_size=52, num_hidden_layers=3, num_attention_heads=3,
                              image_size=30, patch_size=6, hidden_act="quick_gelu", layer_norm_eps=1e-5)
    pins = [[30, 60], [60, 30], [60, 60], [90, 30], [30, 90]]
    cfg = LlavaNextConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=IMG,
                          image_grid_pinpoints=pins, vision_feature_layer=-2,
                          vision_feature_select_strategy="default")
    m = LlavaNextForConditionalGeneration(cfg).float().eval()
    scramble(m)
    ip = LlavaNextImageProcessorPil(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30},
                                    image_grid_pinpoints=pins)
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=6, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=TEMPLATE)
    return m, proc, LlavaNextForConditionalGeneration


def run_video(m, proc, name, out_dir, ref, rows, expected):
    conv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = proc.apply_chat_template(conv, add_generation_prompt=True)
    inputs = proc(videos=[frames], text=text, return_tensors="pt")
    with torch.no_grad():
        feats = m.model.get_video_features(inputs["pixel_values_videos"]).pooler_output
        logits = m(**inputs).logits
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    T = inputs["input_ids"].shape[1]
    key = f"{name}.video"
    pos = sorted(set(range(0, T, 6)) | {T - 1})
    ref[key + ".ids"] = inputs["input_ids"].to(torch.int64)
    ref[key + ".pixel_values_videos"] = inputs["pixel_values_videos"][0].float().contiguous()
    ref[key + ".features"] = feats.reshape(-1, feats.shape[-1]).float()
    ref[key + ".logits_pos"] = torch.tensor(pos, dtype=torch.int64)
    ref[key + ".logits"] = logits[:, pos].float()
    ref[key + ".greedy"] = g[:, T:].to(torch.int64)
    last = logits[0, -1]
    rows.append("\t".join([name, "video", str(T), ",".join(str(int(x)) for x in g[0, T:]), str(int(last.argmax()))]))
    with open(os.path.join(out_dir, f"{name}.video.logits.txt"), "w") as f:
        f.write("".join(f"{float(x):.9g}\n" for x in last))
    expected["video"] = {"templated": text, "n_prompt": T, "greedy_ids": g[0, T:].tolist(),
                         "video_processor": type(proc.video_processor).__name__}


def run(out_dir, name, build, cases):
    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    m, proc, cls = build()
    m.generation_config.max_new_tokens = 8
    m.generation_config.do_sample = False
    m.save_pretrained(d)
    proc.save_pretrained(d)
    # everything below from the directory as saved
    proc = AutoProcessor.from_pretrained(d)
    proc.image_processor = AutoImageProcessor.from_pretrained(d, backend="pil")   # (the video processor has no PIL form)
    assert type(proc.image_processor).__name__.endswith("Pil"), type(proc.image_processor)
    m = cls.from_pretrained(d).float().eval()
    ref, rows, expected = {}, [], {}
    for case, images in cases:
        if case == "video":   # OneVision's video path: every frame, 2x2 bilinear pooling, one newline
            run_video(m, proc, name, out_dir, ref, rows, expected)
            continue
        conv = [{"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": PROMPT}]}]
        text = proc.apply_chat_template(conv, add_generation_prompt=True)
        inputs = proc(images=[images], text=text, return_tensors="pt")
        with torch.no_grad():
            kw = {k: v for k, v in inputs.items() if k in ("pixel_values", "image_sizes", "batch_num_images")}
            feats = m.model.get_image_features(**kw).pooler_output
            logits = m(**inputs).logits
            g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        T = inputs["input_ids"].shape[1]
        pv = inputs["pixel_values"]
        # the real patches of each image (the processor pads the patch axis to a batch)
        n_real = [f.shape[0] for f in feats]
        key = f"{name}.{case}"
        if len(images) > 1:
            pix = pv.reshape(-1, *pv.shape[-3:])[: len(images)]
        else:
            from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
            npatch = image_size_to_num_patches(inputs["image_sizes"][0].tolist(), m.config.image_grid_pinpoints,
                                               m.config.vision_config.image_size)
            pix = pv[0, :npatch]
        ref[key + ".ids"] = inputs["input_ids"].to(torch.int64)
        ref[key + ".pixel_values"] = pix.float().contiguous()
        ref[key + ".image_sizes"] = inputs["image_sizes"].to(torch.int64)
        ref[key + ".features"] = torch.cat(list(feats), 0).float()
        pos = sorted(set(range(0, T, 6)) | {T - 1})   # a subset of positions keeps the fixture small
        ref[key + ".logits_pos"] = torch.tensor(pos, dtype=torch.int64)
        ref[key + ".logits"] = logits[:, pos].float()
        ref[key + ".greedy"] = g[:, T:].to(torch.int64)
        if isinstance(m.model.vision_tower, SiglipVisionModel) and m.model.vision_tower.config.vision_use_head:
            with torch.no_grad():
                ref[key + ".pooler"] = m.model.vision_tower(pix).pooler_output.float()
        last = logits[0, -1]
        rows.append("\t".join([name, case, str(T), ",".join(str(int(x)) for x in g[0, T:]), str(int(last.argmax()))]))
        with open(os.path.join(out_dir, f"{name}.{case}.logits.txt"), "w") as f:
            f.write("".join(f"{float(x):.9g}\n" for x in last))
        expected[case] = {"templated": text, "n_prompt": T, "n_features": n_real,
                          "greedy_ids": g[0, T:].tolist(), "image_sizes": inputs["image_sizes"].tolist()}
    save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(out_dir, "ref.safetensors"))
    with open(os.path.join(out_dir, "expected.tsv"), "w") as f:
        f.write("# dir\tcase\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_llava_next.py)\n"
                + "\n".join(rows) + "\n")
    json.dump(expected, open(os.path.join(out_dir, "expected.json"), "w"), indent=2)
    print(name, {k: list(v.shape) for k, v in ref.items()})
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "templated"} for k, v in expected.items()}))




def layout_copy(out_dir, name, copy, cls, layout):
    """<name>'s checkpoint in another weight naming, bf16 matrices (lossless: the weights are bf16-exact):
    layout "hub" = the Hub's 4.4x files (vision_tower.vision_model.*, image_newline, multi_modal_projector.*,
    language_model.model.*, language_model.lm_head.*; config with torch_dtype and a flat text rope_theta;
    preprocessor_config.json + processor_config.json + chat_template.json), "v452" = transformers 4.52-4.57's
    names (model.vision_tower.vision_model.*, model.image_newline, model.multi_modal_projector.*,
    model.language_model.*, lm_head.*). No tokenizer (the C test feeds the ids). References from the copy as
    transformers reads it: the image_wide case's features and last-position logits, and greedy tokens."""
    src, dst = os.path.join(out_dir, name), os.path.join(out_dir, copy)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    out = {}
    for k, v in load_file(os.path.join(src, "model.safetensors")).items():
        if k.startswith("vision_tower."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        if layout == "v452":
            if k.startswith("language_model.model."):
                k = "model.language_model." + k[len("language_model.model."):]
            elif k == "language_model.lm_head.weight":
                k = "lm_head.weight"
            else:
                k = "model." + k
        out[k] = v.to(torch.bfloat16) if v.dim() >= 2 else v
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cj = json.load(open(os.path.join(src, "config.json")))
    t = cj["text_config"]
    cj.pop("dtype", None)
    cj["torch_dtype"] = "bfloat16"
    if layout == "hub":
        rp = t.pop("rope_parameters")
        t["rope_theta"] = rp.pop("rope_theta")
        t.pop("layer_types", None)
    t.pop("dtype", None)
    t["torch_dtype"] = "bfloat16"
    cj["vision_config"].pop("dtype", None)
    json.dump(cj, open(os.path.join(dst, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)
    pc = json.load(open(os.path.join(src, "processor_config.json")))
    if layout == "hub":
        ipc = pc.pop("image_processor")
        pc.pop("video_processor", None)
        ipc["processor_class"] = pc["processor_class"]
        json.dump(ipc, open(os.path.join(dst, "preprocessor_config.json"), "w"), indent=2)
        json.dump({"chat_template": open(os.path.join(src, "chat_template.jinja")).read()},
                  open(os.path.join(dst, "chat_template.json"), "w"), indent=2)
    json.dump(pc, open(os.path.join(dst, "processor_config.json"), "w"), indent=2)
    m = cls.from_pretrained(dst, dtype=torch.float32).eval()
    ref = dict(load_file(os.path.join(out_dir, "ref.safetensors")))
    key = f"{name}.image_wide"
    kw = {"pixel_values": ref[key + ".pixel_values"][None], "image_sizes": ref[key + ".image_sizes"]}
    ids = ref[key + ".ids"]
    with torch.no_grad():
        feats = torch.cat(list(m.model.get_image_features(**kw).pooler_output), 0).float()
        logits = m(input_ids=ids, **kw).logits
        g = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw, max_new_tokens=8, min_new_tokens=8,
                       do_sample=False)
    assert (feats - ref[key + ".features"]).abs().max() < 1e-6   # the same weights, read from other names
    ref[f"{copy}.image_wide.features"] = feats
    ref[f"{copy}.image_wide.last_logits"] = logits[0, -1].float()
    ref[f"{copy}.image_wide.greedy"] = g[:, ids.shape[1]:].to(torch.int64)
    save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(out_dir, "ref.safetensors"))
    print(copy, sorted(out)[:3], "greedy", g[0, ids.shape[1]:].tolist())


run(OV_DIR, "ov", ov_model, [("image_wide", [wide]), ("image_tall", [tall]), ("two_images", [wide, tall]),
                             ("video", None)])
layout_copy(OV_DIR, "ov", "ov_hub", LlavaOnevisionForConditionalGeneration, "hub")
run(NEXT_DIR, "next", next_model, [("image_wide", [wide]), ("image_tall", [tall])])
layout_copy(NEXT_DIR, "next", "next_v452", LlavaNextForConditionalGeneration, "v452")


def siglip_processors():
    """SiglipImageProcessor (a fixed-size resize, rescale, normalise with mean = std = 0.5) saved by save_pretrained
    with bicubic and with bilinear resampling at an odd 26 x 30 size; pixel_values of both test images from the PIL
    backend and from transformers 5's default (torchvision) one -> tests/fixtures/siglip/."""
    out = os.path.join(ROOT, "siglip")
    os.makedirs(out, exist_ok=True)
    ref = {}
    for name, resample in (("bicubic", 3), ("bilinear", 2)):
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        SiglipImageProcessorPil(size={"height": 26, "width": 30}, resample=resample).save_pretrained(d)
        pil, tv = AutoImageProcessor.from_pretrained(d, backend="pil"), AutoImageProcessor.from_pretrained(d)
        assert type(pil).__name__ == "SiglipImageProcessorPil" and type(tv).__name__ == "SiglipImageProcessor"
        for img_name, img in (("wide", wide), ("tall", tall)):
            ref[f"{name}.{img_name}.pil"] = pil(img, return_tensors="pt")["pixel_values"].float()
            ref[f"{name}.{img_name}.torchvision"] = tv(img, return_tensors="pt")["pixel_values"].float()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "ref.safetensors"))
    print("siglip", {k: list(v.shape) for k, v in ref.items()})


siglip_processors()
