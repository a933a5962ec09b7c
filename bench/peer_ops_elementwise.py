"""peer_ops_elementwise.py — PyTorch (CPU, fp32) peer of bench/bench_ops_elementwise.c:
forward + backward throughput (million output elements / s) of bias add, swiglu, gelu and
softmax at the same shapes and case names."""
import json
import os
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))


def bench(fn, min_seconds=0.5, min_iters=5):
    fn()
    ts = []
    start = time.perf_counter()
    while len(ts) < 1000 and (len(ts) < min_iters or time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    torch.manual_seed(0)
    ops = {
        "add_bias": (lambda a, b: a + b, True),
        "swiglu": (lambda a, b: F.silu(a) * b, True),
        "gelu": (lambda a, b: F.gelu(a), False),
        "softmax": (lambda a, b: torch.softmax(a, dim=-1), False),
    }
    for name, (op, two) in ops.items():
        for R, C in ((512, 4864), (512, 896)):
            a = torch.randn(R, C, requires_grad=True)
            b = None
            if two:
                b = torch.randn(*((C,) if name == "add_bias" else (R, C)), requires_grad=True)
            g = torch.randn(R, C)

            def step():
                y = op(a, b)
                y.backward(g)

            t = bench(step)
            print(json.dumps({"name": f"ew_{name}_fwdbwd_{R}x{C}", "peer": R * C / t / 1e6,
                              "unit": "Melem/s", "better": "higher"}))


if __name__ == "__main__":
    main()
