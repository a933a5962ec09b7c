"""gen_internvl_chat_train.py [--llm internlm2|qwen2] — parity fixtures for `mmc train` on OpenGVLab's remote-code
InternVL layout (InternVLChatModel, model_type internvl_chat: vision_model.*, mlp1.*, language_model.* with an
InternLM2 or a Qwen2 language model), for tests/test_internvl_chat_train.sh, and the PEFT logits that `--adapter` at
inference must give (InternVL chat and text InternLM2).

The reference is OpenGVLab's own code, run as the Hub checkpoints' auto_map runs it: InternVLChatModel,
InternVisionModel and its InternLM2ForCausalLM from the internvl_chat/ folder of github.com/OpenGVLab/InternVL
(tested at commit 2410d1dbf208f0e799459aff9376e5747dbf41a2), on transformers 4.44.2 + PEFT 0.14.0 in
.venv-internlm2 (tools/ref/gen_internlm2_train.py says how to make it; its .pth lends .venv-ref's torch,
torchvision and PIL). That folder is not the project's: point MMC_INTERNVL_CODE at it (default: .internvl-code
in the repository root, a symlink to such a checkout's internvl_chat/):
  git clone https://github.com/OpenGVLab/InternVL /some/where && ln -s /some/where/internvl_chat .internvl-code
  .venv-internlm2/bin/python tools/ref/gen_internvl_chat_train.py
Images are tiled by that folder's own dynamic_preprocess / build_transform (internvl/train/dataset.py, read out
of the file: its module imports decord / cv2), as load_image does.

The model: InternVLChatModel(config) from a seed: the InternViT of tests/fixtures/internvl/remote (36 wide, 3
layers, 3 heads, 56-pixel tiles, qkv bias), select_layer -1, ps_version v2, pixel shuffle 0.5, and an InternLM2
of hidden 48, 6 query heads over 2 key/value heads (wqkv's rows in groups [q0 q1 q2 k v]), bias true (wqkv and
wo biased), rope_scaling dynamic x2, untied output; norms and biases moved off their init so a misplaced one
shows. Saved with save_pretrained (the remote .py files it copies removed) and the fixture tokenizer of
tests/fixtures/internvl/remote_internlm2 (its template takes string content).
--llm qwen2 (InternVL2-1B / 2.5-1B / 2.5-4B / 3's layout: llm_config.architectures Qwen2ForCausalLM, transformers
4.44.2's Qwen2ForCausalLM as InternVLChatModel builds it): the same tower and steps on a Qwen2 of hidden 48, 6 query
heads over 2 key/value heads (head_dim 8), intermediate 72, q / k / v biased, rope_theta 1e6, untied
language_model.lm_head (InternVLChatConfig forces tie_word_embeddings off); LoRA on language_model.model.layers.N.
self_attn.{q,k,v,o}_proj / mlp.{gate,up,down}_proj and mlp1.1 / mlp1.3 (16 modules), QLoRA's NF4 on those seven
projections; the tokenizer files of tests/fixtures/internvl/remote; no text-model part. Writes
tests/fixtures/internvl_chat_train_qwen2/.

Samples: tests/fixtures/internvl_train's wide / tall images and a text-only turn (data.jsonl here), rendered as
InternVLChatModel.chat() renders a prompt: "<image>\\n" + text as the user content, the tokenizer's chat template,
each "<image>" replaced by "<img>" + "<IMG_CONTEXT>" x (num_image_token x tiles) + "</img>"; labels are the
assistant turns' tokens (content and <|im_end|>; what render(messages[:i+1]) adds to
render(messages[:i], add_generation_prompt=True)), -100 elsewhere; the text-only sample carries one zero tile
with image_flags 0, as OpenGVLab's finetune does. Loss: InternVLChatModel.forward(..., labels)'s mean token loss,
one sample per step in file order, AdamW betas (0.9, 0.999), eps 1e-8, constant lr, no clipping; weight decay on
>= 2-D parameters only. Everything in float64 (ref_common.float64_throughout), so the float32 mmc run is held to
an exact reference:
  full:  20 steps, lr 1e-3, weight decay 0.1, the tower frozen (mmc's default): full_losses.txt,
         parity.safetensors "final.<name>" (float32) of every mlp1.* / language_model.* weight after the 20 steps
  tower: 10 steps, lr 1e-3, only vision_model.* and mlp1.* trained (model.freeze [language_model,
         embeddings]): tower_losses.txt, parity.safetensors "tower.<name>" of the tower / projector weights
  LoRA:  PEFT r 4, alpha 8, no dropout on language_model.model.layers.N.attention.wqkv / attention.wo /
         feed_forward.w1 / w2 / w3 and mlp1.1 / mlp1.3, lora_B drawn small instead of zero
         (ref_common.lora_with_random_b): lora_init/ (mmc's model.lora.init), 20 steps at lr 5e-3:
         lora_losses.txt, lora_ref/ (the adapter after them)
  QLoRA: the same LoRA from lora_init/ on a base whose InternLM2 linears (wqkv, wo, w1, w2, w3) are bitsandbytes'
         NF4 round trip (blocksize 64, no double quantisation; nf4_base): qlora_losses.txt, 20 steps at lr 5e-3
  adapter at inference: lora_fwd.safetensors: input_ids [T] and logits [T, V] of PeftModel(tiny, lora_ref) on
         the prompt `mmc forward --image wide.png --prompt "What is in the picture?"` builds (the template's
         system turn, "<image>\\nWhat is in the picture?", the generation prompt)
  text InternLM2: tests/fixtures/internlm2_train/lora_logits.safetensors: ids [1, 19] (random, seed 5) and the
         logits of PeftModel(internlm2_train/tiny, internlm2_train/lora_ref) on them (xtuner's
         modeling_internlm2.py, which made that fixture), float32.
Writes tests/fixtures/internvl_chat_train/.
"""
import argparse
import ast
import importlib.util
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CODE = os.environ.get("MMC_INTERNVL_CODE", os.path.join(REPO, ".internvl-code"))
if not os.path.isdir(os.path.join(CODE, "internvl", "model", "internvl_chat")):
    sys.exit("OpenGVLab's internvl_chat/ code not found at %s: see the docstring (MMC_INTERNVL_CODE)" % CODE)
sys.path.insert(0, CODE)
sys.path.insert(0, HERE)
import transformers  # noqa: E402
from internvl.model.internvl_chat import InternVLChatConfig, InternVLChatModel  # noqa: E402
from peft import PeftModel  # noqa: E402
from PIL import Image  # noqa: E402

import ref_common  # noqa: E402

assert transformers.__version__ == "4.44.2", transformers.__version__

FIX = os.path.join(REPO, "tests", "fixtures")
IMAGES = os.path.join(FIX, "internvl_train")
SAMPLES = [
    {"messages": [{"role": "user", "content": "<image>What is in the picture?"},
                  {"role": "assistant", "content": "A red square on grey."}], "images": ["../internvl_train/wide.png"]},
    {"messages": [{"role": "user", "content": "<image>Describe it briefly."},
                  {"role": "assistant", "content": "Stripes, mostly blue."}], "images": ["../internvl_train/tall.png"]},
    {"messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there!"}]},
]
# per language model: the fixture folder, the fixture whose tokenizer files and tower config it takes, the linears
# LoRA adapts (PEFT's regex over InternVLChatModel's module names) and QLoRA quantises
LLMS = {
    "internlm2": dict(out="internvl_chat_train", src="remote_internlm2",
                      lora=r".*language_model\.model\.layers\.\d+\.(attention\.(wqkv|wo)|feed_forward\.w[123])|mlp1\.[13]",
                      nf4=("wqkv", "wo", "w1", "w2", "w3")),
    "qwen2": dict(out="internvl_chat_train_qwen2", src="remote",
                  lora=r".*language_model\.model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)|mlp1\.[13]",
                  nf4=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
}


def select(llm):
    """the module's paths and settings for one language model (check_internvl_chat_train.py calls it too)"""
    global LLM, OUT, TINY, SRC, LORA_TARGETS
    LLM = llm
    OUT = os.path.join(FIX, LLMS[llm]["out"])
    TINY = os.path.join(OUT, "tiny")
    SRC = os.path.join(FIX, "internvl", LLMS[llm]["src"])   # the tokenizer files and the tower's config
    LORA_TARGETS = LLMS[llm]["lora"]


select("internlm2")


def opengvlab_tiling():
    """dynamic_preprocess / build_transform / find_closest_aspect_ratio as internvl/train/dataset.py defines them
    (the functions taken out of the file, which imports decord / cv2 at the top)."""
    import torchvision.transforms as T
    from torchvision.transforms.functional import InterpolationMode
    ns = {"T": T, "InterpolationMode": InterpolationMode, "Image": Image}
    exec(open(os.path.join(CODE, "internvl", "train", "constants.py")).read(), ns)
    src = open(os.path.join(CODE, "internvl", "train", "dataset.py")).read()
    want = {"find_closest_aspect_ratio", "dynamic_preprocess", "build_transform", "expand2square"}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in want:
            exec(compile(ast.Module([node], []), "dataset.py", "exec"), ns)
    return ns


def tiny_model(cfg_src):
    rc = json.load(open(os.path.join(SRC, "config.json")))
    vc = dict(rc["vision_config"])
    q = rc["llm_config"]
    if LLM == "qwen2":   # (Qwen2Config's own fields; eager attention, as InternVLChatModel picks without flash-attn)
        llm = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=q["vocab_size"], hidden_size=48,
                   intermediate_size=72, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                   hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                   use_sliding_window=False, sliding_window=4096, max_window_layers=2, tie_word_embeddings=False,
                   pad_token_id=0, bos_token_id=None, eos_token_id=q["eos_token_id"], initializer_range=0.05,
                   attention_dropout=0.0, attn_implementation="eager")
    else:
        llm = dict(architectures=["InternLM2ForCausalLM"], model_type="internlm2", vocab_size=q["vocab_size"],
                   hidden_size=48, intermediate_size=88, num_hidden_layers=2, num_attention_heads=6,
                   num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-5, bias=True,
                   rope_theta=1000000.0, rope_scaling={"type": "dynamic", "factor": 2.0}, tie_word_embeddings=False,
                   pad_token_id=0, bos_token_id=1, eos_token_id=q["eos_token_id"], initializer_range=0.05,
                   attn_implementation="eager",
                   auto_map={"AutoConfig": "configuration_internlm2.InternLM2Config",
                             "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
                             "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"})
    cfg = InternVLChatConfig(vision_config=vc, llm_config=llm, select_layer=-1, force_image_size=56,
                             downsample_ratio=0.5, template=rc.get("template", "internvl2_5"), dynamic_image_size=True,
                             use_thumbnail=True, ps_version="v2", min_dynamic_patch=1, max_dynamic_patch=6)
    cfg.architectures = ["InternVLChatModel"]
    cfg.auto_map = rc["auto_map"]
    torch.manual_seed(41)
    m = InternVLChatModel(cfg, use_flash_attn=False).float()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith(".bias") or ".ls" in n:
                p.add_(0.2 * torch.randn_like(p))
    return m


def save_tiny(m):
    shutil.rmtree(TINY, ignore_errors=True)
    m.save_pretrained(TINY, safe_serialization=True)
    for f in os.listdir(TINY):
        if f.endswith(".py"):
            os.remove(os.path.join(TINY, f))   # the remote code save_pretrained may copy: not the project's
    os.chmod(os.path.join(TINY, "model.safetensors"), 0o644)
    for f in ("generation_config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(SRC, f), TINY)
    os.symlink(os.path.join("..", "..", "internvl", "v5", "tokenizer.json"), os.path.join(TINY, "tokenizer.json"))


TOKENIZE = r"""
import json, os, shutil, sys, tempfile
from transformers import AutoTokenizer
with tempfile.TemporaryDirectory() as d:   # the tokenizer files alone (config.json's auto_map would ask to run code)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(sys.argv[1], f), d)
    tok = AutoTokenizer.from_pretrained(d)
out = []
for job in json.load(open(sys.argv[2])):
    msgs, counts, gen = job["messages"], job["counts"], job["generation_prompt"]

    def expand(text):
        for n in counts:
            text = text.replace("<image>", "<img>" + "<IMG_CONTEXT>" * n + "</img>", 1)
        return text

    full = expand(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen))
    spans = []
    for i, x in enumerate(msgs):
        if x["role"] != "assistant":
            continue
        a = expand(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
        b = expand(tok.apply_chat_template(msgs[:i + 1], tokenize=False)).rstrip()
        assert full.startswith(b) and b.startswith(a)
        spans.append((len(a), len(b)))
    enc = tok(full, return_offsets_mapping=True)
    ids = enc["input_ids"]
    labels = [t if o1 > o0 and any(a <= o0 and o1 <= b for a, b in spans) else -100
              for t, (o0, o1) in zip(ids, enc["offset_mapping"])]
    out.append({"ids": ids, "labels": labels, "ctx": tok.convert_tokens_to_ids("<IMG_CONTEXT>")})
print(json.dumps(out))
"""


def tokenize(jobs):
    """The prompts through the fixture tokenizer and its chat template. Its tokenizer.json is written by the
    tokenizers of transformers 5 (.venv-ref), which 4.44.2's cannot parse: this part runs there (the tokenizer
    and template only; no model code)."""
    import subprocess
    import tempfile
    py = os.environ.get("MMC_REF_PYTHON", os.path.join(REPO, ".venv-ref", "bin", "python"))
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(jobs, f)
        f.flush()
        r = subprocess.run([py, "-c", TOKENIZE, TINY, f.name], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if r.returncode:
        sys.exit("tokenizing with %s failed:\n%s" % (py, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_samples(ns, n_tok, samples, generation_prompt=False):
    """per sample: ids, labels [1, T]; pixel_values [tiles, 3, 56, 56]; image_flags [tiles]"""
    jobs, pix = [], []
    for s in samples:
        msgs = []
        for x in s["messages"]:
            c = x["content"]
            if c.startswith("<image>"):
                c = "<image>\n" + c[len("<image>"):]
            msgs.append({"role": x["role"], "content": c})
        tiles = []
        for path in s.get("images", []):
            img = Image.open(os.path.join(OUT, path)).convert("RGB")
            parts = ns["dynamic_preprocess"](img, min_num=1, max_num=6, image_size=56, use_thumbnail=True)
            tf = ns["build_transform"](is_train=False, input_size=56, normalize_type="imagenet")
            tiles.append(torch.stack([tf(p) for p in parts]))
        jobs.append({"messages": msgs, "counts": [n_tok * t.shape[0] for t in tiles],
                     "generation_prompt": generation_prompt})
        pix.append(tiles)
    out = []
    for r, tiles in zip(tokenize(jobs), pix):
        if tiles:
            pv = torch.cat(tiles)
            flags = torch.ones(pv.shape[0], dtype=torch.long)
        else:
            pv = torch.zeros(1, 3, 56, 56)
            flags = torch.zeros(1, dtype=torch.long)
        assert sum(t == r["ctx"] for t in r["ids"]) == n_tok * int(flags.sum())
        out.append((torch.tensor([r["ids"]]), torch.tensor([r["labels"]]), pv, flags, r["ctx"]))
    return out


def train(model, params, batches, steps, lr, wd):
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for k in range(steps):
        ids, labels, pv, flags = batches[k % len(batches)]
        dt = next(iter(params)).dtype
        out = model(pixel_values=pv.to(dt), input_ids=ids, labels=labels, image_flags=flags)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss))
        print("step %d loss %.9f" % (k + 1, losses[-1]))
    return losses


def nf4_base(m):
    """the language model's linears (InternLM2's wqkv / wo / w1 / w2 / w3, Qwen2's q / k / v / o / gate / up / down_proj)
    as bitsandbytes' NF4 round trip (blocks of 64 over the flattened weight,
    fp32 absmax, no double quantisation): what Linear4bit computes with float32 compute (transformers 4.44.2
    quantises only on CUDA, so bitsandbytes' functions are applied here); the tower, mlp1, embeddings, norms and
    output dense, as mmc's model.quantization leaves them."""
    import bitsandbytes.functional as bnbf
    with torch.no_grad():
        for n, mod in m.named_modules():
            if (isinstance(mod, torch.nn.Linear) and n.startswith("language_model.")
                    and n.split(".")[-1] in LLMS[LLM]["nf4"]):
                # on a [-1, 64] view: bitsandbytes 0.50's CPU dequantize_4bit scales a [N, K] weight whose K is not a
                # multiple of the block wrongly (block b's codes with another block's absmax; its quantize_4bit and
                # the CUDA path take the flat blocks), and K is 48, 72 or 88 here; every numel is a multiple of 64
                w = mod.weight.data
                assert w.numel() % 64 == 0
                q, st = bnbf.quantize_4bit(w.reshape(-1, 64), blocksize=64, quant_type="nf4", compress_statistics=False)
                mod.weight.data.copy_(bnbf.dequantize_4bit(q, st).reshape(w.shape))
    return m


def write_losses(name, losses):
    with open(os.path.join(OUT, name), "w") as f:
        f.write("".join("%.9f\n" % v for v in losses))


def main():
    ap = argparse.ArgumentParser(description="internvl_chat training fixtures from OpenGVLab's code")
    ap.add_argument("--llm", choices=sorted(LLMS), default="internlm2")
    select(ap.parse_args().llm)
    rel = os.path.relpath(TINY, REPO)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        f.write("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in SAMPLES))
    save_tiny(tiny_model(SRC))
    ns = opengvlab_tiling()
    probe = InternVLChatModel(InternVLChatConfig.from_pretrained(TINY), use_flash_attn=False)
    batches = build_samples(ns, probe.num_image_token, SAMPLES)
    ctx_id = batches[0][4]
    batches = [b[:4] for b in batches]

    def load(dtype):
        m = InternVLChatModel.from_pretrained(TINY, torch_dtype=dtype, use_flash_attn=False)
        m.img_context_token_id = ctx_id
        return m.to(dtype)

    for ids, labels, pv, flags in batches:
        print("sample: %d tokens, %d labelled, %d tiles" % (ids.shape[1], int((labels != -100).sum()), int(flags.sum())))
    parity = {}
    with ref_common.float64_throughout():
        # full fine-tuning, the tower frozen
        m = load(torch.float64)
        for n, p in m.named_parameters():
            p.requires_grad_(not n.startswith("vision_model."))
        losses = train(m, [p for p in m.parameters() if p.requires_grad], batches, 20, 1e-3, 0.1)
        write_losses("full_losses.txt", losses)
        for n, p in m.state_dict().items():   # (the frozen tower stays as saved)
            if not n.startswith("vision_model."):
                parity["final." + n] = p.detach().float().contiguous()
        # the tower and projector trained, the language model frozen
        m = load(torch.float64)
        for n, p in m.named_parameters():
            p.requires_grad_(n.startswith("vision_model.") or n.startswith("mlp1."))
        losses = train(m, [p for p in m.parameters() if p.requires_grad], batches, 10, 1e-3, 0.0)
        write_losses("tower_losses.txt", losses)
        for n, p in m.state_dict().items():
            if n.startswith("vision_model.") or n.startswith("mlp1."):
                parity["tower." + n] = p.detach().float().contiguous()
        # LoRA from PEFT's initial adapter (lora_B random)
        torch.manual_seed(7)
        pm = ref_common.lora_with_random_b(load(torch.float32), LORA_TARGETS)
        for d in ("lora_init", "lora_ref"):
            shutil.rmtree(os.path.join(OUT, d), ignore_errors=True)
        ref_common.save_adapter_rel(pm, os.path.join(OUT, "lora_init"), rel)
        pm = pm.to(torch.float64)
        losses = train(pm, [p for p in pm.parameters() if p.requires_grad], batches, 20, 5e-3, 0.0)
        write_losses("lora_losses.txt", losses)
    # (outside float64_throughout, which keeps .to(torch.float32) of a float64 tensor float64)
    ref_common.save_adapter_rel(pm.to(torch.float32), os.path.join(OUT, "lora_ref"),
                                rel)
    # QLoRA: the language model's linears as bitsandbytes' NF4 round trip, then the same LoRA from lora_init
    pm = PeftModel.from_pretrained(nf4_base(load(torch.float32)), os.path.join(OUT, "lora_init"), is_trainable=True)
    with ref_common.float64_throughout():
        pm = pm.to(torch.float64)
        losses = train(pm, [p for p in pm.parameters() if p.requires_grad], batches, 20, 5e-3, 0.0)
        write_losses("qlora_losses.txt", losses)
    # (.float() inside float64_throughout leaves float64 as it is: converted here)
    save_file({k: v.to(torch.float32).contiguous() for k, v in parity.items()}, os.path.join(OUT, "parity.safetensors"))

    # adapter at inference: PEFT's logits on the prompt mmc forward builds
    pm = PeftModel.from_pretrained(load(torch.float32), os.path.join(OUT, "lora_ref")).eval()
    fwd = {"messages": [{"role": "user", "content": "<image>What is in the picture?"}],
           "images": ["../internvl_train/wide.png"]}
    ids, _, pv, flags, _ = build_samples(ns, probe.num_image_token, [fwd], generation_prompt=True)[0]
    with torch.no_grad():
        lg = pm(pixel_values=pv, input_ids=ids, image_flags=flags).logits[0]
    save_file({"input_ids": ids[0].to(torch.int64).contiguous(), "logits": lg.float().contiguous()},
              os.path.join(OUT, "lora_fwd.safetensors"))
    print("lora_fwd: %d tokens, argmax_last %d" % (ids.shape[1], int(lg[-1].argmax())))
    if LLM == "internlm2":
        text_internlm2()


def text_internlm2():
    spec = importlib.util.find_spec("xtuner")
    if spec is None:
        sys.exit("xtuner is not installed in this venv: see tools/ref/gen_internlm2_train.py")
    sys.path.insert(0, os.path.join(os.path.dirname(spec.origin), "_lite", "modelings"))
    from internlm2 import InternLM2ForCausalLM
    d = os.path.join(FIX, "internlm2_train")
    base = InternLM2ForCausalLM.from_pretrained(os.path.join(d, "tiny"), torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, base.config.vocab_size, (1, 19), generator=g)
    with torch.no_grad():
        plain = base(input_ids=ids).logits
    pm = PeftModel.from_pretrained(base, os.path.join(d, "lora_ref")).eval()   # (wraps base in place)
    with torch.no_grad():
        lg = pm(input_ids=ids).logits
    print("text InternLM2: max |adapted - base| logits = %.3g" % float((lg - plain).abs().max()))
    save_file({"ids": ids.contiguous(), "logits": lg.float().contiguous()}, os.path.join(d, "lora_logits.safetensors"))


if __name__ == "__main__":
    main()
