"""peer_text_encoders.py — transformers peer of bench/bench_text_encoders.c: the same case names
and shapes (CLIP ViT-L/14 text tower at 77 tokens; 4 T5 v1.1-large blocks at 256 tokens), f32,
torch.inference_mode, transformers' default (SDPA) attention, ms per batch-1 prompt."""
import torch
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from peer_util import median_time, report  # also sets the thread count


def ids(T, vocab):
    return torch.tensor([[(t * 7919 + 3) % vocab for t in range(T)]])


def case(name, model, x):
    model.eval()

    def step():
        with torch.inference_mode():
            model(input_ids=x)

    report(name, 1e3 * median_time(step, 2.0, 3), "ms", higher=False)


def main():
    clip = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                        num_attention_heads=12, vocab_size=1000, max_position_embeddings=77,
                                        hidden_act="quick_gelu", eos_token_id=2))
    case("text_encode_clip_l_77tok_ms", clip, ids(77, 1000))
    del clip
    t5 = T5EncoderModel(T5Config(d_model=1024, d_kv=64, d_ff=2816, num_layers=4, num_heads=16, vocab_size=1000,
                                 feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False))
    case("text_encode_t5_large4_256tok_ms", t5, ids(256, 1000))


if __name__ == "__main__":
    main()
