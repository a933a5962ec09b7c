"""PyTorch peer for bench_moe.c: transformers' Qwen2MoeDecoderLayer (sdpa attention, the default
experts implementation), hidden 512, 8 heads, 16 experts of 352 top-4, shared expert 1408, seq
512, fp32: forward + backward (grad of sum(y)) and the no-grad forward, same thread count; and
the same for the MoE block alone (Qwen2MoeSparseMoeBlock: router, routed experts, gated shared
expert). The experts run transformers' "eager" implementation (a loop over the experts hit, what a
directly built module uses): its "batched_mm" and "grouped_mm" did not finish one block step in
300 s on this CPU (2 threads, transformers 5.23 / torch 2.15)."""
import sys
import time

import torch
from transformers import Qwen2MoeConfig
from transformers.models.qwen2_moe.modeling_qwen2_moe import (Qwen2MoeDecoderLayer, Qwen2MoeRotaryEmbedding,
                                                              Qwen2MoeSparseMoeBlock)

from peer_util import median_time, report

T = 512
cfg = Qwen2MoeConfig(vocab_size=16, hidden_size=512, intermediate_size=1408, num_hidden_layers=1,
                     num_attention_heads=8, num_key_value_heads=8, rms_norm_eps=1e-6,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}, num_experts=16,
                     num_experts_per_tok=4, moe_intermediate_size=352, shared_expert_intermediate_size=1408,
                     attn_implementation="sdpa")
torch.manual_seed(0)
layer = Qwen2MoeDecoderLayer(cfg, 0).float()
with torch.no_grad():   # the experts are torch.empty until a model's init runs
    for n, p in layer.named_parameters():
        if "norm" not in n:
            p.normal_(0.0, 0.02)
rot = Qwen2MoeRotaryEmbedding(cfg)
x = torch.randn(1, T, 512, requires_grad=True)
pos = torch.arange(T)[None]
cos, sin = rot(x, pos)


def step():
    y = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
    y = y[0] if isinstance(y, tuple) else y
    y.backward(torch.ones_like(y))


def fwd():
    with torch.no_grad():
        layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))


report("block_qwen2_moe_fwd_bwd_T512", T / median_time(step, 5.0), "tok/s")
report("block_qwen2_moe_fwd_T512", T / median_time(fwd, 3.0), "tok/s")


block = Qwen2MoeSparseMoeBlock(cfg).float()
with torch.no_grad():
    for n, p in block.named_parameters():
        p.normal_(0.0, 0.02)
xb = torch.randn(1, T, 512, requires_grad=True)


def block_step():
    y = block(xb)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(torch.ones_like(y))


def block_fwd():
    with torch.no_grad():
        block(xb)


report("block_qwen2_moe_sparse_fwd_bwd_T512", T / median_time(block_step, 5.0), "tok/s")
report("block_qwen2_moe_sparse_fwd_T512", T / median_time(block_fwd, 3.0), "tok/s")


def cpu_min(fn, rounds=6):
    """the least process CPU time (all threads) of one call over rounds, as bench_moe prints it"""
    fn()
    best = 1e30
    for _ in range(rounds):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


for name, fn in (("block_qwen2_moe_sparse_fwd_bwd_T512", block_step), ("block_qwen2_moe_sparse_fwd_T512", block_fwd),
                 ("block_qwen2_moe_fwd_bwd_T512", step), ("block_qwen2_moe_fwd_T512", fwd)):
    print("%s: process CPU time, all threads: transformers %.1f ms" % (name, cpu_min(fn) * 1e3), file=sys.stderr)
