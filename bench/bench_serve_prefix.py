"""bench_serve_prefix.py — the shared-prefix scenario of bench/bench_serve.sh: C concurrent clients, each
sending R streaming /v1/completions requests (greedy, max_tokens N) whose prompts share one long "system
prompt" of about P tokens and differ only in a short tail (a chat server's usual traffic: one system
prompt, many users). One untimed warm-up request with the shared prompt goes first (in steady state the
system prompt is cached). Reports output tokens/s, prompt tokens/s and p50 / p99 time to first token over
the level's wall time, and the server's prefix-cache counters from /metrics. Python's standard library.
usage: bench_serve_prefix.py PORT CLIENTS ROUNDS MAX_TOKENS PREFIX_TOKENS"""
import http.client
import json
import sys
import threading
import time

PORT, C, R, NTOK, P = (int(x) for x in sys.argv[1:6])


def post(prompt, ntok, stream=True):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900)
    body = {"prompt": prompt, "max_tokens": ntok, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        j = json.loads(r.read())
        c.close()
        return j["usage"]["prompt_tokens"]
    first, ntok_out, nprompt = None, 0, 0
    for line in r:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        o = json.loads(line[6:])
        if o.get("usage"):
            ntok_out, nprompt = o["usage"]["completion_tokens"], o["usage"]["prompt_tokens"]
        if first is None and any(ch.get("text") for ch in o["choices"]):
            first = time.perf_counter() - t0
    c.close()
    return first, ntok_out, nprompt


def metrics():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.request("GET", "/metrics")
    m = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            m[k] = float(v)
    c.close()
    return m


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


# a system prompt of about P tokens (measured through the server's tokenizer)
unit = "You are the support assistant of a bicycle shop; answer briefly and politely, in English. "
n_unit = max(1, post(unit, 1, stream=False) - 1)
system = unit * max(1, P // n_unit)
post(system + "Warm-up.", 1)
m0 = metrics()
res = []


def client(k):
    for r in range(R):
        res.append(post(system + "Customer %d asks question %d about item %d." % (k, r, k * 7 + r), NTOK))


threads = [threading.Thread(target=client, args=(k,)) for k in range(C)]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
m1 = metrics()
toks = sum(n for _, n, _ in res)
ptoks = sum(p for _, _, p in res)
ttft = [f for f, _, _ in res if f is not None]
hits = m1.get("mmc_prefix_cache_hits_total", 0) - m0.get("mmc_prefix_cache_hits_total", 0)
print("shared prefix: %d clients x %d requests, prompts of %d tokens (%d shared): %d output tokens in %.1f s: "
      "%.1f tok/s, %.0f prompt tok/s; TTFT p50 %.3f s p99 %.3f s; prompt tokens from the prefix cache %d of %d"
      % (C, R, ptoks // max(1, len(res)), n_unit * max(1, P // n_unit), toks, wall, toks / wall,
         ptoks / wall, pct(ttft, 50), pct(ttft, 99), hits, ptoks), flush=True)
print("RESULT %.3f %.4f %.4f" % (toks / wall, pct(ttft, 50), pct(ttft, 99)))
