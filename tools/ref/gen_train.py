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
