"""Fixtures for tests/test_image.c: test images written with PIL, PIL's decoded RGB
(transformers.image_utils.load_image semantics: exif_transpose + convert("RGB")), PIL
resize results, and Qwen2VLImageProcessor (use_fast=False, PIL backend) / video
processor outputs. Large uint8 arrays are stored as a checksum + per-row sums (exact
comparison, tiny files): hash = sum_i byte[i] * (i * 2654435761 + 0x9E3779B97F4A7C15)
mod 2^64, over the [H, W, 3] buffer. Run: .venv-ref/bin/python tools/ref/gen_image.py
"""
import io, json, os, shutil
import numpy as np
from PIL import Image, ImageOps
import torch
from safetensors.numpy import save_file
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from transformers.image_transforms import convert_to_rgb

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "image")
OUT = os.path.abspath(OUT)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
rng = np.random.RandomState(0)


def content(h, w, c=3):
    """Smooth gradients + blobs + a little noise (compresses well, exercises every level)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = []
    for k in range(c):
        f = 127.5 + 100 * np.sin(x / (7 + 5 * k) + k) * np.cos(y / (11 + 3 * k))
        f += 40 * np.sign(np.sin((x + y) / 13.0 + k))
        f += rng.normal(0, 6, (h, w))
        chans.append(f)
    a = np.clip(np.stack(chans, -1), 0, 255).astype(np.uint8)
    return a if c > 1 else a[..., 0]


def hash_u8(a):
    a = np.ascontiguousarray(a, dtype=np.uint8).ravel().astype(np.uint64)
    idx = np.arange(a.size, dtype=np.uint64)
    w = idx * np.uint64(2654435761) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        return np.array([(a * w).sum(dtype=np.uint64)], dtype=np.uint64).view(np.int64)


T = {}


def put_u8(key, arr):
    """Store shape, checksum and row sums of an [H, W, 3] uint8 array (full array if small)."""
    arr = np.ascontiguousarray(arr)
    assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3, (key, arr.shape)
    T[key + ".shape"] = np.array(arr.shape[:2], dtype=np.int64)
    T[key + ".hash"] = hash_u8(arr)
    T[key + ".rowsum"] = arr.reshape(arr.shape[0], -1).astype(np.int64).sum(1)
    if arr.size <= 8000:
        T[key + ".data"] = arr


images = {}  # name -> file name
def save(name, im, ext, **kw):
    fn = f"{name}.{ext}"
    im.save(os.path.join(OUT, fn), **kw)
    images[name] = fn

save("rgb_37x53", Image.fromarray(content(53, 37)), "png")
save("rgb_500x333", Image.fromarray(content(333, 500)), "jpg", quality=85)
save("rgb_640x480", Image.fromarray(content(480, 640)), "jpg", quality=75)
save("tall_100x900", Image.fromarray(content(900, 100)), "png")
save("wide_900x100", Image.fromarray(content(100, 900)), "jpg", quality=90)
save("grey_L", Image.fromarray(content(45, 60, 1), "L"), "png")
save("grey_jpeg", Image.fromarray(content(45, 61, 1), "L"), "jpg", quality=90)
pal = Image.fromarray(content(40, 52)).convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
save("palette_P", pal, "png")
save("palette_trns", pal, "png", transparency=3)
rgba = np.concatenate([content(50, 70), content(50, 70, 1)[..., None]], -1)
save("rgba", Image.fromarray(rgba, "RGBA"), "png")
la = np.stack([content(33, 29, 1), content(33, 29, 1)], -1)
save("grey_alpha_LA", Image.fromarray(la, "LA"), "png")
g16 = (content(30, 40, 1).astype(np.uint16) * 3 + rng.randint(0, 3, (30, 40))).astype(np.uint16)
save("grey16", Image.fromarray(g16), "png")  # mode I;16: PIL clips to 255 in convert("RGB")
save("interlaced", Image.fromarray(content(31, 27)), "png", optimize=False)
exif = Image.Exif()
exif[0x0112] = 6
save("exif6", Image.fromarray(content(48, 64)), "jpg", quality=90, exif=exif.tobytes())
exif3 = Image.Exif()
exif3[0x0112] = 8
save("exif8", Image.fromarray(content(24, 40)), "png", exif=exif3.tobytes())
save("cmyk", Image.fromarray(content(36, 44, 4), "CMYK"), "jpg", quality=90)
save("progressive", Image.fromarray(content(120, 160)), "jpg", quality=80, progressive=True)
save("subsample444", Image.fromarray(content(35, 47)), "jpg", quality=95, subsampling=0)
save("subsample422", Image.fromarray(content(35, 47)), "jpg", quality=95, subsampling=1)


def load_image(path):  # transformers.image_utils.load_image for a local path
    im = Image.open(path)
    im = ImageOps.exif_transpose(im)
    return im.convert("RGB")


def load_white(path):  # PIL image given straight to the processor: composite on white
    im = ImageOps.exif_transpose(Image.open(path))
    return convert_to_rgb(im, return_numpy=True)


names = sorted(images)
for n in names:
    p = os.path.join(OUT, images[n])
    put_u8(f"decode.{n}", np.array(load_image(p)))
    put_u8(f"white.{n}", load_white(p))

# ---- PIL resize (bit-exact targets)
src = {"rgb_500x333": np.array(load_image(os.path.join(OUT, images["rgb_500x333"]))),
       "rgb_37x53": np.array(load_image(os.path.join(OUT, images["rgb_37x53"])))}
resize_cases = [("rgb_500x333", 224, 224), ("rgb_500x333", 700, 1000), ("rgb_500x333", 57, 123),
                ("rgb_500x333", 333, 251), ("rgb_500x333", 150, 500), ("rgb_37x53", 20, 80),
                ("rgb_37x53", 112, 84), ("rgb_37x53", 53, 37)]
rc = []
for i, (n, h, w) in enumerate(resize_cases):
    for fname, f in (("bicubic", Image.BICUBIC), ("bilinear", Image.BILINEAR)):
        out = np.array(Image.fromarray(src[n]).resize((w, h), resample=f))
        put_u8(f"resize{i}.{fname}", out)
    rc.append([n, h, w])

# ---- Qwen2-VL image processor (slow = PIL backend), two configurations
cfgs = {"small": dict(min_pixels=56 * 56, max_pixels=28 * 28 * 16),    # most images downscale
        "large": dict(min_pixels=28 * 28 * 40, max_pixels=28 * 28 * 80)}  # most upscale
full_pv = {"rgb_37x53", "rgb_640x480", "tall_100x900", "rgba", "exif6"}
report = {}
for cname, kw in cfgs.items():
    slow = Qwen2VLImageProcessorPil(**kw)
    fast = Qwen2VLImageProcessor(**kw)
    for n in names:
        im = load_image(os.path.join(OUT, images[n]))
        r = slow(images=[im], return_tensors="np")
        pv, thw = r["pixel_values"].astype(np.float32), r["image_grid_thw"].astype(np.int64)
        T[f"proc.{cname}.{n}.grid_thw"] = thw.reshape(-1)
        if n in full_pv and cname == "small":
            T[f"proc.{cname}.{n}.pixel_values"] = pv
        else:
            T[f"proc.{cname}.{n}.pv_absum"] = np.array([np.abs(pv.astype(np.float64)).sum()])
        # the resized uint8 image the processor normalised
        h, w = int(thw[0, 1]) * 14, int(thw[0, 2]) * 14
        arr = convert_to_rgb(im, return_numpy=True)  # what the processor resizes
        rs = arr if (h, w) == arr.shape[:2] else np.array(Image.fromarray(arr).resize((w, h), resample=Image.BICUBIC))
        put_u8(f"proc.{cname}.{n}.resized", rs)
        rf = fast(images=[im], return_tensors="pt")
        d = float((rf["pixel_values"].numpy() - pv).__abs__().max())
        report[f"{cname}.{n}"] = d
        if cname == "small" and n == "rgb_640x480":
            T["fast.small.rgb_640x480.pixel_values"] = rf["pixel_values"].numpy().astype(np.float32)
T["proc.names"] = np.frombuffer("\n".join(names).encode(), dtype=np.uint8).copy()

# ---- videos: folders of PNG frames; the video processor is torch-only in transformers 5
vkw = dict(size={"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 16})
vp = Qwen2VLVideoProcessor(**vkw)
for vname, (nf, h, w) in {"video4": (4, 56, 84), "video3": (3, 56, 84), "video3r": (3, 50, 70)}.items():
    d = os.path.join(OUT, vname)
    os.makedirs(d)
    frames = []
    for i in range(nf):
        a = content(h, w)
        Image.fromarray(a).save(os.path.join(d, f"frame_{i:03d}.png"))
        frames.append(a)
    v = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()  # [T, C, H, W] uint8
    r = vp(videos=[v], return_tensors="pt", do_sample_frames=False, cap_pixels_per_frame=False)
    T[f"{vname}.pixel_values"] = r["pixel_values_videos"].numpy().astype(np.float32)
    T[f"{vname}.grid_thw"] = r["video_grid_thw"].numpy().astype(np.int64).reshape(-1)

# ---- preprocessor_config.json layouts (old top-level keys, new size dict)
with open(os.path.join(OUT, "preproc_old.json"), "w") as f:
    json.dump({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
               "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
               "image_std": [0.26862954, 0.26130258, 0.27577711], "rescale_factor": 0.00392156862745098,
               "resample": 3, "image_processor_type": "Qwen2VLImageProcessor"}, f, indent=2)
with open(os.path.join(OUT, "preproc_new.json"), "w") as f:
    json.dump({"size": {"shortest_edge": 12544, "longest_edge": 62720}, "patch_size": 14,
               "temporal_patch_size": 2, "merge_size": 2, "do_resize": True,
               "image_processor_type": "Qwen2VLImageProcessor"}, f, indent=2)

T["resize.cases"] = np.array([[0 if n == "rgb_500x333" else 1, h, w] for n, h, w in rc], dtype=np.int64)
save_file(T, os.path.join(OUT, "image.safetensors"))
with open(os.path.join(OUT, "fast_vs_slow.json"), "w") as f:
    json.dump(report, f, indent=1, sort_keys=True)
print("fast vs slow max|diff| over images:", max(report.values()))
tot = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
print(f"fixtures: {len(T)} tensors, folder {tot/1e6:.2f} MB")
