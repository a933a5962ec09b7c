"""gen_train.py — parity fixtures for the trainer: 20 AdamW steps of transformers'
Qwen2ForCausalLM (the tiny model in tests/fixtures/qwen2/tiny) on a fixed batch, with
gradient accumulation (2 micro-batches of 1 row, loss = summed token loss / label tokens of
the global batch, as HF Trainer's num_items_in_batch), clip_grad_norm_(1.0),
get_cosine_schedule_with_warmup(3, 20) and torch.optim.AdamW with no weight decay on 1-D
parameters. Then the same recipe on the tiny Qwen2-VL and Qwen2.5-VL (below).

The reference runs in float64 (model, pixels, optimizer state), with transformers' internal
float32 upcasts (RMSNorm, softmax, the vision rotary) kept in float64 too: mmc trains in
float32, and after 20 Adam steps two float32 runs that differ only in summation order drift
~5e-6 apart (normwise, per tensor; torch's float32 run against this float64 one is printed),
so only an exact reference lets test_train_parity.c hold mmc to 1e-5. The rotary tables stay
as transformers defines them (inv_freq and angles in float32, as mmc computes them too).
Final weights are stored as float32: rounding the float64 result costs 6e-8 relative.

Writes tests/fixtures/train/parity.safetensors: input_ids, labels, losses [20], grad_norms
[20], lrs [20] (float64) and every final weight under its HF name (prefixed "final."); and
batch.safetensors, the fixed batch alone as the trainer's data.train reads it."""
from ref_common import float64_throughout
import os
import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM, get_cosine_schedule_with_warmup
from transformers import Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

root = os.path.join(os.path.dirname(__file__), "..", "..")
torch.set_num_threads(2)
STEPS = 20


def train(model, micro_batches, lr, n_items, V):
    """STEPS optimizer steps on the fixed micro-batches (kwargs for model()); losses, norms, lrs."""
    model.train()
    params = dict(model.named_parameters())   # a tied lm_head appears once (as embed_tokens)
    decay = [p for p in params.values() if p.ndim >= 2]
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=STEPS)
    losses, norms, lrs = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for kw, labels in micro_batches:
            logits = model(**kw).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1).long(),
                                                     ignore_index=-100, reduction="sum") / n_items
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        losses.append(total)
        norms.append(float(norm))
    return losses, norms, lrs


def run(load, micro_batches, lr, n_items, V):
    """The float64 reference, and (for the record) how far torch's own float32 run lands from it."""
    with float64_throughout():
        m64 = load(torch.float64)
        ref = train(m64, [({k: v.double() if v.is_floating_point() else v for k, v in kw.items()}, lab)
                          for kw, lab in micro_batches], lr, n_items, V)
    m32 = load(torch.float32)
    f32 = train(m32, micro_batches, lr, n_items, V)
    w32 = dict(m32.named_parameters())
    worst = max(float((w32[n].detach().double() - p.detach()).norm() / p.detach().norm()) for n, p in m64.named_parameters())
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(f32[0], ref[0]))
    print(f"  torch float32 vs this float64 reference: loss {worst_loss:.2e} rel, "
          f"final weights {worst:.2e} normwise (worst tensor)")
    return m64, ref


def record(ref):
    losses, norms, lrs = ref
    return {"losses": torch.tensor(losses, dtype=torch.float64), "grad_norms": torch.tensor(norms, dtype=torch.float64),
            "lrs": torch.tensor(lrs, dtype=torch.float64)}


# ---- text: the tiny Qwen2
torch.manual_seed(0)
TINY = os.path.join(root, "tests/fixtures/qwen2/tiny")
V = Qwen2ForCausalLM.from_pretrained(TINY).config.vocab_size
ids = torch.randint(0, V, (2, 24), dtype=torch.int32)
labels = ids.clone()
labels[0, :5] = -100           # a prompt that is not trained
labels[1, :9] = -100
n_items = int((labels[:, 1:] != -100).sum())
print("qwen2 tiny:")
model, ref = run(lambda dt: Qwen2ForCausalLM.from_pretrained(TINY, dtype=dt, attn_implementation="eager"),
                 [({"input_ids": ids[r:r + 1].long()}, labels[r:r + 1]) for r in range(2)], 3e-3, n_items, V)
out = {"input_ids": ids, "labels": labels.to(torch.int32), **record(ref)}
for n, p in model.named_parameters():
    out["final." + n] = p.detach().float().contiguous()
save_file(out, os.path.join(root, "tests/fixtures/train/parity.safetensors"))
save_file({"input_ids": ids, "labels": labels.to(torch.int32)}, os.path.join(root, "tests/fixtures/train/batch.safetensors"))
print("  losses", [round(x, 5) for x in ref[0]])

# ---------------------------------------------------------------------------------------------
# VL parity: the same recipe on the tiny Qwen2-VL and Qwen2.5-VL of tests/fixtures/qwen2_vl
# (q2_v5, q25_v5: vision tower + merger + decoder, all trained) with a fixed batch of two rows,
# one image each (grids (1,4,4) and (1,2,4): 4 and 2 <|image_pad|> tokens after the 2x2
# merge), labels -100 except the answer. Writes tests/fixtures/train/vl_batch.safetensors
# (input_ids, labels, pixel_values [24, 1176] stored as bf16 values, image_grid_thw [2, 3]) —
# the trainer's data.train — and vl_parity_{q2,q25}.safetensors (losses, grad_norms, lrs, and a
# subset of the final weights under "final.<HF name>").
IMG, VS, VE, VV = 300, 298, 299, 320
GRIDS = [(1, 4, 4), (1, 2, 4)]
T_VL = 28
g = torch.Generator().manual_seed(5)
rows, labs = [], []
for r, (gt, gh, gw) in enumerate(GRIDS):
    n_img = gt * gh * gw // 4
    pre = torch.randint(0, 290, (3 + r,), generator=g).tolist()
    answer = torch.randint(0, 290, (6,), generator=g).tolist()
    mid = torch.randint(0, 290, (T_VL - len(pre) - n_img - 2 - len(answer),), generator=g).tolist()
    ids_r = pre + [VS] + [IMG] * n_img + [VE] + mid + answer
    lab_r = [-100] * (T_VL - len(answer)) + answer
    rows.append(ids_r)
    labs.append(lab_r)
vl_ids = torch.tensor(rows, dtype=torch.int32)
vl_labels = torch.tensor(labs, dtype=torch.int32)
n_patch = [gt * gh * gw for gt, gh, gw in GRIDS]
pix = torch.randn(sum(n_patch), 3 * 2 * 14 * 14, generator=g).bfloat16()
save_file({"input_ids": vl_ids, "labels": vl_labels, "pixel_values": pix,
           "image_grid_thw": torch.tensor(GRIDS, dtype=torch.int64)},
          os.path.join(root, "tests/fixtures/train/vl_batch.safetensors"))
pix = pix.float()
vl_items = int((vl_labels[:, 1:] != -100).sum())
offs = [0, n_patch[0], sum(n_patch)]
vl_batches = [({"input_ids": vl_ids[r:r + 1].long(), "pixel_values": pix[offs[r]:offs[r + 1]],
                "image_grid_thw": torch.tensor([GRIDS[r]]), "mm_token_type_ids": (vl_ids[r:r + 1] == IMG).int()},
               vl_labels[r:r + 1]) for r in range(2)]
KEEP = ["model.visual.blocks.0.attn.qkv.weight", "model.visual.blocks.1.mlp", "model.visual.merger.",
        "model.language_model.layers.1.self_attn.q_proj.weight", "model.language_model.layers.0.mlp.down_proj.weight",
        "model.language_model.embed_tokens.weight", "model.language_model.norm.weight", "lm_head.weight"]
for arch, cls in [("q2", Qwen2VLForConditionalGeneration), ("q25", Qwen2_5_VLForConditionalGeneration)]:
    print(f"{arch}_v5:")
    path = os.path.join(root, f"tests/fixtures/qwen2_vl/{arch}_v5")
    m, ref = run(lambda dt: cls.from_pretrained(path, dtype=dt, attn_implementation="eager"),
                 vl_batches, 2e-3, vl_items, VV)
    out = record(ref)
    for n, p in m.state_dict().items():
        if any(n.startswith(k) for k in KEEP) and not (arch == "q2" and n == "lm_head.weight"):
            out["final." + n] = p.detach().float().contiguous()
    save_file(out, os.path.join(root, f"tests/fixtures/train/vl_parity_{arch}.safetensors"))
    print("  losses", [round(x, 5) for x in ref[0]], "norms", [round(x, 3) for x in ref[1][:3]], len(out) - 3, "tensors")
