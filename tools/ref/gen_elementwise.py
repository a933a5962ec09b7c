"""gen_elementwise.py — PyTorch fixtures for the view, elementwise and shape-surgery ops
(tests/test_ops_elementwise.c). Each tests/fixtures/elementwise/<case>.safetensors holds the
inputs, `out`, a random `r`, and `grad_<input>` = d sum(out * r) / d input, computed with
torch on CPU in float32 (fixed seeds, tiny shapes)."""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "elementwise")


def case(name, fn, inputs, seed, extra=None):
    torch.manual_seed(seed)
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    out = fn(**leaves)
    r = torch.rand(out.shape, dtype=torch.float32) * 2 - 1
    (out.float() * r).sum().backward()
    t = {k: v.detach().contiguous() for k, v in leaves.items()}
    t["out"] = out.detach().contiguous()
    t["r"] = r.contiguous()
    for k, v in leaves.items():
        if v.is_floating_point():
            t["grad_" + k] = (v.grad if v.grad is not None else torch.zeros_like(v)).contiguous()
    if extra:
        t.update(extra)
    save_file(t, os.path.join(OUT, name + ".safetensors"))


def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float32) * scale


def act_input():
    # normal values plus the tails and exact points where approximations fail first
    x = randn(6, 33, scale=2.0)
    x.view(-1)[:12] = torch.tensor([0.0, -0.0, 1e-6, -1e-6, 3.9, -3.9, 4.0, -4.5, 8.0, -8.0, 12.0, -12.0])
    return x


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    # broadcasting patterns
    case("add_same", lambda a, b: a + b, {"a": randn(4, 7), "b": randn(4, 7)}, 1)
    case("add_bias", lambda a, b: a + b, {"a": randn(3, 5, 8), "b": randn(8)}, 2)
    case("add_bias_left", lambda a, b: a + b, {"a": randn(1, 6), "b": randn(3, 6)}, 3)
    case("add_scalar", lambda a, b: a + b, {"a": randn(4, 6), "b": randn(1)}, 4)
    case("add_bcast", lambda a, b: a + b, {"a": randn(2, 1, 4), "b": randn(3, 1)}, 5)
    case("mul_same", lambda a, b: a * b, {"a": randn(4, 7), "b": randn(4, 7)}, 6)
    case("mul_bias", lambda a, b: a * b, {"a": randn(3, 5, 8), "b": randn(5, 8)}, 7)
    case("mul_bcast", lambda a, b: a * b, {"a": randn(2, 3, 4), "b": randn(3, 1)}, 8)
    case("scale", lambda x: x * 0.37, {"x": randn(5, 7)}, 9)
    # activations
    case("gelu", lambda x: F.gelu(x), {"x": act_input()}, 10)
    case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), {"x": act_input()}, 11)
    case("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), {"x": act_input()}, 12)
    case("silu", lambda x: F.silu(x), {"x": act_input()}, 13)
    case("swiglu", lambda gate, up: F.silu(gate) * up, {"gate": randn(5, 37, scale=2), "up": randn(5, 37)}, 14)
    case("softmax", lambda x: torch.softmax(x, dim=-1), {"x": randn(4, 37, scale=3)}, 15)
    case("sum", lambda x: x.sum(), {"x": randn(7, 13)}, 16)
    case("mean", lambda x: x.mean(), {"x": randn(7, 13)}, 17)
    # views and layout
    case("chain", lambda x: x.transpose(0, 2).contiguous().reshape(4, -1), {"x": randn(2, 3, 4)}, 18)
    case("permute_narrow", lambda x: x.permute(2, 0, 1).narrow(1, 1, 2), {"x": randn(3, 4, 5)}, 19)
    case("cast_bf16", lambda x: x.to(torch.bfloat16), {"x": randn(3, 9)}, 20)
    # shape surgery
    case("concat1", lambda a, b, c: torch.cat([a, b, c], dim=1),
         {"a": randn(2, 3, 4), "b": randn(2, 5, 4), "c": randn(2, 1, 4)}, 21)
    case("concat2", lambda a, b: torch.cat([a, b], dim=2), {"a": randn(2, 3, 4), "b": randn(2, 3, 2)}, 22)
    idx = torch.tensor([5, 0, 2, 2, 5, 1, 5, 3], dtype=torch.int64)
    case("gather_rows", lambda x, idx: x[idx], {"x": randn(6, 5), "idx": idx}, 23)
    sidx = torch.tensor([4, 0, 6], dtype=torch.int64)
    case("scatter_rows", lambda dst, idx, src: dst.index_copy(0, idx, src),
         {"dst": randn(7, 5), "idx": sidx, "src": randn(3, 5)}, 24)


if __name__ == "__main__":
    main()
