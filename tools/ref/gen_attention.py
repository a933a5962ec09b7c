"""gen_attention.py — PyTorch fixtures for mmc_attention (tests/test_ops_attention.c).

Each case stores q [B,T,Hq,D], k [B,S,Hkv,D], v [B,S,Hkv,Dv] (mmc's layout), r (the
upstream gradient), out = scaled_dot_product_attention(...) and the gradients dq, dk, dv of
sum(out * r). torch.nn.functional.scaled_dot_product_attention runs in float64 on float32
inputs (results stored as float32) with enable_gqa for grouped heads and explicit boolean
masks where mmc's semantics differ from is_causal (bottom-right causal when T < S, and the
block-diagonal varlen masks of cu_seqlens).
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "attention")


def mask_for(T, S, causal, cu):
    """Boolean [T, S] mask, True = attend."""
    t = torch.arange(T)[:, None]
    s = torch.arange(S)[None, :]
    if cu is None:
        m = torch.ones(T, S, dtype=torch.bool)
        if causal:
            m = s <= t + (S - T)  # bottom-right aligned
        return m
    seg = torch.zeros(T, dtype=torch.long)
    for i in range(len(cu) - 1):
        seg[cu[i]:cu[i + 1]] = i
    m = seg[:, None] == seg[None, :]
    if causal:
        m = m & (s <= t)
    return m


def case(name, B, T, S, Hq, Hkv, D, Dv, causal=False, cu=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, D, generator=g)
    k = torch.randn(B, S, Hkv, D, generator=g)
    v = torch.randn(B, S, Hkv, Dv, generator=g)
    r = torch.rand(B, T, Hq, Dv, generator=g) * 2 - 1
    qd, kd, vd = (x.double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    mask = mask_for(T, S, causal, cu)
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, enable_gqa=(Hq != Hkv))
    out = out.transpose(1, 2)
    (out * r.double()).sum().backward()
    t = {
        "q": q, "k": k, "v": v, "r": r,
        "out": out.detach().float(),
        "dq": qd.grad.transpose(1, 2).float(),
        "dk": kd.grad.transpose(1, 2).float(),
        "dv": vd.grad.transpose(1, 2).float(),
    }
    save_file({n: x.contiguous() for n, x in t.items()}, os.path.join(OUT, name + ".safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    case("full", 2, 37, 37, 2, 2, 16, 16, seed=1)
    case("causal_gqa", 1, 70, 70, 4, 2, 32, 32, causal=True, seed=2)
    case("causal_decode_chunk", 1, 20, 90, 2, 1, 16, 16, causal=True, seed=3)
    case("dv_ne_d", 1, 33, 41, 2, 2, 16, 24, seed=4)
    cu = [0, 30, 50, 97]
    case("varlen", 1, 97, 97, 2, 1, 16, 16, cu=cu, seed=5)
    case("varlen_causal", 1, 97, 97, 4, 2, 16, 16, causal=True, cu=cu, seed=6)


if __name__ == "__main__":
    main()
