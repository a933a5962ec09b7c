"""peer_conv.py — PyTorch (CPU, fp32) peer of bench/bench_conv.c: same case names, same
shapes, conv2d forward + backward (dx, dW, db), median time over repeated calls."""

import torch
import torch.nn.functional as F

from peer_util import median_time, report  # also sets the thread count


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
    report(name, flop / median_time(step, min_s, 2) * 1e-9, "GFLOP/s")


def main():
    conv(4, 32, 32, 32, 64, 1.0)
    conv(1, 128, 128, 128, 128, 1.0)
    conv(1, 512, 32, 32, 512, 1.5)


if __name__ == "__main__":
    main()
