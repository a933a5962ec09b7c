"""peer_ops_elementwise.py — PyTorch (CPU, fp32) peer of bench/bench_ops_elementwise.c:
forward + backward throughput (million output elements / s) of bias add, swiglu, gelu and
softmax at the same shapes and case names."""
import json

import torch
import torch.nn.functional as F

from peer_util import median_time, report  # also sets the thread count


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

            t = median_time(step, 0.5, 5)
            print(json.dumps({"name": f"ew_{name}_fwdbwd_{R}x{C}", "peer": R * C / t / 1e6,
                              "unit": "Melem/s", "better": "higher"}))


if __name__ == "__main__":
    main()
