"""peer_gemm.py — PyTorch (CPU) figures for the cases of bench/bench_gemm.c, same names.

gemm_f32_<layout>: torch.matmul in the same layout (x @ W.T, dy @ W, dy.T @ x (+= into dW),
square 1024), GFLOP/s. gemm_bf16_<layout> and matvec_bf16_*: the weight is stored bf16 and the
peer is timed in every form a PyTorch user runs bf16 weights with, reporting the fastest (its
"peer_note" names it):
  bf16      both operands bf16 (a model cast with .bfloat16(): F.linear for x @ W.T, matmul
            otherwise) -> oneDNN's bf16 kernels (AVX512-BF16 / AMX where the CPU has them);
            activations already bf16, so the cast is not timed; output bf16
  autocast  f32 activations, bf16 weight under torch.autocast("cpu", bfloat16): the
            activation is cast to bf16 inside the call, then the same bf16 kernel
  widen     f32 activations, the weight widened to f32 per call (matmul(x, W.float().t()):
            mmc_gemm_bf16's arithmetic, but the f32 copy is built in memory every call;
            GEMMs only: on the decode matvec it is 20-30x slower than the others)
PyTorch has no f32-activation x bf16-weight CPU kernel (aten::_mixed_dtypes_linear and
mm(out_dtype=) are CUDA-only in torch 2.15), so autocast is that form. Note that mmc keeps
activations f32 and accumulates in f32 (bf16 only in the weight's storage) while the bf16 and
autocast forms also round activations (and outputs) to bf16: the peer does less work per
FLOP. gemm_bf16dot_<layout> repeats the gemm_bf16 peer figure for mmc's opt-in AVX512_BF16
kernel (MMC_GEMM_BF16=dot), which rounds activations to bf16 as the peer's bf16 forms do, and
gemm_bf16amx_<layout> for its AMX kernel (the one MMC_GEMM_BF16=dot picks where the CPU has AMX).
matvec_*: y = x @ W.T with one token, GB/s of weight bytes, calls back to back (the weight as
cache-resident as it gets); matvec_*_dram: each call after a read of 2 x L3 (or 512 MiB) that
evicts the weight, as bench_gemm.c's _dram cases; matvec_*_packed: the back-to-back figure again,
against mmc's pre-packed weight. Every figure is the best call of a ~1 s run, as in bench_gemm.c;
the "_1t" cases use one thread and its CPU-time clock."""
import json
import os
import time

import torch
import torch.nn.functional as F

from peer_timing import evict_floats

torch.manual_seed(0)


CLOCK = time.perf_counter


def best_time(fn, min_seconds=1.0, min_iters=5):
    fn()
    best, start, n = 1e30, time.perf_counter(), 0
    while n < min_iters or time.perf_counter() - start < min_seconds:
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
        n += 1
    return best


def best_time_after(fn, before, min_seconds=1.0, min_iters=10):
    """best_time with before() run (untimed) ahead of every timed call"""
    before()
    fn()
    best, start, n = 1e30, time.perf_counter(), 0
    while n < min_iters or time.perf_counter() - start < min_seconds:
        before()
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
        n += 1
    return best


def report(name, value, unit, note=None):
    r = {"name": name, "peer": value, "unit": unit, "better": "higher"}
    if note:
        r["peer_note"] = note
    print(json.dumps(r), flush=True)


def autocast(fn):
    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn()
    return run


def fastest(forms, min_seconds=1.0, min_iters=5):
    """forms: {label: fn}; returns (best seconds, label of the fastest form)."""
    ts = {k: best_time(fn, min_seconds, min_iters) for k, fn in forms.items()}
    k = min(ts, key=ts.get)
    return ts[k], k


NOTES = {"bf16": "torch bf16 x bf16 (oneDNN; activations pre-cast to bf16)",
         "autocast": "torch.autocast(cpu, bf16): f32 activations, bf16 weight",
         "widen": "torch f32 matmul on W.float() (bf16 weight widened per call)"}


def suite(sfx):
    T, H, I = 512, 896, 4864
    with torch.no_grad():
        x = torch.randn(T, H)
        W = torch.randn(I, H)          # [out, in]
        dy = torch.randn(T, I)
        dW = torch.randn(I, H)
        a = torch.randn(1024, 1024)
        b = torch.randn(1024, 1024)
        Wh, bh = W.to(torch.bfloat16), b.to(torch.bfloat16)
        xh, dyh, ah = x.to(torch.bfloat16), dy.to(torch.bfloat16), a.to(torch.bfloat16)
        f32 = {}
        for name, fn, mnk in [("gemm_f32_xWt", lambda: torch.matmul(x, W.t()), T * I * H),
                              ("gemm_f32_dyW", lambda: torch.matmul(dy, W), T * H * I),
                              ("gemm_f32_dyTx", lambda: dW.addmm_(dy.t(), x), I * H * T),
                              ("gemm_f32_sq1024", lambda: torch.matmul(a, b), 1024 ** 3)]:
            f32[name[9:]] = gf = 2.0 * mnk / best_time(fn) * 1e-9
            report(name + sfx, gf, "GFLOP/s")
            if name == "gemm_f32_xWt":   # mmc's pre-packed weight against the same figure
                report(f"gemm_f32_xWt_packed{sfx}", gf, "GFLOP/s")
            # mmc's MMC_MATMUL_PRECISION=high (bf16x3 on AMX, ~1e-6 of sum |a||b|) against torch's f32
            # matmul (its default precision "highest"): the peer a user of f32 weights runs
            report(f"gemm_bf16x3_{name[9:]}{sfx}", gf, "GFLOP/s", "torch f32 matmul (precision highest)")
            if name == "gemm_f32_xWt":
                report(f"gemm_bf16x3_xWt_packed{sfx}", gf, "GFLOP/s", "torch f32 matmul (precision highest)")
        for name, forms, mnk in [
                ("xWt", {"bf16": lambda: F.linear(xh, Wh), "autocast": autocast(lambda: F.linear(x, Wh)),
                         "widen": lambda: torch.matmul(x, Wh.float().t())}, T * I * H),
                ("dyW", {"bf16": lambda: torch.matmul(dyh, Wh), "autocast": autocast(lambda: torch.matmul(dy, Wh)),
                         "widen": lambda: torch.matmul(dy, Wh.float())}, T * H * I),
                ("sq1024", {"bf16": lambda: torch.matmul(ah, bh), "autocast": autocast(lambda: torch.matmul(a, bh)),
                            "widen": lambda: torch.matmul(a, bh.float())}, 1024 ** 3)]:
            t, form = fastest(forms)
            gf = 2.0 * mnk / t * 1e-9
            report(f"gemm_bf16_{name}{sfx}", gf, "GFLOP/s", NOTES[form])
            report(f"gemm_bf16_{name}{sfx}_vs_f32", gf / f32[name], "fraction", NOTES[form])
            # mmc's opt-in AVX512_BF16 kernel (activations rounded to bf16, as torch's bf16 forms)
            # against the same figure
            report(f"gemm_bf16dot_{name}{sfx}", gf, "GFLOP/s", NOTES[form])
            report(f"gemm_bf16amx_{name}{sfx}", gf, "GFLOP/s", NOTES[form])  # and its AMX kernel
            if name == "xWt":   # mmc's pre-packed weight on those kernels
                report(f"gemm_bf16dot_xWt_packed{sfx}", gf, "GFLOP/s", NOTES[form])
                report(f"gemm_bf16amx_xWt_packed{sfx}", gf, "GFLOP/s", NOTES[form])

        evict = torch.ones(evict_floats())
        for (n, k, dt) in [(8192, 4096, torch.float32), (8192, 4096, torch.bfloat16), (4864, 896, torch.bfloat16)]:
            w = torch.randn(n, k).to(dt)
            v = torch.randn(1, k)
            tag = "f32" if dt == torch.float32 else "bf16"
            vh = v.to(torch.bfloat16)
            forms = ({None: lambda: F.linear(v, w)} if dt == torch.float32 else
                     {"bf16": lambda: F.linear(vh, w), "autocast": autocast(lambda: F.linear(v, w))})
            t, form = fastest(forms, min_iters=10)
            gbs = n * k * w.element_size() / t * 1e-9
            note = NOTES[form] if form else None
            report(f"matvec_{tag}_{n}x{k}{sfx}", gbs, "GB/s", note)
            if n == 8192:
                # mmc's pre-packed weight (what its generate / chat / serve run) against the same figure
                report(f"matvec_{tag}_{n}x{k}_packed{sfx}", gbs, "GB/s", note)
                # each call after a read of 2 x L3 (or 512 MiB), as bench_gemm's _dram cases: the weight
                # comes from DRAM, as in a decode step of a whole model
                td = {f: best_time_after(fn, lambda: evict.sum()) for f, fn in forms.items()}
                fd = min(td, key=td.get)
                report(f"matvec_{tag}_{n}x{k}_dram{sfx}", n * k * w.element_size() / td[fd] * 1e-9, "GB/s",
                       NOTES[fd] if fd else None)


nthreads = int(os.environ.get("MMC_BENCH_THREADS", "2"))
torch.set_num_threads(nthreads)
suite("")
# one thread timed on its own CPU-time clock, as bench_gemm.c's "_1t" cases
torch.set_num_threads(1)
CLOCK = time.thread_time
suite("_1t")
