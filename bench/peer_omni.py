"""PyTorch peer for bench_omni.c: transformers' Qwen2_5OmniThinkerForConditionalGeneration (sdpa, fp32) with
Qwen2.5-Omni-7B thinker shapes at reduced depth (audio encoder 4 of 32 layers, vision tower 4 of 32 blocks with
the last one full attention, Qwen2-7B LM 2 of 28, vocabulary cut to 32768 and the special tokens at 32001.. as
in bench_omni.c), random weights:
prefill of a 534-token prompt holding one 448x448 image (256 tokens) and 10 s of audio features (1000 frames
of a 30 s window, 250 tokens), laid out as Qwen2_5OmniProcessor does, logits_to_keep=1 (as generate does);
same thread count. Memory: peak RSS minus the RSS after the imports."""
import torch
from transformers import DynamicCache, Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

from peer_util import mem_baseline, median_time, peak_rss_mib, report

torch.manual_seed(0)
base = mem_baseline()
cfg = Qwen2_5OmniThinkerConfig(
    text_config=dict(vocab_size=32768, hidden_size=3584, intermediate_size=18944, num_hidden_layers=2,
                     num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                     hidden_act="silu", tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}),
    audio_config=dict(d_model=1280, encoder_layers=4, encoder_attention_heads=20, encoder_ffn_dim=5120,
                      num_mel_bins=128, max_source_positions=1500, n_window=100, output_dim=3584,
                      activation_function="gelu", scale_embedding=False),
    vision_config=dict(depth=4, hidden_size=1280, intermediate_size=3420, num_heads=16, in_channels=3,
                       out_hidden_size=3584, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                       window_size=112, fullatt_block_indexes=[3], hidden_act="silu"),
    audio_token_index=32001, image_token_index=32002, video_token_index=32003, vision_start_token_id=32004,
    audio_start_token_id=32006, audio_end_token_id=32007, position_id_per_seconds=25, seconds_per_chunk=2)
cfg._attn_implementation = "sdpa"
for c in (cfg.text_config, cfg.audio_config, cfg.vision_config):
    c._attn_implementation = "sdpa"
model = Qwen2_5OmniThinkerForConditionalGeneration(cfg).float().eval()

with torch.inference_mode():
    px = torch.randn(1024, 3 * 2 * 14 * 14)
    grid = torch.tensor([[1, 32, 32]])
    feats = torch.zeros(1, 128, 3000)
    feats[0, :, :1000] = torch.randn(128, 1000) * 0.5
    fmask = torch.zeros(1, 3000, dtype=torch.long)
    fmask[0, :1000] = 1
    ids = torch.cat([torch.randint(0, 30000, (8,)), torch.tensor([32004]), torch.full((256,), 32002),
                     torch.tensor([32005, 32006]), torch.full((250,), 32001), torch.tensor([32007]),
                     torch.randint(0, 30000, (16,))])[None]
    assert ids.shape[1] == 534

    def prefill():
        cache = DynamicCache(config=model.config.text_config)
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=px, image_grid_thw=grid,
                     input_features=feats, feature_attention_mask=fmask, past_key_values=cache, use_cache=True,
                     logits_to_keep=1)

    sec = median_time(prefill, 5.0, 2)
    report("omni_7b_prefill_thinker_2of28_audio10s_image448_T534", 534 / sec, "tok/s")
peak = peak_rss_mib() - base
report("omni_7b_v32k_peak_mem_MiB", peak, "MiB", False)
