"""Fixtures for the text encoders of diffusion pipelines (tests/test_text_encoders.c), written by
transformers itself (the version pinned in requirements.txt) with save_pretrained, untouched:

* clip_quick/: CLIPTextModel, hidden 40 with 5 heads (head dim 8), 2 layers, quick_gelu, the legacy
  eos_token_id 2 (pooled at argmax(ids)), padded with the eos id as SD 1.x's tokenizer pads.
* clip_gelu_proj/: CLIPTextModelWithProjection, hidden 40 with 5 heads, gelu, a real eos id (pooled
  at the first position equal to it; padded with the eos id too, so "first" matters),
  projection_dim 24.
* clip_quick_f16/: clip_quick's weights in float16.
* t5_gated/: T5EncoderModel v1.1 (feed_forward_proj gated-gelu = gelu_new), d_model 40, 5 heads of
  d_kv 12 (inner 60 != d_model), 16 buckets, max_distance 20 (sequences longer than it), sharded
  into several safetensors with an index.
* t5_relu/: T5EncoderModel v1.0 (relu DenseReluDense), 5 heads of d_kv 8, 32 buckets, 128.
* t5_gated_bf16/: t5_gated's weights in bfloat16 (single file).

<case>/expected.safetensors: ids [2, T] (int32; two sequences of different lengths, right
padded), mask [2, T] (int32), and the model's outputs in float32, without the mask (as the
diffusion pipelines call CLIP) and with it (suffix _masked): last_hidden_state, hidden_states[-2]
(hs_m2), and for CLIP pooler_output (pooled) / text_embeds. The reduced-precision copies' outputs
come from their own weights upcast to float32. t5_buckets.safetensors: transformers'
_relative_position_bucket for relative positions -299..299 for (32, 128) and (16, 20), to check the bucket
rounding exactly.
* clip_tokenizer/, clip_tokenizer_pad/: CLIPTokenizer (tokenizers backend) saved with save_pretrained,
  built as transformers builds it from a vocab and merges learnt here on captions (CLIP's
  normalizer, pre-tokenizer and </w> word ends; 600 tokens, every byte in the alphabet but only
  the byte+</w> seen in the corpus, so unknown word ends occur). clip_tokenizer_pad pads with "!"
  (SDXL's tokenizer_2). tokenizer_cases.json: captions (unicode, long, empty, whitespace, the
  special tokens written out); clip_hub/, clip_hub_pad/: the same two tokenizers in the Hub's layout of the
  SD 1.x / SDXL repos (vocab.json, merges.txt, tokenizer_config.json with AddedToken dicts,
  special_tokens_map.json; no tokenizer.json), read back by CLIPTokenizer.from_pretrained for their ids;
  tokenizer_expected.safetensors: for each tokenizer, the ids and
  attention masks of tok(captions, padding="max_length", max_length=77, truncation=True) as the
  pipelines call it, and the unpadded, untruncated ids (flattened with lengths).

Run: /work/main/.venv-ref/bin/python tools/ref/gen_text_encoders.py
"""
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel
from transformers.models.t5.modeling_t5 import T5Attention

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "text_encoders")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)


def rand_init(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embedding" in name or "shared" in name or "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def batch(lengths, T, vocab, eos, pad, seed, bos=None):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), T), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), T), dtype=torch.long)
    for b, n in enumerate(lengths):
        row = torch.randint(3, vocab - 3, (n,), generator=g)
        if bos is not None:
            row[0] = bos
        row[n - 1] = eos
        ids[b, :n] = row
        mask[b, :n] = 1
    return ids, mask


def run(model, ids, mask, clip):
    out = {}
    with torch.no_grad():
        for suffix, m in (("", None), ("_masked", mask)):
            o = model(input_ids=ids, attention_mask=m, output_hidden_states=True)
            out["last_hidden_state" + suffix] = o.last_hidden_state
            out["hs_m2" + suffix] = o.hidden_states[-2]
            if clip:
                if hasattr(o, "text_embeds") and o.text_embeds is not None:
                    out["text_embeds" + suffix] = o.text_embeds
                else:
                    out["pooled" + suffix] = o.pooler_output
    return out


def save_case(name, model, ids, mask, clip, **kw):
    d = os.path.join(OUT, name)
    model.save_pretrained(d, **kw)
    ref = model.float()
    tensors = {"ids": ids.to(torch.int32), "mask": mask.to(torch.int32), **run(ref, ids, mask, clip)}
    save_file({k: v.contiguous().float() if v.is_floating_point() else v.contiguous() for k, v in tensors.items()},
              os.path.join(d, "expected.safetensors"))


# ---------------------------------------------------------------- CLIP
clip_common = dict(vocab_size=99, hidden_size=40, intermediate_size=24, num_hidden_layers=2, num_attention_heads=5,
                   max_position_embeddings=16, layer_norm_eps=1e-5, projection_dim=24, pad_token_id=1)

cfg = CLIPTextConfig(**clip_common, hidden_act="quick_gelu", bos_token_id=0, eos_token_id=2)
m = CLIPTextModel(cfg).eval()
rand_init(m, 1)
ids, mask = batch([7, 12], 12, 99, eos=98, pad=98, seed=11, bos=97)   # legacy: eos is the largest id
save_case("clip_quick", m, ids, mask, True)
m16 = CLIPTextModel(cfg).eval()
m16.load_state_dict(m.state_dict())
save_case("clip_quick_f16", m16.half(), ids, mask, True)

cfg = CLIPTextConfig(**clip_common, hidden_act="gelu", bos_token_id=96, eos_token_id=95)
m = CLIPTextModelWithProjection(cfg).eval()
rand_init(m, 2)
ids, mask = batch([5, 11], 11, 90, eos=95, pad=95, seed=12, bos=96)
ids[1, 3] = 98      # a larger id before the eos: only the legacy rule would pick it
save_case("clip_gelu_proj", m, ids, mask, True)

# ---------------------------------------------------------------- T5
cfg = T5Config(vocab_size=99, d_model=40, d_kv=12, d_ff=52, num_layers=2, num_heads=5, relative_attention_num_buckets=16,
               relative_attention_max_distance=20, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
               is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1)
m = T5EncoderModel(cfg).eval()
rand_init(m, 3)
ids, mask = batch([9, 30], 30, 99, eos=1, pad=0, seed=13)
save_case("t5_gated", m, ids, mask, False, max_shard_size="40KB")
mb = T5EncoderModel(cfg).eval()
mb.load_state_dict(m.state_dict())
save_case("t5_gated_bf16", mb.to(torch.bfloat16), ids, mask, False)

cfg = T5Config(vocab_size=99, d_model=40, d_kv=8, d_ff=48, num_layers=2, num_heads=5, relative_attention_num_buckets=32,
               relative_attention_max_distance=128, feed_forward_proj="relu", layer_norm_epsilon=1e-6,
               is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1)
m = T5EncoderModel(cfg).eval()
rand_init(m, 4)
ids, mask = batch([13, 6], 13, 99, eos=1, pad=0, seed=14)
save_case("t5_relu", m, ids, mask, False)

rel = torch.arange(-299, 300)
save_file({"b32_128": T5Attention._relative_position_bucket(rel, True, 32, 128).to(torch.int32).contiguous(),
           "b16_20": T5Attention._relative_position_bucket(rel, True, 16, 20).to(torch.int32).contiguous()},
          os.path.join(OUT, "t5_buckets.safetensors"))

# ---------------------------------------------------------------- CLIP tokenizer
import json
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
from transformers import CLIPTokenizer

CAPTIONS = [
    "a red circle on the left",
    "A photo of an astronaut riding a horse on Mars.",
    "",
    "   ",
    "Two  dogs\tplaying\n\nin   the SNOW, high-resolution, 4k, 8K HDR!!!",
    "it's a cat; we'll see... don't they've I'm you'd she's",
    "Caf\u00e9 na\u00efve \u00dcn\u00efc\u00f6d\u00e9 cafe\u0301 (decomposed)",
    "\u0130stanbul at NIGHT, \u03a3\u0391\u03a3 \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3",
    "\u4e00\u53ea\u732b\u5750\u5728\u7a97\u53f0\u4e0a \u732b\u306e\u5199\u771f",
    "emoji \U0001f431\U0001f680\u2728 and \uff21\uff22\uff23 full-width, \u00bd price \u2167",
    "non\u00a0breaking\u3000ideographic\u2003em space",
    "<|startoftext|>a prompt with<|endoftext|> special tokens written out",
    "price: $1,234.56 (approx.) -- 50% off!? #sale @shop",
    " ".join(["a very long caption about a beautiful landscape with mountains, rivers and trees"] * 6),
    "UPPER lower MiXeD 123abc abc123",
]
# the CJK and emoji captions stay out of the training text: their word-final bytes are unknown
corpus = [c for i, c in enumerate(CAPTIONS) if i not in (8, 9)] + [
    "a photo of a cat", "a painting of a dog in the style of van gogh", "a red car on a street at night",
    "a blue square on the right", "a green triangle in the middle", "portrait of a woman, studio lighting",
    "landscape with mountains and a lake at sunset", "the quick brown fox jumps over the lazy dog",
] * 20
trainer_tok = Tokenizer(models.BPE(unk_token="<|endoftext|>", end_of_word_suffix="</w>", continuing_subword_prefix=""))
trainer_tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                               normalizers.Lowercase()])
trainer_tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                         behavior="removed", invert=True),
    pre_tokenizers.ByteLevel(add_prefix_space=False)])
# A small BPE learnt here rather than by tokenizers' BpeTrainer, whose tie-breaking follows hash
# order (its output changes run to run): the most frequent pair first, ties by the pair's text.
words = {}
for text in corpus:
    for w, _ in trainer_tok.pre_tokenizer.pre_tokenize_str(trainer_tok.normalizer.normalize_str(text)):
        key = tuple(w[:-1]) + (w[-1] + "</w>",)
        words[key] = words.get(key, 0) + 1
alphabet = sorted(set(pre_tokenizers.ByteLevel.alphabet()) | {s for w in words for s in w})
vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
for a in alphabet:
    vocab[a] = len(vocab)
merges = []
while len(vocab) < 600:
    pairs = {}
    for w, n in words.items():
        for p in zip(w, w[1:]):
            pairs[p] = pairs.get(p, 0) + n
    if not pairs:
        break
    best = min(pairs, key=lambda p: (-pairs[p], p))
    merges.append(best)
    vocab.setdefault(best[0] + best[1], len(vocab))
    merged = {}
    for w, n in words.items():
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                out.append(w[i] + w[i + 1])
                i += 2
            else:
                out.append(w[i])
                i += 1
        merged[tuple(out)] = merged.get(tuple(out), 0) + n
    words = merged
tok_expected = {}
for name, kw in (("clip_tokenizer", {}), ("clip_tokenizer_pad", {"pad_token": "!"})):
    tok = CLIPTokenizer(vocab=vocab, merges=merges, **kw)
    tok.save_pretrained(os.path.join(OUT, name))
    tok = CLIPTokenizer.from_pretrained(os.path.join(OUT, name))
    enc = tok(CAPTIONS, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
    tok_expected[name + ".ids"] = enc.input_ids.to(torch.int32)
    tok_expected[name + ".mask"] = enc.attention_mask.to(torch.int32)
    full = [tok(c).input_ids for c in CAPTIONS]
    tok_expected[name + ".full_ids"] = torch.tensor([i for f in full for i in f], dtype=torch.int32)
    tok_expected[name + ".full_len"] = torch.tensor([len(f) for f in full], dtype=torch.int32)
# The Hub's layout of the same tokenizers, as the SD 1.x / SDXL repos ship them: vocab.json + merges.txt,
# tokenizer_config.json with AddedToken dicts, special_tokens_map.json, no tokenizer.json; read back by
# transformers' CLIPTokenizer.from_pretrained (which builds its pipeline from the two files).
def added(content):
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False,
            "single_word": False}


for name, pad in (("clip_hub", "<|endoftext|>"), ("clip_hub_pad", "!")):
    d = os.path.join(OUT, name)
    os.makedirs(d)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    cfg = {"add_prefix_space": False, "bos_token": added("<|startoftext|>"), "do_lower_case": True,
           "eos_token": added("<|endoftext|>"), "errors": "replace", "model_max_length": 77,
           "name_or_path": "openai/clip-vit-large-patch14", "pad_token": pad,
           "special_tokens_map_file": "./special_tokens_map.json", "tokenizer_class": "CLIPTokenizer",
           "unk_token": added("<|endoftext|>")}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    stm = {k: ({kk: vv for kk, vv in v.items() if kk != "__type"} if isinstance(v, dict) else v)
           for k, v in cfg.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump(stm, f, indent=2)
    tok = CLIPTokenizer.from_pretrained(d)
    assert not os.path.exists(os.path.join(d, "tokenizer.json"))
    enc = tok(CAPTIONS, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
    tok_expected[name + ".ids"] = enc.input_ids.to(torch.int32)
    tok_expected[name + ".mask"] = enc.attention_mask.to(torch.int32)
    full = [tok(c).input_ids for c in CAPTIONS]
    tok_expected[name + ".full_ids"] = torch.tensor([i for f in full for i in f], dtype=torch.int32)
    tok_expected[name + ".full_len"] = torch.tensor([len(f) for f in full], dtype=torch.int32)
with open(os.path.join(OUT, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
    json.dump(CAPTIONS, f, ensure_ascii=False, indent=1)
save_file({k: v.contiguous() for k, v in tok_expected.items()}, os.path.join(OUT, "tokenizer_expected.safetensors"))
print("tokenized lengths:", tok_expected["clip_tokenizer.full_len"].tolist())

for root, _, files in sorted(os.walk(OUT)):
    for f in sorted(files):
        p = os.path.join(root, f)
        print(f"{os.path.getsize(p):8d} {os.path.relpath(p, OUT)}")
