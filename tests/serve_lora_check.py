#!/usr/bin/env python3
"""serve_lora_check.py — tests/test_serve_lora.sh's checks of per-request LoRA adapters (`mmc serve
--lora a=DIR --lora b=DIR`) with the official `openai` client: models.list shows the base and both
adapters with vLLM's "parent" / "root"; an unknown model is openai.NotFoundError (model_not_found);
greedy chats of the base, a and b, one at a time and then all at once (streamed and not), each
equal `mmc generate [--adapter DIR] --greedy`'s text and token count; the prefix cache keeps each
adapter's KV apart (a first round of one prompt under each model has no prefix hits; a second,
all hits), and /metrics counts decode steps that mixed models.
With "unbatched" (a --no-batching server) the prefix-cache and mixed-batch checks are left out.
Usage: serve_lora_check.py PORT BASE_ID EXPECTED_JSON batched|unbatched
(EXPECTED_JSON: a list of {model, prompt, text, tokens})"""
import json, sys, threading

import openai
from serve_util import check, fails, metrics

PORT, BASE_ID, EXPECTED = sys.argv[1], sys.argv[2], sys.argv[3]
BATCHED = sys.argv[4] == "batched"
url = "http://127.0.0.1:%s" % PORT
client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
cases = json.load(open(EXPECTED))


def metric(name):
    return metrics(int(PORT)).get(name, -1)


def chat(c, stream):
    msgs = [{"role": "user", "content": c["prompt"]}]
    if not stream:
        r = client.chat.completions.create(model=c["model"], messages=msgs, max_tokens=len(c["tokens"]), temperature=0)
        return r.choices[0].message.content, r.usage.completion_tokens
    parts, usage = [], None
    for ch in client.chat.completions.create(model=c["model"], messages=msgs, max_tokens=len(c["tokens"]),
                                             temperature=0, stream=True, stream_options={"include_usage": True}):
        usage = ch.usage or usage
        parts += [x.delta.content or "" for x in ch.choices]
    return "".join(parts), usage.completion_tokens if usage else -1


def same(c, got, how):
    check(got == (c["text"], len(c["tokens"])), "%s %s %r: %r != mmc generate's %r (%d tokens)"
          % (how, c["model"], c["prompt"], got, c["text"], len(c["tokens"])))


models = client.models.list().data
ids = [m.id for m in models]
check(ids == [BASE_ID, "a", "b"], "models.list ids %s" % ids)
if len(models) == 3:
    ex = [m.model_extra or {} for m in models]
    check(ex[0].get("parent", 1) is None and ex[0].get("root", "").endswith("qwen2/chat"), "base card %s" % models[0])
    for k, name in ((1, "a"), (2, "b")):
        check(ex[k].get("parent") == BASE_ID and ex[k].get("root", "").endswith("serve_lora/" + name),
              "adapter card %s" % models[k])
check(client.models.retrieve("b").id == "b", "models.retrieve(b)")
for bad in ("c", BASE_ID + "x"):
    try:
        client.chat.completions.create(model=bad, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        check(False, "model %r raised nothing" % bad)
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.code == "model_not_found", "NotFoundError %s" % e)

# one at a time: the first prompt under base, a, b (one prompt, three models: no hits may cross models)
first = [c for c in cases if c["prompt"] == cases[0]["prompt"]]
h0 = metric("mmc_prefix_cache_hits_total")
for c in first:
    same(c, chat(c, False), "sequential")
check(not BATCHED or metric("mmc_prefix_cache_hits_total") == h0, "a first round of one prompt under 3 models took cached blocks: "
      "%d hits" % (metric("mmc_prefix_cache_hits_total") - h0))
for c in first:
    same(c, chat(c, True), "sequential streamed")
hits = metric("mmc_prefix_cache_hits_total") - h0
check(not BATCHED or hits >= 3 * 32, "the second round of each model reused its own cached prompt: %d hit tokens" % hits)

# all at once, interleaved models, twice over (streamed and not): one continuous batch of mixed adapters
out = {}
def worker(i, c, stream):
    try:
        out[i] = chat(c, stream)
    except Exception as e:   # noqa: BLE001 (reported as a failure below)
        out[i] = repr(e)
jobs = [(i, c, i % 2 == 1) for i, c in enumerate(cases + cases)]
m0 = metric("mmc_lora_mixed_decode_steps_total")
ts = [threading.Thread(target=worker, args=j) for j in jobs]
for t in ts:
    t.start()
for t in ts:
    t.join()
for i, c, stream in jobs:
    same(c, out.get(i), "concurrent%s" % (" streamed" if stream else ""))
mixed = metric("mmc_lora_mixed_decode_steps_total") - m0
check(not BATCHED or mixed > 0, "no decode step mixed models (%d)" % mixed)
print("serve_lora_check: %d concurrent requests, %d mixed-model decode steps, %d prefix hit tokens in round 2"
      % (len(jobs), mixed, hits))
sys.exit(1 if fails else 0)
