"""The decoding floor of bench_video's clip: which frames an exact decode of the sampled ones
needs. Reads the H.264 stream's packets with PyAV (no decoding), takes each frame's slice type
and nal_ref_idc from its first slice header, samples the frames as Qwen2VLVideoProcessor does at
2 fps (int(arange(0, total, total / n)), float32 steps), and counts, per keyframe segment, the
frames that must be decoded: every reference frame up to the packet of the segment's last wanted
frame (in decode order), and the wanted frames no other frame refers to. bench_video's
"N frames decoded" should equal the total.

    .venv-ref/bin/python bench/video_floor.py [build/bench/video_30s_720p.mp4]
"""
import sys
from collections import Counter

import av
import numpy as np

path = sys.argv[1] if len(sys.argv) > 1 else "build/bench/video_30s_720p.mp4"


def ue(bits, pos):
    """Exp-Golomb ue(v) at bit pos of the bit string; (value, next pos)."""
    z = 0
    while bits[pos + z] == "0":
        z += 1
    return int(bits[pos + z:pos + 2 * z + 1], 2) - 1, pos + 2 * z + 1


def slice_info(data):
    """(nal_ref_idc, 'I'|'P'|'B') of the first slice NAL of an AVCC (4-byte length) packet."""
    i = 0
    while i + 4 < len(data):
        n = int.from_bytes(data[i:i + 4], "big")
        nal = data[i + 4:i + 4 + n]
        if nal[0] & 31 in (1, 5):
            rbsp = nal[1:16].replace(b"\x00\x00\x03", b"\x00\x00")   # emulation prevention
            bits = "".join(f"{b:08b}" for b in rbsp)
            _, p = ue(bits, 0)          # first_mb_in_slice
            t, _ = ue(bits, p)          # slice_type
            return (nal[0] >> 5) & 3, "PBIPBI"[t % 5] if t % 5 < 3 else "SP/SI"
        i += 4 + n
    return -1, "?"


c = av.open(path)
s = c.streams.video[0]
pk = []   # decode order: (pts, key, ref_idc, type)
for p in c.demux(s):
    if p.size:
        ref, t = slice_info(bytes(p))
        pk.append((p.pts, p.is_keyframe, ref, t))
pts = sorted(p[0] for p in pk)
total = len(pts)
n = int(total / float(s.average_rate) * 2) // 2 * 2   # fps 2, temporal_patch_size 2
step = np.float32(total / n)
want = {pts[int(np.float32(i) * step)] for i in range(n)}
segs = []
for p in pk:
    if p[1] or not segs:
        segs.append([])
    segs[-1].append(p)
need, upto = Counter(), 0
for seg in segs:
    last = max((j for j, p in enumerate(seg) if p[0] in want), default=-1)
    upto += last + 1
    for p in seg[:last + 1]:
        if p[2] > 0 or p[0] in want:
            need[p[3] + ("" if p[2] > 0 else " (non-ref, wanted)")] += 1
print(f"{path}: {total} frames, {sum(p[1] for p in pk)} keyframes, {sum(p[2] > 0 for p in pk)} reference frames; "
      f"{n} sampled")
print(f"all frames by type: {dict(Counter(p[3] + ('' if p[2] > 0 else ' (non-ref)') for p in pk))}")
print(f"frames up to each segment's last wanted one: {upto}; of them needed: {sum(need.values())} {dict(need)}")
