"""Short videos and transformers' Qwen2-VL video processing of them, for tests/test_video.c.

Writes tests/fixtures/video/:
  moving.mkv        FFV1 (bgr0, lossless) in Matroska: 24 frames 64x48 of moving shapes at 8 fps
  moving.mp4        H.264 (libx264 yuv420p) in MP4: 30 frames 64x48 at 12 fps
  moving.{webm,avi,gif,mov}  the same 12 fps clip as VP9/WebM, MPEG-4/AVI, GIF and MJPEG/MOV
                    (decode smoke tests: frame count and size)
  proc/             Qwen2VLProcessor.save_pretrained (transformers 5.x: processor_config.json with
                    the nested "video_processor", fps 2 and do_sample_frames on, small pixel
                    bounds so the fixture stays small) with the fixture tokenizer
  hub/              the 4.4x layout of the same settings: video_preprocessor_config.json next to
                    a preprocessor_config.json with different (image) bounds
  chat_expected.json  `mmc generate --video moving.mp4` on tests/fixtures/qwen2_vl_chat: prompt length and
                    8 greedy tokens from transformers (sampled at 2 fps)
  ref.safetensors   per video: metadata (total frames, fps), frame indices (sample_frames), the
                    sampled frames as PyAV decodes them to RGB24 (what transformers' pyav backend
                    gives), pixel_values_videos, video_grid_thw, second_per_grid_ts; input_ids of
                    a chat prompt with the video through the processor; logits of the tiny
                    Qwen2-VL and Qwen2.5-VL fixture checkpoints (tests/fixtures/qwen2_vl) on
                    ids built from the grid.
transformers 5.x decodes files with torchcodec by default (not installed here; torchvision >= 0.26
has no decoder), so the files are decoded with transformers' own pyav backend
(video_utils.load_video(backend="pyav")) using the processor's sample_frames, exactly as
fetch_videos would with that backend.
"""
import json
import os
import shutil
from functools import partial

import av
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (AutoTokenizer, Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration,
                          Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor)
from transformers.video_utils import load_video
from video_ref import read_pyav

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "video")
os.makedirs(OUT, exist_ok=True)
W, H = 64, 48


def frame(i, n):
    """Gradient background, a square moving right, a disc moving down; colours change over time."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.zeros((H, W, 3), np.uint8)
    img[..., 0] = (x * 4) % 256
    img[..., 1] = (y * 5 + 7 * i) % 256
    img[..., 2] = 90
    sx = 2 + (i * 50) // n
    img[10:22, sx:sx + 12] = [240, (30 * i) % 256, 20]
    cy = 4 + (i * 36) // n
    img[(x - 44) ** 2 + (y - cy) ** 2 < 36] = [20, 200, (255 - 9 * i) % 256]
    return img


def write(path, codec, fps, n, pix_fmt, **opts):
    c = av.open(path, "w")
    s = c.add_stream(codec, rate=fps)
    s.width, s.height, s.pix_fmt = W, H, pix_fmt
    s.options = opts
    for i in range(n):
        f = av.VideoFrame.from_ndarray(frame(i, n), format="rgb24").reformat(format=pix_fmt)
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()


write(os.path.join(OUT, "moving.mkv"), "ffv1", 8, 24, "bgr0")
write(os.path.join(OUT, "moving.mp4"), "libx264", 12, 30, "yuv420p", crf="20", preset="veryfast", g="8",
      bf="2", **{"x264-params": "threads=1"})
write(os.path.join(OUT, "moving.webm"), "libvpx-vp9", 12, 30, "yuv420p", crf="40", **{"b:v": "0"})
write(os.path.join(OUT, "moving.avi"), "mpeg4", 12, 30, "yuv420p", qscale="4")
write(os.path.join(OUT, "moving.gif"), "gif", 12, 30, "rgb8")
write(os.path.join(OUT, "moving.mov"), "mjpeg", 12, 30, "yuvj420p", q="5")

tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
SIZE = {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 16}
vp = Qwen2VLVideoProcessor(size=SIZE, fps=2, do_sample_frames=True, min_frames=2, max_frames=64)
ip = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=tok.chat_template)
pdir = os.path.join(OUT, "proc")
shutil.rmtree(pdir, ignore_errors=True)
proc.save_pretrained(pdir)
for f in os.listdir(pdir):   # keep only the processor settings: the tokenizer is tests/fixtures/tokenizer
    if f not in ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json"):
        os.remove(os.path.join(pdir, f))
pc = json.load(open(os.path.join(pdir, "processor_config.json")))
assert "video_processor" in pc, sorted(pc)
# the Hub (4.4x) layout: a video_preprocessor_config.json beside the image processor's file
hdir = os.path.join(OUT, "hub")
os.makedirs(hdir, exist_ok=True)
json.dump(dict(pc["video_processor"]), open(os.path.join(hdir, "video_preprocessor_config.json"), "w"), indent=2)
json.dump(dict(pc["image_processor"]), open(os.path.join(hdir, "preprocessor_config.json"), "w"), indent=2)
for d in (pdir, hdir):   # the saved settings load back to the same sampling and bounds
    v2 = Qwen2VLVideoProcessor.from_pretrained(d)
    assert v2.fps == 2 and v2.do_sample_frames and v2.size["longest_edge"] == SIZE["longest_edge"], (d, v2)

ref = {}
expect = {}
for name in ["mkv", "mp4"]:
    path = os.path.join(OUT, "moving." + name)
    c = av.open(path)
    st = c.streams.video[0]
    print(name, "frames", st.frames, "average_rate", st.average_rate, "codec", st.codec_context.name)
    c.close()
    frames, meta = read_pyav(path, vp.sample_frames)
    if name == "mp4":   # where the container stores its frame count, transformers' own reader agrees
        f2, m2 = load_video(path, backend="pyav", sample_indices_fn=partial(vp.sample_frames))
        assert np.array_equal(f2, frames) and list(m2.frames_indices) == list(meta.frames_indices)
    idx = np.asarray(meta.frames_indices)
    print(name, "indices", idx.tolist(), "total", meta.total_num_frames, "fps", meta.fps)
    out = proc.video_processor(videos=[frames], video_metadata=[meta], do_sample_frames=False, return_metadata=True,
                               return_tensors="pt")
    # the same frames and metadata the processor's own fetch path would give
    out["video_metadata"][0].frames_indices = idx
    sampled_fps = out["video_metadata"][0].sampled_fps
    spg = vp.temporal_patch_size / sampled_fps
    g = out["video_grid_thw"]
    ref[f"{name}.indices"] = torch.tensor(idx, dtype=torch.int64)
    ref[f"{name}.total_frames"] = torch.tensor([meta.total_num_frames], dtype=torch.int64)
    ref[f"{name}.fps"] = torch.tensor([meta.fps], dtype=torch.float64)
    ref[f"{name}.frames"] = torch.from_numpy(np.ascontiguousarray(frames))        # [n, H, W, 3] u8
    ref[f"{name}.pixel_values_videos"] = out["pixel_values_videos"].float()
    ref[f"{name}.video_grid_thw"] = g.to(torch.int64)
    ref[f"{name}.second_per_grid_ts"] = torch.tensor([spg], dtype=torch.float64)
    # a chat prompt with the video, through the processor (placeholder expansion by the grid)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What moves?"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = proc(text=[text], videos=[frames], videos_kwargs=dict(video_metadata=[meta], do_sample_frames=False),
               return_tensors="pt")
    assert torch.equal(enc["video_grid_thw"], g)
    ref[f"{name}.input_ids"] = enc["input_ids"][0].to(torch.int64)
    expect[name] = dict(text=text, indices=idx.tolist(), grid=g[0].tolist(), second_per_grid_ts=spg)
    # logits of the tiny fixture models on ids built around the grid (their vocabulary is 320)
    VID, VS, VE = 301, 298, 299
    n_tok = int(g[0].prod()) // vp.merge_size ** 2
    ids = torch.tensor([[5, 17, 42, VS] + [VID] * n_tok + [VE, 7, 99, 13]])
    for arch, cls in [("q2", Qwen2VLForConditionalGeneration), ("q25", Qwen2_5_VLForConditionalGeneration)]:
        m = cls.from_pretrained(os.path.join(ROOT, "qwen2_vl", arch + "_v5"), dtype=torch.float32,
                                attn_implementation="eager").eval()
        kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=2 * (ids == VID).int(),
                  pixel_values_videos=out["pixel_values_videos"].float(), video_grid_thw=g)
        if arch == "q25":
            kw["second_per_grid_ts"] = torch.tensor([spg])
        with torch.no_grad():
            ref[f"{name}.{arch}.logits"] = m(**kw).logits[0]
        ref[f"{name}.logit_ids"] = ids[0]
# end to end: the chat fixture (a tiny Qwen2-VL with the fixture tokenizer and transformers' default
# video processor config) generating from the H.264 clip sampled at 2 fps, as `mmc generate --video` does
chat_dir = os.path.join(ROOT, "qwen2_vl_chat")
cproc = Qwen2VLProcessor.from_pretrained(chat_dir)
cm = Qwen2VLForConditionalGeneration.from_pretrained(chat_dir, dtype=torch.float32, attn_implementation="eager").eval()
frames, meta = read_pyav(os.path.join(OUT, "moving.mp4"), partial(cproc.video_processor.sample_frames, fps=2))
msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What moves?"}]}]
text = cproc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
enc = cproc(text=[text], videos=[frames], videos_kwargs=dict(video_metadata=[meta], do_sample_frames=False),
            return_tensors="pt")
with torch.no_grad():
    gen = cm.generate(**enc, max_new_tokens=8, min_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
n = enc["input_ids"].shape[1]
expect["chat_mp4"] = dict(prompt_tokens=n, new_ids=gen[0, n:].tolist(), indices=list(map(int, meta.frames_indices)),
                          grid=enc["video_grid_thw"][0].tolist())
print("chat_mp4", expect["chat_mp4"])
json.dump(expect["chat_mp4"], open(os.path.join(OUT, "chat_expected.json"), "w"))   # one line, for the shell test
json.dump(expect, open(os.path.join(OUT, "expected.json"), "w"), indent=1)
save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
tot = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
print("wrote", OUT, f"{tot / 1e3:.0f} KB")
