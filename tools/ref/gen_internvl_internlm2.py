"""gen_internvl_internlm2.py — a tiny InternVL checkpoint in OpenGVLab's remote-code layout with an InternLM2
language model (InternVL2 / 2.5-8B's: llm_config model_type internlm2, InternLM2ForCausalLM), and what the
InternLM2 reference computes on it, for tests/test_internvl.c (test_remote_internlm2).

The reference: InternLM2ForCausalLM as xtuner 0.2.0 ships it (xtuner/_lite/modelings/internlm2/
modeling_internlm2.py, the InternLM team's remote code: packed attention.wqkv whose rows are grouped per
key/value head as [q_0 .. q_{G-1}, k, v] (G = num_attention_heads / num_key_value_heads), attention.wo,
feed_forward.w1 / w3 / w2, attention_norm, ffn_norm, tok_embeddings, output). transformers 5 cannot run that
file, so it runs in its own venv with transformers 4.44.2 (tools/ref/requirements-internlm2.txt):

  python3 -m venv .venv-internlm2
  .venv-internlm2/bin/pip install -r tools/ref/requirements-internlm2.txt
  .venv-internlm2/bin/pip install --no-deps xtuner==0.2.0     # only its modeling files are used
  echo "$PWD/.venv-ref/lib/python3.11/site-packages" > .venv-internlm2/lib/python3.11/site-packages/zz_ref.pth
  .venv-internlm2/bin/python tools/ref/gen_internvl_internlm2.py

(the .pth line lends .venv-ref's torch; the venv's own transformers 4.44.2 comes first on sys.path). xtuner's
package __init__ pulls in mmengine, so the modeling package is imported from its folder, not as xtuner.*.

The vision side is tests/fixtures/internvl/remote's (vision_model.*, mlp1.*: v5's InternViT and projector in
OpenGVLab's names) and its reference image features are transformers 5.23's for v5
(tests/fixtures/internvl/ref.safetensors v5.image_features, on v5.pixel_values, with v5.ids the prompt as
InternVLChatModel.chat() builds it), so this script needs no transformers 5: it splices those features into
the InternLM2 input embeddings at the <IMG_CONTEXT> rows, as InternVLChatModel.forward does, and runs the
language model on them.

Writes tests/fixtures/internvl/:
  remote_internlm2/  config.json (remote's with llm_config = this InternLM2Config, 4.4x style: rope_theta 1e6,
                     rope_scaling dynamic x2 as internlm2_5-7b-chat has, bias false, GQA 4 heads / 2 kv heads),
                     model.safetensors (remote's vision_model.* / mlp1.* + language_model.model.* /
                     language_model.output.weight of a random InternLM2, seed 19), tokenizer files as remote's
  internlm2_ref.safetensors  logits [1, T, V] of the whole prompt; greedy [1, 8]: 8 argmax tokens, each
                     step a full forward over the prompt and the tokens so far (no cache)
  internlm2_expected.tsv, remote_internlm2.image.logits.txt  the same for tests/test_internvl_cli.sh
and tests/fixtures/internlm2/ (text_only() below): a text-only InternLM2ForCausalLM folder with the other flags.
"""
import importlib.util
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

spec = importlib.util.find_spec("xtuner")
if spec is None:
    sys.exit("xtuner is not installed in this venv: see the docstring")
sys.path.insert(0, os.path.join(os.path.dirname(spec.origin), "_lite", "modelings"))
import transformers  # noqa: E402
from internlm2 import InternLM2Config, InternLM2ForCausalLM  # noqa: E402

assert transformers.__version__ == "4.44.2", transformers.__version__

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "internvl")
SRC = os.path.join(ROOT, "remote")
DST = os.path.join(ROOT, "remote_internlm2")
IMG_CONTEXT = 1394   # <IMG_CONTEXT> in the fixture tokenizer (test_internvl checks it)


def main():
    torch.manual_seed(19)
    rc = json.load(open(os.path.join(SRC, "config.json")))
    q = rc["llm_config"]
    cfg = InternLM2Config(vocab_size=q["vocab_size"], hidden_size=q["hidden_size"], intermediate_size=72,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                          max_position_embeddings=32768, rms_norm_eps=1e-5, bias=False, rope_theta=1000000.0,
                          rope_scaling={"type": "dynamic", "factor": 2.0}, tie_word_embeddings=False,
                          pad_token_id=0, bos_token_id=1, eos_token_id=q["eos_token_id"], attn_implementation="eager")
    lm = InternLM2ForCausalLM(cfg).float().eval()
    with torch.no_grad():   # the init leaves norms at 1: move them so a missed or misplaced norm shows
        for n, p in lm.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))

    ref = load_file(os.path.join(ROOT, "ref.safetensors"))
    ids = ref["v5.ids"]                                   # [1, T]
    feats = ref["v5.image_features"].reshape(-1, q["hidden_size"])   # [tiles * tokens, C]
    assert int((ids == IMG_CONTEXT).sum()) == feats.shape[0]

    def logits_of(seq):   # InternVLChatModel.forward: embeddings with the image rows replaced
        with torch.no_grad():
            e = lm.get_input_embeddings()(seq).clone()
            sel = seq[0] == IMG_CONTEXT
            e[0, sel] = feats
            return lm(inputs_embeds=e).logits

    logits = logits_of(ids)
    seq, new = ids, []
    for _ in range(8):
        t = int(logits_of(seq)[0, -1].argmax())
        new.append(t)
        seq = torch.cat([seq, torch.tensor([[t]])], 1)
    print("greedy", new, "logits", tuple(logits.shape))

    shutil.rmtree(DST, ignore_errors=True)
    os.makedirs(DST)
    w = {k: v for k, v in load_file(os.path.join(SRC, "model.safetensors")).items()
         if not k.startswith("language_model.")}
    for k, v in lm.state_dict().items():
        w["language_model." + k] = v.contiguous()
    save_file(w, os.path.join(DST, "model.safetensors"), metadata={"format": "pt"})
    os.chmod(os.path.join(DST, "model.safetensors"), 0o644)
    llm = cfg.to_dict()
    for k in ("_name_or_path", "transformers_version", "attn_implementation", "_attn_implementation_autoset"):
        llm.pop(k, None)
    llm.update(architectures=["InternLM2ForCausalLM"], torch_dtype="float32",
               auto_map={"AutoConfig": "configuration_internlm2.InternLM2Config",
                         "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
                         "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"})
    rc["llm_config"] = llm
    json.dump(rc, open(os.path.join(DST, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(SRC, "generation_config.json"), DST)
    shutil.copy(os.path.join(SRC, "tokenizer_config.json"), DST)
    os.symlink(os.path.join("..", "v5", "tokenizer.json"), os.path.join(DST, "tokenizer.json"))
    save_file({"ids": ids.contiguous(), "logits": logits.float().contiguous(),
               "greedy": torch.tensor([new], dtype=torch.int64)},
              os.path.join(ROOT, "internlm2_ref.safetensors"))
    last = logits[0, -1]   # for tests/test_internvl_cli.sh, in expected.tsv's format
    with open(os.path.join(ROOT, "remote_internlm2.image.logits.txt"), "w") as f:
        f.write("".join(f"{float(x):.9g}\n" for x in last))
    with open(os.path.join(ROOT, "internlm2_expected.tsv"), "w") as f:
        f.write("# dir\tcase\tprompt_tokens\tgreedy_ids\targmax_last (tools/ref/gen_internvl_internlm2.py)\n")
        f.write("\t".join(["remote_internlm2", "image", str(ids.shape[1]), ",".join(map(str, new)),
                           str(int(last.argmax()))]) + "\n")
    print({k: (tuple(v.shape), v.dtype) for k, v in list(lm.state_dict().items())[:8]})



TEXT = os.path.join(ROOT, "..", "internlm2")


def text_only():
    """tests/fixtures/internlm2/tiny: a text-only InternLM2ForCausalLM as the remote code's save_pretrained writes it,
    with the flags remote_internlm2 leaves off: bias true (InternLM2Config's default: wqkv and wo biased), rope_scaling
    linear x2, 6 query heads over 2 key/value heads (3 per group); ref.safetensors: ids [1, 21] (random), logits
    [1, 21, V], greedy [1, 8] (full forwards, no cache)."""
    torch.manual_seed(23)
    cfg = InternLM2Config(vocab_size=300, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          bias=True, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0},
                          tie_word_embeddings=False, initializer_range=0.15, attn_implementation="eager")
    lm = InternLM2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "norm" in n or n.endswith(".bias"):   # init leaves them at 1 / 0
                p.add_(0.2 * torch.randn_like(p))
    d = os.path.join(TEXT, "tiny")
    shutil.rmtree(d, ignore_errors=True)
    lm.save_pretrained(d, safe_serialization=True)
    for f in ("modeling_internlm2.py", "configuration_internlm2.py"):   # the remote code save_pretrained copies:
        os.remove(os.path.join(d, f))                                   # not the project's to ship
    os.chmod(os.path.join(d, "model.safetensors"), 0o644)
    c = json.load(open(os.path.join(d, "config.json")))
    c["auto_map"] = {"AutoConfig": "configuration_internlm2.InternLM2Config",
                     "AutoModel": "modeling_internlm2.InternLM2ForCausalLM",
                     "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"}
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    lm = InternLM2ForCausalLM.from_pretrained(d).float().eval()   # everything below from the folder as saved
    ids = torch.randint(3, 300, (1, 21))
    with torch.no_grad():
        logits = lm(input_ids=ids).logits
        seq, new = ids, []
        for _ in range(8):
            t = int(lm(input_ids=seq).logits[0, -1].argmax())
            new.append(t)
            seq = torch.cat([seq, torch.tensor([[t]])], 1)
    save_file({"ids": ids.contiguous(), "logits": logits.float().contiguous(),
               "greedy": torch.tensor([new], dtype=torch.int64)}, os.path.join(TEXT, "ref.safetensors"))
    print("text-only greedy", new)


if __name__ == "__main__":
    main()
    text_only()
