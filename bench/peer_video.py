"""Peer for bench/bench_video.c: transformers' Qwen2-VL video processor on a 30 s 720p H.264
clip sampled at 2 fps (60 of 900 frames): decode + sampling (transformers.video_utils.load_video
with the processor's sample_frames) and then the processor's preprocessing (resize, normalise,
patchify). The decoder is the one transformers 5.23 picks by default: the video processor's
fetch_videos uses torchcodec when it is installed and loads (FFmpeg's shared libraries,
libavdevice/libavfilter included); without it, and with torchvision >= 0.26 (no decoder), it
raises. The pinned reference requirements have no torchcodec, so there the peer is transformers'
own load_video with its default backend, "pyav" (av pinned: PyAV's default slice threading, every
frame decoded up to the last wanted one). The backend used is printed to stderr; both run with
the bench's thread count (OMP_NUM_THREADS, torch.set_num_threads; FFmpeg threads: each backend's
default, 0 = automatic). As bench_video, it prints CPU-seconds per clip (getrusage) to stderr
and MMC_BENCH_VIDEO_CASE=decode|full runs one case.

`python bench/peer_video.py --make-clip PATH` writes the clip (PyAV + libx264, moving shapes
over a scrolling texture, 30 fps, keyframe every 2 s as phone cameras write) and exits."""
import os
import resource
import sys
from functools import partial

import numpy as np

CLIP = os.environ.get("MMC_BENCH_VIDEO", "build/bench/video_30s_720p.mp4")


def make_clip(path, w=1280, h=720, fps=30, seconds=30):
    import av
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rng = np.random.RandomState(0)
    tex = rng.randint(0, 255, (h, w * 2, 3), np.uint8)
    tex = ((tex.astype(np.uint16) + np.roll(tex, 1, 0) + np.roll(tex, 1, 1) + np.roll(tex, 2, 1)) // 4).astype(np.uint8)
    c = av.open(path + ".tmp.mp4", "w")
    s = c.add_stream("libx264", rate=fps)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    s.options = {"preset": "veryfast", "crf": "23", "g": str(2 * fps)}
    y, x = np.mgrid[0:h, 0:w]
    for i in range(fps * seconds):
        f = tex[:, (i * 4) % w:(i * 4) % w + w].copy()
        cx, cy = (100 + i * 5) % w, 200 + int(150 * np.sin(i / 20))
        f[max(cy - 60, 0):cy + 60, max(cx - 80, 0):cx + 80] = [230, 40, (i * 3) % 256]
        for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    os.replace(path + ".tmp.mp4", path)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--make-clip":
    make_clip(sys.argv[2])
    sys.exit(0)

sys.path.insert(0, os.path.dirname(__file__))
from peer_util import median_time, report  # noqa: E402
from transformers import Qwen2VLVideoProcessor  # noqa: E402
from transformers.video_utils import load_video  # noqa: E402


if not os.path.exists(CLIP):
    make_clip(CLIP)
vp = Qwen2VLVideoProcessor()   # the defaults: size 128*28*28 .. 768*28*28 pixels per frame


try:
    from transformers.utils.import_utils import is_torchcodec_usable
    TORCHCODEC = is_torchcodec_usable(decode="video")
except Exception:
    TORCHCODEC = False
BACKEND = "torchcodec" if TORCHCODEC else "pyav"


def decode():
    if TORCHCODEC:   # the processor's own path for a file: fetch_videos with its sample_frames
        return vp.fetch_videos(CLIP, sample_indices_fn=partial(vp.sample_frames, fps=2))
    return load_video(CLIP, backend="pyav", sample_indices_fn=partial(vp.sample_frames, fps=2))


def full():
    if TORCHCODEC:   # a path straight to the processor, as a user writes it
        return vp(videos=[CLIP], do_sample_frames=True, fps=2, return_tensors="pt", cap_pixels_per_frame=False)
    frames, meta = decode()
    return vp(videos=[frames], video_metadata=[meta], do_sample_frames=False, return_tensors="pt",
              cap_pixels_per_frame=False)


out = full()
print(f"peer_video ({BACKEND}): {len(decode()[1].frames_indices)} frames -> pixel_values_videos "
      f"{tuple(out['pixel_values_videos'].shape)}, grid {out['video_grid_thw'].tolist()}", file=sys.stderr)


def timed(name, fn):
    """Median wall time as the C bench; CPU-seconds per call (getrusage: user + system, every
    thread, warm-up included) to stderr."""
    calls = [0]

    def counted():
        calls[0] += 1
        return fn()
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t = median_time(counted, min_s=0, min_iters=3)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime) / calls[0]
    print(f"peer_video: {name} {cpu:.3f} CPU-s per clip, {t:.3f} s wall (median of {calls[0] - 1})", file=sys.stderr)
    report(name, 1.0 / t, "clips/s")


ONLY = os.environ.get("MMC_BENCH_VIDEO_CASE", "")
if ONLY in ("", "decode"):
    timed("video_decode_sample_30s_720p_h264_2fps", decode)
if ONLY in ("", "full"):
    timed("video_qwen2vl_30s_720p_h264_2fps", full)
