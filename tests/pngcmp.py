#!/usr/bin/env python3
"""pngcmp.py A.png B.png — the largest per-channel difference between two 8-bit RGB PNGs (stdlib only:
a system python3's zlib decodes both, all five row filters), printed; exit 0 when the sizes agree and it
is at most 1 (PNG text chunks and compression are ignored)."""
import struct, sys, zlib
def pixels(path):
    data = open(path, "rb").read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype == 2, "8-bit RGB expected"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, out, stride, prev = zlib.decompress(idat), [], w * 3, bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], prev[i - 3] if i >= 3 else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, out
wa, ha, a = pixels(sys.argv[1])
wb, hb, b = pixels(sys.argv[2])
worst = max(abs(x - y) for x, y in zip(a, b)) if (wa, ha) == (wb, hb) else 999
print("size", wa, ha, "vs", wb, hb, "max pixel difference", worst)
sys.exit(0 if worst <= 1 else 1)
