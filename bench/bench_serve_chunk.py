"""bench_serve_chunk.py — the long-prompt scenario of bench/bench_serve.sh: C streaming clients decode
(greedy, max_tokens N, short prompts) while, once they are streaming, one more client sends a prompt of
about P tokens; reports the running streams' inter-token latency (p50, p99, max: a whole-prompt prefill
stalls them for its whole length, a chunked one for a chunk at a time) and the long prompt's time to first
token. Python's standard library only. usage: bench_serve_chunk.py PORT CLIENTS MAX_TOKENS PROMPT_TOKENS"""
import http.client
import json
import sys
import threading
import time

PORT, C, NTOK, P = (int(x) for x in sys.argv[1:5])


def stream(prompt, ntok, gaps, started=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=900)
    body = {"prompt": prompt, "max_tokens": ntok, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    last, first = None, None
    for line in c.getresponse():
        line = line.decode().rstrip("\n")
        if not line.startswith("data: {"):
            continue
        if any(ch.get("text") for ch in json.loads(line[6:])["choices"]):
            now = time.perf_counter()
            if first is None:
                first = now - t0
                if started:
                    started.release()
            else:
                gaps.append((now, now - last))
            last = now
    c.close()
    return first


def tokens(text):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    c.request("POST", "/v1/completions", json.dumps({"prompt": text, "max_tokens": 1}), {"Content-Type": "application/json"})
    n = json.loads(c.getresponse().read())["usage"]["prompt_tokens"]
    c.close()
    return n


unit = "A long document about the history of bicycles, chapter and verse, with many details. "
long_prompt = unit * max(1, P // tokens(unit))
stream("warm-up", 2, [])
gaps, started = [], threading.Semaphore(0)
threads = [threading.Thread(target=stream, args=("Stream %d: count slowly." % k, NTOK, gaps, started)) for k in range(C)]
for t in threads:
    t.start()
for _ in range(C):
    started.acquire()
time.sleep(0.5)
t_long = time.perf_counter()
ttft_long = stream(long_prompt, 1, [])
t_end = time.perf_counter()
for t in threads:
    t.join()
during = sorted(g for at, g in gaps if t_long <= at <= t_end + 0.5)
allg = sorted(g for _, g in gaps)
pct = lambda xs, p: xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")
print("long prompt of %d tokens: TTFT %.2f s; the %d streams' inter-token gaps while it was prefilled: %d, "
      "p50 %.3f s, max %.3f s; over the whole run: p50 %.3f s, p99 %.3f s, max %.3f s"
      % (tokens(long_prompt), ttft_long, C, len(during), pct(during, 50), during[-1] if during else float("nan"),
         pct(allg, 50), pct(allg, 99), allg[-1]), flush=True)
