"""PyTorch peer for bench_internvl.c: transformers' InternVLForConditionalGeneration (sdpa, fp32) with an
InternViT-300M tower at 4 of 24 layers and Qwen2-7B layers at 2 of 28 (full vocabulary, untied head), random
weights: image features of one 448x448 tile (256 tokens after the pixel shuffle) and prefill of a 280-token
prompt holding it (logits_to_keep=1, as generate does); same thread count. Memory: peak RSS minus the RSS
after the imports."""
import torch
from transformers import DynamicCache, InternVLConfig, InternVLForConditionalGeneration

from peer_util import mem_baseline, median_time, peak_rss_mib, report

torch.manual_seed(0)
base = mem_baseline()
cfg = InternVLConfig(
    text_config=dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=2, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                       image_size=448, patch_size=14, attention_bias=True, norm_type="layer_norm", use_qk_norm=False),
    image_token_id=151667, projector_hidden_act="gelu", downsample_ratio=0.5, vision_feature_layer=-1,
    vision_feature_select_strategy="default", tie_word_embeddings=False)
cfg._attn_implementation = "sdpa"
model = InternVLForConditionalGeneration(cfg).float().eval()

with torch.inference_mode():
    px = torch.randn(1, 3, 448, 448)
    sec = median_time(lambda: model.model.get_image_features(pixel_values=px), 3.0, 2)
    report("internvl_8b_image_features_vit300m_4of24_448px", 1.0 / sec, "img/s")
    ids = torch.randint(0, 150000, (1, 280))
    ids[0, 8:8 + 256] = 151667

    def prefill():
        cache = DynamicCache(config=model.config)
        return model(input_ids=ids, pixel_values=px, past_key_values=cache, use_cache=True, logits_to_keep=1)

    sec = median_time(prefill, 5.0, 2)
    report("internvl_8b_prefill_qwen2_7b_2of28_image_T280", 280 / sec, "tok/s")
peak = peak_rss_mib() - base
report("internvl_8b_peak_mem_MiB", peak, "MiB", False)
