"""Fixtures for T5's SentencePiece Unigram tokenizer (tests/test_t5_tokenizer.c), written by
transformers / tokenizers themselves (versions pinned in requirements.txt):

* t5_tokenizer/: a small SentencePiece unigram model trained here (sentencepiece pip package,
  nmt_nfkc normalization as T5's spiece.model has, so the precompiled charsmap is the real one;
  pad 0, eos 1, unk 2 as T5 lays them out; 300 pieces, character_coverage < 1 and the CJK /
  emoji captions kept out of the training text so unknown characters occur), converted by
  transformers' T5Tokenizer from spiece.model with extra_ids=4 and saved with save_pretrained,
  untouched. transformers 5.x writes normalizer Precompiled, pre_tokenizer
  Sequence[WhitespaceSplit, Metaspace(always, split)].
* t5_tokenizer_hub/: the same vocabulary in the layout of the tokenizer.json files on the Hub
  (google/t5-v1_1-xxl, Flux's tokenizer_2, SD3's tokenizer_3, converted by transformers 4.x):
  normalizer Sequence[Precompiled, Replace(" {2,}" -> " ")], pre_tokenizer Metaspace alone, the
  legacy "add_prefix_space": true / "str_rep" keys. Built with tokenizers, wrapped in
  T5Tokenizer(tokenizer_object=...) and saved with save_pretrained; the legacy keys are added to
  the saved JSON afterwards (tokenizers reads them, as it reads the Hub's files).
* t5_small_spm/: a 120-piece model (charsmap compiled by sentencepiece from a few rules) in the
  layout transformers' SpmConverter emits by default: Sequence[Precompiled, Strip(right),
  Replace(" {2,}" -> "▁")], Metaspace(always, split). Also the loader's fuzz seeds.
* t5_stress.json: 300 random strings over many Unicode blocks, special tokens and spaces mixed
  in (full ids only, .stress_ids / .stress_len, for all three tokenizers).
* <tok>.tf5_*: for t5_tokenizer_hub and t5_small_spm, the ids of transformers 5's
  T5Tokenizer.from_pretrained, which rebuilds the pipeline whatever the file says (Precompiled
  only, WhitespaceSplit + Metaspace, unk_id 2, $A </s>): captions (tf5_full_*, tf5_ids77 /
  tf5_mask77 padded) and the random strings (tf5_stress_*).
* t5_cases.json: captions (accents, decomposed accents, CJK, emoji, full-width, NFKC-affected
  characters, non-breaking and ideographic spaces, tabs and newlines, multiple / leading /
  trailing spaces, the empty string, the special tokens written out, a long caption).
* t5_expected.safetensors: for each tokenizer, tokenizer(text).input_ids flattened (.full_ids)
  with lengths (.full_len), and tokenizer(texts, padding="max_length", max_length=L,
  truncation=True, add_special_tokens=True) ids / attention masks for L = 16 (.ids16 / .mask16)
  and L = 77 (.ids77 / .mask77), as the Flux / SD3 pipelines call it (512 / 256 / 77 there).

Run: /work/main/.venv-ref/bin/python tools/ref/gen_t5_tokenizer.py
"""
import io
import json
import os
import random
import shutil

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from transformers import T5Tokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "t5_tokenizer")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

CAPTIONS = [
    "a red circle on the left",
    "A photo of an astronaut riding a horse on Mars.",
    "",
    " ",
    "   ",
    "  leading and trailing spaces  ",
    "Two  dogs\tplaying\n\nin   the SNOW, high-resolution, 4k, 8K HDR!!!",
    "it's a cat; we'll see... don't",
    "Caf\u00e9 na\u00efve \u00dcn\u00efc\u00f6d\u00e9 cafe\u0301 (decomposed) r\u00e9sum\u00e9",
    "\u0130stanbul at NIGHT, \u03a3\u0391\u03a3 \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3",
    "\u4e00\u53ea\u732b\u5750\u5728\u7a97\u53f0\u4e0a \u732b\u306e\u5199\u771f",
    "emoji \U0001f431\U0001f680\u2728 and \U0001f468\u200d\U0001f469\u200d\U0001f467 family \U0001f44d\U0001f3fd",
    "\uff21\uff22\uff23 full-width \uff11\uff12\uff13 \uff08\uff54\uff45\uff58\uff54\uff09, \u00bd price \u2167",
    "\ufb01ne \ufb02ower \u2460 \u2461 \u2462 \u33a1 \u2122 \u00b2 x\u2082",
    "non\u00a0breaking\u3000ideographic\u2003em\u200bzero-width space",
    "<extra_id_0> a cat </s> with<pad>special <unk> tokens<extra_id_3>",
    "price: $1,234.56 (approx.) -- 50% off!? #sale @shop",
    " ".join(["a very long caption about a beautiful landscape with mountains, rivers and trees"] * 5),
    "UPPER lower MiXeD 123abc abc123",
    "\u2581already has a metaspace\u2581\u2581and\u2581 more",
    "zzzz qqqq xxyyzz",
    "e\u0301\u0301\u0301 a\u0308\u0304 \u1100\u1161\u11a8 \ud55c\uad6d\uc5b4",
]
L_PAD = (16, 77)

# ---------------------------------------------------------------- a SentencePiece model
rng = random.Random(0)
SUBJ = ["a cat", "a dog", "an astronaut", "a woman", "a man", "a red car", "a blue house", "two birds",
        "a bowl of fruit", "the city", "a mountain lake", "an old tree", "a robot", "a castle", "a horse"]
VERB = ["sitting on", "riding", "next to", "in front of", "under", "above", "walking through", "looking at",
        "painted in", "floating over"]
OBJ = ["the table", "a window", "the beach", "a forest", "the snow", "a street at night", "the moon",
       "a field of flowers", "the ocean", "a busy market"]
STYLE = ["photo", "oil painting", "watercolor", "digital art", "4k, highly detailed", "studio lighting",
         "in the style of van gogh", "cinematic", "sharp focus", "resum\u00e9 caf\u00e9 na\u00efve"]
train = [c for i, c in enumerate(CAPTIONS) if i not in (9, 10, 11, 20, 21)]
for _ in range(3000):
    train.append(f"{rng.choice(SUBJ)} {rng.choice(VERB)} {rng.choice(OBJ)}, {rng.choice(STYLE)}")
    if rng.random() < 0.3:
        train[-1] = train[-1].capitalize()
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(train), model_writer=model, model_type="unigram",
                               vocab_size=300, normalization_rule_name="nmt_nfkc", character_coverage=1.0,
                               pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
                               unk_piece="<unk>", num_threads=1, seed_sentencepiece_size=20000,
                               hard_vocab_limit=False)
tmp = os.path.join(OUT, "_spm")
os.makedirs(tmp)
with open(os.path.join(tmp, "spiece.model"), "wb") as f:
    f.write(model.getvalue())

# ---------------------------------------------------------------- transformers' conversion
tok = T5Tokenizer.from_pretrained(tmp, extra_ids=4)
tok.save_pretrained(os.path.join(OUT, "t5_tokenizer"))
shutil.rmtree(tmp)
for f in os.listdir(os.path.join(OUT, "t5_tokenizer")):   # the slow model file, if written: not read
    if f.endswith(".model"):
        os.remove(os.path.join(OUT, "t5_tokenizer", f))

# ---------------------------------------------------------------- the Hub's layout
with open(os.path.join(OUT, "t5_tokenizer", "tokenizer.json"), encoding="utf-8") as f:
    j = json.load(f)
charsmap = None
norm = j["normalizer"]
for n in ([norm] if norm["type"] != "Sequence" else norm["normalizers"]):
    if n["type"] == "Precompiled":
        charsmap = n["precompiled_charsmap"]
assert charsmap, norm
hub = Tokenizer.from_str(json.dumps(j))
import base64

hub.normalizer = normalizers.Sequence([normalizers.Precompiled(base64.b64decode(charsmap)),
                                       normalizers.Replace(Regex(" {2,}"), " ")])
hub.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
hub_tok = T5Tokenizer(tokenizer_object=hub, extra_ids=4)
hub_dir = os.path.join(OUT, "t5_tokenizer_hub")
hub_tok.save_pretrained(hub_dir)
with open(os.path.join(hub_dir, "tokenizer.json"), encoding="utf-8") as f:
    j = json.load(f)
pt = j["pre_tokenizer"]
assert pt["type"] == "Metaspace", pt
j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "str_rep": "\u2581", "add_prefix_space": True}
with open(os.path.join(hub_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(j, f, ensure_ascii=False, indent=2)

# ---------------------------------------------------------------- fuzz seeds (fuzz/fuzz_t5_tokenizer.c), t5_small_spm/
# A loader seed must be small (libFuzzer mutates inputs of at most 64 KB): a 120-piece model whose
# charsmap is compiled by sentencepiece from a few rules (ligature, circled digit, full-width,
# spaces) instead of nmt_nfkc's 240 KB, converted and saved the same way.
SEEDS = os.path.join(ROOT, "fuzz", "corpus", "t5_tokenizer")
shutil.rmtree(SEEDS, ignore_errors=True)
os.makedirs(SEEDS)
rules = os.path.join(OUT, "_rules.tsv")
with open(rules, "w") as f:
    f.write("FB01\t66 69\n2460\t31\n3000\t20\nA0\t20\nFF21\t41\n65 301\tE9\n9\t20\n")
tmp = os.path.join(OUT, "_spm_small")
os.makedirs(tmp)
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(train[:400]), model_writer=model, model_type="unigram",
                               vocab_size=120, normalization_rule_tsv=rules, character_coverage=1.0,
                               pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
                               unk_piece="<unk>", num_threads=1, hard_vocab_limit=False)
with open(os.path.join(tmp, "spiece.model"), "wb") as f:
    f.write(model.getvalue())
small = T5Tokenizer.from_pretrained(tmp, extra_ids=2)
shutil.rmtree(tmp)
os.remove(rules)
j = json.loads(small.backend_tokenizer.to_str())
with open(os.path.join(SEEDS, "load_v5.json"), "w", encoding="utf-8") as f:
    json.dump(j, f, ensure_ascii=False)
j["normalizer"] = {"type": "Sequence", "normalizers": [j["normalizer"], {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "str_rep": "\u2581", "add_prefix_space": True}
with open(os.path.join(SEEDS, "load_hub.json"), "w", encoding="utf-8") as f:
    json.dump(j, f, ensure_ascii=False)
# the layout transformers' SpmConverter emits by default (Strip right, runs of spaces -> "▁"):
# a third fixture, small enough to commit beside the two big ones
j["normalizer"] = {"type": "Sequence", "normalizers": [j["normalizer"]["normalizers"][0],
                   {"type": "Strip", "strip_left": False, "strip_right": True},
                   {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "\u2581"}]}
j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
os.makedirs(os.path.join(OUT, "t5_small_spm"))
with open(os.path.join(OUT, "t5_small_spm", "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(j, f, ensure_ascii=False, indent=1)
# its tokenizer_config.json as save_pretrained writes it (extra_ids 2: without it, transformers 5
# would add <extra_id_0..99> of its own)
small.save_pretrained(os.path.join(OUT, "_small"))
shutil.copy(os.path.join(OUT, "_small", "tokenizer_config.json"), os.path.join(OUT, "t5_small_spm"))
shutil.rmtree(os.path.join(OUT, "_small"))
for i, c in enumerate(CAPTIONS):   # prompt seeds
    if c and i % 2 == 0:
        with open(os.path.join(SEEDS, f"text{i:02d}.txt"), "w", encoding="utf-8") as f:
            f.write(c)
print("fuzz seeds:", sorted(os.listdir(SEEDS)))

# ---------------------------------------------------------------- expected ids
expected = {}


def encode_with_tokenizers(path, texts, L=None):
    """tokenizers itself on the file's own pipeline (what transformers 4.x's T5TokenizerFast runs)."""
    t = Tokenizer.from_file(path)
    if L:
        t.enable_truncation(max_length=L)
        t.enable_padding(length=L, pad_id=0, pad_token="<pad>")
    return [(e.ids, e.attention_mask) for e in t.encode_batch(texts)]


# random text over many Unicode blocks (combining marks, ZWJ / variation selectors, Hangul jamo,
# regional indicators, Devanagari, math letters, C1 controls, ...) with words and special tokens
# mixed in: full ids only
rng = random.Random(1)
BLOCKS = [(0x20, 0x7e)] * 6 + [(0xa0, 0x17f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x2000, 0x206f),
          (0x2100, 0x24ff), (0x3000, 0x30ff), (0x4e00, 0x4e80), (0xac00, 0xac40), (0x1100, 0x11ff),
          (0xfb00, 0xfb4f), (0xfe00, 0xfe6f), (0xff00, 0xffef), (0x1f300, 0x1f6ff), (0x1f1e6, 0x1f1ff),
          (0x900, 0x97f), (0x600, 0x6ff), (0xe00, 0xe7f), (0x1d400, 0x1d7ff), (0x1f3fb, 0x1f3ff),
          (0x200b, 0x200f), (0x9, 0xd), (0x80, 0x9f)]
WORDS = ["a", "cat", " ", "  ", "the", "photo", "\u200d", "\ufe0f", "</s>", "<extra_id_1>", "<pad>", "\ufb01",
         "\u2460", "\u00a0", "e\u0301"]
STRESS = []
for _ in range(300):
    s = []
    for _ in range(rng.randint(0, 25)):
        if rng.random() < 0.3:
            s.append(rng.choice(WORDS))
        else:
            c = rng.randint(*rng.choice(BLOCKS))
            s.append(chr(c))
    STRESS.append("".join(s))
for name in ("t5_tokenizer", "t5_tokenizer_hub", "t5_small_spm"):
    path = os.path.join(OUT, name, "tokenizer.json")
    stress = [ids for ids, _ in encode_with_tokenizers(path, STRESS)]
    expected[name + ".stress_ids"] = torch.tensor([i for f in stress for i in f], dtype=torch.int32)
    expected[name + ".stress_len"] = torch.tensor([len(f) for f in stress], dtype=torch.int32)
    if name == "t5_small_spm":
        continue
    full = [ids for ids, _ in encode_with_tokenizers(path, CAPTIONS)]
    if name == "t5_tokenizer":
        # transformers 5 rebuilds T5's pipeline in T5Tokenizer.__init__ whatever the file says; on
        # the file it wrote itself the two agree
        t = T5Tokenizer.from_pretrained(os.path.join(OUT, name))
        assert full == [t(c).input_ids for c in CAPTIONS]
        for L in L_PAD:
            enc = t(CAPTIONS, padding="max_length", max_length=L, truncation=True, add_special_tokens=True)
            assert enc.input_ids == [ids for ids, _ in encode_with_tokenizers(path, CAPTIONS, L)]
    expected[name + ".full_ids"] = torch.tensor([i for f in full for i in f], dtype=torch.int32)
    expected[name + ".full_len"] = torch.tensor([len(f) for f in full], dtype=torch.int32)
    for L in L_PAD:
        enc = encode_with_tokenizers(path, CAPTIONS, L)
        expected[f"{name}.ids{L}"] = torch.tensor([ids for ids, _ in enc], dtype=torch.int32)
        expected[f"{name}.mask{L}"] = torch.tensor([m for _, m in enc], dtype=torch.int32)
    print(name, "lengths:", expected[name + ".full_len"].tolist())
    print(name, "unk count:", sum(f.count(2) for f in full))
# transformers 5's T5Tokenizer rebuilds its pipeline whatever the file says (mmc's
# MMC_T5_PIPELINE_TRANSFORMERS5): its ids on the Hub layout and on the SpmConverter one
for name in ("t5_tokenizer_hub", "t5_small_spm"):
    t = T5Tokenizer.from_pretrained(os.path.join(OUT, name))
    for key, texts in (("tf5_full", CAPTIONS), ("tf5_stress", STRESS)):
        ids = [t(c).input_ids for c in texts]
        expected[f"{name}.{key}_ids"] = torch.tensor([i for f in ids for i in f], dtype=torch.int32)
        expected[f"{name}.{key}_len"] = torch.tensor([len(f) for f in ids], dtype=torch.int32)
    enc = t(CAPTIONS, padding="max_length", max_length=77, truncation=True, add_special_tokens=True,
            return_tensors="pt")
    expected[f"{name}.tf5_ids77"] = enc.input_ids.to(torch.int32)
    expected[f"{name}.tf5_mask77"] = enc.attention_mask.to(torch.int32)
    differ = sum(a != b for a, b in zip(ids, [ids for ids, _ in encode_with_tokenizers(
        os.path.join(OUT, name, "tokenizer.json"), STRESS)]))
    print(name, "transformers 5 vs the file's pipeline: stress strings that differ:", differ)
with open(os.path.join(OUT, "t5_cases.json"), "w", encoding="utf-8") as f:
    json.dump(CAPTIONS, f, ensure_ascii=False, indent=1)
with open(os.path.join(OUT, "t5_stress.json"), "w", encoding="utf-8") as f:
    json.dump(STRESS, f, ensure_ascii=True, indent=0)   # escaped: lone controls stay readable
save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(OUT, "t5_expected.safetensors"))

for root, _, files in sorted(os.walk(OUT)):
    for f in sorted(files):
        p = os.path.join(root, f)
        print(f"{os.path.getsize(p):8d} {os.path.relpath(p, OUT)}")

