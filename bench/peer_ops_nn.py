"""peer_ops_nn.py — PyTorch (CPU, fp32) peer of bench/bench_ops_nn.c: same case names,
same shapes, forward + backward, median time over repeated calls."""

import torch
import torch.nn.functional as F

from peer_util import median_time, report  # also sets the thread count


def linear(tag, M, K, N):
    flop = 6.0 * M * N * K
    A, B, dy = torch.randn(M, K), torch.randn(N, K), torch.randn(M, N)
    D, E = torch.zeros(M, K), torch.zeros(N, K)

    def gemm3():
        torch.mm(A, B.t())
        D.addmm_(dy, B)
        E.addmm_(dy.t(), A)

    report(f"gemm3_{tag}", flop / median_time(gemm3, 1.0, 2) * 1e-9, "GFLOP/s")
    x = torch.randn(M, K, requires_grad=True)
    w = (torch.randn(N, K) * 0.05).requires_grad_(True)

    def step():
        F.linear(x, w).backward(dy)

    report(f"linear_fwdbwd_{tag}", flop / median_time(step, 1.0, 2) * 1e-9, "GFLOP/s")


def norm(name, fn, xshape, C, bias=True):
    x = torch.randn(*xshape, requires_grad=True)
    w = torch.randn(C, requires_grad=True)
    b = torch.randn(C, requires_grad=True) if bias else None
    dy = torch.randn(*xshape)

    def step():
        fn(x, w, b).backward(dy)

    report(name, median_time(step, 0.5, 5) * 1e6, "us", False)


def rms(x, w, b):   # transformers' Qwen2RMSNorm forward
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + 1e-6))


def main():
    linear("512x896x4864", 512, 896, 4864)
    linear("512x4864x896", 512, 4864, 896)
    norm("rmsnorm_fwdbwd_512x896", rms, (512, 896), 896, bias=False)
    norm("layernorm_fwdbwd_512x896", lambda x, w, b: F.layer_norm(x, (896,), w, b, 1e-5), (512, 896), 896)
    norm("groupnorm_fwdbwd_4x128x32x32_g32", lambda x, w, b: F.group_norm(x, 32, w, b, 1e-5),
         (4, 128, 32, 32), 128)
    N, V = 256, 151936
    logits = (torch.randn(N, V) * 2).requires_grad_(True)
    t = torch.tensor([-100 if i % 17 == 5 else (i * 7919) % V for i in range(N)])

    def xent():
        F.cross_entropy(logits, t, ignore_index=-100).backward()

    report(f"xent_fwdbwd_{N}x{V}", median_time(xent, 1.0, 3) * 1e3, "ms", False)


if __name__ == "__main__":
    main()
