#!/usr/bin/env python3
"""serve_image_prefix_check.py — the prefix cache of image prompts in `mmc serve` (tests/test_serve_image_prefix.sh).
Server A caches (the default), server B is a fresh one with --no-prefix-cache (the uncached reference). On A: a
chat with an image (a data: URI) and a question, then the same image with another question: the second must take
cached blocks (prefix hits of at least one block) and run no vision encode (mmc_vision_encodes_total unchanged:
the image's features come from the encoder cache, its blocks from the prefix cache, keyed by the image's content
hash); then another image of the same size with the first question: one new encode, and it must not take the
first image's blocks (no more hits than the blocks before the image). Every answer (greedy) must equal B's for the
same request, token for token (text and count). Python's standard library only.
usage: serve_image_prefix_check.py PORT_A PORT_B IMAGE"""
import base64
import http.client
import json
import struct
import sys
import zlib

from serve_util import check, fails, metrics

PA, PB, IMG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def chat(port, png, question):
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": question}]}]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 10, "temperature": 0}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    c.close()
    if r.status != 200:
        return ("HTTP %d %s" % (r.status, j), None, None)
    return j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"], j["usage"]["prompt_tokens"]


with open(IMG, "rb") as f:
    png = f.read()
# another image of the same size (so the same placeholder ids): a gradient, as a PNG written here
w, h = struct.unpack(">II", png[16:24])
rows = b"".join(b"\x00" + bytes((x * 5 + y * 11) % 256 for x in range(w * 3)) for y in range(h))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png2 = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
    chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
Q1, Q2 = "What colour is the square?", "How many shapes are there?"
reqs = [(png, Q1), (png, Q2), (png2, Q1)]

m = [metrics(PA)]
got = []
for img, q in reqs:
    got.append(chat(PA, img, q))
    m.append(metrics(PA))
enc = [x["mmc_vision_encodes_total"] for x in m]
hit = [x["mmc_prefix_cache_hits_total"] for x in m]
check(enc[1] - enc[0] == 1, "first image chat: %d vision encodes (want 1)" % (enc[1] - enc[0]))
check(enc[2] == enc[1], "the same image again ran the vision tower: encodes %s" % enc)
check(hit[2] - hit[1] >= 16, "the same image again took %d cached tokens (want >= one 16-token block)"
      % (hit[2] - hit[1]))
check(enc[3] - enc[2] == 1, "another image: %d vision encodes (want 1)" % (enc[3] - enc[2]))
check(hit[3] - hit[2] < hit[2] - hit[1], "another image took %d cached tokens, as many as the same image (%d): "
      "its placeholders hit the first image's blocks" % (hit[3] - hit[2], hit[2] - hit[1]))
ref = [chat(PB, img, q) for img, q in reqs]
for k, (a, b) in enumerate(zip(got, ref)):
    check(a[:2] == b[:2] and a[1] == 10, "request %d: cached server %r, fresh --no-prefix-cache server %r" % (k, a, b))
print("serve_image_prefix_check: vision encodes %s, prefix hits %s over 3 image chats (prompt %s tokens); answers "
      "equal the uncached server's: %s" % (enc, hit, got[0][2], [a[:2] == b[:2] for a, b in zip(got, ref)]))
sys.exit(1 if fails else 0)
