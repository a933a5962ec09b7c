"""Tiny random Qwen2-VL and Qwen2.5-VL checkpoints and reference outputs from transformers.

Writes tests/fixtures/qwen2_vl/:
  q2_v5/, q25_v5/     save_pretrained() of random Qwen2VLForConditionalGeneration /
                      Qwen2_5_VLForConditionalGeneration (transformers 5.x layout: model.visual.*,
                      model.language_model.*, lm_head; nested text_config, rope_parameters)
  q2_hub/, q25_hub/   the same weights converted to the Hub (transformers 4.4x) layout: visual.*,
                      model.*, lm_head; flat text config with rope_scaling {type: mrope},
                      rope_theta, torch_dtype, vision_config.in_chans. 2-D matrices are stored as
                      BF16 there (lossless: every weight is rounded to a bf16 value first), which
                      also exercises the bf16-weight path and keeps the fixtures small.
  ref.safetensors     inputs (ids, pixel values, grids), position ids and rope deltas from
                      get_rope_index, vision tower outputs, logits, greedy continuations.
Both layouts are re-loaded with from_pretrained and checked to give the same logits.
"""
import json
import os
import shutil

import torch
from hub_layout import model_to_hub
from safetensors.torch import load_file, save_file
from transformers import (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2_5_VLConfig,
                          Qwen2_5_VLForConditionalGeneration)

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "qwen2_vl")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(2)

V = 320
IMG, VID, VS, VE = 300, 301, 298, 299   # image/video pad, vision start/end (inside the vocab)
PATCH, TP, MERGE, CIN = 14, 2, 2, 3
TEXT = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=1024, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
TOK = dict(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS, vision_end_token_id=VE)


def randomize(m):
    """HF initialises biases to 0 and norms to 1: make everything non-trivial, and round every
    value to bf16 so the BF16 Hub copy is lossless."""
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.05)
            elif "norm" in n or "ln_q" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.1)
            p.copy_(p.bfloat16().float())
    return m


def make(arch):
    if arch == "q2":
        cfg = Qwen2VLConfig(vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                                               patch_size=PATCH, temporal_patch_size=TP, spatial_merge_size=MERGE,
                                               in_channels=CIN),
                            text_config=dict(TEXT), tie_word_embeddings=True, **TOK)
        m = Qwen2VLForConditionalGeneration(cfg)
    else:
        cfg = Qwen2_5_VLConfig(vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48,
                                                  out_hidden_size=64, patch_size=PATCH, temporal_patch_size=TP,
                                                  spatial_merge_size=MERGE, in_channels=CIN, window_size=56,
                                                  fullatt_block_indexes=[1], tokens_per_second=2),
                               text_config=dict(TEXT), tie_word_embeddings=False, **TOK)
        m = Qwen2_5_VLForConditionalGeneration(cfg)
    m.config._attn_implementation = "eager"
    m = randomize(m.float().eval())
    with torch.no_grad():  # shrink the vision tokens' output rows (x 2^-7, exact in bf16) so that
        for w in {id(m.lm_head.weight): m.lm_head.weight}.values():  # greedy text never picks them
            w[VS:VID + 1] *= 2.0 ** -7
    return m


def to_hub(src, dst, arch):
    """Convert a 5.x save_pretrained directory to the Hub's 4.4x layout."""
    c = model_to_hub(src, dst, arch)
    c["architectures"] = ["Qwen2VLForConditionalGeneration" if arch == "q2" else "Qwen2_5_VLForConditionalGeneration"]
    json.dump(c, open(os.path.join(dst, "config.json"), "w"), indent=2)


# ---------------------------------------------------------------- inputs (shared by both archs)
def text(n):
    return torch.randint(0, 290, (n,)).tolist()


def vis(tok, grid):
    t, h, w = grid
    return [VS] + [tok] * (t * h * w // (MERGE * MERGE)) + [VE]


def pixels(grid):
    t, h, w = grid
    return torch.randn(t * h * w, CIN * TP * PATCH * PATCH).bfloat16().float()


G1, G2, GV = [1, 4, 6], [1, 6, 4], [2, 4, 4]
P1, P2, PV = pixels(G1), pixels(G2), pixels(GV)
cases = {
    "text": dict(ids=text(12)),
    "image": dict(ids=text(5) + vis(IMG, G1) + text(6), images=[G1]),
    "two_images": dict(ids=text(3) + vis(IMG, G1) + text(4) + vis(IMG, G2) + text(5), images=[G1, G2]),
    "video": dict(ids=text(4) + vis(VID, GV) + text(5), videos=[GV]),
    "mixed": dict(ids=text(3) + vis(IMG, G2) + text(3) + vis(VID, GV) + text(4), images=[G2], videos=[GV]),
}
PIX = {tuple(G1): P1, tuple(G2): P2}


def model_inputs(case, arch):
    ids = torch.tensor([case["ids"]])
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
              mm_token_type_ids=(ids == IMG).int() + 2 * (ids == VID).int())
    if case.get("images"):
        kw["pixel_values"] = torch.cat([PIX[tuple(g)] for g in case["images"]])
        kw["image_grid_thw"] = torch.tensor(case["images"])
    if case.get("videos"):
        kw["pixel_values_videos"] = PV
        kw["video_grid_thw"] = torch.tensor(case["videos"])
        if arch == "q25":
            kw["second_per_grid_ts"] = torch.tensor([1.3])   # x tokens_per_second 2 = 2.6 -> t index 2
    return kw


ref = {"pixels.g146": P1.bfloat16(), "pixels.g164": P2.bfloat16(), "pixels.video": PV.bfloat16()}  # exact: values are bf16
for arch in ["q2", "q25"]:
    m = make(arch)
    d5, dh = os.path.join(OUT, arch + "_v5"), os.path.join(OUT, arch + "_hub")
    shutil.rmtree(d5, ignore_errors=True)
    shutil.rmtree(dh, ignore_errors=True)
    m.save_pretrained(d5)
    # transformers 5.23 saves under the Hub names again; write the in-memory (>= 4.52) names
    # explicitly, as other 5.x tools and fine-tuning frameworks do (tied lm_head left out).
    sd = {k: v.contiguous() for k, v in m.state_dict().items()
          if not (k == "lm_head.weight" and m.config.tie_word_embeddings)}
    assert any(k.startswith("model.language_model.") for k in sd) and any(k.startswith("model.visual.") for k in sd)
    save_file(sd, os.path.join(d5, "model.safetensors"), metadata={"format": "pt"})
    to_hub(d5, dh, arch)
    cls = type(m)
    reloaded = [cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval() for d in (d5, dh)]
    with torch.no_grad():
        # vision tower alone
        for name, grids, px in [("g146", [G1], P1), ("two", [G1, G2], torch.cat([P1, P2])), ("video", [GV], PV)]:
            o = m.model.visual(px, grid_thw=torch.tensor(grids))
            ref[f"{arch}.vision.{name}"] = o.pooler_output
            if name == "two":
                ref[f"{arch}.vision_hidden.{name}"] = o.last_hidden_state
        for cname, case in cases.items():
            kw = model_inputs(case, arch)
            ref[f"{cname}.ids"] = kw["input_ids"]
            if "image_grid_thw" in kw:
                ref[f"{cname}.image_grid_thw"] = kw["image_grid_thw"]
            if "video_grid_thw" in kw:
                ref[f"{cname}.video_grid_thw"] = kw["video_grid_thw"]
            if case.get("images") or case.get("videos"):
                rkw = {k: kw[k] for k in ["image_grid_thw", "video_grid_thw", "second_per_grid_ts"] if k in kw}
                pos, delta = m.model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], **rkw)
                ref[f"{arch}.{cname}.position_ids"] = pos
                ref[f"{arch}.{cname}.rope_deltas"] = delta
            outs = []
            for mm in [m] + reloaded:
                mm.model.rope_deltas = None
                outs.append(mm(**kw).logits)
            for o in outs[1:]:
                assert torch.allclose(o, outs[0], atol=1e-5, rtol=0), (arch, cname, (o - outs[0]).abs().max())
            ref[f"{arch}.{cname}.logits"] = outs[0]
        # greedy generation, 32 tokens, through the KV cache
        for cname in ["image", "mixed"]:
            kw = model_inputs(cases[cname], arch)
            m.model.rope_deltas = None
            g = m.generate(**kw, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                           output_scores=True, return_dict_in_generate=True)
            new = g.sequences[:, kw["input_ids"].shape[1]:]
            assert new.shape[1] == 32
            assert int(new.max()) < VS, "greedy output hit a vision token: pick another seed"
            margin = min(float(s.topk(2).values[0, 0] - s.topk(2).values[0, 1]) for s in g.scores)
            assert margin > 1e-3, f"near-tie in greedy decoding (margin {margin})"
            print(arch, cname, "greedy margin", margin, new.tolist())
            ref[f"{arch}.{cname}.greedy"] = new
save_file({k: v.detach().contiguous().clone() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
tot = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
print("wrote", OUT, f"{tot / 1e6:.2f} MB")
