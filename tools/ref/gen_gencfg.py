"""Fixtures for generation_config.json (tests/test_gen_config.c): several configs written by
transformers' GenerationConfig.save_pretrained (untouched), and the values transformers'
generate() resolves from each (model._prepare_generation_config on the tiny Qwen2 in
tests/fixtures/qwen2/chat: the file's values over GenerationConfig's global defaults).

Writes tests/fixtures/gencfg/<case>/generation_config.json and tests/fixtures/gencfg/expected.json.

And an end-to-end case for `mmc generate` (tests/test_cli.sh): generate_model/generation_config.json
(do_sample with top_k 1, so sampling is deterministic, a repetition penalty below 1 so that it
changes the greedy tokens of this random model, an eos list, a
max_new_tokens budget) and generate_expected.json: the tokens transformers' generate() gives on
the tiny chat model with that file as its generation config and the prompt of chat_expected.json.
"""
import json
import os
import shutil

import torch

from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "gencfg")
MODEL = os.path.join(ROOT, "tests", "fixtures", "qwen2", "chat")

CASES = {
    # Qwen2-VL-Instruct's published generation settings
    "qwen2_vl_instruct": dict(bos_token_id=151643, pad_token_id=151643, do_sample=True,
                              eos_token_id=[151645, 151643], repetition_penalty=1.05,
                              temperature=0.1, top_p=0.001, top_k=1),
    # Qwen3's thinking-mode recommendation (min_p set)
    "qwen3_like": dict(bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643,
                       do_sample=True, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05),
    # sampling with only a temperature: top_k comes from the global default (50)
    "sample_temperature_only": dict(do_sample=True, temperature=0.7, eos_token_id=7),
    # greedy with a length budget and one eos id
    "greedy_max_new": dict(eos_token_id=1379, max_new_tokens=64),
    "greedy_max_length": dict(eos_token_id=[1379], max_length=128, repetition_penalty=1.2),
    # what save_pretrained writes for a model with no generation settings
    "empty": dict(),
}

shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
model = AutoModelForCausalLM.from_pretrained(MODEL)
expected = {}
for name, kw in CASES.items():
    d = os.path.join(OUT, name)
    GenerationConfig(**kw).save_pretrained(d)
    model.generation_config = GenerationConfig.from_pretrained(d)
    g, _ = model._prepare_generation_config(None)
    eos = g.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    expected[name] = dict(
        do_sample=bool(g.do_sample), temperature=float(g.temperature), top_k=int(g.top_k),
        top_p=float(g.top_p), min_p=float(g.min_p or 0.0), repetition_penalty=float(g.repetition_penalty),
        max_new_tokens=-1 if g.max_new_tokens is None else int(g.max_new_tokens),
        max_length=int(g.max_length), eos=eos,
        bos=-1 if g.bos_token_id is None else int(g.bos_token_id),
        pad=-1 if g.pad_token_id is None else int(g.pad_token_id))
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1, sort_keys=True)

# end to end: generate() under a generation_config.json alone (no generate() kwargs)
gdir = os.path.join(OUT, "generate_model")
GenerationConfig(do_sample=True, top_k=1, repetition_penalty=0.2, max_new_tokens=16,
                 eos_token_id=[5, 1379]).save_pretrained(gdir)
tok = AutoTokenizer.from_pretrained(MODEL)
msgs = [{"role": "user", "content": "What colour is the circle?"}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
model.generation_config = GenerationConfig.from_pretrained(gdir)
with torch.no_grad():
    out = model.generate(ids, pad_token_id=0)[0, ids.shape[1]:].tolist()
    plain = model.generate(ids, do_sample=False, repetition_penalty=1.0, max_new_tokens=16, pad_token_id=0,
                           eos_token_id=[5, 1379])[0, ids.shape[1]:].tolist()

assert out != plain, "the repetition penalty should change the greedy tokens"
with open(os.path.join(OUT, "generate_expected.json"), "w") as f:
    json.dump({"prompt": msgs[0]["content"], "new_ids": out, "plain_greedy_ids": plain}, f)
print("gencfg:", ", ".join(CASES), "+ generate:", out)
