"""peer_whisper.py — transformers peer of bench/bench_whisper.c: the same case names and shapes
(Whisper-small-shaped encoder and decoder with 2 layers each, d_model 768, 12 heads, ffn 3072,
80 mel bins, vocabulary 51865), f32, torch.inference_mode, transformers' default (SDPA) attention:
  whisper_small2_encode_30s_ms: model.model.encoder on [1, 80, 3000] features;
  whisper_small2_decode_ms_per_token: a fresh EncoderDecoderCache, the 4-token prompt, then 32 tokens
  one at a time (model(...) with the cache: decoder + proj_out), total / 32."""
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from peer_util import median_time, report  # also sets the thread count

STEPS = 32


def main():
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=768, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                        decoder_ffn_dim=3072, max_source_positions=1500, max_target_positions=448)
    model = WhisperForConditionalGeneration(cfg).eval()
    i = torch.arange(80 * 3000)
    feats = (((i * 2654435761) % (1 << 32)) % 1000).float().div(700.0).sub(0.6).view(1, 80, 3000)

    def encode():
        with torch.inference_mode():
            return model.model.encoder(feats).last_hidden_state

    report("whisper_small2_encode_30s_ms", 1e3 * median_time(encode, 3.0, 3), "ms", higher=False)
    enc = BaseModelOutput(last_hidden_state=encode())
    prompt = torch.tensor([[50258, 50259, 50359, 50363]])
    ids = [torch.tensor([[(t * 7919 + 11) % 50000]]) for t in range(STEPS)]

    def decode():
        with torch.inference_mode():
            cache = EncoderDecoderCache(DynamicCache(config=cfg), DynamicCache(config=cfg))
            out = model(encoder_outputs=enc, decoder_input_ids=prompt, past_key_values=cache, use_cache=True,
                        logits_to_keep=1)
            for x in ids:
                out = model(encoder_outputs=enc, decoder_input_ids=x, past_key_values=out.past_key_values,
                            use_cache=True)

    report("whisper_small2_decode_ms_per_token", 1e3 * median_time(decode, 3.0, 3) / STEPS, "ms", higher=False)


if __name__ == "__main__":
    main()
