"""PyTorch peer for bench_llava.c: transformers' LlavaForConditionalGeneration (sdpa, fp32) in
LLaVA-1.5-7B shapes with random weights, CLIP tower depth 4 of 24 and Llama depth 2 of 32 (full
vocabulary, untied head): image features of one 336x336 image, prefill of a 600-token prompt
holding it (576 image tokens; logits_to_keep=1, as generate does) and single-token decode with
the KV cache after it; same thread count. Memory: peak RSS minus the RSS after the imports."""
import os

import torch
from transformers import DynamicCache, LlavaConfig, LlavaForConditionalGeneration

from peer_util import mem_baseline, median_time, peak_rss_mib, report

torch.manual_seed(0)
base = mem_baseline()
cfg = LlavaConfig(
    text_config=dict(model_type="llama", vocab_size=32064, hidden_size=4096, intermediate_size=11008,
                     num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=32,
                     max_position_embeddings=4096, rms_norm_eps=1e-5),
    vision_config=dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                       num_attention_heads=16, image_size=336, patch_size=14),
    image_token_id=32000, projector_hidden_act="gelu", vision_feature_layer=-2,
    vision_feature_select_strategy="default")
cfg._attn_implementation = "sdpa"
model = LlavaForConditionalGeneration(cfg).float().eval()

with torch.inference_mode():
    px = torch.randn(1, 3, 336, 336)
    sec = median_time(lambda: model.model.get_image_features(pixel_values=px), 3.0, 2)
    report("llava15_7b_image_features_tower4of24_336px", 1.0 / sec, "img/s")
    ids = torch.randint(0, 31000, (1, 600))
    ids[0, 8:8 + 576] = 32000

    def prefill():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, pixel_values=px, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out, cache

    sec = median_time(prefill, 5.0, 2)
    report("llava15_7b_prefill_lm2of32_image_T600", 600 / sec, "tok/s")
    out, cache = prefill()
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    import time
    times = []
    for s in range(32):
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    times.sort()
    report("llava15_7b_decode_lm2of32_after600", 1.0 / times[16], "tok/s")
MiB = 1024.0 * 1024.0
weights = sum(p.numel() * p.element_size() for p in model.parameters())
kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
         if isinstance(t, torch.Tensor))
peak = peak_rss_mib() - base
report("llava15_7b_peak_mem_MiB", peak, "MiB", False)
print('{"name": "llava15_7b_rss_baseline_MiB", "peer": %g, "unit": "MiB", "better": "none"}' % base, flush=True)
report("llava15_7b_peak_mem_over_weights_kv", peak * MiB / (weights + kv), "x", False)
