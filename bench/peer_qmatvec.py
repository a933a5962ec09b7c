"""peer_qmatvec.py — the peers of bench/bench_qmatvec.c's cases, same names (GB/s of the weight bytes held).

qmv_nf4_* / qmv_nf4dq_*: bitsandbytes' matmul_4bit on the CPU (what a QLoRA / 4-bit PyTorch user runs: the
  weight from bitsandbytes.functional.quantize_4bit(quant_type="nf4", blocksize=64), compress_statistics
  False / True for nf4dq), x in f32 and in bf16 (the dtype a 4-bit model usually computes in), the faster
  form reported (peer_note names it). bitsandbytes 0.50 reaches a fused CPU kernel only through the
  `kernels` package (downloaded from the Hub); without it (as here: it says "Failed to load CPU
  gemm_4bit_forward from kernels-community") matmul_4bit dequantises the whole weight each call and
  multiplies, which the note says.
qmv_int8_*: torch._weight_int8pack_mm (PyTorch's CPU weight-only int8 kernel: int8 [N, K], one scale a
  row, x f32 or bf16), where this torch has it.
qmv_bf16_*: F.linear with a bf16 weight and bf16 activations (oneDNN), as peer_gemm.py's bf16 matvec.
Sizes and shapes as bench_qmatvec.c (l2 1024x2048, l3 4096x4096 back to back; dram 8192x4096, each call
after an untimed read of 512 MiB or 2 x L3); M = 1..4 rows; "_1t" one thread on its CPU-time clock,
"_2t" two threads (MMC_BENCH_THREADS caps it) on the wall clock. Best call of a ~0.3 s run (the slow
dequantising forms: at least 3 calls)."""
import json
import os
import time

import torch
import torch.nn.functional as F

from peer_timing import evict_floats

torch.manual_seed(0)
CLOCK = time.perf_counter


def report(name, value, unit, note=None):
    r = {"name": name, "peer": value, "unit": unit, "better": "higher"}
    if note:
        r["peer_note"] = note
    print(json.dumps(r), flush=True)


def best_time(fn, before=None, min_seconds=0.3, min_iters=3):
    if before:
        before()
    fn()
    best, start, n = 1e30, time.perf_counter(), 0
    while n < min_iters or time.perf_counter() - start < min_seconds:
        if before:
            before()
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
        n += 1
    return best


def main():
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as bf
    except ImportError:
        bnb = None
    int8mm = getattr(torch, "_weight_int8pack_mm", None)
    sizes = [("l2", 1024, 2048), ("l3", 4096, 4096), ("dram", 8192, 4096)]
    maxt = min(2, int(os.environ.get("MMC_BENCH_THREADS", "2")))
    evict = None
    global CLOCK
    with torch.no_grad():
        for sname, n, k in sizes:
            before = None
            if sname == "dram":
                evict = torch.ones(evict_floats())
                before = evict.sum
            g = torch.Generator().manual_seed(12345)
            w = (torch.rand(n, k, generator=g) - 0.5) * 0.1
            forms = {}   # fmt -> (bytes held, {label: fn(x_f32, x_bf16)})
            if bnb is not None:
                for fmt, dq in (("nf4", False), ("nf4dq", True)):
                    qw, st = bf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=dq)
                    qh, sh = bf.quantize_4bit(w.to(torch.bfloat16), blocksize=64, quant_type="nf4",
                                              compress_statistics=dq)
                    held = qw.numel() + (n * k // 64) * (1 if dq else 4) + (((n * k // 64 + 255) // 256) * 4 if dq else 0)
                    forms[fmt] = (held, {
                        "bitsandbytes matmul_4bit, f32 x": lambda x, xh, qw=qw, st=st: bnb.matmul_4bit(x, qw.t(), quant_state=st),
                        "bitsandbytes matmul_4bit, bf16 x": lambda x, xh, qh=qh, sh=sh: bnb.matmul_4bit(xh, qh.t(), quant_state=sh)})
            if int8mm is not None:
                sc = w.abs().amax(dim=1) / 127
                q8 = torch.round(w / sc[:, None]).clamp(-127, 127).to(torch.int8)
                sch = sc.to(torch.bfloat16)
                forms["int8"] = (n * k + n * 4, {
                    "torch._weight_int8pack_mm, f32 x": lambda x, xh: int8mm(x, q8, sc),
                    "torch._weight_int8pack_mm, bf16 x": lambda x, xh: int8mm(xh, q8, sch)})
            wh = w.to(torch.bfloat16)
            forms["bf16"] = (n * k * 2, {"torch F.linear bf16 x bf16 (oneDNN)": lambda x, xh: F.linear(xh, wh)})
            for t in range(1, maxt + 1):
                torch.set_num_threads(t)
                CLOCK = time.thread_time if t == 1 else time.perf_counter
                for m in range(1, 5):
                    x = torch.randn(m, k)
                    xh = x.to(torch.bfloat16)
                    for fmt, (held, fns) in forms.items():
                        ts = {}
                        for label, fn in fns.items():
                            try:
                                ts[label] = best_time(lambda: fn(x, xh), before)
                            except (RuntimeError, NotImplementedError):
                                continue
                        if not ts:
                            continue
                        lab = min(ts, key=ts.get)
                        note = lab + (" (no fused CPU kernel: the weight dequantised each call)"
                                      if fmt.startswith("nf4") else "")
                        report(f"qmv_{fmt}_{sname}_m{m}_{t}t", held / ts[lab] * 1e-9, "GB/s", note)
            del forms


main()
