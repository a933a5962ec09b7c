#!/usr/bin/env python3
"""serve_check.py — the HTTP checks of tests/test_serve.sh against a running `mmc serve`
(Python's standard library only: http.client, json, threading). Usage:
    serve_check.py PORT API_KEY MMC MODEL_DIR IMAGE
The server runs with --api-key API_KEY --media-root (IMAGE's folder) --max-images 2
--max-body-bytes 1048576. Greedy answers are compared with `mmc generate --json` on the same
prompt and image; prints one line per failed check, exits 1 if any."""
import base64, http.client, json, os, socket, subprocess, sys, threading, time

from serve_util import is_error, request

PORT, KEY, MMC, MODEL, IMG = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
PORT = int(PORT)
fails = []
n_checks = 0


def check(cond, what):
    global n_checks
    n_checks += 1
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr)


def req(method, path, body=None, key=KEY, raw=None, headers=None, timeout=120):
    h = {"Authorization": "Bearer " + key} if key else {}
    h.update(headers or {})
    return request(PORT, method, path, body=body, raw=raw, headers=h, timeout=timeout)


def stream(body, key=KEY):
    """POST a streaming chat request: (status, list of parsed chunks, saw [DONE])."""
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/chat/completions" if "messages" in body else "/v1/completions",
              body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    r = c.getresponse()
    chunks, done = [], False
    if r.status != 200:
        return r.status, json.loads(r.read()), False
    check(r.getheader("Content-Type", "").startswith("text/event-stream"), "stream content type")
    for line in r:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        check(not done, "a chunk after [DONE]")
        chunks.append(json.loads(line[6:]))
    c.close()
    return 200, chunks, done


def gen(prompt, image=None, n=8):
    cmd = [MMC, "generate", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", str(n), "--greedy", "--json"]
    if image:
        cmd += ["--image", image]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


with open(IMG, "rb") as f:
    IMG_URI = "data:image/png;base64," + base64.b64encode(f.read()).decode()
PROMPT = "What colour is the square?"


def chat_body(prompt=PROMPT, image=IMG_URI, **kw):
    content = [{"type": "text", "text": prompt}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": image}})
    return dict({"model": os.path.basename(MODEL), "messages": [{"role": "user", "content": content}],
                 "max_tokens": 8, "temperature": 0}, **kw)


# --- health, models, auth
s, j, _ = req("GET", "/health", key=None)
check(s == 200 and j == {"status": "ok"}, "GET /health without a key: %s %s" % (s, j))
s, j, _ = req("GET", "/v1/models")
check(s == 200 and j["object"] == "list" and j["data"][0]["id"] == os.path.basename(MODEL)
      and j["data"][0]["object"] == "model", "GET /v1/models: %s %s" % (s, j))
for path, method in [("/v1/models", "GET"), ("/metrics", "GET"), ("/v1/chat/completions", "POST")]:
    s, j, _ = req(method, path, chat_body() if method == "POST" else None, key=None)
    check(s == 401 and is_error(j, code="invalid_api_key"), "%s %s without a key: %s %s" % (method, path, s, j))
s, j, _ = req("GET", "/v1/models", key="wrong")
check(s == 401 and is_error(j), "a wrong key: %s" % s)

# --- greedy chat with an image == mmc generate
ref = gen(PROMPT, IMG)
s, j, _ = req("POST", "/v1/chat/completions", chat_body())
check(s == 200, "chat completion status %s %s" % (s, j))
if s == 200:
    ch = j["choices"][0]
    check(j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-") and isinstance(j["created"], int)
          and j["model"] == os.path.basename(MODEL), "chat completion envelope %s" % j)
    check(ch["message"]["role"] == "assistant" and ch["message"]["content"] == ref["text"],
          "served '%s' != mmc generate '%s'" % (ch["message"]["content"], ref["text"]))
    check(ch["finish_reason"] == "length" and ch["index"] == 0, "finish_reason %s" % ch["finish_reason"])
    check(j["usage"] == {"prompt_tokens": ref["prompt_tokens"], "completion_tokens": ref["new_tokens"],
                         "total_tokens": ref["prompt_tokens"] + ref["new_tokens"]}, "usage %s" % j["usage"])
# the same image as a local path under --media-root
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image=os.path.basename(IMG)))
check(s == 200 and j["choices"][0]["message"]["content"] == ref["text"], "media-root path: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image="/etc/passwd"))
check(s == 400 and is_error(j, code="invalid_image_url"), "a path outside the media root: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image="https://example.com/a.png"))
check(s == 400 and is_error(j, code="invalid_image_url"), "an http image URL: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image="data:image/png;base64,!!!!"))
check(s == 400 and is_error(j), "bad base64: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image="data:image/png;base64,aGVsbG8gd29ybGQ="))
check(s == 400 and is_error(j, code="invalid_image"), "not an image: %s %s" % (s, j))

# --- streaming: the chunks concatenate to the same text, then [DONE]
s, chunks, done = stream(chat_body(stream_options={"include_usage": True}))
check(s == 200 and done, "stream status %s, [DONE] %s" % (s, done))
if s == 200 and chunks:
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check(text == ref["text"], "streamed '%s' != '%s'" % (text, ref["text"]))
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first chunk has no role")
    check(all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks), "chunk ids")
    fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    check(fin == ["length"], "finish reasons %s" % fin)
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8, "usage chunk %s" % chunks[-1])
    check(all(c["usage"] is None for c in chunks[:-1]), "usage null before the last chunk")

# --- stop sequences (non-streaming and streaming)
full = ref["text"]
k = len(full) // 2
stop = full[k:k + 2]
want = full[:full.find(stop)]
s, j, _ = req("POST", "/v1/chat/completions", chat_body(stop=[stop, "\x01never"]))
check(s == 200 and j["choices"][0]["message"]["content"] == want and j["choices"][0]["finish_reason"] == "stop",
      "stop %r: got %s, want %r" % (stop, j, want))
s, chunks, done = stream(chat_body(stop=stop))
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) if s == 200 else None
check(text == want and done, "streamed stop %r: %r, want %r" % (stop, text, want))

# --- n=2 with a seed: reproducible, choice 0 equals n=1 with the same seed
body = chat_body(image=None, n=2, seed=1234, temperature=1.0, max_tokens=12)
s1, j1, _ = req("POST", "/v1/chat/completions", body)
s2, j2, _ = req("POST", "/v1/chat/completions", body)
s3, j3, _ = req("POST", "/v1/chat/completions", dict(body, n=1))
if s1 == 200 and s2 == 200 and s3 == 200:
    t1 = [c["message"]["content"] for c in j1["choices"]]
    t2 = [c["message"]["content"] for c in j2["choices"]]
    check(len(t1) == 2 and [c["index"] for c in j1["choices"]] == [0, 1], "n=2 choices %s" % j1["choices"])
    check(t1 == t2, "n=2 seed 1234 not reproducible: %s vs %s" % (t1, t2))
    check(j3["choices"][0]["message"]["content"] == t1[0], "n=1 seed 1234 != choice 0 of n=2")
    check(j1["usage"]["completion_tokens"] == sum(1 for _ in range(0)) or j1["usage"]["completion_tokens"] > 0, "usage n=2")
else:
    check(False, "n=2 status %s %s %s" % (s1, s2, s3))

# --- sampling (temperature 1, a seed) draws what `mmc generate --temperature 1 --seed S` draws
sref = json.loads(subprocess.run([MMC, "generate", "--model", MODEL, "--prompt", "Tell a story.", "--max-new-tokens",
                                  "16", "--temperature", "1", "--seed", "77", "--json"],
                                 capture_output=True, text=True, check=True).stdout)
s, j, _ = req("POST", "/v1/chat/completions", chat_body("Tell a story.", image=None, temperature=1, seed=77, max_tokens=16))
check(s == 200 and j["choices"][0]["message"]["content"] == sref["text"],
      "sampled with seed 77: %r != mmc generate's %r" % (j["choices"][0]["message"]["content"] if s == 200 else j, sref["text"]))

# --- completions and logprobs
s, j, _ = req("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0, "logprobs": 2})
check(s == 200 and j["object"] == "text_completion" and j["id"].startswith("cmpl-")
      and len(j["choices"][0]["logprobs"]["tokens"]) == 4
      and all(len(t) == 2 for t in j["choices"][0]["logprobs"]["top_logprobs"]), "completions %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image=None, logprobs=True, top_logprobs=3, max_tokens=3))
if s == 200:
    lp = j["choices"][0]["logprobs"]["content"]
    check(len(lp) == 3 and all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in lp)
          and all(abs(e["logprob"] - e["top_logprobs"][0]["logprob"]) < 1e-6 for e in lp), "greedy logprobs %s" % lp)
else:
    check(False, "logprobs status %s %s" % (s, j))

# --- malformed requests
s, j, _ = req("POST", "/v1/chat/completions", raw=b'{"messages": [')
check(s == 400 and is_error(j), "malformed JSON: %s %s" % (s, j))
for field, val in [("max_tokens", "8"), ("temperature", "hot"), ("messages", "hi"), ("n", 1.5), ("stream", 1),
                   ("stop", 7), ("top_p", 5)]:
    s, j, _ = req("POST", "/v1/chat/completions", chat_body(**{field: val}))
    check(s == 400 and is_error(j, param=field), "%s=%r: %s %s" % (field, val, s, j))
# (response_format and tools are served: tests/test_serve_json.sh, tests/test_serve_tools.sh)
for field, val in [("logit_bias", {"1": 5})]:
    s, j, _ = req("POST", "/v1/chat/completions", chat_body(**{field: val}))
    check(s == 400 and is_error(j, param=field, code="unsupported_parameter"), "%s=%r: %s %s" % (field, val, s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image=None, response_format={"type": "text"}, tools=[], max_tokens=1))
check(s == 200, "response_format text and tools [] are accepted: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", raw=b"[" * 100 + b"]" * 100)
check(s == 400 and is_error(j, code="json_too_deep"), "deep JSON: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", raw=b'{"messages": []}')
check(s == 400 and is_error(j, param="messages"), "empty messages: %s %s" % (s, j))
three = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMG_URI}}] * 3
                       + [{"type": "text", "text": "x"}]}]}
s, j, _ = req("POST", "/v1/chat/completions", three)
check(s == 413 or (s == 400 and is_error(j, code="too_many_images")), "3 images (limit 2): %s %s" % (s, j))


def raw_post(head_extra, body_len, body=b""):
    """Headers announcing body_len bytes, then body (maybe less): the status line and JSON body."""
    sock = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\n" + head_extra +
                 b"Content-Length: " + str(body_len).encode() + b"\r\n\r\n")
    try:
        sock.sendall(body)
    except OSError:
        pass
    data = b""
    while True:
        try:
            b = sock.recv(65536)
        except OSError:
            break
        if not b:
            break
        data += b
        if b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            cl = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
            if cl and len(rest) >= cl[0]:
                break
    sock.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head else 0
    try:
        return status, json.loads(rest)
    except ValueError:
        return status, None


s, j = raw_post(b"", 2 << 20)   # a 2 MiB body announced: refused before it is sent
check(s == 413 and is_error(j, code="request_too_large"), "a 2 MiB body (limit 1 MiB): %s %s" % (s, j))
s, j = raw_post(b"Expect: 100-continue\r\n", 2 << 20)
check(s == 413 and is_error(j), "a 2 MiB body with Expect: 100-continue: %s %s" % (s, j))
c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)   # chunked: no Content-Length to refuse by
c.request("POST", "/v1/chat/completions", body=iter([b'{"messages": "', b"x" * (3 << 19), b'"}']),
          headers={"Authorization": "Bearer " + KEY, "Transfer-Encoding": "chunked"}, encode_chunked=True)
r = c.getresponse()
j = json.loads(r.read())
c.close()
check(r.status == 413 and is_error(j, code="request_too_large"), "a 1.5 MiB chunked body: %s %s" % (r.status, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(model="gpt-4o"))
check(s == 404 and is_error(j, code="model_not_found"), "unknown model: %s %s" % (s, j))
s, j, _ = req("GET", "/v1/nothing")
check(s == 404 and is_error(j), "unknown URL: %s %s" % (s, j))
s, j, _ = req("GET", "/v1/chat/completions")
check(s == 405 and is_error(j), "GET on a POST route: %s %s" % (s, j))
s, j, _ = req("POST", "/v1/chat/completions", chat_body(image=None, max_tokens=100000))
check(s == 400 and is_error(j, param="max_tokens"), "max_tokens over the limit: %s %s" % (s, j))


# --- a client that disconnects mid-stream: generation stops, the server keeps serving
def metric(name):
    _, _, out = req("GET", "/metrics")
    for line in out.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_idle(seconds=5):
    """queue depth 0 within seconds (the engine counts a job out just after its answer is sent)"""
    t0 = time.time()
    while time.time() - t0 < seconds:
        if metric("mmc_queue_depth") == 0:
            return True
        time.sleep(0.05)
    return False


before = metric("mmc_completion_tokens_total")
sock = socket.create_connection(("127.0.0.1", PORT))
body = json.dumps(chat_body(image=None, max_tokens=2000, stream=True, temperature=1.0, seed=1)).encode()
sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
             b"\r\n\r\n" + body)
got = sock.recv(4096)
sock.close()
check(b"200" in got.split(b"\r\n")[0], "disconnect test: no 200 %r" % got[:80])
time.sleep(1.0)
s, j, _ = req("POST", "/v1/chat/completions", chat_body())
check(s == 200 and j["choices"][0]["message"]["content"] == ref["text"], "after a disconnect: %s %s" % (s, j))
after = metric("mmc_completion_tokens_total")
check(after is not None and after - before < 2000 + 8, "disconnect did not cancel: %s tokens" % (after - before))
print("serve_check: the disconnected stream generated %d of 2000 tokens" % (after - before - 8))
check(wait_idle(), "queue depth after the disconnect")
# the same for a non-streaming request whose client leaves while it generates
before = metric("mmc_completion_tokens_total")
body = json.dumps(chat_body(image=None, max_tokens=2000, temperature=1.0, seed=2)).encode()
sock = socket.create_connection(("127.0.0.1", PORT))
sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
             b"\r\n\r\n" + body)
time.sleep(0.1)   # 2000 tokens of the tiny model take about 0.4 s on a quiet machine
sock.close()
check(wait_idle(), "a non-streaming request whose client left is still running")
s, j, _ = req("POST", "/v1/chat/completions", chat_body())
check(s == 200 and j["choices"][0]["message"]["content"] == ref["text"], "after a non-streaming disconnect: %s" % s)
after = metric("mmc_completion_tokens_total")
check(after - before < 2000, "a non-streaming disconnect did not cancel: %s tokens" % (after - before))
print("serve_check: the disconnected non-streaming request generated %d of 2000 tokens" % (after - before - 8))

# --- 8 concurrent clients, each its own prompt: all complete, each equal to its sequential answer
prompts = ["Count to %d." % i for i in range(8)]
expect = {}
for p in prompts:
    s, j, _ = req("POST", "/v1/chat/completions", chat_body(p, image=None))
    expect[p] = j["choices"][0]["message"]["content"] if s == 200 else None
results = {}


def client(p, streaming):
    try:
        if streaming:
            s, chunks, done = stream(chat_body(p, image=None))
            results[p] = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) if done else None
        else:
            s, j, _ = req("POST", "/v1/chat/completions", chat_body(p, image=None))
            results[p] = j["choices"][0]["message"]["content"] if s == 200 else None
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        results[p] = "exception %s" % e


threads = [threading.Thread(target=client, args=(p, i % 2 == 0)) for i, p in enumerate(prompts)]
t0 = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join(120)
for p in prompts:
    check(expect[p] is not None and results.get(p) == expect[p], "concurrent %r: %r != %r" % (p, results.get(p), expect[p]))

s, j, out = req("GET", "/metrics")
text = out.decode()
for name in ["mmc_requests_total{code=\"200\"}", "mmc_requests_total{code=\"400\"}", "mmc_prompt_tokens_total",
             "mmc_completion_tokens_total", "mmc_queue_depth", "mmc_time_to_first_token_seconds_bucket",
             "mmc_inter_token_latency_seconds_count"]:
    check(name in text, "/metrics lacks %s" % name)

print("serve_check: %d checks, %d failed" % (n_checks, len(fails)))
sys.exit(1 if fails else 0)
