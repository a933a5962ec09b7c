"""serve_prefix_check.py — prefix caching and chunked prefill in `mmc serve` (tests/test_serve_prefix.sh).
Chats sharing one long system prompt (about 240 tokens on the fixtures), sent one after another and then together, must each
get exactly `mmc generate --greedy --system ...`'s text and token count (the cached prefix changes nothing);
/metrics must then show prefix-cache hits covering most of the shared prompt (or none with
--expect-no-hits: the server runs with --no-prefix-cache), and with --expect-chunks more prefill passes
than prompts (--prefill-chunk). With IMAGE given, two chats with the same long system prompt and text but
different images (the fixture PNG and another of its size) must match `mmc generate` too and take the same
number of cached tokens (the system prompt's blocks; blocks holding an image are keyed by its content, so the
second image never takes the first's). Python's standard library only.
usage: serve_prefix_check.py PORT MMC MODEL IMAGE|- [--expect-no-hits] [--expect-chunks]"""
import base64
import http.client
import json
import subprocess
import sys
import threading

PORT, MMC, MODEL, IMG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
NO_HITS = "--expect-no-hits" in sys.argv
CHUNKS = "--expect-chunks" in sys.argv
fails = 0

SYSTEM = ("You are a careful assistant for a small shop that sells bicycles, helmets, lights and locks. " * 4).strip()
USERS = ["What lights do you sell?", "Do you repair flat tyres on Sundays?", "How much is a helmet?",
         "Tell me about locks."]


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def chat(messages, n):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    c.request("POST", "/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": n, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    if r.status != 200:
        return ("HTTP %d %s" % (r.status, j), None)
    return j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"], j["usage"]["prompt_tokens"]


def generate(user, n, image=None):
    args = [MMC, "generate", "--model", MODEL, "--greedy", "--json", "--system", SYSTEM, "--prompt", user,
            "--max-new-tokens", str(n)] + (["--image", image] if image else [])
    j = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    return j["text"], j["new_tokens"]


def metrics():
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    c.request("GET", "/metrics")
    m = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in m.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


expect = [generate(u, 12 + 3 * i) for i, u in enumerate(USERS)]
msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}] for u in USERS]
# one after another: the second and later find the first's blocks
seq = [chat(msgs[i], 12 + 3 * i) for i in range(2)]
for i, got in enumerate(seq):
    check(got[:2] == expect[i], "sequential chat %d: served %r, mmc generate alone %r" % (i, got[:2], expect[i]))
m1 = metrics()
prompt0 = seq[0][2] if len(seq[0]) > 2 else 0
if NO_HITS:
    check(m1.get("mmc_prefix_cache_hits_total") == 0, "hits with --no-prefix-cache: %s" % m1)
else:
    # the second chat's prompt shares all but its last user turn with the first: most of it is a hit
    hit = m1.get("mmc_prefix_cache_hits_total", 0)
    check(hit >= 0.8 * prompt0, "prefix-cache hits %s after two chats with a %d-token shared prompt" % (hit, prompt0))
# then all four at once
res = [None] * len(USERS)


def client(i):
    try:
        res[i] = chat(msgs[i], 12 + 3 * i)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        res[i] = ("exception %s" % e, None)


threads = [threading.Thread(target=client, args=(i,)) for i in range(len(USERS))]
for t in threads:
    t.start()
for t in threads:
    t.join(300)
for i, got in enumerate(res):
    check(got[:2] == expect[i], "concurrent chat %d: served %r, mmc generate alone %r" % (i, got[:2], expect[i]))
m2 = metrics()
if not NO_HITS:
    check(m2["mmc_prefix_cache_hits_total"] >= m1["mmc_prefix_cache_hits_total"] + 4 * 0.8 * prompt0,
          "four more chats with the cached system prompt: hits %s -> %s" % (m1["mmc_prefix_cache_hits_total"],
                                                                            m2["mmc_prefix_cache_hits_total"]))
if CHUNKS:
    check(m2["mmc_prefill_chunks_total"] > 6, "prefill passes with --prefill-chunk: %s" % m2["mmc_prefill_chunks_total"])
check(m2.get("mmc_kv_blocks_in_use") == 0, "KV blocks in use after every request finished: %s" % m2)
if IMG != "-":
    # the same long system prompt and text with two different images: never a cached prefix
    import os
    import tempfile
    import zlib
    import struct
    with open(IMG, "rb") as f:
        png = f.read()
    # a second image: the same size, its colours inverted (a valid PNG written here)
    w, h = struct.unpack(">II", png[16:24])
    rows = b"".join(b"\x00" + bytes((255 - ((x * 7 + y * 3) % 256)) for x in range(w * 3)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    png2 = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    tmp = tempfile.mkdtemp()
    img2 = os.path.join(tmp, "other.png")
    with open(img2, "wb") as f:
        f.write(png2)
    hits = [metrics()["mmc_prefix_cache_hits_total"]]
    for k, (path, data) in enumerate(((IMG, png), (img2, png2))):
        uri = "data:image/png;base64," + base64.b64encode(data).decode()
        m = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                          {"type": "text", "text": "What is in the picture?"}]}]
        got = chat(m, 10)
        exp = generate("What is in the picture?", 10, path)
        check(got[:2] == exp, "image chat %d: served %r, mmc generate alone %r" % (k, got[:2], exp))
        hits.append(metrics()["mmc_prefix_cache_hits_total"])
    # the blocks before the image (the cached system prompt) may be taken, never one holding the first
    # image's placeholders for the second image: both chats take the same number of cached tokens
    check(hits[2] - hits[1] == hits[1] - hits[0], "image prompts' hits %s: the second image took the first's blocks"
          % hits)
    os.unlink(img2)
    os.rmdir(tmp)
print("serve_prefix_check: %d chats equal to mmc generate; prefix-cache hits %s of %s prompt tokens looked up; "
      "prefill passes %s; %d failures" % (2 + len(USERS), m2.get("mmc_prefix_cache_hits_total"),
                                          m2.get("mmc_prefix_cache_queries_total"), m2.get("mmc_prefill_chunks_total"),
                                          fails))
sys.exit(1 if fails else 0)
