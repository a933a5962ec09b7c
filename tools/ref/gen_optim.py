"""AdamW, gradient clipping and LR schedules from torch/transformers, for tests/test_optim.c.
Writes tests/fixtures/optim/adamw.safetensors: initial weights w0 [2 params], per-step
gradients, per-step learning rates (cosine with warmup), and the weights after each step."""
import os
import torch
from safetensors.torch import save_file
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

torch.manual_seed(0)
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "optim")
os.makedirs(OUT, exist_ok=True)
steps = 8
w = torch.randn(6, 5, requires_grad=True)      # matrix: weight decay
b = torch.randn(5, requires_grad=True)         # vector: no weight decay
grads_w = torch.randn(steps, 6, 5) * 3
grads_b = torch.randn(steps, 5) * 3
out = {"w0": w.detach().clone(), "b0": b.detach().clone(), "grads_w": grads_w, "grads_b": grads_b}
opt = torch.optim.AdamW([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                        lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=steps)
lrs, norms = [], []
ws, bs = [], []
for s in range(steps):
    opt.zero_grad()
    w.grad = grads_w[s].clone()
    b.grad = grads_b[s].clone()
    lrs.append(opt.param_groups[0]["lr"])
    norms.append(float(torch.nn.utils.clip_grad_norm_([w, b], max_norm=5.0)))
    opt.step()
    sched.step()
    ws.append(w.detach().clone())
    bs.append(b.detach().clone())
out["lrs"] = torch.tensor(lrs, dtype=torch.float64)
out["norms"] = torch.tensor(norms, dtype=torch.float64)
out["w_steps"] = torch.stack(ws)
out["b_steps"] = torch.stack(bs)
# linear schedule values for a second check
o2 = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
s2 = get_linear_schedule_with_warmup(o2, num_warmup_steps=2, num_training_steps=10)
lin = []
for s in range(12):
    lin.append(o2.param_groups[0]["lr"])
    o2.step()
    s2.step()
out["linear_lrs"] = torch.tensor(lin, dtype=torch.float64)
save_file(out, os.path.join(OUT, "adamw.safetensors"))
print("wrote", OUT)
