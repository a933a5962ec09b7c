"""gen_internlm2_train.py — parity fixtures for InternLM2 training through `mmc train` (tests/test_internlm2_train.sh).

The reference: InternLM2ForCausalLM as xtuner 0.2.0 ships it (the InternLM team's modeling_internlm2.py: packed
attention.wqkv whose rows are grouped per key/value head [q_0 .. q_{G-1}, k, v], attention.wo, feed_forward.w1/w3/w2),
run by transformers 4.44.2 and PEFT 0.14.0 in their own venv (transformers 5 cannot run that file):

  python3 -m venv .venv-internlm2
  echo "$PWD/.venv-ref/lib/python3.11/site-packages" > .venv-internlm2/lib/python3.11/site-packages/zz_ref.pth
  .venv-internlm2/bin/pip install -r tools/ref/requirements-internlm2.txt      # transformers 4.44.2, einops
  .venv-internlm2/bin/pip install --no-deps xtuner==0.2.0 peft==0.14.0 accelerate==0.34.2
  .venv-internlm2/bin/python tools/ref/gen_internlm2_train.py

(the .pth line, written first, lends .venv-ref's torch and bitsandbytes; the venv's own transformers 4.44.2 comes
first on sys.path; --no-deps keeps pip from pulling another torch). PEFT 0.14.0: the first to read the lora_bias key
that mmc's (and PEFT 0.21's) adapter_config.json carries, and still running on transformers 4.44.2.

The model: a tiny InternLM2 (hidden 64, 4 query heads over 2 key/value heads of 16, so wqkv is [128, 64] in two
groups [q0 q1 k v]; bias true: wqkv and wo biased; rope_scaling linear x2; untied output), norms and biases moved
off their init so a misplaced one shows. The loop is tools/ref/gen_llama_train.py's: a fixed batch of 2 rows x 24
random ids (prompt tokens -100), 2 micro-batches of 1 row, loss = summed token loss / label tokens of the global
batch, clip_grad_norm_(1.0), get_cosine_schedule_with_warmup(3, 20), AdamW lr 3e-3 betas (0.9, 0.95) with weight
decay 0.1 on >= 2-D parameters only.

  full: in float64 with transformers' float32 upcasts kept in float64 (ref_common.float64_throughout), so the
        float32 mmc run is held to an exact reference; parity.safetensors: losses, grad_norms, lrs [20] and
        "final.<name>" (float32) of every weight after 20 steps, under the remote code's names
  LoRA: PEFT, float32, r 4, alpha 8, no dropout on the modules named wqkv, wo, w1, w2, w3 (PEFT's one lora_A
        [4, 64] and one lora_B [128, 4] over the packed wqkv, B's rows in the grouped order), lora_B drawn small
        instead of zero (ref_common.lora_with_random_b): lora_init/ (mmc's model.lora.init), lora_losses.txt,
        lora_ref/ (the adapter after 20 steps), merged_ref.safetensors (PeftModel(lora_ref).merge_and_unload()'s
        state dict: what `mmc merge` must write)
  QLoRA: transformers 4.44.2 quantises through bitsandbytes only on a CUDA device (its Bnb4BitHfQuantizer raises
        "No GPU found"), so the NF4 base is made with bitsandbytes' own functions on the CPU: every linear of the
        decoder (wqkv, wo, w1, w2, w3) replaced by dequantize_4bit(quantize_4bit(W, blocksize 64, nf4, no double
        quantisation)) — what bitsandbytes' Linear4bit computes with float32 compute — the embeddings, norms and
        output dense, then the same PEFT LoRA from lora_init/: qlora_losses.txt. Every K here is a multiple of 64,
        so each NF4 block lies in one row of W.

Writes tests/fixtures/internlm2_train/ (tiny/, batch.safetensors, parity.safetensors, lora_init/, lora_ref/,
lora_losses.txt, merged_ref.safetensors, qlora_losses.txt).
"""
import importlib.util
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import load_file, save_file

spec = importlib.util.find_spec("xtuner")
if spec is None:
    sys.exit("xtuner is not installed in this venv: see the docstring")
sys.path.insert(0, os.path.join(os.path.dirname(spec.origin), "_lite", "modelings"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
from internlm2 import InternLM2Config, InternLM2ForCausalLM  # noqa: E402
from transformers import get_cosine_schedule_with_warmup  # noqa: E402

from ref_common import float64_throughout, lora_with_random_b, save_adapter_rel  # noqa: E402

assert transformers.__version__ == "4.44.2", transformers.__version__

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(root, "tests/fixtures/internlm2_train")
REL = "tests/fixtures/internlm2_train/tiny"
torch.set_num_threads(2)
STEPS = 20
LR = 3e-3
V = 300
TARGETS = ["wqkv", "wo", "w1", "w2", "w3"]


def train(model, rows, n_items):
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


def save_tiny(d):
    torch.manual_seed(0)
    cfg = InternLM2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          bias=True, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0},
                          tie_word_embeddings=False, initializer_range=0.05, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, attn_implementation="eager")
    lm = InternLM2ForCausalLM(cfg).float()
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "norm" in n or n.endswith(".bias"):   # the init leaves them at 1 / 0
                p.add_(0.2 * torch.randn_like(p))
    shutil.rmtree(d, ignore_errors=True)
    lm.save_pretrained(d, safe_serialization=True)
    for f in ("modeling_internlm2.py", "configuration_internlm2.py"):   # the remote code save_pretrained copies:
        if os.path.exists(os.path.join(d, f)):                           # not the project's to ship
            os.remove(os.path.join(d, f))
    os.chmod(os.path.join(d, "model.safetensors"), 0o644)
    c = json.load(open(os.path.join(d, "config.json")))
    c["auto_map"] = {"AutoConfig": "configuration_internlm2.InternLM2Config",
                     "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
                     "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)


def load(d, dtype):
    return InternLM2ForCausalLM.from_pretrained(d, torch_dtype=dtype)


def nf4_base(m):
    """The decoder's linears as bitsandbytes' NF4 round trip (blocks of 64, fp32 absmax, no double quantisation)."""
    import bitsandbytes.functional as bnbf
    with torch.no_grad():
        for n, mod in m.named_modules():
            if isinstance(mod, torch.nn.Linear) and n.split(".")[-1] in TARGETS:
                q, s = bnbf.quantize_4bit(mod.weight.data, blocksize=64, quant_type="nf4", compress_statistics=False)
                mod.weight.data.copy_(bnbf.dequantize_4bit(q, s))
    return m


def main():
    os.makedirs(OUT, exist_ok=True)
    tiny = os.path.join(OUT, "tiny")
    save_tiny(tiny)

    T = 24
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, V, (2, T), generator=g, dtype=torch.int64).to(torch.int32)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, :9] = -100
    n_items = int((labels[:, 1:] != -100).sum())
    rows = [(ids[r:r + 1].long(), labels[r:r + 1]) for r in range(2)]
    save_file({"input_ids": ids, "labels": labels}, os.path.join(OUT, "batch.safetensors"))

    # ---- full fine-tuning: float64 reference, torch float32 printed against it
    with float64_throughout():
        m64 = load(tiny, torch.float64)
        ref = train(m64, rows, n_items)
    m32 = load(tiny, torch.float32)
    f32 = train(m32, rows, n_items)
    w32 = dict(m32.named_parameters())
    worst = max(float((w32[n].detach().double() - p.detach()).norm() / p.detach().norm())
                for n, p in m64.named_parameters())
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(f32[0], ref[0]))
    print(f"full: torch float32 vs the float64 reference: loss {worst_loss:.2e} rel, final weights {worst:.2e} normwise")
    print("losses", [round(x, 5) for x in ref[0]])
    out = {"losses": torch.tensor(ref[0], dtype=torch.float64), "grad_norms": torch.tensor(ref[1], dtype=torch.float64),
           "lrs": torch.tensor(ref[2], dtype=torch.float64)}
    for n, p in m64.named_parameters():
        out["final." + n] = p.detach().float().contiguous()
    save_file(out, os.path.join(OUT, "parity.safetensors"))

    # ---- LoRA through PEFT
    from peft import PeftModel
    torch.manual_seed(1)
    pm = lora_with_random_b(load(tiny, torch.float32), TARGETS)
    a = [p for n, p in pm.named_parameters() if "layers.0.attention.wqkv.lora_" in n]
    print("wqkv lora shapes", [tuple(p.shape) for p in a])
    save_adapter_rel(pm, os.path.join(OUT, "lora_init"), REL)
    lora = train(pm, rows, n_items)
    save_adapter_rel(pm, os.path.join(OUT, "lora_ref"), REL)
    with open(os.path.join(OUT, "lora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in lora[0]))
    print("lora losses", [round(x, 5) for x in lora[0]])
    merged = PeftModel.from_pretrained(load(tiny, torch.float32), os.path.join(OUT, "lora_ref")).merge_and_unload()
    save_file({k: v.contiguous() for k, v in merged.state_dict().items()}, os.path.join(OUT, "merged_ref.safetensors"))

    # ---- QLoRA: the NF4 round trip of the base, the same LoRA from lora_init
    qm = PeftModel.from_pretrained(nf4_base(load(tiny, torch.float32)), os.path.join(OUT, "lora_init"),
                                   is_trainable=True)
    qlora = train(qm, rows, n_items)
    with open(os.path.join(OUT, "qlora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in qlora[0]))
    print("qlora losses", [round(x, 5) for x in qlora[0]])


if __name__ == "__main__":
    main()
