"""serve_batch_check.py — continuous batching of `mmc serve` (tests/test_serve_batch.sh): 8 clients at
once, each with its own prompt and max_tokens (raw completions, and chats with an image for a VLM), half
of them streaming; every answer must equal `mmc generate --greedy` run alone on the same prompt (text and
token count). Then /metrics: with --expect-preempt, mmc_preemptions_total > 0 (a tiny --kv-blocks pool
forced preemption by recompute, and a request larger than the whole pool gets 400
context_length_exceeded). Python's standard library only.
usage: serve_batch_check.py PORT MMC MODEL IMAGE|- [--expect-preempt]"""
import base64
import http.client
import json
import subprocess
import sys
import threading

PORT, MMC, MODEL, IMG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
EXPECT_PREEMPT = "--expect-preempt" in sys.argv
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def post(path, body, stream):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    c.request("POST", path, json.dumps(dict(body, stream=stream)), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        j = json.loads(r.read())
        c.close()
        ch = j["choices"][0]
        return ch.get("text", ch.get("message", {}).get("content")), j["usage"]["completion_tokens"]
    text, n, done = "", None, False
    for line in r:
        line = line.decode().rstrip("\n")
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            o = json.loads(line[6:])
            if o.get("usage"):
                n = o["usage"]["completion_tokens"]
            for ch in o["choices"]:
                text += ch.get("text", "") if "text" in ch else ch.get("delta", {}).get("content", "") or ""
    c.close()
    return (text if done else None), n


cases = []   # (path, body, generate args)
words = ["alpha", "beta gamma", "The quick brown fox", "1 2 3 4 5", "Hello", "zeta eta theta iota kappa",
         "Once upon a time, in a land far away,", "x"]
for i, w in enumerate(words):
    n = 6 + 7 * i
    if IMG != "-" and i in (2, 5):
        with open(IMG, "rb") as f:
            uri = "data:image/png;base64," + base64.b64encode(f.read()).decode()
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                          {"type": "text", "text": w}]}],
                "max_tokens": n, "temperature": 0}
        cases.append(("/v1/chat/completions", body, ["--prompt", w, "--image", IMG, "--max-new-tokens", str(n)]))
    else:
        body = {"prompt": w, "max_tokens": n, "temperature": 0}
        cases.append(("/v1/completions", body, ["--raw", "--prompt", w, "--max-new-tokens", str(n)]))
expect = []
for _, _, args in cases:
    out = subprocess.run([MMC, "generate", "--model", MODEL, "--greedy", "--json"] + args, capture_output=True,
                         text=True, check=True).stdout
    j = json.loads(out)
    expect.append((j["text"], j["new_tokens"]))
results = [None] * len(cases)


def client(i):
    path, body, _ = cases[i]
    try:
        results[i] = post(path, dict(body, stream_options={"include_usage": True}) if i % 2 else body, i % 2 == 1)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        results[i] = ("exception %s" % e, None)


threads = [threading.Thread(target=client, args=(i,)) for i in range(len(cases))]
for t in threads:
    t.start()
for t in threads:
    t.join(300)
for i, (exp, got) in enumerate(zip(expect, results)):
    check(got is not None and got[0] == exp[0] and got[1] == exp[1],
          "client %d (%s): served %r, mmc generate alone %r" % (i, cases[i][0], got, exp))
c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
c.request("GET", "/metrics")
metrics = c.getresponse().read().decode()
c.close()
pre = [float(l.split()[1]) for l in metrics.splitlines() if l.startswith("mmc_preemptions_total ")]
used = [float(l.split()[1]) for l in metrics.splitlines() if l.startswith("mmc_kv_blocks_in_use ")]
packed = [float(l.split()[1]) for l in metrics.splitlines() if l.startswith("mmc_packed_prefill_prompts_total ")]
check(pre, "mmc_preemptions_total in /metrics")
check(used == [0.0], "KV blocks in use after every request finished: %s" % used)
if EXPECT_PREEMPT:
    check(pre and pre[0] > 0, "no preemption happened with the tiny KV pool")
    # a request that cannot fit the whole pool is refused up front
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "hello", "max_tokens": 200}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    check(r.status == 400 and j["error"]["code"] == "context_length_exceeded" and j["error"]["param"] == "max_tokens",
          "a request larger than the KV pool: %s %s" % (r.status, j))
print("serve_batch_check: %d concurrent clients, %d equal to mmc generate; preemptions %s; prompts in packed "
      "prefills %s; %d failures" % (len(cases), sum(1 for e, g in zip(expect, results) if g == e),
                                    pre[0] if pre else "?", packed[0] if packed else "?", fails))
sys.exit(1 if fails else 0)
