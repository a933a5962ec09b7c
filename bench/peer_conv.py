"""peer_conv.py — PyTorch (CPU, fp32) peer of bench/bench_conv.c: same case names, same
shapes, conv2d forward + backward (dx, dW, db), median time over repeated calls."""
import json
import os
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))


def bench(fn, min_s=1.0, min_iters=2):
    fn()
    ts, start = [], time.perf_counter()
    while len(ts) < 1000 and (len(ts) < min_iters or time.perf_counter() - start < min_s):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def conv(B, Cin, H, W, Cout, min_s):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, Cin, H, W, generator=g, requires_grad=True)
    w = (torch.randn(Cout, Cin, 3, 3, generator=g) * 0.05).requires_grad_(True)
    b = torch.randn(Cout, generator=g, requires_grad=True)
    dy = torch.randn(B, Cout, H, W, generator=g)

    def step():
        F.conv2d(x, w, b, stride=1, padding=1).backward(dy)

    flop = 3 * 2.0 * B * Cout * H * W * Cin * 9
    name = f"conv2d_fwdbwd_{B}x{Cin}x{H}x{W}_k3_c{Cout}"
    print(json.dumps({"name": name, "peer": flop / bench(step, min_s) * 1e-9, "unit": "GFLOP/s",
                      "better": "higher"}), flush=True)


def main():
    conv(4, 32, 32, 32, 64, 1.0)
    conv(1, 128, 128, 128, 128, 1.0)
    conv(1, 512, 32, 32, 512, 1.5)


if __name__ == "__main__":
    main()
