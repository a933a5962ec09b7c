"""peer_conv.py — PyTorch (CPU, fp32) peer of bench/bench_conv.c: same case names, same
shapes, conv2d forward + backward (dx, dW, db), median time over repeated calls; and each
pass alone (_fwd: forward, _bwd_data: dx only, _bwd_weight: dW and db only, the backward
passes timed on one recorded graph with retain_graph, as bench_conv.c does)."""

import torch
import torch.nn.functional as F

from peer_util import median_time, report  # also sets the thread count


def conv(B, Cin, H, W, Cout, min_s, passes):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, Cin, H, W, generator=g, requires_grad=True)
    w = (torch.randn(Cout, Cin, 3, 3, generator=g) * 0.05).requires_grad_(True)
    b = torch.randn(Cout, generator=g, requires_grad=True)
    dy = torch.randn(B, Cout, H, W, generator=g)

    def step():
        F.conv2d(x, w, b, stride=1, padding=1).backward(dy)

    flop1 = 2.0 * B * Cout * H * W * Cin * 9
    name = f"conv2d_fwdbwd_{B}x{Cin}x{H}x{W}_k3_c{Cout}"
    report(name, 3 * flop1 / median_time(step, min_s, 2) * 1e-9, "GFLOP/s")
    if not passes:
        return

    def fwd():
        F.conv2d(x, w, b, stride=1, padding=1)

    report(name + "_fwd", flop1 / median_time(fwd, min_s / 2, 2) * 1e-9, "GFLOP/s")
    for tag, wrt in (("bwd_data", [x]), ("bwd_weight", [w, b])):
        y = F.conv2d(x, w, b, stride=1, padding=1)

        def bwd():
            torch.autograd.grad(y, wrt, dy, retain_graph=True)

        report(f"{name}_{tag}", flop1 / median_time(bwd, min_s / 2, 2) * 1e-9, "GFLOP/s")


def main():
    conv(4, 32, 32, 32, 64, 1.0, True)
    conv(1, 128, 128, 128, 128, 1.0, True)
    conv(1, 512, 32, 32, 512, 1.5, True)


if __name__ == "__main__":
    main()
