"""A tiny random CLIPModel (the dual encoder: CLIP text and vision towers with their projections and
the learned temperature) and what transformers computes on it, for tests/test_clip_model.c and
tests/test_embed_cli.sh.

Writes tests/fixtures/clip_model/:
  model/     CLIPModel.save_pretrained + CLIPProcessor.save_pretrained, untouched: text tower hidden 40,
             5 heads, 2 layers, quick_gelu (OpenAI's CLIP), vision tower hidden 30, 3 heads, 3 layers,
             30x30 crops of 6x6 patches, projection_dim 24, logit_scale set to log(20) (CLIP's learnt
             value is log(100); an untrained one log(1/0.07)). The tokenizer is the 600-token CLIP BPE
             of tests/fixtures/text_encoders/clip_tokenizer (re-saved by CLIPProcessor).
  ref.safetensors  for the IMAGES and TEXTS below: image_embeds [4, 24], text_embeds [5, 24] (both L2
             normalised, as CLIPModel.forward returns them), logits_per_image [4, 5] = exp(logit_scale)
             image_embeds @ text_embeds^T, input_ids / attention_mask of processor(text=TEXTS,
             padding=True), pixel_values (PIL backend, mmc's default) and the same three outputs for
             the torchvision backend's pixels (suffix _tv).
  retrieval.jsonl  the IMAGES with two captions each ({"image", "captions"}) and one with a single
             "caption"; expected.json: recall@1/5/10 image->text and text->image that the standard
             protocol (clip_benchmark's: an image is a hit at K when any of its captions ranks in its
             top K; a caption when its image does) gives on transformers' embeddings (PIL pixels), and
             the ranks themselves; also the images, texts and logits_per_image (PIL pixels) for the shell test.
Run: .venv-ref/bin/python tools/ref/gen_clip_model.py
"""
import json
import math
import os
import shutil

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTextConfig,
                          CLIPTokenizer, CLIPVisionConfig)

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "clip_model")
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
torch.manual_seed(7)
torch.set_num_threads(2)

IMAGES = ["e2e/shapes_160x120.png", "image/rgb_37x53.png", "image/wide_900x100.jpg", "image/palette_P.png"]
TEXTS = ["a red circle on the left", "two blue squares", "", "A photo of a CAT, sitting!",
         "a very long caption " + "with many repeated words " * 12]   # > 77 tokens: truncated

tok = CLIPTokenizer.from_pretrained(os.path.join(ROOT, "text_encoders", "clip_tokenizer"), model_max_length=77)
text = CLIPTextConfig(vocab_size=len(tok), hidden_size=40, intermediate_size=52, num_hidden_layers=2,
                      num_attention_heads=5, max_position_embeddings=77, hidden_act="quick_gelu",
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
vision = CLIPVisionConfig(hidden_size=30, intermediate_size=44, num_hidden_layers=3, num_attention_heads=3,
                          image_size=30, patch_size=6, hidden_act="quick_gelu")
cfg = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=24,
                 logit_scale_init_value=math.log(20.0))
model = CLIPModel(cfg).eval()
for i, part in enumerate([model.text_model, model.vision_model, model.visual_projection, model.text_projection]):
    rand_init(part, 11 + i)
with torch.no_grad():
    model.logit_scale.fill_(math.log(20.0))
ip = CLIPImageProcessor(size={"shortest_edge": 34}, crop_size={"height": 30, "width": 30})
proc = CLIPProcessor(image_processor=ip, tokenizer=tok)
mdir = os.path.join(OUT, "model")
model.save_pretrained(mdir)
proc.save_pretrained(mdir)

# what a user gets back from the folder: the default (torchvision) processor and the PIL one
proc_tv = CLIPProcessor.from_pretrained(mdir)
proc_pil = CLIPProcessor.from_pretrained(mdir, backend="pil")
model = CLIPModel.from_pretrained(mdir).eval()
imgs = [Image.open(os.path.join(ROOT, p)) for p in IMAGES]


def run(pr):
    inp = pr(text=TEXTS, images=imgs, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**inp)
    return inp, out


inp, out = run(proc_pil)
inp_tv, out_tv = run(proc_tv)
ref = {"pixel_values": inp["pixel_values"].contiguous(), "input_ids": inp["input_ids"].to(torch.int32),
       "attention_mask": inp["attention_mask"].to(torch.int32), "image_embeds": out.image_embeds,
       "text_embeds": out.text_embeds, "logits_per_image": out.logits_per_image,
       "image_embeds_tv": out_tv.image_embeds, "logits_per_image_tv": out_tv.logits_per_image}
assert torch.equal(out.text_embeds, out_tv.text_embeds)
save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))

# retrieval: every image with its captions; the ranks and recalls on transformers' embeddings
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
    ie = model.get_image_features(**proc_pil(images=imgs, return_tensors="pt"))
    ie = (ie.pooler_output if hasattr(ie, "pooler_output") else ie)
    te = model.get_text_features(**proc_pil(text=caps, padding=True, truncation=True, return_tensors="pt"))
    te = (te.pooler_output if hasattr(te, "pooler_output") else te)
ie = ie / ie.norm(dim=-1, keepdim=True)
te = te / te.norm(dim=-1, keepdim=True)
sim = ie @ te.T                                               # [images, captions]
owner_t = torch.tensor(owner)
# image -> text: the best rank among the image's own captions; text -> image: its image's rank
i2t_rank = []
for i in range(len(rows)):
    order = torch.argsort(sim[i], descending=True, stable=True)
    pos = [int((order == j).nonzero()) for j in range(len(caps)) if owner[j] == i]
    i2t_rank.append(min(pos))
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
               "logits_per_image": out.logits_per_image.tolist(),
               "logit_scale_exp": float(model.logit_scale.exp())}, f, indent=1)
print("wrote", OUT, exp)
