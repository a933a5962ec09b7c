"""PyTorch peer for bench_block.c: transformers' Qwen2DecoderLayer (sdpa), Qwen2-0.5B
shapes, seq 512, fp32 forward + backward (grad of sum(y)), same thread count. Memory as
bench_block.c: step_mem = peak RSS minus the RSS once the layer and inputs exist (what the step
adds); peak_mem = peak RSS minus the RSS after the imports, before the model
(peer_util.mem_baseline), and that baseline."""
import json, os, time
import torch
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

from peer_util import mem_baseline, peak_rss_mib

base0 = mem_baseline()

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
T = 512
cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                  num_key_value_heads=2, num_hidden_layers=1, rope_theta=1e6, vocab_size=16,
                  attn_implementation="sdpa")
layer = Qwen2DecoderLayer(cfg, 0).float()
rot = Qwen2RotaryEmbedding(cfg)
x = torch.randn(1, T, 896, requires_grad=True)
pos = torch.arange(T)[None]
cos, sin = rot(x, pos)
mask = None  # sdpa with is_causal


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024
    return 0.0


def step():
    out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
    y = out[0] if isinstance(out, tuple) else out
    y.backward(torch.ones_like(y))


# sdpa needs is_causal when mask is None: transformers passes is_causal=True for q_len > 1
base = rss_mib()
step()
times = []
t_end = time.time() + 5.0
while len(times) < 3 or time.time() < t_end:
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
times.sort()
sec = times[len(times) // 2]
peak = peak_rss_mib()
print(json.dumps({"name": "block_qwen2_0.5b_fwd_bwd_T512", "peer": T / sec, "unit": "tok/s", "better": "higher"}))
print(json.dumps({"name": "block_qwen2_0.5b_step_mem_MiB", "peer": peak - base, "unit": "MiB", "better": "lower"}))
print(json.dumps({"name": "block_qwen2_0.5b_peak_mem_MiB", "peer": peak - base0, "unit": "MiB", "better": "lower"}))
print(json.dumps({"name": "block_qwen2_0.5b_rss_baseline_MiB", "peer": base0, "unit": "MiB", "better": "none"}))
