"""peer_gemm.py — PyTorch (CPU) figures for the cases of bench/bench_gemm.c, same names.

gemm_f32_<layout>: torch.matmul in the same layout (x @ W.T, dy @ W, dy.T @ x (+= into dW),
square 1024), GFLOP/s. gemm_bf16_<layout>: the weight is stored bf16 and widened to f32 for
the f32 matmul (what mmc_gemm_bf16 computes). matvec_*: y = x @ W.T with one token, GB/s of
weight bytes. Every figure is the best call of a ~1 s run, as in bench_gemm.c; the "_1t"
cases use one thread and its CPU-time clock."""
import json
import os
import time

import torch

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


def report(name, value, unit):
    print(json.dumps({"name": name, "peer": value, "unit": unit, "better": "higher"}), flush=True)


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
        cases = [
            ("gemm_f32_xWt", lambda: torch.matmul(x, W.t()), T * I * H),
            ("gemm_f32_dyW", lambda: torch.matmul(dy, W), T * H * I),
            ("gemm_f32_dyTx", lambda: dW.addmm_(dy.t(), x), I * H * T),
            ("gemm_f32_sq1024", lambda: torch.matmul(a, b), 1024 ** 3),
            ("gemm_bf16_xWt", lambda: torch.matmul(x, Wh.float().t()), T * I * H),
            ("gemm_bf16_dyW", lambda: torch.matmul(dy, Wh.float()), T * H * I),
            ("gemm_bf16_sq1024", lambda: torch.matmul(a, bh.float()), 1024 ** 3),
        ]
        f32 = {}
        for name, fn, mnk in cases:
            gf = 2.0 * mnk / best_time(fn) * 1e-9
            report(name + sfx, gf, "GFLOP/s")
            if name.startswith("gemm_f32"):
                f32[name[9:]] = gf
            else:
                report(name + sfx + "_vs_f32", gf / f32[name[10:]], "fraction")

        for (n, k, dt) in [(8192, 4096, torch.float32), (8192, 4096, torch.bfloat16), (4864, 896, torch.bfloat16)]:
            w = torch.randn(n, k).to(dt)
            v = torch.randn(1, k)
            if dt == torch.float32:
                fn = lambda: torch.matmul(v, w.t())
            else:  # bf16 weight, f32 activations: widen the weight (as mmc does, but in memory)
                fn = lambda: torch.matmul(v, w.float().t())
            t = best_time(fn, min_iters=10)
            tag = "f32" if dt == torch.float32 else "bf16"
            report(f"matvec_{tag}_{n}x{k}{sfx}", n * k * w.element_size() / t * 1e-9, "GB/s")


nthreads = int(os.environ.get("MMC_BENCH_THREADS", "2"))
torch.set_num_threads(nthreads)
suite("")
# one thread timed on its own CPU-time clock, as bench_gemm.c's "_1t" cases
torch.set_num_threads(1)
CLOCK = time.thread_time
suite("_1t")
