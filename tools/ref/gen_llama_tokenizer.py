"""Fixtures for the SentencePiece-BPE tokenizers of Llama-family checkpoints (LLaVA-1.5 / NeXT,
Mistral, Vicuna, InternLM ...): BPE over characters with byte fallback (<0x0A> ...), "▁" for
spaces, fuse_unk (tests/test_llama_tokenizer.c). Written by tokenizers / transformers themselves
(versions pinned in requirements.txt):

* A SentencePiece BPE model trained here (byte_fallback, split_digits, identity normalization,
  <unk> 0 <s> 1 </s> 2 as Llama lays them out; CJK and emoji kept out of the training text so
  byte fallback and unknown characters occur); its vocab and merges extracted with
  transformers' SentencePieceExtractor.
* llama_tok_hub/: the layout of the tokenizer.json files on the Hub (llava-hf/llava-1.5-7b-hf,
  lmsys/vicuna, meta-llama/Llama-2: transformers 4.3x's LlamaConverter, legacy): normalizer
  Sequence[Prepend("▁"), Replace(" " -> "▁")], pre_tokenizer null, decoder Sequence[Replace("▁" ->
  " "), ByteFallback, Fuse, Strip(" ", 1, 0)], TemplateProcessing "<s> $A"; LLaVA's "<image>"
  (32000 there) and "<pad>" added; tokenizer_config.json as the Hub has it (LlamaTokenizer,
  legacy false, add_bos_token true).
* llama_tok_meta/: the non-legacy layout (transformers >= 4.40's LlamaConverter with legacy=False, e.g.
  Mistral's files): normalizer null, pre_tokenizer Metaspace(prepend_scheme "first", split false).
* llama_tok_joined/: llama_tok_meta plus a merge "s" + "▁" (a token spanning a character and a following
  "▁"), no tokenizer_config.json: BPE must then run over whole sections.
* llama_tok_v5/: llama_tok_hub loaded with AutoTokenizer and saved with save_pretrained by
  transformers 5, untouched.
* expected.json: for each layout and each text, the ids of (a) tokenizers on the file as written
  ("raw") and (b) transformers 5's AutoTokenizer ("tf5": it rebuilds LlamaTokenizer's pipeline
  from the vocab and merges, whatever the file says); the decode of those ids with and without
  special tokens (transformers' tokenizer.decode), and of a few single ids.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_llama_tokenizer.py
"""
import io
import json
import os
import random
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":   # set iteration order in tokenizers' Python side
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers import AutoTokenizer
from transformers.convert_slow_tokenizer import SentencePieceExtractor

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "llama_tokenizer")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

TEXTS = [
    "Hello world",
    "USER: <image>\nWhat is shown in this image? ASSISTANT:",
    "USER: <image>\nWhat colour is the square? ASSISTANT: It is red.</s>",
    "",
    " ",
    "  two leading spaces and trailing  ",
    "line one\nline two\n\n\ttabbed",
    "The year 2024 had 365 days; pi = 3.14159.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00dcber",
    "\u4e00\u53ea\u732b\u5750\u5728\u7a97\u53f0\u4e0a",
    "emoji \U0001f431\U0001f680 family \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "<s>already special</s> <unk> and <image><image> twice",
    "\u2581already has a metaspace\u2581\u2581and\u2581 more",
    "a very long answer about the picture, " * 12,
    "UPPER lower MiXeD 123abc abc123 x_y-z",
    "[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi there [/INST]",
]

rng = random.Random(0)
WORDS = ("the a an of to in is it that what which colour color shape red green blue square circle triangle "
         "image picture photo shows shown there are two three left right top bottom USER ASSISTANT answer "
         "question cat dog sitting on table window hello world line tab year days long very about "
         "caf\u00e9 na\u00efve r\u00e9sum\u00e9 upper lower mixed").split()
train = []
for _ in range(4000):
    n = rng.randint(3, 12)
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    if rng.random() < 0.3:
        s = s.capitalize() + rng.choice([".", "?", "!", ",", ":"]) + " " + str(rng.randint(0, 9999))
    if rng.random() < 0.1:
        s += "\n" + rng.choice(WORDS)
    train.append(s)
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(train), model_writer=model, model_type="bpe",
                               vocab_size=640, byte_fallback=True, split_digits=True,
                               normalization_rule_name="identity", add_dummy_prefix=True,
                               allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
                               character_coverage=0.9999, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                               num_threads=1, hard_vocab_limit=False)
tmp = os.path.join(OUT, "_spm.model")
with open(tmp, "wb") as f:
    f.write(model.getvalue())
kw = SentencePieceExtractor(tmp).extract(BPE)
vocab, merges = kw["vocab"], kw["merges"]
os.remove(tmp)
n_base = len(vocab)


def build(legacy):
    t = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    t.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                          AddedToken("<s>", normalized=False, special=True),
                          AddedToken("</s>", normalized=False, special=True)])
    if legacy:
        t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        t.pre_tokenizer = None
    else:
        t.normalizer = None
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(content=" ", left=1, right=0)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                     special_tokens=[("<s>", 1)])
    # LLaVA-1.5's additions: <image> (special) and <pad>
    t.add_tokens([AddedToken("<image>", normalized=False, special=True)])
    t.add_special_tokens([AddedToken("<pad>", normalized=False, special=True)])
    return t


def hub_config(d):
    n = n_base
    cfg = {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True} for i, c in ((0, "<unk>"), (1, "<s>"), (2, "</s>"), (n, "<image>"), (n + 1, "<pad>"))},
        "bos_token": "<s>", "clean_up_tokenization_spaces": False, "eos_token": "</s>", "legacy": False,
        "model_max_length": 4096, "pad_token": "<pad>", "padding_side": "left", "processor_class": "LlavaProcessor",
        "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "trust_remote_code": False,
        "unk_token": "<unk>", "use_default_system_prompt": False,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)


dirs = {}
for name, legacy in (("llama_tok_hub", True), ("llama_tok_meta", False)):
    d = os.path.join(OUT, name)
    os.makedirs(d)
    build(legacy).save(os.path.join(d, "tokenizer.json"))
    hub_config(d)
    dirs[name] = d
# llama_tok_joined/: the non-legacy layout plus a merge that joins a character to a following "▁"
# ("s" + "▁", first in rank): mmc may then not split at "▁" runs (its fast path); no
# tokenizer_config.json, so both sides run the file's own pipeline.
d = os.path.join(OUT, "llama_tok_joined")
os.makedirs(d)
vocab_j = dict(vocab)
vocab_j["s\u2581"] = len(vocab_j)
saved_vm = (vocab, merges)
vocab, merges = vocab_j, [("s", "\u2581")] + list(merges)
build(False).save(os.path.join(d, "tokenizer.json"))
vocab, merges = saved_vm
dirs["llama_tok_joined"] = d
v5 = os.path.join(OUT, "llama_tok_v5")
AutoTokenizer.from_pretrained(dirs["llama_tok_hub"]).save_pretrained(v5)
dirs["llama_tok_v5"] = v5

# random strings: words of the training text, other scripts, emoji, spaces / tabs / newlines, the
# special tokens and "▁" written out
POOL = WORDS + ["\u4e00\u732b", "\U0001f431", "\u00e9t\u00e9", "\u0414\u0430", "\u03a3\u03bf\u03c6", "x\u0301",
                "<s>", "</s>", "<unk>", "<image>", "<pad>", "\u2581", "\u2581\u2581", "12", "3.5", "--", "?!"]
SEPS = [" ", "  ", "", "\n", "\t", " \n ", "   "]
STRESS = []
for _ in range(200):
    parts = [rng.choice(SEPS) if rng.random() < 0.2 else ""]
    for _ in range(rng.randint(1, 8)):
        parts.append(rng.choice(POOL))
        parts.append(rng.choice(SEPS))
    STRESS.append("".join(parts))
TEXTS += STRESS
expected = {"texts": TEXTS, "layouts": {}}
for name, d in dirs.items():
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    tf = AutoTokenizer.from_pretrained(d)
    lay = {"raw": [], "tf5": [], "tf5_nospecial": [], "decode": [], "decode_skip": [], "raw_decode": []}
    for t in TEXTS:
        r = raw.encode(t).ids
        ids = tf(t).input_ids
        lay["raw"].append(r)
        lay["tf5"].append(ids)
        lay["tf5_nospecial"].append(tf(t, add_special_tokens=False).input_ids)
        lay["decode"].append(tf.decode(ids, skip_special_tokens=False))
        lay["decode_skip"].append(tf.decode(ids, skip_special_tokens=True))
        lay["raw_decode"].append(raw.decode(r, skip_special_tokens=False))
    singles = list(range(0, 8)) + [3 + 0x0A, 3 + 0x20, 300, 400, n_base - 1, n_base, n_base + 1]
    lay["single_ids"] = singles
    lay["single_decode"] = [tf.decode([i]) for i in singles]
    lay["pipeline"] = {"normalizer": str(tf.backend_tokenizer.normalizer), "pre_tokenizer": str(tf.backend_tokenizer.pre_tokenizer),
                       "decoder": str(tf.backend_tokenizer.decoder)}
    expected["layouts"][name] = lay
with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
    json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
for name, lay in expected["layouts"].items():
    same = sum(a == b for a, b in zip(lay["raw"], lay["tf5"]))
    print(f"{name}: raw == tf5 on {same}/{len(TEXTS)} texts; pipeline {lay['pipeline']}")
print("vocab", n_base, "merges", len(merges), "files", sorted(os.listdir(v5)))

# fuzz seeds (fuzz/fuzz_tokenizer_load.c: tokenizer.json, then NUL and tokenizer_config.json)
SEEDS = os.path.join(ROOT, "fuzz", "corpus", "tokenizer_load")
for name, with_cfg in (("llama_tok_hub", True), ("llama_tok_meta", False)):
    with open(os.path.join(dirs[name], "tokenizer.json"), "rb") as f:
        blob = f.read()
    if with_cfg:
        with open(os.path.join(dirs[name], "tokenizer_config.json"), "rb") as f:
            blob += b"\0" + f.read()
    with open(os.path.join(SEEDS, f"spm_{name}{'_cfg' if with_cfg else ''}.json"), "wb") as f:
        f.write(blob)

# bench/data/llama_spm_8k/: a Llama-shaped tokenizer for bench/bench_tokenizer.c (the "llama" rows):
# SentencePiece BPE with byte fallback, 8000 pieces, trained on the first 400 kB of the benchmark
# corpus (bench/data/tokenizer_corpus.txt), in the non-legacy layout (Metaspace "first").
corpus = os.path.join(ROOT, "bench", "data", "tokenizer_corpus.txt")
if os.path.exists(corpus):
    lines = open(corpus, encoding="utf-8").read()[:400000].splitlines()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="bpe",
                                   vocab_size=8000, byte_fallback=True, split_digits=True,
                                   normalization_rule_name="identity", add_dummy_prefix=True,
                                   allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
                                   character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   num_threads=1, hard_vocab_limit=False, max_sentence_length=1 << 16)
    with open(tmp, "wb") as f:
        f.write(model.getvalue())
    kw = SentencePieceExtractor(tmp).extract(BPE)
    os.remove(tmp)
    vocab, merges = kw["vocab"], kw["merges"]
    n_base = len(vocab)
    d = os.path.join(ROOT, "bench", "data", "llama_spm_8k")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    build(False).save(os.path.join(d, "tokenizer.json"))
    hub_config(d)
    print("bench tokenizer:", n_base, "pieces,", len(merges), "merges")
