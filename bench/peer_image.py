"""Peer for bench/bench_image.c: transformers' Qwen2-VL image processors on the same JPEGs
(bytes in memory -> decode -> pixel_values), the files bench_image writes (build/bench/
bench_image_{1024x768,4032x3024}.jpg; run build/bench_image first). Two rows per file:
  qwen2vl_preprocess_<WxH>_jpeg          the slow processor (Qwen2VLImageProcessorPil, PIL
                                         decode via load_image semantics: exif_transpose +
                                         convert("RGB"), PIL resize; PIL is single-threaded)
  qwen2vl_preprocess_<WxH>_jpeg_vs_fast  the fast processor (Qwen2VLImageProcessor, torchvision
                                         on torch tensors, torch threads = MMC_BENCH_THREADS),
                                         fed either a PIL-decoded image or a uint8 tensor from
                                         torchvision.io.decode_jpeg; the faster is reported and
                                         its "peer_note" says which
Median of >= 10 calls and >= 3 s after a warm-up, as bench_util.h's bench_time."""
import io, json, os, statistics, sys, time
import torch
from PIL import Image, ImageOps
from torchvision.io import ImageReadMode, decode_jpeg
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

THREADS = int(os.environ.get("MMC_BENCH_THREADS", "2"))
torch.set_num_threads(THREADS)


def bench(once):
    once()
    ts, start = [], time.perf_counter()
    while len(ts) < 10 or time.perf_counter() - start < 3.0:
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    return 1.0 / statistics.median(ts)


def pil(data):
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def report(name, v, note):
    print(json.dumps({"name": name, "peer": v, "unit": "images/s", "better": "higher", "peer_note": note}), flush=True)


slow, fast = Qwen2VLImageProcessorPil(), Qwen2VLImageProcessor()
for w, h in ((1024, 768), (4032, 3024)):
    path = f"build/bench/bench_image_{w}x{h}.jpg"
    if not os.path.exists(path):
        sys.exit(f"peer_image: {path} missing: run build/bench_image first (bench/run.sh does)")
    data = open(path, "rb").read()
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    name = f"qwen2vl_preprocess_{w}x{h}_jpeg"
    report(name, bench(lambda: slow(images=[pil(data)], return_tensors="np")),
           "transformers Qwen2VLImageProcessorPil (slow, PIL, 1 thread)")
    forms = {f"transformers Qwen2VLImageProcessor (fast, torchvision, {THREADS} threads), PIL decode":
             lambda: fast(images=[pil(data)], return_tensors="pt"),
             f"transformers Qwen2VLImageProcessor (fast, torchvision, {THREADS} threads), torchvision.io.decode_jpeg":
             lambda: fast(images=[decode_jpeg(raw, mode=ImageReadMode.RGB, apply_exif_orientation=True)],
                          return_tensors="pt")}
    res = {k: bench(f) for k, f in forms.items()}
    best = max(res, key=res.get)
    report(name + "_vs_fast", res[best], best)
