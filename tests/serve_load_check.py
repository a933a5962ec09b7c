#!/usr/bin/env python3
"""serve_load_check.py — load and abuse checks of tests/test_serve_load.sh against a running `mmc serve`
(Python's standard library only; loopback). Usage:
    serve_load_check.py PORT PID MMC MODEL CLIENT_TIMEOUT MAX_CONNECTIONS [quick|long]
The server (pid PID) serves MODEL, the tiny Qwen2 of tests/fixtures/qwen2/chat with its context widened
to 16384 positions, with --client-timeout CLIENT_TIMEOUT and --max-connections MAX_CONNECTIONS.

Load: rounds of 1, 4, 16 and 64 concurrent clients, each level a fixed number of greedy streaming
/v1/completions requests (one in four not streamed) over 8 prompts of 8-29 new tokens; every answer must
equal `mmc generate --greedy --raw` alone on its prompt (text, token count, finish_reason) and every
stream end with [DONE]. After each round: no running sequence, no KV block in use, queue depth 0, and the
server's RSS (VmRSS of PID) is recorded; the first round is a warm-up (the allocator's arenas, the KV
pool's pages, MHD's threads), and the RSS after the last round may exceed the RSS after the first by at
most RSS_BOUND_MIB (below): a leak of one allocation per request or per streamed token (a few hundred
requests, several thousand tokens per round) would show.

Abuse, each followed by a normal request that must get its exact answer (the server keeps serving):
malformed JSON (12 bodies), wrong types and ranges (27 fields), a huge base64 image (3 MiB of base64
that is not an image; one with a byte outside the alphabet), a body over --max-body-bytes (413), a
truncated body (Content-Length larger than what is sent: closed by the server within the client
timeout, or on the client's half-close), slow-loris clients (headers or body trickled a byte at a time:
cut off within the client timeout while a normal request is served meanwhile), clients that leave
mid-stream (8 of 16 concurrent streams: generation cancelled, the other 8 exact), a ~10k-token prompt
(completed, equal to `mmc generate`) and a ~20k-token one (400 context_length_exceeded), and more
concurrent requests than --max-connections (503 too_many_connections for the extra ones, the others
served). Prints one line per failed check; exits 1 if any."""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

from serve_util import is_error, request

PORT, PID, MMC, MODEL = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
CLIENT_TIMEOUT, MAX_CONN = float(sys.argv[5]), int(sys.argv[6])
MODE = sys.argv[7] if len(sys.argv) > 7 else "quick"
SANITIZED = os.environ.get("MMC_SANITIZED", "0") in ("1", "ON", "TRUE", "true")
LEVELS = [1, 4, 16, 64]
# requests per level and rounds: quick ~20 s on 2 quiet cores, long (ctest label "demo") ~10x
REQS, ROUNDS = (256, 4) if MODE == "quick" else (1024, 8)
if SANITIZED:
    REQS, ROUNDS = 32, 3
# the RSS growth allowed between the end of round 1 and the end of the last round (MiB)
RSS_BOUND_MIB = 4
fails = []
n_checks = 0


def check(cond, what):
    global n_checks
    n_checks += 1
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr, flush=True)
    return cond


def conn(timeout=120):
    return http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)


def req(method, path, body=None, raw=None, timeout=120):
    return request(PORT, method, path, body=body, raw=raw, timeout=timeout)


def complete(prompt, max_tokens, stream, timeout=300):
    """a greedy /v1/completions: (text or None if incomplete, completion tokens, finish_reason)"""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    c = conn(timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out = r.read()
        c.close()
        return None, r.status, out[:200]
    if not stream:
        j = json.loads(r.read())
        c.close()
        ch = j["choices"][0]
        return ch["text"], j["usage"]["completion_tokens"], ch["finish_reason"]
    text, n, fin, done = "", None, None, False
    for line in r:
        line = line.decode().rstrip("\n")
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            o = json.loads(line[6:])
            if o.get("usage"):
                n = o["usage"]["completion_tokens"]
            for ch in o["choices"]:
                text += ch.get("text", "")
                fin = ch.get("finish_reason") or fin
    c.close()
    return (text if done else None), n, fin


def generate(prompt, n):
    out = subprocess.run([MMC, "generate", "--model", MODEL, "--greedy", "--json", "--raw", "--prompt", prompt,
                          "--max-new-tokens", str(n)], capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    # finish: "length" when all n were generated, else the model stopped (EOS)
    return j["text"], j["new_tokens"], "length" if j["new_tokens"] == n else "stop", j["prompt_tokens"]


def metric(name):
    _, _, out = req("GET", "/metrics")
    for line in out.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_idle(seconds=10):
    t0 = time.time()
    while time.time() - t0 < seconds:
        if metric("mmc_queue_depth") == 0 and metric("mmc_running_sequences") == 0 and \
                metric("mmc_kv_blocks_in_use") == 0:
            return True
        time.sleep(0.05)
    return False


def rss_kib():
    with open("/proc/%d/status" % PID) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


PROMPTS = ["alpha", "beta gamma", "The quick brown fox", "1 2 3 4 5", "Hello, who are you?",
           "zeta eta theta iota kappa", "Once upon a time, in a land far away,", "x"]
NTOK = [8 + 3 * i for i in range(len(PROMPTS))]
REF = [generate(p, n)[:3] for p, n in zip(PROMPTS, NTOK)]


def normal(what):
    """one plain request after an abuse case: the server still answers, exactly"""
    try:
        got = complete(PROMPTS[2], NTOK[2], True, timeout=60)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        got = ("exception %s" % e,)
    return check(got == REF[2], "a normal request after %s: %r, expected %r" % (what, got, REF[2]))


# ------------------------------------------------------------------------------------------ load
def level(C, reqs):
    res, lock = [], threading.Lock()

    def client(k):
        for r in range(k, reqs, C):
            i = r % len(PROMPTS)
            try:
                got = complete(PROMPTS[i], NTOK[i], r % 4 != 3)
            except Exception as e:  # noqa: BLE001
                got = ("exception %s" % e,)
            with lock:
                res.append((i, got))

    ts = [threading.Thread(target=client, args=(k,)) for k in range(C)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    wall = time.time() - t0
    bad = [(i, g) for i, g in res if g != REF[i]]
    check(len(res) == reqs and not bad, "%d clients: %d of %d answers, %d wrong, e.g. %r" %
          (C, len(res), reqs, len(bad), bad[:2]))
    return wall


rss = []
t_load = time.time()
cut0 = metric("mmc_client_timeouts_total")
for rnd in range(ROUNDS):
    walls = [level(C, REQS) for C in LEVELS]
    check(wait_idle(), "round %d: the engine is not idle afterwards (queue %s, running %s, KV blocks %s)" %
          (rnd, metric("mmc_queue_depth"), metric("mmc_running_sequences"), metric("mmc_kv_blocks_in_use")))
    rss.append(rss_kib())
    print("serve_load_check: round %d: %s requests at 1/4/16/64 clients in %s s; RSS %.1f MiB" %
          (rnd, REQS, "/".join("%.1f" % w for w in walls), rss[-1] / 1024), flush=True)
cut = metric("mmc_client_timeouts_total") - cut0
check(cut == 0, "%d clients of the load rounds were cut off by --client-timeout %g" % (cut, CLIENT_TIMEOUT))
grow = (rss[-1] - rss[0]) / 1024
# (under ASan its quarantine holds freed memory: there LeakSanitizer checks for leaks at exit)
check(SANITIZED or grow <= RSS_BOUND_MIB, "RSS grew %.1f MiB from round 1 to round %d (bound %d MiB): %s KiB" %
      (grow, ROUNDS, RSS_BOUND_MIB, rss))
print("serve_load_check: %d requests in %.1f s, RSS after each round (MiB): %s; growth after round 1: %.2f MiB "
      "(%s)" % (ROUNDS * REQS * len(LEVELS), time.time() - t_load, " ".join("%.1f" % (r / 1024) for r in rss), grow,
                "not bounded under ASan" if SANITIZED else "bound %d" % RSS_BOUND_MIB), flush=True)

# ----------------------------------------------------------------------------- malformed JSON
for raw in [b"", b"{", b'{"prompt": "x",}', b"\xff\xfe\x00{", b"null", b"[]", b'"prompt"', b"42",
            b'{"prompt": "a\x00b"}', b'{"prompt": "x", "max_tokens": 1e999}', b'{"prompt": NaN}',
            b'{"prompt": "x"} trailing']:
    for path in ("/v1/completions", "/v1/chat/completions"):
        s, j, out = req("POST", path, raw=raw)
        check(s == 400 and is_error(j), "malformed %r to %s: %s %r" % (raw[:40], path, s, out[:200]))
normal("malformed JSON")

# ----------------------------------------------------------------------------- wrong types
cmpl = {"prompt": "x", "max_tokens": 2}
chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
wrong = [("prompt", 5, cmpl), ("prompt", None, cmpl), ("prompt", {"a": 1}, cmpl), ("max_tokens", "8", cmpl),
         ("max_tokens", -1, cmpl), ("max_tokens", 0, cmpl), ("max_tokens", 1.5, cmpl), ("max_tokens", True, cmpl),
         ("max_tokens", 10 ** 30, cmpl), ("temperature", "hot", cmpl), ("temperature", -1, cmpl),
         ("top_p", 5, cmpl), ("top_k", "x", cmpl), ("seed", "s", cmpl), ("n", 0, cmpl), ("n", 10 ** 6, cmpl),
         ("stop", 7, cmpl), ("stop", [1, 2], cmpl), ("stream", "yes", cmpl), ("stream_options", 5, cmpl),
         ("logprobs", "many", cmpl), ("presence_penalty", 9, cmpl),
         ("messages", "hi", chat), ("messages", {}, chat), ("messages", [1], chat),
         ("messages", [{"role": 5, "content": "hi"}], chat), ("messages", [{"role": "user", "content": 5}], chat),
         ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], chat),
         ("messages", [{"role": "user", "content": [{"type": "bogus", "text": "x"}]}], chat),
         ("messages", [{"role": "wizard", "content": "hi"}], chat), ("top_logprobs", 100, chat),
         ("response_format", "json", chat), ("tools", 5, chat)]
for field, val, base in wrong:
    path = "/v1/chat/completions" if "messages" in base else "/v1/completions"
    s, j, out = req("POST", path, dict(base, **{field: val}))
    check(s == 400 and is_error(j) and (j["error"]["param"] or "").split(".")[0].split("[")[0] == field,
          "%s=%r: %s %r" % (field, val, s, out[:200]))
normal("wrong types")

# ----------------------------------------------------------------------------- huge base64 / big bodies
junk = b"QUJD" * (3 << 18)   # 3 MiB of base64 ("ABC" repeated): not an image
for uri, what in [(b"data:image/png;base64," + junk, "3 MiB of base64 that is no image"),
                  (b"data:image/png;base64," + junk[:100000] + b"*" + junk[:1000], "base64 with a '*'")]:
    body = b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "' + uri + \
        b'"}}, {"type": "text", "text": "x"}]}], "max_tokens": 2}'
    s, j, out = req("POST", "/v1/chat/completions", raw=body)
    check(s == 400 and is_error(j), "%s: %s %r" % (what, s, out[:200]))
sk = socket.create_connection(("127.0.0.1", PORT), timeout=30)   # the server answers before the body is sent
try:
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (5 << 20) + b'{"prompt": "' + b"x" * (5 << 20))
except OSError:
    pass
data = b""
while True:
    try:
        b = sk.recv(65536)
    except OSError:
        break
    if not b:
        break
    data += b
sk.close()
head, _, rest = data.partition(b"\r\n\r\n")
try:
    j = json.loads(rest)
except ValueError:
    j = None
check(head.startswith(b"HTTP/1.1 413") and is_error(j, code="request_too_large"), "a 5 MiB body: %r" % data[:300])
normal("huge base64")


# ----------------------------------------------------------------------------- truncated bodies, slow loris
def open_raw(head, body=b""):
    sk = socket.create_connection(("127.0.0.1", PORT), timeout=CLIENT_TIMEOUT + 10)
    sk.sendall(head + body)
    return sk


def closed_within(sk, seconds):
    """the server closes the connection (EOF or reset) within seconds, sending no 2xx: (closed, data)"""
    t0, data = time.time(), b""
    sk.settimeout(0.2)
    while time.time() - t0 < seconds:
        try:
            b = sk.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return True, data
        if not b:
            return True, data
        data += b
    return False, data


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
t0 = metric("mmc_client_timeouts_total")
# announced 1000 bytes, sent 20 and then nothing: closed at the client timeout
sk = open_raw(HEAD + b"Content-Length: 1000\r\n\r\n", b'{"prompt": "abcdefgh')
closed, data = closed_within(sk, CLIENT_TIMEOUT + 5)
check(closed and b" 200 " not in data[:20], "a truncated body (1000 announced, 20 sent) not closed: %r" % data[:80])
sk.close()
# the same, then the client half-closes: the server drops the request at once, answers nothing
sk = open_raw(HEAD + b"Content-Length: 1000\r\n\r\n", b'{"prompt": "abcdefgh')
sk.shutdown(socket.SHUT_WR)
closed, data = closed_within(sk, CLIENT_TIMEOUT + 5)
check(closed and b" 200 " not in data[:20], "a half-closed truncated body not closed: %r" % data[:80])
sk.close()
normal("truncated bodies")

# slow loris: 8 clients trickling headers, 4 trickling a body, one byte every 0.3 s for longer than the
# timeout; meanwhile normal requests are served; each loris is cut off within the timeout (+ slack)
LORIS = 12
results = [None] * LORIS


def loris(k):
    head = HEAD + b"Content-Length: 40\r\n" if k >= 8 else b""
    try:
        sk = socket.create_connection(("127.0.0.1", PORT), timeout=5)
        if k >= 8:
            sk.sendall(head + b"\r\n")
        t0 = time.time()
        msg = b'{"prompt": "slow", "max_tokens": 2}    ' if k >= 8 else HEAD + b"X-Slow: " + b"a" * 200 + b"\r\n"
        for i in range(len(msg)):
            sk.sendall(msg[i:i + 1])
            time.sleep(0.3)
            if time.time() - t0 > CLIENT_TIMEOUT * 3 + 10:
                break
        results[k] = ("not cut off after %.1f s" % (time.time() - t0), time.time() - t0)
    except OSError as e:
        results[k] = ("cut", time.time() - t0, str(e))


ts = [threading.Thread(target=loris, args=(k,)) for k in range(LORIS)]
for t in ts:
    t.start()
time.sleep(0.5)
normal("slow-loris clients connected")
for t in ts:
    t.join(CLIENT_TIMEOUT * 3 + 20)
for k, r in enumerate(results):
    check(r is not None and r[0] == "cut" and r[1] < CLIENT_TIMEOUT + 3,
          "slow-loris client %d (%s): %r" % (k, "body" if k >= 8 else "headers", r))
cut = metric("mmc_client_timeouts_total") - t0
check(cut >= LORIS + 1, "mmc_client_timeouts_total counted %s of the %d slow clients" % (cut, LORIS + 1))
normal("slow-loris clients")
print("serve_load_check: %d slow clients cut off after %s s (client timeout %g s)" %
      (LORIS, "/".join("%.1f" % r[1] for r in results if r), CLIENT_TIMEOUT), flush=True)

# ----------------------------------------------------------------------------- disconnects mid-stream
before = metric("mmc_completion_tokens_total")
res = [None] * 16


def leaver(k):
    body = json.dumps({"prompt": PROMPTS[k % 8], "max_tokens": 1500 if k % 2 else NTOK[k % 8], "temperature": 0,
                       "stream": True}).encode()
    if k % 2 == 0:
        try:
            res[k] = complete(PROMPTS[k % 8], NTOK[k % 8], True)
        except Exception as e:  # noqa: BLE001
            res[k] = ("exception %s" % e,)
        return
    sk = socket.create_connection(("127.0.0.1", PORT), timeout=60)
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
    data = b""
    while b'"text"' not in data:
        b = sk.recv(4096)
        if not b:
            break
        data += b
    sk.close()
    res[k] = b" 200 " in data[:20] and b'"text"' in data


ts = [threading.Thread(target=leaver, args=(k,)) for k in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join(300)
for k in range(16):
    if k % 2 == 0:
        check(res[k] == REF[k % 8], "a stream beside clients that left: %r, expected %r" % (res[k], REF[k % 8]))
    else:
        check(res[k] is True, "a client leaving mid-stream did not get its stream started: %r" % (res[k],))
check(wait_idle(), "after 8 clients left mid-stream: not idle (running %s, KV blocks %s)" %
      (metric("mmc_running_sequences"), metric("mmc_kv_blocks_in_use")))
gen = metric("mmc_completion_tokens_total") - before
check(gen < 8 * 1500, "the 8 clients that left were not cancelled: %d tokens generated" % gen)
print("serve_load_check: 8 streams left mid-stream: %d tokens generated in all (uncancelled: > %d)" %
      (gen, 8 * 1500), flush=True)
normal("disconnects mid-stream")

# ----------------------------------------------------------------------------- long prompts
words = " ".join("w%d" % (i % 97) for i in range(2600))
text, ntok, fin, n_prompt = generate(words, 4)
got = complete(words, 4, True)
check(got == (text, ntok, fin), "a %d-token prompt: %r, mmc generate %r" % (n_prompt, got, (text, ntok, fin)))
s, j, out = req("POST", "/v1/completions", {"prompt": words + " " + words, "max_tokens": 4})
check(s == 400 and is_error(j, code="context_length_exceeded"), "a ~%d-token prompt over the 16384 context: %s %r" %
      (2 * n_prompt, s, out[:200]))
print("serve_load_check: a %d-token prompt completed; a ~%d-token one refused (%d)" % (n_prompt, 2 * n_prompt, s),
      flush=True)
normal("long prompts")

# ----------------------------------------------------------------------------- too many connections
# MAX_CONN streams of 2000 tokens hold every slot; 8 more requests meanwhile each get 503
# too_many_connections (or are refused at accept beyond MAX_CONN + 16); then the holders leave
# (their generations cancelled) and the server serves again
holders, started = [], 0
stop_reading = threading.Event()
for k in range(MAX_CONN):
    body = json.dumps({"prompt": PROMPTS[k % 8], "max_tokens": 2000, "temperature": 0, "stream": True}).encode()
    sk = socket.create_connection(("127.0.0.1", PORT), timeout=60)
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
    holders.append(sk)


def drain(sk, out, streaming):
    """Read one holder's stream; release `streaming` once, when its first token arrives (releasing
    on every later read let a few fast streams stand in for the slow ones, and the wait below
    ended before every holder had streamed: seen under ASan)."""
    data, seen = b"", False
    sk.settimeout(0.2)
    while not stop_reading.is_set():
        try:
            b = sk.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not b:
            break
        if len(data) < 4096:
            data += b
            if not seen and b'"text"' in data:
                seen = True
                streaming.release()
    out.append(data)


heads, streaming = [], threading.Semaphore(0)
readers = [threading.Thread(target=drain, args=(sk, heads, streaming)) for sk in holders]
for t in readers:
    t.start()
t0 = time.time()
while req("GET", "/health")[0] != 503 and time.time() - t0 < 30:   # every slot held: /health gets a 503 too
    time.sleep(0.05)
extra = []
for _ in range(8):
    try:
        s, j, out = req("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=30)
        extra.append((s, j["error"]["code"] if is_error(j) else out[:100]))
    except OSError as e:
        extra.append(("refused", str(e)))
for _ in range(MAX_CONN):   # the holders all stream (each in the batch: --max-batch above MAX_CONN)
    if not streaming.acquire(timeout=120):
        break
stop_reading.set()
for t in readers:
    t.join(30)
for sk in holders:
    sk.close()
check(all(e == (503, "too_many_connections") or e[0] == "refused" for e in extra) and
      any(e[0] == 503 for e in extra), "requests beyond --max-connections %d: %r" % (MAX_CONN, extra))
check(len(heads) == MAX_CONN and all(h.startswith(b"HTTP/1.1 200") and b'"text"' in h for h in heads),
      "the %d streams holding the connections: %d streaming" %
      (MAX_CONN, sum(h.startswith(b"HTTP/1.1 200") for h in heads)))
check(wait_idle(), "after the connection flood: not idle (running %s)" % metric("mmc_running_sequences"))
print("serve_load_check: %d streams held every connection: %d extra requests got 503, %d were refused at accept" %
      (MAX_CONN, sum(e[0] == 503 for e in extra), sum(e[0] == "refused" for e in extra)), flush=True)
normal("too many connections")

print("serve_load_check: %d checks, %d failed" % (n_checks, len(fails)))
sys.exit(1 if fails else 0)
