"""gen_io.py — fixtures for tests/test_safetensors.c, test_json.c, test_yaml.c.

Writes tests/fixtures/io/:
  escapes.safetensors      JSON escapes in a tensor name and a metadata value;
  all_dtypes.safetensors   every dtype mmc supports, written by safetensors.torch.save_file
                           (test_safetensors rebuilds the same tensors with mmc_stw_* and
                           compares the files byte for byte);
  sharded/                 model.safetensors.index.json + 2 shards;
  sharded_missing/         an index whose second shard is absent;
  nomodel/                 a directory without any model file;
  bad/*.safetensors        malformed files, and bad/cases.json: for each, whether the
                           Python loader accepts it and its error message (the C test checks
                           mmc rejects what Python rejects);
  config.json, bad_syntax.json, run.yaml  config files for the JSON / YAML tests.

`python tools/ref/gen_io.py --verify FILE` loads a file written by mmc (test_safetensors
leaves one at /tmp/mmc_io_test/all_dtypes_mmc.safetensors) and checks it against the same
tensors, proving Python reads what mmc writes.
"""
import json
import os
import struct
import sys

import torch
from safetensors.torch import load_file, save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "io")
# one metadata key per file: the Rust writer emits __metadata__ in HashMap (random) order
META = {"format": "pt"}
NOTE = {"note": "quote \" backslash \\ newline \n tab \t \x01 ünï"}


def all_dtypes():
    """Same formulas as make_all() in tests/test_safetensors.c."""
    i = torch.arange(6, dtype=torch.float64)
    t = {
        "f32": (i * 0.5 - 1.25).to(torch.float32).reshape(2, 3),
        "f64": (i * 0.1 - 0.3).reshape(2, 3),
        "bf16": (i * 0.1 - 0.3).to(torch.float32).to(torch.bfloat16).reshape(3, 2),
        "f16": (i * 0.1 - 0.3).to(torch.float32).to(torch.float16).reshape(6),
        "i32": (torch.arange(6, dtype=torch.int32) * 1000 - 2500).reshape(1, 2, 3),
        "i64": ((torch.arange(6, dtype=torch.int64) - 3) * (1 << 40)).reshape(2, 3),
        "u8": (torch.arange(6, dtype=torch.int32) * 50).to(torch.uint8).reshape(2, 3),
        "i8": (torch.arange(6, dtype=torch.int32) * 40 - 100).to(torch.int8).reshape(2, 3),
        "bool": (torch.arange(6) % 2 == 1).reshape(2, 3),
        "scalar": torch.tensor(3.5, dtype=torch.float32),
        "empty": torch.zeros(0, dtype=torch.float32),
        "model.layers.0.ünïcode": torch.ones(2, dtype=torch.float32),
    }
    return t


def hdr_file(path, header, data=b"", raw=None):
    h = raw if raw is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def E(dt, shape, off):
    return {"dtype": dt, "shape": shape, "data_offsets": off}


def gen_bad(d):
    os.makedirs(d, exist_ok=True)
    z = lambda n: b"\0" * n
    cases = {
        "empty": lambda p: open(p, "wb").close(),
        "short": lambda p: open(p, "wb").write(b"\x05\0\0\0\0"),
        "hlen_lies": lambda p: open(p, "wb").write(struct.pack("<Q", 1000) + b'{"a":1}'),
        "hlen_huge": lambda p: open(p, "wb").write(struct.pack("<Q", 1 << 63) + b"{}"),
        "bad_json": lambda p: hdr_file(p, None, z(4), raw=b'{"a": {"dtype": "F32",\n "shape": [1] "x"}}'),
        "not_object": lambda p: hdr_file(p, None, raw=b"[]"),
        "unknown_dtype": lambda p: hdr_file(p, {"a": E("Q7", [1], [0, 4])}, z(4)),
        "lowercase_dtype": lambda p: hdr_file(p, {"a": E("f32", [1], [0, 4])}, z(4)),
        "shape_mismatch": lambda p: hdr_file(p, {"a": E("F32", [3], [0, 8])}, z(8)),
        "offsets_outside": lambda p: hdr_file(p, {"a": E("F32", [4], [0, 16])}, z(8)),
        "offsets_reversed": lambda p: hdr_file(p, {"a": E("F32", [1], [8, 4])}, z(8)),
        "gap": lambda p: hdr_file(p, {"a": E("F32", [1], [0, 4]), "b": E("F32", [1], [8, 12])}, z(12)),
        "overlap": lambda p: hdr_file(p, {"a": E("F32", [2], [0, 8]), "b": E("F32", [1], [4, 8])}, z(8)),
        "trailing_bytes": lambda p: hdr_file(p, {"a": E("F32", [2], [0, 8])}, z(12)),
        "truncated": lambda p: hdr_file(p, {"a": E("F32", [4], [0, 16])}, z(12)),
        "negative_dim": lambda p: hdr_file(p, {"a": E("F32", [-1], [0, 4])}, z(4)),
        "fractional_dim": lambda p: hdr_file(p, {"a": E("F32", [1.5], [0, 4])}, z(4)),
        "meta_not_string": lambda p: hdr_file(p, {"__metadata__": {"k": 1}, "a": E("F32", [1], [0, 4])}, z(4)),
        "bad_utf8": lambda p: hdr_file(p, None, z(4), raw=b'{"\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
        "missing_offsets": lambda p: hdr_file(p, {"a": {"dtype": "F32", "shape": [1]}}, z(4)),
        "three_offsets": lambda p: hdr_file(p, {"a": E("F32", [1], [0, 4, 4])}, z(4)),
        "shape_overflow": lambda p: hdr_file(p, {"a": E("F32", [1 << 40, 1 << 40, 1 << 40], [0, 4])}, z(4)),
        "trailing_junk": lambda p: hdr_file(p, None, z(4), raw=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x'),
        "entry_not_object": lambda p: hdr_file(p, {"a": [1, 2]}, z(4)),
        # accepted by Python: out-of-order offsets, whitespace around the JSON, zero-size tensors
        "ok_out_of_order": lambda p: hdr_file(p, {"b": E("F32", [1], [4, 8]), "a": E("I32", [1], [0, 4])}, b"\1\0\0\0\0\0\x80\x3f"),
        "ok_whitespace": lambda p: hdr_file(p, None, z(4), raw=b'  {"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   '),
        "ok_zero_size": lambda p: hdr_file(p, {"e": E("F32", [0, 3], [0, 0]), "a": E("U8", [2], [0, 2])}, z(2)),
        "ok_meta_null": lambda p: hdr_file(p, {"__metadata__": None, "a": E("U8", [1], [0, 1])}, z(1)),
        # accepted by Python, rejected by mmc on purpose
        "dup_name": lambda p: hdr_file(p, None, z(4), raw=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
        "dtype_f8": lambda p: hdr_file(p, {"a": E("F8_E4M3", [1], [0, 1])}, z(1)),
        "six_dims": lambda p: hdr_file(p, {"a": E("U8", [1, 1, 1, 1, 1, 1], [0, 1])}, z(1)),
    }
    verdict = {}
    for name, make in cases.items():
        p = os.path.join(d, name + ".safetensors")
        make(p)
        try:
            load_file(p)
            verdict[name] = {"python_ok": True, "python_error": ""}
        except Exception as e:  # noqa: BLE001 — any rejection counts
            verdict[name] = {"python_ok": False, "python_error": str(e)}
    with open(os.path.join(d, "cases.json"), "w") as f:
        json.dump(verdict, f, indent=1, sort_keys=True)


def gen_sharded(d, drop_second=False):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    s1 = {"layers.0.w": torch.randn(4, 4, generator=g), "layers.0.b": torch.randn(4, generator=g)}
    s2 = {"layers.1.w": torch.randn(4, 4, generator=g), "layers.1.b": torch.randn(4, generator=g),
          "embed": torch.randn(3, 4, generator=g).to(torch.bfloat16)}
    n1, n2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file(s1, os.path.join(d, n1), metadata={"format": "pt"})
    if not drop_second:
        save_file(s2, os.path.join(d, n2), metadata={"format": "pt"})
    wm = {k: n1 for k in s1}
    wm.update({k: n2 for k in s2})
    total = sum(t.numel() * t.element_size() for t in list(s1.values()) + list(s2.values()))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)


CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "embed_dim": 1280, "patch_size": 14, "hidden_act": "quick_gelu"},
    "sliding_window": None,
    "layer_types": ["full", "sliding", "full"],
}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--verify":
        got = load_file(sys.argv[2])
        want = all_dtypes()
        assert set(got) == set(want), (sorted(got), sorted(want))
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert torch.equal(got[k], v), k
        with open(sys.argv[2], "rb") as f:
            mine = f.read()
        ref = os.path.join(OUT, "all_dtypes.safetensors")
        with open(ref, "rb") as f:
            print("verify: %d tensors OK; bytes identical to save_file: %s" % (len(got), mine == f.read()))
        return
    os.makedirs(OUT, exist_ok=True)
    save_file(all_dtypes(), os.path.join(OUT, "all_dtypes.safetensors"), metadata=META)
    save_file({'we"ird\\name\t': torch.ones(1, dtype=torch.float32)},
              os.path.join(OUT, "escapes.safetensors"), metadata=NOTE)
    gen_sharded(os.path.join(OUT, "sharded"))
    gen_sharded(os.path.join(OUT, "sharded_missing"), drop_second=True)
    os.makedirs(os.path.join(OUT, "nomodel"), exist_ok=True)
    with open(os.path.join(OUT, "nomodel", "README.txt"), "w") as f:
        f.write("A directory without model.safetensors or its index (test_safetensors).\n")
    gen_bad(os.path.join(OUT, "bad"))
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(OUT, "bad_syntax.json"), "w") as f:
        f.write('{\n  "hidden_size": 1536,\n  "vision_config": {\n    "depth": 32,,\n  }\n}\n')
    with open(os.path.join(OUT, "run.yaml"), "w") as f:
        f.write(RUN_YAML)


RUN_YAML = """\
# a run config (test_yaml.c)
model: qwen2-vl-2b
seed: 42
train:
  steps: 1000
  batch_size: 8
  bf16: yes
  datasets: [coco, "cc3m"]
optimizer:
  name: adamw
  lr: 2e-5
  weight_decay: 1.0e-4
  betas_note: "0.9, 0.95"
tags:
  - vision
  - 'chat'
"""

if __name__ == "__main__":
    main()
