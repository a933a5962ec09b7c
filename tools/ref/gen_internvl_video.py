"""InternVL videos as transformers 5.23 processes and runs them (InternVLVideoProcessor +
InternVLProcessor's per-frame expansion + InternVLForConditionalGeneration), for
tests/test_internvl_video.c and tests/test_internvl_cli.sh.

Writes tests/fixtures/internvl/video/: the tiny v5 checkpoint of gen_internvl.py (run that first)
loaded and saved again by save_pretrained with a processor whose video processor has 56x56 frames
(the tower's tile size, so frames and image tiles share one pixel_values), ImageNet mean / std (as
the InternVL*-hf checkpoints have), do_sample_frames true and num_frames 5; model.safetensors is a
link to v5's (the same weights). And video_ref.safetensors, per case:
  file   tests/fixtures/video/moving.mkv (FFV1, 24 frames at 8 fps) sampled by sample_frames with the
         saved settings (num_frames 5, initial_shift true), an image (tests/fixtures/e2e/shapes_160x120.png,
         7 tiles) before it in the message: indices, pixel_values (the image's tiles then the frames,
         as InternVLProcessor concatenates them), ids, logits of the last 16 positions, 8 greedy tokens
  fps    the same file with num_frames unset and fps 2 (int(24 / 8 * 2) = 6 frames; the CLI's
         --video-fps 2): indices, the frames' pixel_values, ids, last-16 logits, greedy
  dir    tests/fixtures/llava_onevision/video/ (3 PNG frames of 45x34), every frame (a frame list is never
         sampled by transformers): pixel_values, ids, last-16 logits, greedy
Frames are decoded with PyAV to rgb24 (what transformers' pyav backend gives; its default torchcodec
is not installed) with a frame count from demuxing (Matroska's header has none), then handed to the
processor with do_sample_frames=False, as fetch_videos would with that backend.
Run: .venv-ref/bin/python tools/ref/gen_internvl_video.py
"""
import json
import os
import shutil

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (AutoImageProcessor, AutoProcessor, InternVLForConditionalGeneration, InternVLProcessor,
                          InternVLVideoProcessor)
from video_ref import read_pyav

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
SRC = os.path.join(ROOT, "internvl", "v5")
OUT = os.path.join(ROOT, "internvl", "video")
torch.manual_seed(0)

shutil.rmtree(OUT, ignore_errors=True)
m = InternVLForConditionalGeneration.from_pretrained(SRC).float().eval()
m.save_pretrained(OUT)
p0 = InternVLProcessor.from_pretrained(SRC)
vp = InternVLVideoProcessor(size={"height": 56, "width": 56}, image_mean=[0.485, 0.456, 0.406],
                            image_std=[0.229, 0.224, 0.225], do_sample_frames=True, num_frames=5)
InternVLProcessor(image_processor=p0.image_processor, tokenizer=p0.tokenizer, video_processor=vp,
                  image_seq_length=p0.image_seq_length, chat_template=p0.chat_template).save_pretrained(OUT)
os.remove(os.path.join(OUT, "model.safetensors"))
os.symlink(os.path.join("..", "v5", "model.safetensors"), os.path.join(OUT, "model.safetensors"))

# everything below from the directory as saved
proc = AutoProcessor.from_pretrained(OUT)
proc.image_processor = AutoImageProcessor.from_pretrained(OUT, backend="pil")   # the CLI's default backend
vproc = proc.video_processor
assert type(vproc).__name__ == "InternVLVideoProcessor" and vproc.num_frames == 5 and vproc.do_sample_frames
m = InternVLForConditionalGeneration.from_pretrained(OUT).float().eval()


image = Image.open(os.path.join(ROOT, "e2e", "shapes_160x120.png")).convert("RGB")
MKV = os.path.join(ROOT, "video", "moving.mkv")
ref, expected = {}, {}
for case in ("file", "fps", "dir"):
    if case == "dir":
        d = os.path.join(ROOT, "llava_onevision", "video")
        frames = np.stack([np.asarray(Image.open(os.path.join(d, f)).convert("RGB")) for f in sorted(os.listdir(d))
                           if f.endswith(".png")])
        indices = list(range(len(frames)))
    elif case == "file":
        frames, meta = read_pyav(MKV, vproc.sample_frames)
        indices = [int(i) for i in meta.frames_indices]
    else:
        v2 = InternVLVideoProcessor.from_pretrained(OUT)
        v2.num_frames, v2.fps = None, 2   # preprocess() passes its own fps to sample_frames as a keyword
        frames, meta = read_pyav(MKV, lambda metadata: v2.sample_frames(metadata, fps=v2.fps))
        indices = [int(i) for i in meta.frames_indices]
    content = ([{"type": "image"}] if case == "file" else []) + [{"type": "video"},
                                                                {"type": "text", "text": "What happens in the video?"}]
    conv = [{"role": "user", "content": content}]
    text = proc.apply_chat_template(conv, add_generation_prompt=True)
    inputs = proc(images=image if case == "file" else None, text=text, videos=[frames], do_sample_frames=False,
                  return_tensors="pt")
    T = inputs["input_ids"].shape[1]
    with torch.no_grad():
        logits = m(**inputs).logits
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    n_img_tiles = inputs["pixel_values"].shape[0] - len(frames)
    ref[case + ".indices"] = torch.tensor(indices, dtype=torch.int64)
    ref[case + ".ids"] = inputs["input_ids"].to(torch.int64)
    if case != "fps":
        ref[case + ".pixel_values"] = inputs["pixel_values"].float().contiguous()
    else:
        ref[case + ".pixel_values"] = inputs["pixel_values"][n_img_tiles:].float().contiguous()
    ref[case + ".logits_tail"] = logits[:, -16:].float().contiguous()   # [1, 16, V]
    ref[case + ".greedy"] = g[:, T:].to(torch.int64)
    expected[case] = {"templated": text, "n_prompt": T, "indices": indices, "n_frames": len(frames),
                      "n_image_tiles": n_img_tiles, "greedy_ids": g[0, T:].tolist(),
                      "argmax_last": int(logits[0, -1].argmax())}
    print(case, "indices", indices, "T", T, "pixel_values", list(inputs["pixel_values"].shape),
          "greedy", g[0, T:].tolist())

save_file(ref, os.path.join(ROOT, "internvl", "video_ref.safetensors"))
with open(os.path.join(ROOT, "internvl", "video_expected.tsv"), "w") as f:
    f.write("# case\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_internvl_video.py)\n")
    for case, e in expected.items():
        f.write("\t".join([case, str(e["n_prompt"]), ",".join(str(x) for x in e["greedy_ids"]),
                           str(e["argmax_last"])]) + "\n")
print(json.dumps(expected, indent=1, ensure_ascii=False)[:2000])
