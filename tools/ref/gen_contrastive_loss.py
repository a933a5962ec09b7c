"""The contrastive losses of transformers' dual encoders and their gradients, for
tests/test_contrastive_loss.c: CLIPModel.forward(return_loss=True) (clip_loss: the mean of the
cross-entropies over logits_per_text and logits_per_image with the diagonal as labels, no clamp of
logit_scale) on tests/fixtures/clip_model, SiglipModel.forward(return_loss=True) (-logsigmoid of
(2 eye - 1) * logits_per_text, summed over each text's row, mean over texts) on
tests/fixtures/siglip_model, each on the fixture's 4 images and first 4 texts (PIL pixels).

Writes tests/fixtures/contrastive_loss/ref.safetensors: per family (clip_, siglip_) the pooled
projections before normalisation (img [4, D] = visual_projection / vision head output, txt [4, D] =
text_projection / text head output, captured with forward hooks), loss [1], and autograd's gradients
of the loss w.r.t. img, txt, logit_scale (the parameter, log of the scale) and logit_bias (SigLIP).
Run: /work/main/.venv-ref/bin/python tools/ref/gen_contrastive_loss.py
"""
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import CLIPModel, CLIPProcessor, SiglipModel, SiglipProcessor

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "contrastive_loss")
os.makedirs(OUT, exist_ok=True)
torch.set_num_threads(2)
IMAGES = ["e2e/shapes_160x120.png", "image/rgb_37x53.png", "image/wide_900x100.jpg", "image/palette_P.png"]
TEXTS = ["a red circle on the left", "two blue squares", "", "A photo of a CAT, sitting!"]
imgs = [Image.open(os.path.join(ROOT, p)) for p in IMAGES]
ref = {}
for fam, cls, pcls, img_mod, txt_mod, kw in [
        ("clip", CLIPModel, CLIPProcessor, "visual_projection", "text_projection", {"padding": True}),
        ("siglip", SiglipModel, SiglipProcessor, "vision_model.head", "text_model.head", {"padding": "max_length"})]:
    d = os.path.join(ROOT, fam + "_model", "model")
    model = cls.from_pretrained(d).train(False)
    proc = pcls.from_pretrained(d, backend="pil")
    inp = proc(text=TEXTS, images=imgs, truncation=True, return_tensors="pt", **kw)
    cap = {}

    def hook(name):
        def f(mod, args, out):
            o = out if torch.is_tensor(out) else out[0]
            o.retain_grad()
            cap[name] = o
        return f

    model.get_submodule(img_mod).register_forward_hook(hook("img"))
    model.get_submodule(txt_mod).register_forward_hook(hook("txt"))
    out = model(**inp, return_loss=True)
    out.loss.backward()
    gi, gt = cap["img"].grad, cap["txt"].grad
    img, txt = cap["img"].detach(), cap["txt"].detach()
    assert img.shape == txt.shape and img.dim() == 2
    ref[fam + "_img"] = img.contiguous()
    ref[fam + "_txt"] = txt.contiguous()
    ref[fam + "_loss"] = out.loss.detach().reshape(1)
    ref[fam + "_d_img"] = gi.contiguous()
    ref[fam + "_d_txt"] = gt.contiguous()
    ref[fam + "_logit_scale"] = model.logit_scale.detach().reshape(1)
    ref[fam + "_d_logit_scale"] = model.logit_scale.grad.reshape(1)
    if fam == "siglip":
        ref[fam + "_logit_bias"] = model.logit_bias.detach().reshape(1)
        ref[fam + "_d_logit_bias"] = model.logit_bias.grad.reshape(1)
    print(fam, float(out.loss), img.shape, txt.shape)
save_file(ref, os.path.join(OUT, "ref.safetensors"))
print("wrote", OUT)
