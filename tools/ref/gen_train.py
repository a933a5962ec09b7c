"""gen_train.py — parity fixture for the trainer: 20 AdamW steps of transformers'
Qwen2ForCausalLM (the tiny model in tests/fixtures/qwen2/tiny) on a fixed batch, with
gradient accumulation (2 micro-batches of 1 row, loss = summed token loss / label tokens of
the global batch, as HF Trainer's num_items_in_batch), clip_grad_norm_(1.0),
get_cosine_schedule_with_warmup(3, 20) and torch.optim.AdamW with no weight decay on 1-D
parameters. Writes tests/fixtures/train/parity.safetensors: input_ids, labels, losses [20],
grad_norms [20], lrs [20] and every final weight under its HF name (prefixed "final.")."""
import os
import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM, get_cosine_schedule_with_warmup

root = os.path.join(os.path.dirname(__file__), "..", "..")
torch.manual_seed(0)
torch.set_num_threads(2)
model = Qwen2ForCausalLM.from_pretrained(os.path.join(root, "tests/fixtures/qwen2/tiny"),
                                         dtype=torch.float32, attn_implementation="eager")
model.train()
V = model.config.vocab_size
ids = torch.randint(0, V, (2, 24), dtype=torch.int32)
labels = ids.clone()
labels[0, :5] = -100           # a prompt that is not trained
labels[1, :9] = -100
n_items = int((labels[:, 1:] != -100).sum())

decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=20)
losses, norms, lrs = [], [], []
for step in range(20):
    opt.zero_grad()
    total = 0.0
    for r in range(2):         # micro-batches of one row
        logits = model(input_ids=ids[r:r + 1].long()).logits
        tgt = labels[r:r + 1, 1:].long()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), tgt.reshape(-1),
                                                 ignore_index=-100, reduction="sum") / n_items
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    lrs.append(sched.get_last_lr()[0])
    opt.step()
    sched.step()
    losses.append(total)
    norms.append(float(norm))
out = {"input_ids": ids, "labels": labels.to(torch.int32),
       "losses": torch.tensor(losses, dtype=torch.float64), "grad_norms": torch.tensor(norms, dtype=torch.float64),
       "lrs": torch.tensor(lrs, dtype=torch.float64)}
for n, p in model.named_parameters():
    out["final." + n] = p.detach().clone().contiguous()
save_file(out, os.path.join(root, "tests/fixtures/train/parity.safetensors"))
# the fixed batch alone, as the trainer's data.train reads it
save_file({"input_ids": ids, "labels": labels.to(torch.int32)}, os.path.join(root, "tests/fixtures/train/batch.safetensors"))
print("losses", [round(x, 5) for x in losses])

# ---------------------------------------------------------------------------------------------
# VL parity: the same recipe on the tiny Qwen2-VL and Qwen2.5-VL of tests/fixtures/qwen2_vl
# (q2_v5, q25_v5: vision tower + merger + decoder, all trained) with a fixed batch of two rows,
# one image each (grids (1,4,4) and (1,2,4): 4 and 2 <|image_pad|> tokens after the 2x2
# merge), labels -100 except the answer. Writes tests/fixtures/train/vl_batch.safetensors
# (input_ids, labels, pixel_values [24, 1176] stored as bf16 values, image_grid_thw [2, 3]) —
# the trainer's data.train — and vl_parity_{q2,q25}.safetensors (losses, grad_norms, lrs, and a
# subset of the final weights under "final.<HF name>").
from transformers import Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration

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
KEEP = ["model.visual.blocks.0.attn.qkv.weight", "model.visual.blocks.1.mlp", "model.visual.merger.",
        "model.language_model.layers.1.self_attn.q_proj.weight", "model.language_model.layers.0.mlp.down_proj.weight",
        "model.language_model.embed_tokens.weight", "model.language_model.norm.weight", "lm_head.weight"]
for arch, cls in [("q2", Qwen2VLForConditionalGeneration), ("q25", Qwen2_5_VLForConditionalGeneration)]:
    torch.manual_seed(0)
    m = cls.from_pretrained(os.path.join(root, f"tests/fixtures/qwen2_vl/{arch}_v5"), dtype=torch.float32,
                            attn_implementation="eager")
    m.train()
    params = dict(m.named_parameters())   # tied lm_head appears once (as embed_tokens)
    decay = [p for n, p in params.items() if p.ndim >= 2]
    no_decay = [p for n, p in params.items() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=20)
    losses, norms, lrs = [], [], []
    offs = [0, n_patch[0], sum(n_patch)]
    for step in range(20):
        opt.zero_grad()
        total = 0.0
        for r in range(2):
            logits = m(input_ids=vl_ids[r:r + 1].long(), pixel_values=pix[offs[r]:offs[r + 1]],
                       image_grid_thw=torch.tensor([GRIDS[r]]),
                       mm_token_type_ids=(vl_ids[r:r + 1] == IMG).int()).logits
            tgt = vl_labels[r:r + 1, 1:].long()
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VV).float(), tgt.reshape(-1),
                                                     ignore_index=-100, reduction="sum") / vl_items
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        losses.append(total)
        norms.append(float(norm))
    out = {"losses": torch.tensor(losses, dtype=torch.float64), "grad_norms": torch.tensor(norms, dtype=torch.float64),
           "lrs": torch.tensor(lrs, dtype=torch.float64)}
    sd = m.state_dict()
    for n, p in sd.items():
        if any(n.startswith(k) for k in KEEP) and not (arch == "q2" and n == "lm_head.weight"):
            out["final." + n] = p.detach().clone().contiguous()
    save_file(out, os.path.join(root, f"tests/fixtures/train/vl_parity_{arch}.safetensors"))
    print(arch, "losses", [round(x, 5) for x in losses], "norms", [round(x, 3) for x in norms[:3]], len(out) - 3, "tensors")
