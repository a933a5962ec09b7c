"""peer_attention.py — PyTorch peer of bench/bench_attention.c: F.scaled_dot_product_attention
(fp32, CPU, enable_gqa) forward and forward+backward, same case names and FLOP formula
(forward 4*T*S*D*Hq*B, halved when causal; backward 2.5x forward), at the thread count of the
C benches (peer_util). Every call runs under sdpa_kernel(FLASH_ATTENTION): PyTorch's fastest
CPU path (the tiled flash-attention kernel, _scaled_dot_product_flash_attention_for_cpu and
its backward), and an error instead of a silent fallback to the unfused math path if this
PyTorch cannot run it for a shape. `..._fwdbwd_cpu`: the fwd+bwd FLOPs per process CPU-second
times the threads (min of 4 calls), as bench_attention.c reports it."""
import json
import os
import resource

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peer_util import median_time, report  # also sets the thread count

CASES = [
    ("attn_qwen2_0.5b_t512_causal", 1, 512, 512, 14, 2, 64, True),
    ("attn_qwen2_0.5b_t2048_causal", 1, 2048, 2048, 14, 2, 64, True),
    ("attn_vision_t1024_h16_d80_full", 1, 1024, 1024, 16, 16, 80, False),
]


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_time(fn, n):
    """min over n calls of the process CPU seconds one call takes"""
    best = float("inf")
    for _ in range(n):
        c0 = cpu_seconds()
        fn()
        best = min(best, cpu_seconds() - c0)
    return best


def main():
    for name, B, T, S, Hq, Hkv, D, causal in CASES:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(B, Hq, T, D, generator=g).requires_grad_()
        k = torch.randn(B, Hkv, S, D, generator=g).requires_grad_()
        v = torch.randn(B, Hkv, S, D, generator=g).requires_grad_()
        gy = torch.randn(B, Hq, T, D, generator=g) * 1e-3
        gqa = Hq != Hkv
        fwd = 4.0 * B * T * S * D * Hq * (0.5 if causal else 1.0)

        def f():
            with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        def fb():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            y.backward(gy)

        t = median_time(f, 1.0)
        print(json.dumps({"name": name + "_fwd", "peer": fwd / t * 1e-9, "unit": "GFLOP/s", "better": "higher"}))
        t = median_time(fb, 2.0)
        print(json.dumps({"name": name + "_fwdbwd", "peer": 3.5 * fwd / t * 1e-9, "unit": "GFLOP/s",
                          "better": "higher"}), flush=True)
        t = cpu_time(fb, 4) / int(os.environ.get("MMC_BENCH_THREADS", "2"))
        print(json.dumps({"name": name + "_fwdbwd_cpu", "peer": 3.5 * fwd / t * 1e-9,
                          "unit": "GFLOP/s (CPU)", "better": "higher"}), flush=True)


if __name__ == "__main__":
    main()
