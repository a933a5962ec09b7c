#!/usr/bin/env python3
"""st_diff.py A.safetensors B.safetensors TOL — the largest absolute difference between the
tensors of two f32 safetensors files (the same names and shapes required); exit 1 above TOL.
Pure standard library (struct), so a test needs no numpy."""
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, d in head.items():
        if name == "__metadata__":
            continue
        if d["dtype"] != "F32":
            sys.exit(f"st_diff: {path}: {name} is {d['dtype']}, only F32 is compared")
        a, b = d["data_offsets"]
        out[name] = (tuple(d["shape"]), struct.unpack(f"<{(b - a) // 4}f", data[a:b]))
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: st_diff.py A.safetensors B.safetensors TOL")
    a, b, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
    if sorted(a) != sorted(b):
        sys.exit(f"st_diff: different tensor names: {sorted(set(a) ^ set(b))[:5]}")
    worst, at = 0.0, ""
    for name, (shape, va) in a.items():
        shape_b, vb = b[name]
        if shape != shape_b:
            sys.exit(f"st_diff: {name}: shape {shape} vs {shape_b}")
        d = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        if d > worst or d != d:
            worst, at = d, name
    print(f"{len(a)} tensors, max abs diff {worst:.2e} ({at or '-'}; tol {tol:g})")
    sys.exit(0 if worst <= tol else 1)


if __name__ == "__main__":
    main()
