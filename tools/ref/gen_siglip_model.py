"""A tiny random SiglipModel (SigLIP's dual encoder: the text tower pooled at its last position with
its `head`, the vision tower's attention-pooling head, logit_scale and logit_bias) and what
transformers computes on it, for tests/test_siglip_model.c and tests/test_embed_cli.sh.

Writes tests/fixtures/siglip_model/:
  model/     SiglipModel.save_pretrained + SiglipProcessor.save_pretrained, untouched: text tower hidden
             32, 4 heads, 2 layers, max_position_embeddings 64, projection_size 32 (= hidden, as the
             released checkpoints), vision tower hidden 32, 4 heads, 2 layers, 24x24 images of 6x6
             patches with the pooling head, gelu_pytorch_tanh, layer_norm_eps 1e-6; logit_scale log(10),
             logit_bias -2. The tokenizer is a SiglipTokenizer over a 64-piece SentencePiece unigram
             model trained here (nmt_nfkc, pad = eos = </s> 1, unk 2, as SigLIP's spiece.model);
             transformers 5 saves it as spiece.model + tokenizer_config.json (no tokenizer.json).
  ref.safetensors  for IMAGES and TEXTS: input_ids of processor(text=TEXTS, padding="max_length")
             [5, 64] and its attention_mask (1 up to the </s>, 0 on the padding; SiglipModel's text tower
             masks the padded keys with it, bidirectionally) (what the model card tells users to call: the processor's default max_length is
             the tokenizer's model_max_length, 64), pixel_values (PIL backend), image_embeds [4, 32],
             text_embeds [5, 32] (L2 normalised, as SiglipModel.forward returns them), logits_per_image
             [4, 5] = img @ txt^T * exp(logit_scale) + logit_bias, probs = sigmoid(logits_per_image).
  tokenizer_cases.json  SiglipTokenizer's input_ids (padding="max_length", truncation) for texts
             with punctuation, accents (composed and decomposed), NFKC-affected characters, Unicode
             spaces, CJK, emoji, special tokens written out, "\u2581", upper case with special lower
             casings, a truncated one.
  retrieval.jsonl / expected.json  as gen_clip_model.py: recalls and ranks of the standard protocol
             on transformers' embeddings, plus the texts, images, logits and probabilities.
Run: /work/main/.venv-ref/bin/python tools/ref/gen_siglip_model.py
"""
import io
import json
import math
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import sentencepiece as spm
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipProcessor,
                          SiglipTextConfig, SiglipTokenizer, SiglipVisionConfig)

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "siglip_model")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
torch.manual_seed(7)
torch.set_num_threads(2)

IMAGES = ["e2e/shapes_160x120.png", "image/rgb_37x53.png", "image/wide_900x100.jpg", "image/palette_P.png"]
TEXTS = ["a red circle on the left", "two blue squares", "", "A photo of a CAT, sitting!",
         "a very long caption " + "with many repeated words " * 12]   # > 64 tokens: truncated

CORPUS = ["a red circle on the left", "two blue squares on the right", "a photo of a cat sitting",
          "a photo of a dog", "a very long caption with many repeated words", "a grey palette",
          "pixels in a grid", "the green triangle is small", "many cats and dogs"] * 20
buf = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=64,
                               model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                               pad_piece="<pad>", normalization_rule_name="nmt_nfkc", num_threads=1,
                               character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
tmp = os.path.join(OUT, "tmp")
os.makedirs(tmp)
with open(os.path.join(tmp, "spiece.model"), "wb") as f:
    f.write(buf.getvalue())
tok = SiglipTokenizer(os.path.join(tmp, "spiece.model"))

text = SiglipTextConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64, pad_token_id=1, eos_token_id=1)
vision = SiglipVisionConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                            image_size=24, patch_size=6)
cfg = SiglipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())
model = SiglipModel(cfg).eval()
for i, part in enumerate([model.text_model, model.vision_model]):
    rand_init(part, 11 + i)
with torch.no_grad():
    model.logit_scale.fill_(math.log(10.0))
    model.logit_bias.fill_(-2.0)
ip = SiglipImageProcessorPil(size={"height": 24, "width": 24})
proc = SiglipProcessor(image_processor=ip, tokenizer=tok)
mdir = os.path.join(OUT, "model")
model.save_pretrained(mdir)
proc.save_pretrained(mdir)
shutil.rmtree(tmp)

proc = SiglipProcessor.from_pretrained(mdir, backend="pil")
model = SiglipModel.from_pretrained(mdir).eval()
imgs = [Image.open(os.path.join(ROOT, p)) for p in IMAGES]
inp = proc(text=TEXTS, images=imgs, padding="max_length", truncation=True, return_tensors="pt")
assert inp["input_ids"].shape[1] == 64
with torch.no_grad():
    out = model(**inp)
ref = {"pixel_values": inp["pixel_values"].contiguous(), "input_ids": inp["input_ids"].to(torch.int32),
       "attention_mask": inp["attention_mask"].to(torch.int32),
       "image_embeds": out.image_embeds, "text_embeds": out.text_embeds,
       "logits_per_image": out.logits_per_image, "probs": torch.sigmoid(out.logits_per_image)}
save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))

rows = [{"image": os.path.join("..", IMAGES[0]), "captions": [TEXTS[0], TEXTS[1]]},
        {"image": os.path.join("..", IMAGES[1]), "captions": [TEXTS[2], TEXTS[3]]},
        {"image": os.path.join("..", IMAGES[2]), "caption": TEXTS[4]},
        {"image": os.path.join("..", IMAGES[3]), "captions": ["a grey palette", "pixels in a grid"]}]
with open(os.path.join(OUT, "retrieval.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
caps, owner = [], []
for i, r in enumerate(rows):
    for c in (r["captions"] if "captions" in r else [r["caption"]]):
        caps.append(c)
        owner.append(i)
with torch.no_grad():
    ie = model.get_image_features(**proc(images=imgs, return_tensors="pt")).pooler_output
    te = model.get_text_features(**proc(text=caps, padding="max_length", truncation=True,
                                        return_tensors="pt")).pooler_output
ie = ie / ie.norm(dim=-1, keepdim=True)
te = te / te.norm(dim=-1, keepdim=True)
sim = ie @ te.T
i2t_rank = []
for i in range(len(rows)):
    order = torch.argsort(sim[i], descending=True, stable=True)
    i2t_rank.append(min(int((order == j).nonzero()) for j in range(len(caps)) if owner[j] == i))
t2i_rank = []
for j in range(len(caps)):
    order = torch.argsort(sim[:, j], descending=True, stable=True)
    t2i_rank.append(int((order == owner[j]).nonzero()))
exp = {"i2t_rank": i2t_rank, "t2i_rank": t2i_rank, "images": len(rows), "captions": len(caps)}
for k in (1, 5, 10):
    exp[f"i2t_recall@{k}"] = sum(r < k for r in i2t_rank) / len(rows)
    exp[f"t2i_recall@{k}"] = sum(r < k for r in t2i_rank) / len(caps)
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump({"images": IMAGES, "texts": TEXTS, "retrieval": exp,
               "input_ids": inp["input_ids"].tolist(), "attention_mask": inp["attention_mask"].tolist(),
               "logits_per_image": out.logits_per_image.tolist(),
               "probs": torch.sigmoid(out.logits_per_image).tolist(),
               "logit_scale_exp": float(model.logit_scale.detach().exp()), "logit_bias": float(model.logit_bias.detach())},
              f, indent=1)

# the tokenizer on harder texts: SiglipTokenizer's ids (padding="max_length", 64) for each
CASES = ["", " ", "!!!", "   leading and trailing   ", "Two  dogs\tplaying\n\nin   the SNOW, 4k, 8K HDR!!!",
         "caf\u00e9 cafe\u0301 na\u00efve", "\uff21\uff42\uff43 full-width", "\u2460 circled \u00bd fraction \ufb01ne",
         "non\u00a0breaking\u3000ideographic\u2003em space", "\u4e00\u4e8c\u4e09 cjk", "emoji \U0001F468\u200d\U0001F469 x",
         "</s> written out <unk>", "\u2581already\u2581metaspace", "UPPER lower MiXeD \u0130stanbul \u00df",
         "tabs\tand\nnewlines\r\n", "under_score and-dash (parens) [brackets] {braces}", "qqqq zzzz xxxx",
         "a photo of a cat sitting on the left of the grid " * 4, "\u00c5ngstr\u00f6m \u212b \u2126 ohm",
         "digits 0123456789 and \u0661\u0662\u0663", "\u1100\u1161\u11a8 jamo \uac00",
         "a</s>b", "ab</s>cd ef", "  </s> lead", "x<pad>y <unk><unk>z", "\u039f\u0394\u039f\u03a3 \u03a3\u0391 \u03a3"]
tcases = {"texts": CASES, "input_ids": tok(CASES, padding="max_length", truncation=True)["input_ids"]}
with open(os.path.join(OUT, "tokenizer_cases.json"), "w") as f:
    json.dump(tcases, f, indent=0)
print("wrote", OUT, exp)
