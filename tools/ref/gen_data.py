"""gen_data.py — fixtures for the data pipeline (tests/test_data.c).

Writes tests/fixtures/data/:
  llava.jsonl, sharegpt.jsonl, openai.json  the same conversations in the three layouts
                                            (LLaVA, LLaMA-Factory/MindSpeed-MM, OpenAI parts)
  ref.safetensors   per conversation k: s{k}.input_ids, s{k}.labels (int32),
                    s{k}.pixel_values (f32), s{k}.image_grid_thw, s{k}.video_values,
                    s{k}.video_grid_thw (int64), made by transformers' Qwen2VLProcessor
                    (fixture tokenizer + Qwen2VLImageProcessorPil + Qwen2VLVideoProcessor):
                    apply_chat_template, then processor(text, images, videos).
                    Labels: ids of tokens starting inside an assistant turn's content or its
                    closing <|im_end|> (found in the expanded text by regex), else -100.
  corrupt.jpg, bad/*.jsonl   inputs for the error tests
Media come from tests/fixtures/image/ (paths relative to the dataset file).
"""
import json
import os
import re

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import AutoTokenizer, Qwen2VLProcessor
from transformers.image_utils import load_image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from PIL import Image

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "data")
TOK = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
IMG = "../image/"
os.makedirs(os.path.join(OUT, "bad"), exist_ok=True)

MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 8            # keep fixtures small
VMIN, VMAX = 28 * 28 * 4, 28 * 28 * 16

# conversations: list of (role, [parts]); part = ("text", s) | ("image", file) | ("video", dir)
CONVS = [
    dict(type="color", msgs=[
        ("user", [("image", "rgb_37x53.png"), ("text", "What colour is it?")]),
        ("assistant", [("text", "Mostly red.")])]),
    dict(type="compare", msgs=[
        ("system", [("text", "You are terse.")]),
        ("user", [("image", "rgb_500x333.jpg"), ("text", " and "), ("image", "rgb_37x53.png"),
                  ("text", "\nWhich is bigger?")]),
        ("assistant", [("text", "The first one.")]),
        ("user", [("text", "Why?")]),
        ("assistant", [("text", "More pixels, more área. ✓")])]),
    dict(type=None, msgs=[
        ("user", [("text", "Hello there")]),
        ("assistant", [("text", "Hi! How can I help?")])]),
    dict(type="video", msgs=[
        ("user", [("video", "video3"), ("text", "Describe the clip.")]),
        ("assistant", [("text", "Colours shift.")])]),
]


def tagged(parts):
    return "".join(p[1] if p[0] == "text" else f"<{p[0]}>" for p in parts)


def media(conv, kind):
    return [IMG + p[1] for _, parts in conv["msgs"] for p in parts if p[0] == kind]


def write_formats():
    with open(os.path.join(OUT, "llava.jsonl"), "w") as f:
        for c in CONVS:
            rec = {}
            imgs, vids = media(c, "image"), media(c, "video")
            if imgs:
                rec["image"] = imgs[0] if len(imgs) == 1 else imgs
            if vids:
                rec["video"] = vids
            rec["conversations"] = [{"from": {"user": "human", "assistant": "gpt"}.get(r, r),
                                     "value": tagged(p)} for r, p in c["msgs"]]
            if c["type"]:
                rec["type"] = c["type"]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "sharegpt.jsonl"), "w") as f:
        for c in CONVS:
            rec = {"messages": [{"role": r, "content": tagged(p)} for r, p in c["msgs"]]}
            if media(c, "image"):
                rec["images"] = media(c, "image")
            if media(c, "video"):
                rec["videos"] = media(c, "video")
            if c["type"]:
                rec["type"] = c["type"]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    recs = []
    for c in CONVS:
        msgs = []
        for r, parts in c["msgs"]:
            if r == "assistant" and len(parts) == 1:
                msgs.append({"role": r, "content": parts[0][1]})   # plain string content
                continue
            cont = []
            for k, v in parts:
                if k == "text":
                    cont.append({"type": "text", "text": v})
                elif k == "image":
                    cont.append({"type": "image_url", "image_url": {"url": IMG + v}} if v.endswith(".jpg")
                                else {"type": "image", "image": IMG + v})
                else:
                    cont.append({"type": "video", "video": IMG + v})
            msgs.append({"role": r, "content": cont})
        rec = {"messages": msgs}
        if c["type"]:
            rec["type"] = c["type"]
        recs.append(rec)
    with open(os.path.join(OUT, "openai.json"), "w") as f:
        json.dump(recs, f, indent=2, ensure_ascii=False)   # multi-line: line numbers matter
        f.write("\n")


def write_bad():
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    bad = {
        "malformed.jsonl": good + "\n" + good + "\n" + '{"messages": [ {"role": "user", "content": "x"}\n',
        "no_assistant.jsonl": good + "\n" + json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n",
        "mismatch.jsonl": json.dumps({"messages": [{"role": "user", "content": "<image><image>two?"},
                                                   {"role": "assistant", "content": "one"}],
                                      "images": ["../../image/rgb_37x53.png"]}) + "\n",
        "empty.jsonl": "\n  \n",
        "no_messages.jsonl": json.dumps({"text": "plain text"}) + "\n",
        "bad_role.jsonl": json.dumps({"conversations": [{"from": "robot", "value": "x"}]}) + "\n",
        "malformed_array.json": "[\n  " + good + ",\n  {\"messages\": oops}\n]\n",
        "corrupt_image.jsonl": "".join(json.dumps({"type": t, "messages": [
            {"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": a}],
            "images": [img]}) + "\n" for t, img, a in [
                ("ok", "../../image/rgb_37x53.png", "fine"), ("bad", "../corrupt.jpg", "broken"),
                ("ok", "../../image/palette_P.png", "also fine"), ("missing", "../nope.png", "gone")]),
    }
    for name, text in bad.items():
        with open(os.path.join(OUT, "bad", name), "w") as f:
            f.write(text)
    with open(os.path.join(ROOT, "tests", "fixtures", "image", "rgb_500x333.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(OUT, "corrupt.jpg"), "wb") as f:
        f.write(data[:400])   # truncated JPEG


def reference():
    tok = AutoTokenizer.from_pretrained(TOK)
    ip = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    vp = Qwen2VLVideoProcessor(size={"shortest_edge": VMIN, "longest_edge": VMAX})
    proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                            chat_template=tok.chat_template)
    T = {}
    for k, c in enumerate(CONVS):
        messages = []
        for r, parts in c["msgs"]:
            messages.append({"role": r, "content": [{"type": "text", "text": v} if t == "text" else {"type": t}
                                                    for t, v in parts]})
        text = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        imgs = [load_image(os.path.join(OUT, p)) for p in media(c, "image")]
        vids = []
        for d in media(c, "video"):
            d = os.path.join(OUT, d)
            fr = [np.array(Image.open(os.path.join(d, n)).convert("RGB")) for n in sorted(os.listdir(d))]
            vids.append(torch.from_numpy(np.stack(fr)).permute(0, 3, 1, 2).contiguous())
        kw = {}
        if imgs:
            kw["images"] = imgs
        if vids:
            kw["videos"] = vids
            kw["do_sample_frames"] = False
            kw["cap_pixels_per_frame"] = False
        out = proc(text=[text], return_tensors="np", **kw)
        ids = out["input_ids"][0].astype(np.int64)
        # expanded text (what the processor tokenised) -> assistant spans -> labels
        merge2 = ip.merge_size ** 2
        exp = text
        for key, tokname in (("image_grid_thw", "<|image_pad|>"), ("video_grid_thw", "<|video_pad|>")):
            if key in out:
                for g in out[key]:
                    exp = exp.replace(tokname, "<|placeholder|>" * int(np.prod(g) // merge2), 1)
                exp = exp.replace("<|placeholder|>", tokname)
        enc = tok(exp, return_offsets_mapping=True, add_special_tokens=False)
        assert list(enc["input_ids"]) == list(ids), "expanded text does not reproduce processor ids"
        spans = [(m.start(1), m.end(1)) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", exp, re.S)]
        labels = np.full_like(ids, -100)
        for i, (a, _) in enumerate(enc["offset_mapping"]):
            if any(s <= a < e for s, e in spans):
                labels[i] = ids[i]
        T[f"s{k}.input_ids"] = ids.astype(np.int32)
        T[f"s{k}.labels"] = labels.astype(np.int32)
        if imgs:
            T[f"s{k}.pixel_values"] = out["pixel_values"].astype(np.float32)
            T[f"s{k}.image_grid_thw"] = out["image_grid_thw"].astype(np.int64)
        if vids:
            T[f"s{k}.video_values"] = out["pixel_values_videos"].astype(np.float32)
            T[f"s{k}.video_grid_thw"] = out["video_grid_thw"].astype(np.int64)
        print(f"s{k}: {len(ids)} tokens, {int((labels != -100).sum())} labels")
    T["min_max_pixels"] = np.array([MIN_PIXELS, MAX_PIXELS, VMIN, VMAX], dtype=np.int64)
    save_file(T, os.path.join(OUT, "ref.safetensors"))


if __name__ == "__main__":
    write_formats()
    write_bad()
    reference()
