"""A tiny Qwen2-VL with the fixture tokenizer and a real processor config, for the CLI test:
transformers' Qwen2VLProcessor (slow image processor) + apply_chat_template + greedy
generate of 16 tokens with one image. Writes tests/fixtures/qwen2_vl_chat/ (an HF
directory mmc loads) and expected.json."""
import json, os, shutil
import torch
from PIL import Image
from transformers import (AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                          Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "qwen2_vl_chat")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(3)
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"))
ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>",
                                                  "<|vision_end|>", "<|im_end|>")}
cfg = Qwen2VLConfig(
    vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                       temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
    text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                     rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
    image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
    vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    eos_token_id=ids["<|im_end|>"], tie_word_embeddings=True)
m = Qwen2VLForConditionalGeneration(cfg).float().eval()
with torch.no_grad():
    for n, p in m.named_parameters():
        if n.endswith("bias"):
            p.normal_(0, 0.05)
        elif "norm" in n or "ln_q" in n:
            p.copy_(1 + 0.1 * torch.randn_like(p))
        else:
            p.normal_(0, 0.3)
m.save_pretrained(OUT, safe_serialization=True)
ip = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
proc = Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
                        chat_template=tok.chat_template)
proc.save_pretrained(OUT)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(ROOT, "tokenizer", f), os.path.join(OUT, f))
gc = os.path.join(OUT, "generation_config.json")
if os.path.exists(gc):
    os.remove(gc)
img_path = os.path.join(ROOT, "image", "rgb_500x333.jpg")
image = Image.open(img_path).convert("RGB")
msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is the circle?"}]}]
text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
inputs = proc(text=[text], images=[image], return_tensors="pt")
with torch.no_grad():
    g = m.generate(**inputs, max_new_tokens=16, do_sample=False, min_new_tokens=16, eos_token_id=None,
                   pad_token_id=0)
n = inputs["input_ids"].shape[1]
json.dump({"image": "tests/fixtures/image/rgb_500x333.jpg", "prompt": "What colour is the circle?",
           "prompt_tokens": n, "new_ids": g[0, n:].tolist(),
           "image_grid_thw": inputs["image_grid_thw"].tolist()},
          open(os.path.join(OUT, "expected.json"), "w"))
print("wrote", OUT, os.listdir(OUT))
