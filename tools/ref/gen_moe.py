"""gen_moe.py — fixtures for Qwen2-MoE (src/models/text/qwen2_moe.c) from transformers 5.23's
Qwen2MoeForCausalLM, saved with save_pretrained untouched (experts as mlp.experts.N.*_proj).

Writes tests/fixtures/moe/:
  tiny/       3 layers: 0 and 2 sparse (4 experts, top-2, norm_topk_prob false, shared expert),
              1 dense (mlp_only_layers [1]); GQA 4/2 heads; output_router_logits true,
              router_aux_loss_coef 0.05; the tokenizer of tests/fixtures/llama_tokenizer/llama_tok_v5.
  tiny_norm/  2 layers, decoder_sparse_step 2 (layer 1 sparse), norm_topk_prob true, 8 experts top-3,
              tied embeddings; weights bf16-exact.
  tiny_norm_hub/  the same in the 4.4x Hub form (Qwen1.5-MoE's): flat rope_theta, torch_dtype bfloat16,
              bf16 matrices; transformers gives it tiny_norm's logits exactly.
  ref.safetensors  ids [2, 14]; per directory its logits, aux_loss (load_balancing_loss_func of that
              forward) and the greedy continuation of ids[0, :6] (10 tokens); "prompt_ids" /
              "prompt_greedy": the raw prompt PROMPT tokenized and its 8 greedy tokens (mmc generate).
  train.safetensors  full fine-tuning of tiny/, 10 steps of the trainer's loop in float64 (as
              tools/ref/gen_llama_train.py): 2 micro-batches of 1 row, per micro-batch
              loss = summed token loss / label tokens of the global batch
                     + router_aux_loss_coef * aux_loss / 2   (the mean over the micro-batches),
              clip_grad_norm_(1.0), cosine with 2 warmup steps, AdamW (decay 0.1 on >= 2-D).
              losses, grad_norms, lrs [10] float64, "final.<name>" for every weight, input_ids / labels.
  lora_init/, lora_ref/, lora_losses.txt  the same loop through PEFT (float32): r 4, alpha 8 on
              q_proj, v_proj, shared_expert.up_proj, shared_expert.down_proj (transformers 5 keeps the
              routed experts as 3-D parameters, which PEFT's target_modules cannot name), lora_B random.
Run: /work/main/.venv-ref/bin/python tools/ref/gen_moe.py
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen2MoeConfig, Qwen2MoeForCausalLM, get_cosine_schedule_with_warmup
from ref_common import float64_throughout, lora_with_random_b, save_adapter_rel

root = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(root, "tests/fixtures/moe")
os.makedirs(OUT, exist_ok=True)
torch.set_num_threads(2)
STEPS = 10
LR = 3e-3
PROMPT = "The quick brown fox"

tok = AutoTokenizer.from_pretrained(os.path.join(root, "tests/fixtures/llama_tokenizer/llama_tok_v5"))
V = len(tok)


def make(name, seed, bf16_exact=False, **kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64, rms_norm_eps=1e-5, moe_intermediate_size=16,
                shared_expert_intermediate_size=24, output_router_logits=True, router_aux_loss_coef=0.05,
                bos_token_id=1, eos_token_id=2, attention_dropout=0.0,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    base.update(kw)
    cfg = Qwen2MoeConfig(**base)
    torch.manual_seed(seed)
    m = Qwen2MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if n.endswith("mlp.gate.weight"):   # decisive routing: no near-ties between float32 and float64
                p.normal_(0.0, 0.5)
            if "shared_expert_gate" in n:
                p.normal_(0.0, 0.3)
            if bf16_exact:   # so that the bf16 copy (tiny_norm_hub) is the same model
                p.copy_(p.to(torch.bfloat16).float())
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


tiny = make("tiny", 0, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1],
            norm_topk_prob=False, tie_word_embeddings=False)
tiny_norm = make("tiny_norm", 1, bf16_exact=True, num_hidden_layers=2, num_experts=8, num_experts_per_tok=3, decoder_sparse_step=2,
                 norm_topk_prob=True, tie_word_embeddings=True)

# the 4.4x Hub form of tiny_norm (as Qwen1.5-MoE-A2.7B's folder): flat rope_theta, torch_dtype, bf16 matrices
hub = os.path.join(OUT, "tiny_norm_hub")
shutil.rmtree(hub, ignore_errors=True)
os.makedirs(hub)
save_file({k: (v.to(torch.bfloat16) if v.dim() >= 2 else v) for k, v in load_file(os.path.join(tiny_norm, "model.safetensors")).items()},
          os.path.join(hub, "model.safetensors"), metadata={"format": "pt"})
c = json.load(open(os.path.join(tiny_norm, "config.json")))
c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
for k in ("dtype", "layer_types", "qkv_bias"):
    c.pop(k, None)
c["torch_dtype"] = "bfloat16"
c["transformers_version"] = "4.40.0"
json.dump(c, open(os.path.join(hub, "config.json"), "w"), indent=2)

torch.manual_seed(5)
ids = torch.randint(3, V, (2, 14))
ref = {"ids": ids}
for name, d in (("tiny", tiny), ("tiny_norm", tiny_norm)):
    m = Qwen2MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        o = m(input_ids=ids, output_router_logits=True)
        ref[name + ".logits"] = o.logits.float()
        ref[name + ".aux_loss"] = o.aux_loss.reshape(1).double()
        gaps = []
        for rl in o.router_logits:   # the top-k margin of each row
            p = torch.softmax(rl.float(), -1).sort(-1, descending=True).values
            k = m.config.num_experts_per_tok
            gaps.append((p[:, k - 1] - p[:, k]).min().item())
        print(name, "smallest top-k margin", min(gaps))
        g = m.generate(ids[:1, :6], max_new_tokens=10, min_new_tokens=10, do_sample=False, eos_token_id=None,
                       pad_token_id=0)
        ref[name + ".greedy"] = g[:, 6:].to(torch.int64)
m = Qwen2MoeForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
pids = tok(PROMPT, return_tensors="pt").input_ids
with torch.no_grad():
    g = m.generate(pids, max_new_tokens=8, min_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
ref["prompt_ids"] = pids.to(torch.int64)
ref["prompt_greedy"] = g[:, pids.shape[1]:].to(torch.int64)
with torch.no_grad():
    d = (Qwen2MoeForCausalLM.from_pretrained(hub, dtype=torch.float32).eval()(input_ids=ids).logits
         - ref["tiny_norm.logits"]).abs().max().item()
print("tiny_norm_hub vs tiny_norm:", d)
assert d == 0.0
save_file({k: v.contiguous().clone() for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))


# ---------------------------------------------------------------- training
T = 24
texts = ["The quick brown fox jumps over the lazy dog and runs far away",
         "A tiny llama learns to count one two three four five six seven"]
bids = torch.tensor([tok(s).input_ids[:T] for s in texts], dtype=torch.int32)
assert bids.shape == (2, T), bids.shape
labels = bids.clone()
labels[0, :5] = -100
labels[1, :9] = -100
n_items = int((labels[:, 1:] != -100).sum())
rows = [(bids[r:r + 1].long(), labels[r:r + 1]) for r in range(2)]


def train(model):
    model.train()
    coef = model.config.router_aux_loss_coef
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in params.values() if p.ndim >= 2]
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=STEPS)
    losses, norms, lrs = [], [], []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for ids_, lab in rows:
            out = model(input_ids=ids_, output_router_logits=True)
            ce = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), lab[:, 1:].reshape(-1).long(),
                                                   ignore_index=-100, reduction="sum") / n_items
            loss = ce + coef * out.aux_loss / len(rows)
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        losses.append(total)
        norms.append(float(norm))
    return losses, norms, lrs


with float64_throughout():
    m64 = Qwen2MoeForCausalLM.from_pretrained(tiny, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
    ref64 = train(m64)
m32 = Qwen2MoeForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
f32 = train(m32)
w32 = dict(m32.named_parameters())
# transformers 5 holds the experts fused (gate_up_proj [E, 2I, C], down_proj [E, C, I]); the
# checkpoint names are per expert: split them back
final = {}
for n, p in m64.named_parameters():
    p = p.detach().float()
    if n.endswith("mlp.experts.gate_up_proj"):
        half = p.shape[1] // 2
        for e in range(p.shape[0]):
            final[f"final.{n[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = p[e, :half]
            final[f"final.{n[:-len('gate_up_proj')]}{e}.up_proj.weight"] = p[e, half:]
    elif n.endswith("mlp.experts.down_proj"):
        for e in range(p.shape[0]):
            final[f"final.{n[:-len('down_proj')]}{e}.down_proj.weight"] = p[e]
    else:
        final["final." + n] = p
worst = max(float((w32[n].detach().double() - p.detach()).norm() / p.detach().norm()) for n, p in m64.named_parameters())
worst_loss = max(abs(a - b) / abs(b) for a, b in zip(f32[0], ref64[0]))
print(f"train: torch float32 vs the float64 reference: loss {worst_loss:.2e} rel, final weights {worst:.2e} normwise")
print("losses", [round(x, 5) for x in ref64[0]])
out = {"input_ids": bids, "labels": labels.to(torch.int32), "losses": torch.tensor(ref64[0], dtype=torch.float64),
       "grad_norms": torch.tensor(ref64[1], dtype=torch.float64), "lrs": torch.tensor(ref64[2], dtype=torch.float64)}
out.update({k: v.contiguous() for k, v in final.items()})
save_file(out, os.path.join(OUT, "train.safetensors"))
save_file({"input_ids": bids, "labels": labels.to(torch.int32)}, os.path.join(OUT, "batch.safetensors"))

# ---- LoRA through PEFT

torch.manual_seed(1)
base = Qwen2MoeForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
pm = lora_with_random_b(base, ["q_proj", "v_proj", "shared_expert.up_proj", "shared_expert.down_proj"])


def save_adapter(d):
    save_adapter_rel(pm, os.path.join(OUT, d), "tests/fixtures/moe/tiny")   # relative to the repository root


save_adapter("lora_init")
lora = train(pm)
save_adapter("lora_ref")
with open(os.path.join(OUT, "lora_losses.txt"), "w") as f:
    f.write("".join("%.8f\n" % v for v in lora[0]))
print("lora losses", [round(x, 5) for x in lora[0]])
