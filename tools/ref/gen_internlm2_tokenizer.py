"""Fixtures for InternLM2's tokenizer (tokenizer.model, a SentencePiece BPE model, with the remote-code
InternLM2Tokenizer; no tokenizer.json), for tests/test_internlm2_tokenizer.c and fuzz/fuzz_spm_model.c.

Two tiny SentencePiece BPE models trained here with the sentencepiece trainer (0.2.3, pinned in
requirements.txt):

* internlm2/: as InternLM2's tokenizer.model is built: BPE, byte_fallback, split_digits, identity
  normalization, add_dummy_prefix, remove_extra_whitespaces off, whitespace-only pieces; <unk> 0 <s> 1
  </s> 2; InternLM2's chat tokens as USER_DEFINED pieces (<|im_start|> ...) plus one user-defined piece
  that tokenizer_config.json does not list; tokenizer_config.json as internlm2_5-7b-chat's (InternLM2Tokenizer,
  add_bos_token, added_tokens_decoder of the specials) plus InternVL 2.5's added tokens past the vocab
  (<img>, </img>, <IMG_CONTEXT>, <quad> ... as InternVL2_5-8B's), lstrip on one of them.
* variant/: the other normalizer branches: a precompiled charsmap from a small rule table
  (normalization_rule_tsv: full-width letters, a ligature, the ideographic space, a two-character
  source), add_dummy_prefix off, remove_extra_whitespaces on, no byte_fallback (unknown characters:
  one fused <unk>), and two merged pieces turned UNUSED (sentencepiece splits them back); no
  tokenizer_config.json (InternLM2Tokenizer's defaults).
* unigram/: a Unigram model (sentencepiece's default type, as other checkpoints' tokenizer.model are):
  byte_fallback, a user-defined piece, dummy prefix, extra whitespace removed; no tokenizer_config.json.

The reference: transformers 4.44.2's slow PreTrainedTokenizer (added tokens split off, leftmost
longest, with their lstrip / rstrip) around InternLM2Tokenizer's own methods, restated below from the
InternLM team's tokenization_internlm2.py (_tokenize = sp_model.encode(text, out_type=str), ids by
piece_to_id, bos_token_id = sp_model.bos_id(), bos first when add_bos_token); transformers' own
LlamaTokenizer(legacy=True) on the same files is checked to agree. Run in the InternLM2 venv (see
gen_internvl_internlm2.py's docstring: transformers 4.44.2 first, .venv-ref's sentencepiece after):

  .venv-internlm2/bin/python tools/ref/gen_internlm2_tokenizer.py

Writes tests/fixtures/internlm2_tokenizer/{internlm2,variant,unigram}/ and expected.json: the texts; per layout
the ids with and without special tokens, sentencepiece's own ids of each text (sp.encode) and its
decode of them; fuzz/corpus/spm_model/ seeds (the three models, a truncated one); and
bench/data/internlm2_spm_8k/tokenizer.model (8000 pieces, for bench/bench_tokenizer.c).
"""
import io
import json
import os
import random
import shutil
import tempfile

import sentencepiece as spm
import transformers
from sentencepiece import sentencepiece_model_pb2 as pb
from transformers import AddedToken, LlamaTokenizer, PreTrainedTokenizer

assert transformers.__version__ == "4.44.2", transformers.__version__
assert spm.__version__ == "0.2.3", spm.__version__

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "internlm2_tokenizer")
SEEDS = os.path.join(ROOT, "fuzz", "corpus", "spm_model")
CHAT = ["<|plugin|>", "<|interpreter|>", "<|action_end|>", "<|action_start|>", "<|im_end|>", "<|im_start|>"]
INTERNVL = ["<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>"]


class InternLM2Tokenizer(PreTrainedTokenizer):
    """InternLM2Tokenizer's encoding path (tokenization_internlm2.py), over transformers 4.44.2."""
    vocab_files_names = {"vocab_file": "tokenizer.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>",
                 add_bos_token=True, add_eos_token=False, **kwargs):
        self.vocab_file = vocab_file
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.sp_model = spm.SentencePieceProcessor()
        self.sp_model.Load(vocab_file)
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         clean_up_tokenization_spaces=False, **kwargs)

    @property
    def vocab_size(self):
        return self.sp_model.get_piece_size()

    @property
    def bos_token_id(self):
        return self.sp_model.bos_id()

    @property
    def eos_token_id(self):
        return self.sp_model.eos_id()

    def get_vocab(self):
        vocab = {self.convert_ids_to_tokens(i): i for i in range(self.vocab_size)}
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text):
        return self.sp_model.encode(text, out_type=str)

    def _convert_token_to_id(self, token):
        return self.sp_model.piece_to_id(token)

    def _convert_id_to_token(self, index):
        return self.sp_model.IdToPiece(index)

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        out = ([self.bos_token_id] if self.add_bos_token else []) + token_ids_0
        if token_ids_1 is not None:
            out = out + token_ids_1
        return out + ([self.eos_token_id] if self.add_eos_token else [])


rng = random.Random(19)
WORDS = ("the a an of to in is it that what which colour shape red green blue square circle image picture photo "
         "shows there are two left right top bottom user assistant answer question cat dog sitting on table window "
         "hello world line very long about describe this def return import print self value for while if else "
         "caf\u00e9 na\u00efve \u4e00 \u53ea \u732b \u5750 \u5728 \u7a97 \u53f0 \u4e0a \u4eba \u56fe").split()


def corpus(n):
    out = []
    for _ in range(n):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        if rng.random() < 0.3:
            s = s.capitalize() + rng.choice([".", "?", "!", ",", ":"]) + " " + str(rng.randint(0, 99999))
        if rng.random() < 0.15:
            s = "    " + s + "\n\t" + rng.choice(WORDS) + "()"
        out.append(s)
    return out


def train(model_type="bpe", **kw):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus(3000)), model_writer=buf, model_type=model_type,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   num_threads=1, hard_vocab_limit=False, **kw)
    return buf.getvalue()


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    # internlm2/: InternLM2's settings
    a = train(vocab_size=700, byte_fallback=True, character_coverage=0.9995, split_digits=True, normalization_rule_name="identity",
              add_dummy_prefix=True, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
              user_defined_symbols=CHAT + ["<fim_pad>"])
    da = os.path.join(OUT, "internlm2")
    os.makedirs(da)
    with open(os.path.join(da, "tokenizer.model"), "wb") as f:
        f.write(a)
    sp = spm.SentencePieceProcessor(model_proto=a)
    n = sp.get_piece_size()
    atd = {}
    for i, c in [(0, "<unk>"), (1, "<s>"), (2, "</s>")] + [(sp.piece_to_id(c), c) for c in CHAT] + \
            [(n + k, c) for k, c in enumerate(INTERNVL)]:
        atd[str(i)] = {"content": c, "lstrip": c == "<quad>", "normalized": False, "rstrip": False,
                       "single_word": False, "special": True}
    cfg = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": atd,
           "additional_special_tokens": CHAT, "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer",
                                                                             None]},
           "bos_token": "<s>", "clean_up_tokenization_spaces": False, "decode_with_prefix_space": False,
           "eos_token": "</s>", "model_max_length": 8192, "pad_token": "</s>", "sp_model_kwargs": None,
           "tokenizer_class": "InternLM2Tokenizer", "unk_token": "<unk>",
           "chat_template": "{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                            "{{ '<|im_start|>assistant\\n' }}{% endif %}"}
    with open(os.path.join(da, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)

    # variant/: a charsmap, no dummy prefix, extra whitespace removed, no byte fallback, UNUSED pieces
    rules = os.path.join(tempfile.mkdtemp(), "rules.tsv")
    with open(rules, "w") as f:
        for src, dst in [("FF21", "41"), ("FF22", "42"), ("FF43", "63"), ("FB01", "66 69"), ("3000", "20"),
                         ("2460", "31"), ("61 62 63", "78 79"), ("2003", "20 20")]:
            f.write(f"{src}\t{dst}\n")
    b = train(vocab_size=500, byte_fallback=False, normalization_rule_tsv=rules, add_dummy_prefix=False,
              remove_extra_whitespaces=True, character_coverage=0.98)
    os.remove(rules)
    mp = pb.ModelProto()
    mp.ParseFromString(b)
    merged = [i for i, p in enumerate(mp.pieces) if p.type == pb.ModelProto.SentencePiece.NORMAL and len(p.piece) >= 3]
    unused = [merged[5], merged[40]]
    for i in unused:
        mp.pieces[i].type = pb.ModelProto.SentencePiece.UNUSED
    mp.normalizer_spec.normalization_rule_tsv = ""   # the rule file's path: not needed once compiled
    b = mp.SerializeToString()
    db = os.path.join(OUT, "variant")
    os.makedirs(db)
    with open(os.path.join(db, "tokenizer.model"), "wb") as f:
        f.write(b)
    print("variant: charsmap", len(mp.normalizer_spec.precompiled_charsmap), "bytes; UNUSED",
          [mp.pieces[i].piece for i in unused])

    # unigram/
    u = train(model_type="unigram", vocab_size=400, byte_fallback=True, normalization_rule_name="identity",
              add_dummy_prefix=True, remove_extra_whitespaces=True, user_defined_symbols=["<fim_pad>"],
              character_coverage=0.99)
    du = os.path.join(OUT, "unigram")
    os.makedirs(du)
    with open(os.path.join(du, "tokenizer.model"), "wb") as f:
        f.write(u)

    texts = [
        "", " ", "   ", "\n", "Hello world", " leading space", "trailing space ", "two  spaces   three",
        "A red square and a blue circle on a white table.",
        "USER: <image>\nWhat is shown in this image? ASSISTANT:",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<s>already special</s> <unk> and </s></s> twice",
        "<img><IMG_CONTEXT><IMG_CONTEXT><IMG_CONTEXT></img>\nDescribe the image.",
        "Please locate <ref>the cat</ref>  <quad>(1,2),(3,4)</quad> and <box>[[1, 2, 3, 4]]</box>",
        "   <quad>after spaces (lstrip)",
        "<fim_pad>user defined<fim_pad><fim_pad>",
        "The year 2024 had 365 days; pi = 3.14159.",
        "def f(x):\n    return x * 2\n\n\tprint(f(21))",
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00dcber Stra\u00dfe",
        "\u4e00\u53ea\u732b\u5750\u5728\u7a97\u53f0\u4e0a\u3002\u4eba\u56fe",
        "emoji \U0001f431\U0001f680 family \U0001f468\u200d\U0001f469\u200d\U0001f467 x\u0301",
        "\u2581already has a metaspace\u2581\u2581and\u2581 more",
        "\uff21\uff22\uff43 \ufb01sh\u3000ideographic \u2460 abcabc \u2003em",
        "\u0414\u0430 \u03a3\u03bf\u03c6\u03af\u03b1 \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
        "\x01soh and \x7f del \u200b zero width",
        "a very long answer about the picture, with the cat sitting on the table by the window. " * 8,
    ]
    pool = WORDS + ["\U0001f431", "\u00e9t\u00e9", "x\u0301", "\uff21", "\ufb01", "\u3000", "abc", "<s>", "</s>",
                    "<unk>", "<|im_start|>", "<|im_end|>", "<img>", "<IMG_CONTEXT>", "<quad>", "<fim_pad>", "\u2581",
                    "12", "3.5", "--", "?!", "\u2003"]
    seps = [" ", "  ", "", "\n", "\t", " \n ", "   "]
    for _ in range(200):
        parts = [rng.choice(seps) if rng.random() < 0.2 else ""]
        for _ in range(rng.randint(1, 8)):
            parts += [rng.choice(pool), rng.choice(seps)]
        texts.append("".join(parts))

    expected = {"texts": texts, "layouts": {}}
    for name, d, model in (("internlm2", da, a), ("variant", db, b), ("unigram", du, u)):
        cfgp = os.path.join(d, "tokenizer_config.json")
        kw = {}
        if os.path.exists(cfgp):
            c = json.load(open(cfgp))
            kw = {"added_tokens_decoder": {int(k): AddedToken(**v) for k, v in c["added_tokens_decoder"].items()},
                  "additional_special_tokens": c["additional_special_tokens"]}
        tok = InternLM2Tokenizer(os.path.join(d, "tokenizer.model"), **kw)
        llama = LlamaTokenizer(os.path.join(d, "tokenizer.model"), legacy=True, add_bos_token=True, **kw)
        s = spm.SentencePieceProcessor(model_proto=model)
        lay = {"ids": [], "ids_nospecial": [], "sp_ids": [], "sp_decode": [], "vocab_size": len(tok)}
        for t in texts:
            ids = tok(t).input_ids
            assert ids == llama(t).input_ids, (name, t)
            lay["ids"].append(ids)
            lay["ids_nospecial"].append(tok(t, add_special_tokens=False).input_ids)
            si = s.encode(t)
            lay["sp_ids"].append(si)
            lay["sp_decode"].append(s.decode(si))
        expected["layouts"][name] = lay
        print(name, "pieces", s.get_piece_size(), "tokenizer size", len(tok), "e.g.", lay["ids"][10][:12])
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))

    # bench/data/internlm2_spm_8k/: an InternLM2-shaped tokenizer.model for bench/bench_tokenizer.c (the
    # "internlm2" rows; peer: sentencepiece itself): BPE, byte fallback, 8000 pieces, trained on the first
    # 400 kB of the benchmark corpus with internlm2/'s settings
    lines = open(os.path.join(ROOT, "bench", "data", "tokenizer_corpus.txt"), encoding="utf-8").read()[:400000]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines.splitlines()), model_writer=buf, model_type="bpe",
                                   vocab_size=8000, byte_fallback=True, split_digits=True,
                                   normalization_rule_name="identity", add_dummy_prefix=True,
                                   allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
                                   character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   num_threads=1, hard_vocab_limit=False, max_sentence_length=1 << 16,
                                   user_defined_symbols=CHAT)
    d = os.path.join(ROOT, "bench", "data", "internlm2_spm_8k")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(buf.getvalue())

    shutil.rmtree(SEEDS, ignore_errors=True)
    os.makedirs(SEEDS)
    for nm, data in (("internlm2.model", a), ("variant.model", b), ("unigram.model", u),
                     ("truncated.model", a[: len(a) // 3])):
        with open(os.path.join(SEEDS, nm), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
