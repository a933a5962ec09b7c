"""A variable-frame-rate H.264 clip with B-frames (b-pyramid: B-frames other frames refer to)
and transformers' Qwen2-VL video processing of it, for tests/test_video.c (test_vfr).

Writes tests/fixtures/video/:
  vfr.mp4           H.264 (libx264 yuv420p, 3 B-frames, b-pyramid, keyframe every 12 frames) in
                    MP4: 90 frames 64x48 whose durations cycle through 1/30, 1/15, 1/10 and 1/60 s
                    (timestamps in 1/600 s), so the container's average rate is no frame's rate
  vfr_ref.safetensors  per sampling rate (fps 2 and 7, the processor settings of
                    tests/fixtures/video/proc otherwise): the metadata transformers reads (frame
                    count, average fps), sample_frames' indices, the frames PyAV decodes to RGB24
                    (transformers' pyav backend); for fps 2 pixel_values_videos and video_grid_thw.
The clip is decoded with transformers' own load_video(backend="pyav") and the processor's
sample_frames, as fetch_videos does with that backend (torchcodec, the default, is not installed).
"""
import os
from fractions import Fraction
from functools import partial

import av
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import Qwen2VLVideoProcessor
from transformers.video_utils import load_video

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "video")
W, H, N = 64, 48, 90
TB = Fraction(1, 600)
STEPS = [20, 40, 60, 10]   # 1/30, 1/15, 1/10, 1/60 s in 1/600 s ticks


def frame(i):
    y, x = np.mgrid[0:H, 0:W]
    f = np.stack([(x * 4 + i * 3) % 256, (y * 5 + i * 7) % 256, ((x + y) * 2 + i * 11) % 256], -1).astype(np.uint8)
    cx, cy = (5 + i) % W, 10 + (i * 3) % 30
    f[max(cy - 6, 0):cy + 6, max(cx - 8, 0):cx + 8] = [230, 40, (i * 9) % 256]
    return f


path = os.path.join(OUT, "vfr.mp4")
c = av.open(path, "w")
s = c.add_stream("libx264", rate=30)
s.width, s.height, s.pix_fmt = W, H, "yuv420p"
s.time_base = TB
s.codec_context.time_base = TB
s.options = {"crf": "20", "preset": "veryfast", "g": "12", "bf": "3", "x264-params": "threads=1:b-pyramid=normal"}
pts = 0
for i in range(N):
    f = av.VideoFrame.from_ndarray(frame(i), format="rgb24").reformat(format="yuv420p")
    f.pts, f.time_base = pts, TB
    pts += STEPS[i % len(STEPS)]
    for p in s.encode(f):
        c.mux(p)
for p in s.encode():
    c.mux(p)
c.close()

vp = Qwen2VLVideoProcessor.from_pretrained(os.path.join(OUT, "proc"))
ref = {}
with av.open(path) as c:
    st = c.streams.video[0]
    durs = sorted({int(p.duration) for p in c.demux(st) if p.size})
    print("frames", st.frames, "average_rate", st.average_rate, "packet durations", durs)
    assert len(durs) > 1, "the clip is not variable-rate"
for fps in (2, 7):
    frames, meta = load_video(path, backend="pyav", sample_indices_fn=partial(vp.sample_frames, fps=fps))
    out = vp(videos=[frames], video_metadata=[meta], do_sample_frames=False, return_tensors="pt")
    idx = np.asarray(meta.frames_indices)
    print(f"fps {fps}: total {meta.total_num_frames} avg fps {meta.fps} indices {idx.tolist()} "
          f"grid {out['video_grid_thw'].tolist()}")
    k = f"vfr{fps}"
    ref[f"{k}.indices"] = torch.tensor(idx, dtype=torch.int64)
    ref[f"{k}.total_frames"] = torch.tensor([meta.total_num_frames], dtype=torch.int64)
    ref[f"{k}.fps"] = torch.tensor([meta.fps], dtype=torch.float64)
    ref[f"{k}.frames"] = torch.from_numpy(np.ascontiguousarray(frames))
    if fps == 2:   # the processor's output once (1.3 MB more at 7 fps)
        ref[f"{k}.pixel_values_videos"] = out["pixel_values_videos"].float()
        ref[f"{k}.video_grid_thw"] = out["video_grid_thw"].to(torch.int64)
save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "vfr_ref.safetensors"))
print("wrote", path, os.path.getsize(path), "bytes and vfr_ref.safetensors",
      os.path.getsize(os.path.join(OUT, "vfr_ref.safetensors")), "bytes")
