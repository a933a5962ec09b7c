"""gen_nn.py — PyTorch reference fixtures for the dense/norm/loss/conv ops
(mmc_linear, mmc_embedding, mmc_rmsnorm, mmc_layernorm, mmc_groupnorm, mmc_cross_entropy,
mmc_patch_embed, mmc_conv2d).

Each tests/fixtures/nn/<case>.safetensors holds the op's inputs, its output `out`, a fixed
random `r` shaped like `out`, and the gradients `g<name>` of L = sum(out * r) with respect
to every differentiable input. Everything is float32 except where the dtype is the point
(bf16 weights, integer ids/targets). Run: /work/refvenv/bin/python tools/ref/gen_nn.py
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "nn")


def run(name, fn, inputs, grad_names, extra=None):
    """inputs: dict name -> tensor; grad_names: inputs to differentiate (float32 leaves)."""
    leaves = {}
    for k, v in inputs.items():
        if k in grad_names:
            v = v.detach().clone().requires_grad_(True)
        leaves[k] = v
    out = fn(**leaves)
    g = torch.Generator().manual_seed(7)
    r = torch.rand(out.shape, generator=g) * 2 - 1
    if grad_names:
        (out * r).sum().backward()
    d = {k: v.detach().contiguous() for k, v in leaves.items()}
    d["out"] = out.detach().contiguous()
    d["r"] = r.contiguous()
    for k in grad_names:
        d["g" + k] = leaves[k].grad.contiguous()
    if extra:
        d.update(extra)
    save_file(d, os.path.join(OUT, name + ".safetensors"))


def randn(*shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def main():
    os.makedirs(OUT, exist_ok=True)
    # --- linear: x [2, 3, 8], w [5, 8], b [5]
    x, w, b = randn(2, 3, 8, seed=1), randn(5, 8, seed=2, scale=0.3), randn(5, seed=3)
    run("linear_bias", lambda x, w, b: F.linear(x, w, b), {"x": x, "w": w, "b": b}, ["x", "w", "b"])
    run("linear_nobias", lambda x, w: F.linear(x, w), {"x": x, "w": w}, ["x", "w"])
    # bf16 weight: torch computes with the bf16 values widened to f32 (what mmc does)
    wb = w.to(torch.bfloat16)
    run("linear_bf16", lambda x, w, b: F.linear(x, w.float(), b), {"x": x, "w": wb, "b": b},
        ["x", "b"])
    # --- embedding: table [10, 6], ids [2, 4] with repeated ids
    table = randn(10, 6, seed=4)
    ids = torch.tensor([[1, 3, 3, 9], [0, 1, 1, 1]], dtype=torch.int64)
    run("embedding", lambda table, ids: F.embedding(ids, table), {"table": table, "ids": ids}, ["table"])
    run("embedding_bf16", lambda table, ids: F.embedding(ids, table.float()),
        {"table": table.to(torch.bfloat16), "ids": ids}, [])
    # nn.Embedding(padding_idx=1), as transformers' decoders build embed_tokens from pad_token_id:
    # row 1 (three of the ids) gets no gradient
    run("embedding_padded", lambda table, ids: F.embedding(ids, table, padding_idx=1),
        {"table": table, "ids": ids}, ["table"])
    # --- rmsnorm (transformers Qwen2RMSNorm), eps 1e-6
    x = randn(3, 4, 16, seed=5, scale=2.0)
    w = 1 + randn(16, seed=6, scale=0.2)

    norm = Qwen2RMSNorm(16, eps=1e-6)
    run("rmsnorm", lambda x, w: torch.func.functional_call(norm, {"weight": w}, (x,)),
        {"x": x, "w": w}, ["x", "w"])
    run("rmsnorm_noweight", lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        {"x": x}, ["x"])
    # --- layernorm, eps 1e-5
    b = randn(16, seed=7, scale=0.5)
    run("layernorm", lambda x, w, b: F.layer_norm(x, (16,), w, b, 1e-5), {"x": x, "w": w, "b": b},
        ["x", "w", "b"])
    run("layernorm_noaffine", lambda x: F.layer_norm(x, (16,), None, None, 1e-5), {"x": x}, ["x"])
    # --- groupnorm: x [2, 8, 3, 5], 4 groups; and [2, 6, 7], 3 groups without affine
    x = randn(2, 8, 3, 5, seed=8, scale=1.5) + 0.5
    w, b = 1 + randn(8, seed=9, scale=0.2), randn(8, seed=10, scale=0.3)
    run("groupnorm", lambda x, w, b: F.group_norm(x, 4, w, b, 1e-5), {"x": x, "w": w, "b": b},
        ["x", "w", "b"])
    x = randn(2, 6, 7, seed=11)
    run("groupnorm_noaffine", lambda x: F.group_norm(x, 3, None, None, 1e-5), {"x": x}, ["x"])
    # --- cross entropy: small V with ignored rows; larger V (not a multiple of 16)
    logits = randn(6, 37, seed=12, scale=3.0)
    tgt = torch.tensor([3, -100, 36, 0, -100, 17], dtype=torch.int64)
    run("xent_small", lambda logits, targets: F.cross_entropy(logits, targets, ignore_index=-100),
        {"logits": logits, "targets": tgt}, ["logits"])
    logits = randn(8, 4099, seed=13, scale=4.0)
    tgt = torch.tensor([5, 4098, -100, 1000, 0, 2047, -100, 3333], dtype=torch.int64)
    run("xent_large", lambda logits, targets: F.cross_entropy(logits, targets, ignore_index=-100),
        {"logits": logits, "targets": tgt}, ["logits"])
    # --- patch embed (Qwen2-VL PatchEmbed: Conv3d, stride == kernel, no bias)
    Cin, kt, kh, kw, Cout = 3, 2, 4, 4, 8
    x = randn(5, Cin * kt * kh * kw, seed=14)
    w = randn(Cout, Cin, kt, kh, kw, seed=15, scale=0.1)
    run("patch_embed3d",
        lambda x, w: F.conv3d(x.view(-1, Cin, kt, kh, kw), w, stride=(kt, kh, kw)).view(-1, Cout),
        {"x": x, "w": w}, ["x", "w"])
    x = randn(5, Cin * kh * kw, seed=16)
    w, b = randn(Cout, Cin, kh, kw, seed=17, scale=0.1), randn(Cout, seed=18)
    run("patch_embed2d",
        lambda x, w, b: F.conv2d(x.view(-1, Cin, kh, kw), w, b, stride=(kh, kw)).view(-1, Cout),
        {"x": x, "w": w, "b": b}, ["x", "w", "b"])
    # --- conv2d: stride 2 / padding 1 with bias; stride 1 / padding 0 without
    x = randn(2, 3, 7, 6, seed=19)
    w, b = randn(4, 3, 3, 3, seed=20, scale=0.3), randn(4, seed=21)
    run("conv2d_s2p1", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        {"x": x, "w": w, "b": b}, ["x", "w", "b"])
    w = randn(5, 3, 2, 3, seed=22, scale=0.3)
    run("conv2d_s1p0", lambda x, w: F.conv2d(x, w, None, stride=1, padding=0), {"x": x, "w": w},
        ["x", "w"])
    print("wrote", OUT)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
