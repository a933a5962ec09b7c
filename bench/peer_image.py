"""Peer for bench/bench_image.c: transformers' Qwen2-VL image processor on the same
1024x768 JPEG (bytes in memory -> load_image semantics -> pixel_values). The slow PIL
processor is the main peer; the fast (torchvision) one is reported as the _vs_fast case."""
import io, json, os, statistics, time
import torch
from PIL import Image, ImageOps
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
path = "build/bench/bench_image_1024x768.jpg"
if not os.path.exists(path):
    import numpy as np
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (768, 1024, 3), np.uint8)).save(path, quality=85)
data = open(path, "rb").read()


def bench(proc, tensors):
    def once():
        im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
        proc(images=[im], return_tensors=tensors)
    once()
    ts, start = [], time.perf_counter()
    while len(ts) < 10 or time.perf_counter() - start < 3.0:
        t0 = time.perf_counter()
        once()
        ts.append(time.perf_counter() - t0)
    return 1.0 / statistics.median(ts)


for name, proc, tens in (("qwen2vl_preprocess_1024x768_jpeg", Qwen2VLImageProcessorPil(), "np"),
                         ("qwen2vl_preprocess_1024x768_jpeg_vs_fast", Qwen2VLImageProcessor(), "pt")):
    print(json.dumps({"name": name, "peer": bench(proc, tens), "unit": "images/s", "better": "higher"}))
