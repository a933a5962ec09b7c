"""gen_llama_train.py — parity fixtures for text Llama training through `mmc train`
(tests/test_llama_train.sh): a tiny LlamaForCausalLM (GQA: 4 query heads over 2 KV heads,
llama3 rope_scaling, untied lm_head, no dropout) saved with save_pretrained together with the
tokenizer of tests/fixtures/llama_tokenizer/llama_tok_v5, and 20 steps of the trainer's loop in
transformers + torch.optim.AdamW on a fixed batch of that tokenizer's ids: 2 micro-batches of 1
row, loss = summed token loss / label tokens of the global batch (HF Trainer's
num_items_in_batch), clip_grad_norm_(1.0), get_cosine_schedule_with_warmup(3, 20), weight decay
0.1 on >= 2-D parameters only (the recipe of tools/ref/gen_train.py).

As gen_train.py, the reference runs in float64 with transformers' internal float32 upcasts kept
in float64, so the float32 mmc run is held to an exact reference; torch's own float32 run is
printed against it for the record.

Writes tests/fixtures/llama_train/: tiny/ (config.json, model.safetensors, tokenizer files),
batch.safetensors (input_ids, labels: the trainer's data.train) and parity.safetensors (losses,
grad_norms, lrs [20] float64 and "final.<HF name>" float32 for every weight).

LoRA (PEFT, float32 as a user runs it): r 4, alpha 8, no dropout on the modules named q_proj,
v_proj, down_proj, the same loop and batch (every LoRA matrix is 2-D, so all take the decay),
from PEFT's initial adapter with lora_B set to small random values (PEFT's zero B would leave
A's first gradients zero): lora_init/ (the adapter mmc starts from, model.lora.init),
lora_losses.txt (20 losses), lora_ref/ (the adapter after 20 steps, save_pretrained).

Mistral: a tiny MistralForCausalLM (GQA, tied embeddings, sliding_window 32 >= the batch's 24
tokens, so its attention is the full causal one) through the same float64 full fine-tuning
recipe: mistral/ (save_pretrained) and mistral_parity.safetensors (as parity.safetensors)."""
import json
import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup
from transformers import MistralConfig, MistralForCausalLM

from ref_common import float64_throughout, lora_with_random_b, save_adapter_rel

root = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(root, "tests/fixtures/llama_train")
torch.set_num_threads(2)
STEPS = 20
LR = 3e-3


def train(model, rows, n_items, V):
    model.train()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}   # LoRA: the adapter only
    decay = [p for p in params.values() if p.ndim >= 2]
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=STEPS)
    losses, norms, lrs = [], [], []
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for ids, labels in rows:
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1).long(),
                                                     ignore_index=-100, reduction="sum") / n_items
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
        losses.append(total)
        norms.append(float(norm))
    return losses, norms, lrs


tok = AutoTokenizer.from_pretrained(os.path.join(root, "tests/fixtures/llama_tokenizer/llama_tok_v5"))
V = len(tok)
cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16})
torch.manual_seed(0)
init = LlamaForCausalLM(cfg)
tiny = os.path.join(OUT, "tiny")
init.save_pretrained(tiny)
tok.save_pretrained(tiny)

# the fixed dataset: two tokenized sentences, 24 tokens each, the first tokens a prompt (-100)
T = 24
texts = ["The quick brown fox jumps over the lazy dog and runs far away",
         "A tiny llama learns to count one two three four five six seven"]
ids = torch.tensor([tok(s).input_ids[:T] for s in texts], dtype=torch.int32)
assert ids.shape == (2, T), ids.shape
labels = ids.clone()
labels[0, :5] = -100
labels[1, :9] = -100
n_items = int((labels[:, 1:] != -100).sum())
rows = [(ids[r:r + 1].long(), labels[r:r + 1]) for r in range(2)]



def full_parity(cls, d, name):
    with float64_throughout():
        m64 = cls.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
        ref = train(m64, rows, n_items, V)
    m32 = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    f32 = train(m32, rows, n_items, V)
    w32 = dict(m32.named_parameters())
    worst = max(float((w32[n].detach().double() - p.detach()).norm() / p.detach().norm())
                for n, p in m64.named_parameters())
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(f32[0], ref[0]))
    print(f"{name}: torch float32 vs the float64 reference: loss {worst_loss:.2e} rel, final weights {worst:.2e} normwise")
    print("losses", [round(x, 5) for x in ref[0]])
    out = {"input_ids": ids, "labels": labels.to(torch.int32),
           "losses": torch.tensor(ref[0], dtype=torch.float64), "grad_norms": torch.tensor(ref[1], dtype=torch.float64),
           "lrs": torch.tensor(ref[2], dtype=torch.float64)}
    for n, p in m64.named_parameters():
        out["final." + n] = p.detach().float().contiguous()
    save_file(out, os.path.join(OUT, name))


full_parity(LlamaForCausalLM, tiny, "parity.safetensors")
save_file({"input_ids": ids, "labels": labels.to(torch.int32)}, os.path.join(OUT, "batch.safetensors"))

# ---- LoRA through PEFT

torch.manual_seed(1)
base = LlamaForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="eager")
pm = lora_with_random_b(base, ["q_proj", "v_proj", "down_proj"])


def save_adapter(d):
    save_adapter_rel(pm, os.path.join(OUT, d), "tests/fixtures/llama_train/tiny")   # relative to the repository root


save_adapter("lora_init")
lora = train(pm, rows, n_items, V)
save_adapter("lora_ref")
with open(os.path.join(OUT, "lora_losses.txt"), "w") as f:
    f.write("".join("%.8f\n" % v for v in lora[0]))
print("lora losses", [round(x, 5) for x in lora[0]])

# ---- Mistral: full fine-tuning parity
mcfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
                     sliding_window=32, tie_word_embeddings=True, attention_dropout=0.0, bos_token_id=1,
                     eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
torch.manual_seed(2)
mdir = os.path.join(OUT, "mistral")
MistralForCausalLM(mcfg).save_pretrained(mdir)
full_parity(MistralForCausalLM, mdir, "mistral_parity.safetensors")
