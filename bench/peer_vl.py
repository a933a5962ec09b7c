"""PyTorch peer for bench_vl.c: transformers' Qwen2VLForConditionalGeneration (sdpa, fp32) in
Qwen2-VL-2B shapes with random weights, vision depth 4 of 32 and LM depth 4 of 28 (full
vocabulary, tied head): vision encode of 448x448 (grid 1x32x32) and 1024x768 (smart_resize
-> grid 1x54x74) images, prefill of 512 tokens (logits_to_keep=1, as generate does), and
single-token decode with the KV cache after it; same thread count. Memory as bench_vl.c: peak
RSS minus the RSS after the imports, before the model (peer_util.mem_baseline), and that
baseline."""
import json
import os
import time

import torch
from transformers import DynamicCache, Qwen2VLConfig, Qwen2VLForConditionalGeneration

from peer_util import mem_baseline, peak_rss_mib

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
torch.manual_seed(0)
base = mem_baseline()
cfg = Qwen2VLConfig(
    vision_config=dict(depth=4, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                       temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
    text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=4,
                     num_attention_heads=12, num_key_value_heads=2, rms_norm_eps=1e-6,
                     max_position_embeddings=32768,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
    tie_word_embeddings=True)
cfg._attn_implementation = "sdpa"
with torch.device("cpu"):
    model = Qwen2VLForConditionalGeneration(cfg).float().eval()


def timeit(fn, min_seconds, min_iters):
    fn()
    times = []
    t_end = time.time() + min_seconds
    while len(times) < min_iters or time.time() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def report(name, v, unit, better="higher"):
    print(json.dumps({"name": name, "peer": v, "unit": unit, "better": better}), flush=True)


with torch.inference_mode():
    for name, grid, (ms, mi) in [("vl_qwen2vl2b_vision_d4of32_448x448", [1, 32, 32], (5.0, 2)),
                                 ("vl_qwen2vl2b_vision_d4of32_1024x768", [1, 54, 74], (0.0, 1))]:
        n = grid[0] * grid[1] * grid[2]
        px = torch.randn(n, 3 * 2 * 14 * 14)
        g = torch.tensor([grid])
        sec = timeit(lambda: model.model.visual(px, grid_thw=g), ms, mi)
        report(name, 1.0 / sec, "img/s")
        report(name + "_prepacked", 1.0 / sec, "img/s")   # mmc with pre-packed weights, same peer figure
        report(name + "_bf16x3", 1.0 / sec, "img/s")   # mmc at matmul precision high (bf16x3), against f32
        report(name + "_bf16x3_prepacked", 1.0 / sec, "img/s")

    T = 512
    ids = torch.randint(0, 150000, (1, T))

    def prefill():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out, cache

    sec = timeit(prefill, 5.0, 2)
    report("vl_qwen2vl2b_prefill_lm4of28_T512", T / sec, "tok/s")
    report("vl_qwen2vl2b_prefill_lm4of28_T512_prepacked", T / sec, "tok/s")
    report("vl_qwen2vl2b_prefill_lm4of28_T512_bf16x3", T / sec, "tok/s")   # mmc bf16x3 against f32
    report("vl_qwen2vl2b_prefill_lm4of28_T512_bf16x3_prepacked", T / sec, "tok/s")
    out, cache = prefill()
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for s in range(32):
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    times.sort()
    report("vl_qwen2vl2b_decode_lm4of28_after512", 1.0 / times[16], "tok/s")
    report("vl_qwen2vl2b_decode_lm4of28_after512_prepacked", 1.0 / times[16], "tok/s")
    # bf16 weights, as published checkpoints ship and transformers users load them
    # (torch_dtype=bfloat16: the whole language model computes in bf16; oneDNN's bf16 matmul,
    # AMX where the CPU has it): bench_vl.c's _bf16 (exact) and _bf16matmul (mmc's bf16-product
    # kernel, --bf16-matmul) rows
    model.model.language_model.to(torch.bfloat16)
    model.lm_head.to(torch.bfloat16)
    sec = timeit(prefill, 5.0, 2)
    for tag in ("bf16", "bf16matmul", "bf16matmul_prepacked"):
        report(f"vl_qwen2vl2b_prefill_lm4of28_T512_{tag}", T / sec, "tok/s")
    model.float()
MiB = 1024.0 * 1024.0
weights = sum(p.numel() * p.element_size() for p in model.parameters())   # tied embedding counted once
kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
         if isinstance(t, torch.Tensor))
peak = peak_rss_mib() - base
report("vl_qwen2vl2b_weights_MiB", weights / MiB, "MiB", "lower")
report("vl_qwen2vl2b_kv_cache_MiB", kv / MiB, "MiB", "lower")
report("vl_qwen2vl2b_peak_mem_MiB", peak, "MiB", "lower")
report("vl_qwen2vl2b_rss_baseline_MiB", base, "MiB", "none")
report("vl_qwen2vl2b_peak_mem_over_weights_kv", peak * MiB / (weights + kv), "x", "lower")
