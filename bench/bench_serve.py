"""bench_serve.py — load generator for `mmc serve` (bench/bench_serve.sh), Python's standard library only:
C concurrent clients, each sending R streaming /v1/completions requests one after another (greedy,
max_tokens N, its own prompt) after one untimed warm-up request; reports output tokens/s over the
level's wall time, and p50 / p99 of the time to first token and of the inter-token latency (the gaps
between streamed chunks: a chunk may carry several tokens when the detokenizer held back an incomplete
character, so these are per chunk). The completion tokens are the server's usage count when it sends one
(stream_options.include_usage), else the number of streamed chunks before the one with the finish_reason
(llama-cpp-python's server: one a token, now and then two), at most max_tokens. Also the time per output token of each request, vLLM's TPOT: (time of
its last token - time of its first) / (tokens - 1), which does not depend on how tokens are grouped into
chunks. Works against any OpenAI-compatible server (bench_serve.sh runs it on llama-cpp-python's too); a
last line per level "RESULT clients requests tokens wall tok/s ttft_p50 ttft_p99 itl_p50 itl_p99 tpot_p50
tpot_p99" for scripts.
usage: bench_serve.py PORT LEVELS(1,4,16) ROUNDS MAX_TOKENS   (MIN_REQUESTS=N: each level at least N requests)"""
import http.client
import json
import os
import sys
import threading
import time

PORT, LEVELS, ROUNDS, NTOK = int(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
MIN_REQUESTS = int(os.environ.get("MIN_REQUESTS", "0"))   # per level at least (1 client: that many in a row)


def one(prompt, out):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    body = {"prompt": prompt, "max_tokens": NTOK, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    first, last, gaps, ntok, nchunk = None, None, [], None, 0
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        o = json.loads(line[6:])
        now = time.perf_counter()
        if o.get("usage"):
            ntok = o["usage"]["completion_tokens"]
        if o.get("choices") and not any(ch.get("finish_reason") for ch in o["choices"]):
            nchunk += 1
        if any(ch.get("text") for ch in o["choices"]):
            if first is None:
                first = now - t0
            else:
                gaps.append(now - last)
            last = now
    c.close()
    n = ntok if ntok is not None else min(nchunk, NTOK)   # llama-cpp-python may split a token's text in two
    tpot = (last - t0 - first) / (n - 1) if first is not None and n > 1 else None
    out.append((first, gaps, n, tpot))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


one("warm-up: the weights' pages and the KV pool's first blocks are touched here, untimed", [])
rows = []
for C in LEVELS:
    res = []

    def client(k):
        for r in range(max(ROUNDS, -(-MIN_REQUESTS // C))):
            one("Request %d from client %d: tell me a story about the number %d." % (r, k, k * 7 + r), res)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(C)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    toks = sum(r[2] for r in res)
    ttft = [r[0] for r in res if r[0] is not None]
    itl = [g for r in res for g in r[1]]
    tpot = [r[3] for r in res if r[3] is not None]
    rows.append((C, len(res), toks, wall, toks / wall, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99),
                 pct(tpot, 50), pct(tpot, 99)))
    print("clients %2d: %3d requests, %5d tokens in %6.1f s: %7.1f tok/s; TTFT p50 %6.3f s p99 %6.3f s; "
          "ITL p50 %6.4f s p99 %6.4f s; TPOT p50 %6.4f s p99 %6.4f s" % rows[-1], flush=True)
    print("RESULT %d %d %d %.6f %.6f %.6f %.6f %.6f %.6f %.6f %.6f" % rows[-1], flush=True)
base = rows[0][4]
for r in rows[1:]:
    print("throughput at %d clients / at %d: %.2fx" % (r[0], rows[0][0], r[4] / base))
