"""PyTorch peer for bench_llava.c: transformers' LlavaForConditionalGeneration (sdpa, fp32) in
LLaVA-1.5-7B shapes with random weights, CLIP tower depth 4 of 24 and Llama depth 2 of 32 (full
vocabulary, untied head): image features of one 336x336 image, prefill of a 600-token prompt
holding it (576 image tokens; logits_to_keep=1, as generate does), prefill of 512 text tokens, and
single-token decode with the KV cache after the image prompt (tok/s and the GB/s of decoder +
lm_head weights and KV cache read per token, as bench_llava.c counts them); same thread count.
Memory: peak RSS minus the RSS after the imports.

Training (before the inference cases, each mode in a spawned process, as bench_llava.c): one step
= zero_grad, forward with labels (transformers' ForCausalLMLoss over the 56 text tokens after the
image), backward, clip_grad_norm_(1.0), torch.optim.AdamW(lr 1e-5, wd 0.01), on a 640-token row
(8 text, 576 <image>, 56 text) with the tower (4 of 24) frozen (requires_grad False: no graph
through it) and the language model at 1 of 32 layers; "full" trains the projector and the
language model, "lora" PEFT LoRA r=16 alpha 32 on the language model's
q/k/v/o/gate/up/down_proj (regex target, as bench_llava.c). MMC_BENCH_VLM7B_TRAIN=full,lora|none,
MMC_BENCH_VLM7B_TRAIN_STEPS (default 3) timed steps after one warm-up, median."""
import time

import torch

from peer_util import mem_baseline, median_time, peak_rss_mib, report, run_train_modes, time_train_steps

LORA_RE = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def make_cfg(lm_layers):
    from transformers import LlavaConfig
    cfg = LlavaConfig(
        text_config=dict(model_type="llama", vocab_size=32064, hidden_size=4096, intermediate_size=11008,
                         num_hidden_layers=lm_layers, num_attention_heads=32, num_key_value_heads=32,
                         max_position_embeddings=4096, rms_norm_eps=1e-5),
        vision_config=dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096,
                           num_hidden_layers=4, num_attention_heads=16, image_size=336, patch_size=14),
        image_token_id=32000, projector_hidden_act="gelu", vision_feature_layer=-2,
        vision_feature_select_strategy="default")
    cfg._attn_implementation = "sdpa"
    return cfg


def train_case(mode):
    from transformers import LlavaForConditionalGeneration
    if mode == "lora":
        import peft  # noqa: F401  (an import: before the baseline)
    torch.manual_seed(0)
    base = mem_baseline()
    model = LlavaForConditionalGeneration(make_cfg(1)).float().train()
    model.model.vision_tower.requires_grad_(False)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_RE))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01)
    T = 640
    ids = torch.randint(0, 31000, (1, T))
    ids[0, 8:8 + 576] = 32000
    labels = torch.full_like(ids, -100)
    labels[0, 8 + 576:] = ids[0, 8 + 576:]
    px = torch.randn(1, 3, 336, 336)

    def step():
        opt.zero_grad()
        loss = model(input_ids=ids, pixel_values=px, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    time_train_steps(step, T, f"llava15_7b_train_t4l1_T640_{mode}", base)


def inference():
    from transformers import DynamicCache, LlavaForConditionalGeneration
    torch.manual_seed(0)
    base = mem_baseline()
    model = LlavaForConditionalGeneration(make_cfg(2)).float().eval()
    with torch.inference_mode():
        px = torch.randn(1, 3, 336, 336)
        sec = median_time(lambda: model.model.get_image_features(pixel_values=px), 3.0, 2)
        report("llava15_7b_image_features_tower4of24_336px", 1.0 / sec, "img/s")
        ids = torch.randint(0, 31000, (1, 600))
        ids[0, 8:8 + 576] = 32000

        def prefill(ids=ids, px=px):
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, pixel_values=px, past_key_values=cache, use_cache=True, logits_to_keep=1)
            return out, cache

        sec = median_time(prefill, 5.0, 2)
        report("llava15_7b_prefill_lm2of32_image_T600", 600 / sec, "tok/s")
        out, cache = prefill()
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for s in range(32):
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t0)
        times.sort()
        report("llava15_7b_decode_lm2of32_after600", 1.0 / times[16], "tok/s")
        lm = model.model.language_model
        dec = sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if "embed_tokens" not in n)
        dec += model.lm_head.weight.numel() * 4
        tc = model.config.text_config
        dec += 2 * tc.num_hidden_layers * (600 + 16) * tc.num_key_value_heads * (tc.hidden_size // tc.num_attention_heads) * 4
        report("llava15_7b_decode_GBps", dec / times[16] / 1e9, "GB/s")
        kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
                 if isinstance(t, torch.Tensor))
        text = torch.randint(0, 31000, (1, 512))
        sec = median_time(lambda: prefill(text, None), 5.0, 2)
        report("llava15_7b_prefill_lm2of32_T512", 512 / sec, "tok/s")
    MiB = 1024.0 * 1024.0
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = peak_rss_mib() - base
    report("llava15_7b_peak_mem_MiB", peak, "MiB", False)
    print('{"name": "llava15_7b_rss_baseline_MiB", "peer": %g, "unit": "MiB", "better": "none"}' % base, flush=True)
    report("llava15_7b_peak_mem_over_weights_kv", peak * MiB / (weights + kv), "x", False)


if __name__ == "__main__":
    run_train_modes(train_case, "full,lora")
    inference()
