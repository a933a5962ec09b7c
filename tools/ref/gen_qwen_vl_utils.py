"""qwen-vl-utils' frame choice and frame size, for tests/test_video.c (mmc's --video-pixel-budget mode,
mmc_qwen2vl_video_proc.qwen_vl_utils).

Writes tests/fixtures/qwen_vl_utils/:
  cases.json       a table of rows: video metadata (total frames, fps, height x width), the request
                   (fps with min/max frames, or nframes), the pixel bounds (min_pixels, max_pixels,
                   the total budget from MODEL_SEQ_LEN tokens) and patch size, and what
                   qwen_vl_utils.fetch_video gives: the frame indices, the sample fps, the resized
                   height and width (or that it raises).
  e2e.safetensors  tests/fixtures/video/moving.mkv (lossless FFV1) through fetch_video at 4 fps with
                   a budget that binds, then a Qwen2-VL processor with the request's pixel bounds
                   (do_sample_frames=False, fetch_video's sample fps): pixel_values_videos,
                   video_grid_thw, second_per_grid_ts, the frame indices and input_ids of a chat
                   prompt with the video.
  e2e.json         the request of the end-to-end case and the decoder it ran with.
  proc/            that video processor's save_pretrained (video_preprocessor_config.json).

Every row runs qwen_vl_utils.fetch_video itself (calculate_video_frame_range, smart_nframes, the
reader's round(torch.linspace) indices, the total-pixel share, smart_resize): only the decoder under
it is replaced. For the table, a stand-in for torchcodec's VideoDecoder that has the row's metadata
and returns blank frames, with torchvision's resize returning an empty tensor of the size asked
(the size is what is checked, the pixels would only cost time). For the end-to-end case, torchcodec
itself when it is installed and loads (it needs FFmpeg's libavdevice/libavfilter), else the same
stand-in decoding with PyAV (pinned av: the frames of a lossless file are the same bytes).
"""
import json
import math
import os
import random
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import types  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "qwen_vl_utils")
VIDEO = os.path.join(ROOT, "video", "moving.mkv")
os.makedirs(OUT, exist_ok=True)

torch.manual_seed(0)
rng = random.Random(0)

from qwen_vl_utils import vision_process as vp  # noqa: E402

vp.FORCE_QWENVL_VIDEO_READER = "torchcodec"   # read before the (cached) first backend choice
vp.get_video_reader_backend.cache_clear()


class _Meta:
    def __init__(self, num_frames, fps):
        self.num_frames, self.average_fps = num_frames, fps


class _Frames:
    def __init__(self, data):
        self.data = data


class BlankDecoder:
    """torchcodec.decoders.VideoDecoder's surface for fetch_video: metadata and get_frames_at."""
    row = None

    def __init__(self, path, num_ffmpeg_threads=0, **kw):
        r = BlankDecoder.row
        self.metadata = _Meta(r["total"], r["video_fps"])
        self.h, self.w = r["height"], r["width"]

    def get_frames_at(self, indices):
        return _Frames(torch.zeros(1, 3, self.h, self.w, dtype=torch.uint8).expand(len(indices), -1, -1, -1))


class PyAVDecoder:
    """The same surface over PyAV (pinned av): metadata as PyAV reads it, frames by decoding in order."""

    def __init__(self, path, num_ffmpeg_threads=0, **kw):
        import av
        with av.open(path) as c:
            s = c.streams.video[0]
            self.frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
            # torchcodec's exact mode counts the frames when the header has no count (Matroska)
            self.metadata = _Meta(s.frames or len(self.frames), float(s.average_rate))

    def get_frames_at(self, indices):
        return _Frames(torch.from_numpy(np.stack([self.frames[i] for i in indices])).permute(0, 3, 1, 2).contiguous())


def use_decoder(cls):
    mod = types.ModuleType("torchcodec.decoders")
    mod.VideoDecoder = cls
    sys.modules["torchcodec.decoders"] = mod


def blank_resize(video, size, **kw):
    return torch.empty(video.shape[0], video.shape[1], size[0], size[1])


_READ = vp.VIDEO_READER_BACKENDS["torchcodec"]
_failure = []


def _read_keeping_error(ele):
    try:
        return _READ(ele)
    except Exception as e:   # fetch_video would hide it behind its torchvision fallback
        _failure.append(e)
        raise


def _no_fallback(ele):
    raise RuntimeError("torchvision fallback")


vp.VIDEO_READER_BACKENDS["torchcodec"] = _read_keeping_error
vp.VIDEO_READER_BACKENDS["torchvision"] = _no_fallback


def run_row(r):
    """fetch_video on the row; returns what it gives, or the error it raises."""
    ele = {"video": "row.mp4", "min_pixels": r["min_pixels"], "max_pixels": r["max_pixels"],
           "total_pixels": r["total_pixels"]}
    if "nframes" in r:
        ele["nframes"] = r["nframes"]
    else:
        ele.update(fps=r["fps"], min_frames=r["min_frames"], max_frames=r["max_frames"])
    BlankDecoder.row = r
    try:
        (video, meta), sample_fps = vp.fetch_video(ele, image_patch_size=r["patch_size"],
                                                    return_video_sample_fps=True, return_video_metadata=True)
    except RuntimeError:
        e = _failure.pop()
        if not isinstance(e, (ValueError, AssertionError)):
            raise e
        return {"error": str(e)[:200]}
    if video.shape[-2] == 0 or video.shape[-1] == 0:   # torchvision's resize then fails on the empty size
        return {"error": f"smart_resize gives {video.shape[-2]}x{video.shape[-1]}"}
    return {"indices": [int(i) for i in meta["frames_indices"]], "sample_fps": float(sample_fps),
            "resized_height": int(video.shape[-2]), "resized_width": int(video.shape[-1])}


def table():
    sizes = [(720, 1280), (1080, 1920), (480, 640), (1280, 720), (2160, 3840), (360, 480), (240, 320), (64, 48),
             (48, 64), (1920, 1080), (544, 960), (100, 5000)]
    rows = []
    # the common requests over common clips: 2 fps default budget, the budget binding, nframes
    for total, fps in [(900, 30.0), (300, 29.97), (7200, 24.0), (45, 15.0), (61, 30.0), (18000, 30.0), (25, 25.0),
                       (241, 23.976), (10, 5.0), (3, 1.0), (1, 30.0)]:
        for req in [{"fps": 2.0}, {"fps": 1.0}, {"fps": 0.5}, {"fps": 4.0}, {"nframes": 8}, {"nframes": 7},
                    {"nframes": 5}, {"nframes": 30}]:
            for _ in range(2):
                h, w = sizes[len(rows) % 4]
                tokens = [128000, 16384, 2048][len(rows) % 3]
                rows.append(dict(total=total, video_fps=fps, height=h, width=w, tokens=tokens, **req))
    # random rows: any fps, frame bounds, bounds on pixels, odd sizes, patch 14 or 16
    for _ in range(400):
        total = rng.choice([rng.randint(1, 64), rng.randint(64, 4000), rng.randint(4000, 100000)])
        fps = rng.choice([24.0, 25.0, 30.0, 29.97, 60.0, 8.0, round(rng.uniform(0.5, 120), 3)])
        h, w = rng.choice(sizes) if rng.random() < 0.5 else (rng.randint(28, 2500), rng.randint(28, 2500))
        row = dict(total=total, video_fps=fps, height=h, width=w, tokens=rng.choice([128000, 32768, 8192, 1024, 256]),
                   patch_size=rng.choice([14, 14, 16]))
        if rng.random() < 0.3:
            row["nframes"] = rng.randint(1, 200)
        else:
            row.update(fps=rng.choice([2.0, 1.0, 0.5, 3.0, round(rng.uniform(0.1, 8), 3)]),
                       min_frames=rng.choice([4, 4, 2, 5, 7, 16]), max_frames=rng.choice([768, 768, 64, 33, 256, 9]))
        if rng.random() < 0.4:
            row["min_pixels"] = rng.choice([4 * 28 * 28, 64 * 28 * 28, 256 * 28 * 28, 3136])
            row["max_pixels"] = row["min_pixels"] * rng.choice([1, 2, 8, 40])
        rows.append(row)
    out = []
    for r in rows:
        r.setdefault("patch_size", 14)
        f = r["patch_size"] * vp.SPATIAL_MERGE_SIZE
        r.setdefault("min_frames", vp.FPS_MIN_FRAMES)
        r.setdefault("max_frames", vp.FPS_MAX_FRAMES)
        r.setdefault("min_pixels", vp.VIDEO_MIN_TOKEN_NUM * f * f)
        r.setdefault("max_pixels", vp.VIDEO_MAX_TOKEN_NUM * f * f)
        # fetch_video's default total: MODEL_SEQ_LEN tokens' pixels, 90% of them (given per row here)
        r["total_pixels"] = r["tokens"] * f * f * 0.9
        r.update(run_row(r))
        out.append(r)
    return out


def end_to_end():
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor
    try:
        import torchcodec  # noqa: F401
        from transformers.utils.import_utils import is_torchcodec_usable
        real = is_torchcodec_usable(decode="video")
    except Exception:
        real = False
    if real:
        sys.modules.pop("torchcodec.decoders", None)
        import torchcodec.decoders  # noqa: F401
        decoder = "torchcodec"
    else:
        use_decoder(PyAVDecoder)
        decoder = "pyav (stand-in for torchcodec's VideoDecoder)"
    vp.transforms.functional.resize = REAL_RESIZE
    f = 14 * 2
    # 24 frames at 8 fps sampled at 4 fps: 12 frames; a 16-token budget binds (64x48 -> 28x28 per frame, not
    # the 56x56 that max_pixels allows). The processor's bounds are the request's, so that it leaves
    # fetch_video's size alone; its settings are saved (video_preprocessor_config.json) for mmc to read.
    req = {"fps": 4.0, "min_frames": 4, "max_frames": 768, "min_pixels": 1 * f * f, "max_pixels": 4 * f * f,
           "tokens": 16}
    vproc = Qwen2VLVideoProcessor(size={"shortest_edge": req["min_pixels"], "longest_edge": req["max_pixels"]})
    vproc.save_pretrained(os.path.join(OUT, "proc"))
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tok, video_processor=vproc)
    ele = {"type": "video", "video": VIDEO, "fps": req["fps"], "min_frames": req["min_frames"],
           "max_frames": req["max_frames"], "min_pixels": req["min_pixels"], "max_pixels": req["max_pixels"],
           "total_pixels": req["tokens"] * f * f * 0.9}
    (video, meta), sample_fps = vp.fetch_video(ele, image_patch_size=14, return_video_sample_fps=True,
                                               return_video_metadata=True)
    text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "<|vision_start|><|video_pad|><|vision_end|>What moves?<|im_end|>\n<|im_start|>assistant\n")
    out = proc(text=[text], videos=[video], fps=sample_fps, do_sample_frames=False, do_resize=False,
               return_tensors="pt")
    # the processor itself would leave the size alone too (it is within its bounds and a multiple of 28)
    again = proc(text=[text], videos=[video], fps=sample_fps, do_sample_frames=False, return_tensors="pt")
    assert torch.equal(again["pixel_values_videos"], out["pixel_values_videos"])
    t = {"pixel_values_videos": out["pixel_values_videos"].float().contiguous(),
         "video_grid_thw": out["video_grid_thw"].long(),
         "second_per_grid_ts": torch.tensor([2.0 / sample_fps], dtype=torch.float64),
         "indices": torch.tensor([int(i) for i in meta["frames_indices"]], dtype=torch.int64),
         "input_ids": out["input_ids"][0].long()}
    save_file(t, os.path.join(OUT, "e2e.safetensors"))
    with open(os.path.join(OUT, "e2e.json"), "w") as fh:
        json.dump({"video": "tests/fixtures/video/moving.mkv", "processor": "tests/fixtures/qwen_vl_utils/proc",
                   "request": req, "decoder": decoder, "text": text,
                   "grid": out["video_grid_thw"][0].tolist()}, fh, indent=1)
    print(f"e2e: {decoder}, {len(t['indices'])} frames {t['indices'].tolist()}, grid {t['video_grid_thw'].tolist()}")


REAL_RESIZE = vp.transforms.functional.resize
if __name__ == "__main__":
    import importlib.metadata as md
    use_decoder(BlankDecoder)
    vp.transforms.functional.resize = blank_resize
    rows = table()
    with open(os.path.join(OUT, "cases.json"), "w") as fh:
        json.dump({"qwen_vl_utils": md.version("qwen-vl-utils"), "rows": rows}, fh, separators=(",", ":"))
    nerr = sum("error" in r for r in rows)
    print(f"cases: {len(rows)} rows ({nerr} raise)")
    end_to_end()
