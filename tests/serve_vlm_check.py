#!/usr/bin/env python3
"""serve_vlm_check.py — the image prefix cache and per-request LoRA of `mmc serve` on one VLM family
(tests/test_serve_vlm.sh). Server A caches (the default), server B is a fresh --no-prefix-cache one, both
with --lora a=DIR. Checks, every answer greedy, token for token (text and count) against B's for the same
request:
  - two images in one prompt (the given image and a gradient of its size), twice: the second time takes
    every full block of the prompt from the cache (both images' placeholders) and runs no vision encode;
  - the adapter "a" on the image and the fixture question: the answer equals `mmc generate --adapter`'s
    (CASES_JSON; the test compared those ids with transformers + PEFT's) and runs its own vision encode (the
    encoder cache is kept per adapter); then "a" on the same image with another question: cached blocks,
    no encode; then base and "a" at once (one continuous batch).
Python's standard library only.
usage: serve_vlm_check.py PORT_A PORT_B IMAGE CASES_JSON"""
import base64
import http.client
import json
import struct
import sys
import threading
import zlib

from serve_util import check, fails, metrics

PA, PB, IMG, CASES = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.load(open(sys.argv[4]))


prompt_tokens = {}


def chat(port, model, pngs, question, max_tokens):
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(p).decode()}}
               for p in pngs] + [{"type": "text", "text": question}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    if r.status != 200:
        return ("HTTP %d %s" % (r.status, j), None)
    prompt_tokens[port] = j["usage"]["prompt_tokens"]
    return j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"]


with open(IMG, "rb") as f:
    png = f.read()
w, h = struct.unpack(">II", png[16:24])
rows = b"".join(b"\x00" + bytes((x * 7 + y * 3) % 256 for x in range(w * 3)) for y in range(h))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png2 = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
    chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
BASE = CASES["base_id"]
Q1, Q2 = CASES["question"], "How many shapes are there?"


def m():
    x = metrics(PA)
    return x["mmc_vision_encodes_total"], x["mmc_prefix_cache_hits_total"]


def same(req, got):
    ref = chat(PB, *req)
    check(got == ref and got[1] == req[-1], "%s: cached server %r, fresh --no-prefix-cache server %r"
          % (req[:2] + (req[3],), got, ref))


# two images in one prompt, twice
req = (BASE, [png, png2], Q1, 8)
e0, h0 = m()
got = chat(PA, *req)
e1, h1 = m()
got2 = chat(PA, *req)
e2, h2 = m()
check(e1 - e0 == 1 and e2 == e1, "two images: vision encodes %s (want one, then none)" % [e0, e1, e2])
full = (prompt_tokens[PA] - 1) // 16 * 16   # every full block but one holding the last token
check(h2 - h1 == full, "two images again took %d cached tokens of %d (want %d: every full block before the last token)"
      % (h2 - h1, prompt_tokens[PA], full))
check(got == got2, "two images: the cached answer %r != the first %r" % (got2, got))
same(req, got)

# the adapter: as mmc generate --adapter (= transformers + PEFT), its own encode, then cached
n = len(CASES["lora_tokens"])
got = chat(PA, "a", [png], Q1, n)
e3, h3 = m()
check(got == (CASES["lora_text"], n), "a: %r != mmc generate --adapter's %r (%d tokens)" % (got, CASES["lora_text"], n))
check(e3 - e2 == 1, "a: %d vision encodes (want 1: the base's features are not the adapter's)" % (e3 - e2))
same(("a", [png], Q1, n), got)
got = chat(PA, "a", [png], Q2, n)
e4, h4 = m()
check(e4 == e3 and h4 - h3 >= 16, "a again, another question: encodes %s, %d cached tokens" % ([e3, e4], h4 - h3))
same(("a", [png], Q2, n), got)

# base and adapter in one batch
reqs = [(BASE, [png], Q1, n), ("a", [png], Q1, n), (BASE, [png2], Q2, n), ("a", [png2], Q2, n)] * 2
out = [None] * len(reqs)
ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, chat(PA, *reqs[i]))) for i in range(len(reqs))]
for t in ts:
    t.start()
for t in ts:
    t.join()
for r, g in zip(reqs, out):
    same(r, g)
print("serve_vlm_check: vision encodes %s, prefix hits %s; %d answers equal the uncached server's%s"
      % ([e0, e1, e2, e3, e4], [h0, h1, h2, h3, h4], 5 + len(reqs), "" if not fails else " (%d FAILED)" % len(fails)))
sys.exit(1 if fails else 0)
