"""peer_clip.py — transformers peer of bench/bench_clip.c: the same case names and shapes (a CLIP
ViT-B/32-shaped CLIPModel, random weights, f32, torch.inference_mode, transformers' default (SDPA)
attention):
  clip_b32_image_embed_16: get_image_features on [16, 3, 224, 224] pixels, then the L2 normalisation;
  clip_b32_text_embed_16: the fast CLIP tokenizer (the fixture's, padding=True) on the same 16 captions,
  get_text_features, the L2 normalisation."""
import torch
from transformers import CLIPConfig, CLIPModel, CLIPTokenizerFast

from peer_util import median_time, report  # also sets the thread count

N = 16
CAPTIONS = [
    "a red circle on the left of a blue square", "two green triangles", "a photo of a cat sitting on a mat",
    "three small yellow stars above a large purple circle", "an orange square", "a dog runs in the park",
    "the blue circle is to the right of the red square", "one big grey triangle in the middle of the picture",
    "a cup of coffee on a wooden table", "children play football on the beach at sunset",
    "a white boat on a calm lake", "four red squares in a row", "a green circle below a yellow triangle",
    "a man rides a bicycle down the street", "a bowl of fruit", "small blue stars on a black background"]


def features(out):
    return out.pooler_output if hasattr(out, "pooler_output") else out


def main():
    cfg = CLIPConfig(projection_dim=512,
                     text_config=dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                                      num_attention_heads=8, max_position_embeddings=77, eos_token_id=1,
                                      hidden_act="quick_gelu"),
                     vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                        num_attention_heads=12, image_size=224, patch_size=32, hidden_act="quick_gelu"))
    model = CLIPModel(cfg).eval()
    tok = CLIPTokenizerFast.from_pretrained("tests/fixtures/clip_model/model")
    i = torch.arange(N * 3 * 224 * 224)
    px = (((i * 2654435761) % (1 << 32)) % 1000).float().div(500.0).sub(1.0).view(N, 3, 224, 224)

    def images():
        with torch.inference_mode():
            e = features(model.get_image_features(pixel_values=px))
            return e / e.norm(dim=-1, keepdim=True)

    def texts():
        with torch.inference_mode():
            inp = tok(CAPTIONS, padding=True, truncation=True, return_tensors="pt")
            e = features(model.get_text_features(**inp))
            return e / e.norm(dim=-1, keepdim=True)

    report("clip_b32_image_embed_16", N / median_time(images, 3.0, 3), "img/s")
    report("clip_b32_text_embed_16", N / median_time(texts, 3.0, 3), "texts/s")


if __name__ == "__main__":
    main()
