#!/usr/bin/env python3
"""serve_audio_check.py — the HTTP checks of tests/test_serve_audio.sh against a running `mmc serve` of a
Qwen2.5-Omni thinker (Python's standard library only). Usage:
    serve_audio_check.py PORT MMC MODEL_DIR MEDIA_ROOT
The server runs with --media-root MEDIA_ROOT --max-audios 2 --max-audio-seconds 1. Greedy answers are
compared with `mmc generate --audio F --json` on the same prompt and clip (text, prompt_tokens and
completion_tokens equal); prints one line per failed check, exits 1 if any."""
import base64, http.client, json, os, subprocess, sys, threading

PORT, MMC, MODEL, ROOT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
WAV = os.path.join(ROOT, "audio.wav")                     # 0.5 s (the fixture clip)
LONG = os.path.join(ROOT, "video_audio.wav")              # 2.2 s: over --max-audio-seconds 1
MP3 = os.path.join(os.path.dirname(ROOT), "audio", "speech.mp3")
fails, n_checks = [], 0


def check(cond, what):
    global n_checks
    n_checks += 1
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr)


def req(body, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/chat/completions", body=raw if raw is not None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    try:
        return r.status, json.loads(out)
    except ValueError:
        return r.status, None


def stream_text(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return r.status, None, False
    text, done = "", False
    for line in r:
        line = line.decode().rstrip("\n")
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            for ch in json.loads(line[6:])["choices"]:
                text += ch["delta"].get("content") or ""
    c.close()
    return 200, text, done


def b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def gen(prompt, audio=None, n=8):
    cmd = [MMC, "generate", "--model", MODEL, "--prompt", prompt, "--max-new-tokens", str(n), "--greedy", "--json"]
    if audio:
        cmd += ["--audio", audio]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def body(part, prompt="What did you hear?", **kw):
    content = ([part] if part else []) + [{"type": "text", "text": prompt}]
    return dict({"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}, **kw)


def is_error(s, j, code=None, param=None, want_in=None):
    if s != 400 or not isinstance(j, dict) or "error" not in j:
        return False
    e = j["error"]
    return (code is None or e.get("code") == code) and (param is None or e.get("param") == param) and \
        (want_in is None or want_in in e.get("message", ""))


def same(s, j, ref, what):
    ok = s == 200 and j["choices"][0]["message"]["content"] == ref["text"] and \
        j["usage"]["prompt_tokens"] == ref["prompt_tokens"] and j["usage"]["completion_tokens"] == ref["new_tokens"]
    check(ok, "%s: served %s %s != mmc generate %r (prompt %d)" % (what, s, j, ref["text"], ref["prompt_tokens"]))


# --- greedy answers equal `mmc generate --audio`: input_audio (wav, mp3), audio_url (data: URI, media-root path)
ref = gen("What did you hear?", WAV)
check(ref["prompt_tokens"] == 34, "generate's prompt is transformers' 34 tokens (tests/fixtures/omni): %d" % ref["prompt_tokens"])
wav = b64(WAV)
s, j = req(body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}))
same(s, j, ref, "input_audio wav")
s, j = req(body({"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + wav}}))
same(s, j, ref, "audio_url data: URI")
s, j = req(body({"type": "audio_url", "audio_url": {"url": "audio.wav"}}))
same(s, j, ref, "audio_url path under the media root")
s, text, done = stream_text(body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}))
check(s == 200 and done and text == ref["text"], "streamed input_audio: %s %r != %r" % (s, text, ref["text"]))
if os.path.exists(MP3):
    s, j = req(body({"type": "input_audio", "input_audio": {"data": b64(MP3), "format": "mp3"}}, "Hi"))
    if is_error(s, j, "audio_too_long"):   # speech.mp3 is longer than this server's 1 s: check the refusal's text
        check("longer than the 1 s allowed" in j["error"]["message"], "mp3 too long: %s" % j)
    else:
        same(s, j, gen("Hi", MP3), "input_audio mp3")
# two clips in one message, in order
ref2 = gen("Both?", None)  # (text-only reference below; the two-clip answer is checked against generate with two --audio)
cmd = [MMC, "generate", "--model", MODEL, "--prompt", "Both?", "--max-new-tokens", "8", "--greedy", "--json",
       "--audio", WAV, "--audio", WAV]
ref_two = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
b = body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}, "Both?")
b["messages"][0]["content"].insert(1, {"type": "audio_url", "audio_url": {"url": "audio.wav"}})
s, j = req(b)
same(s, j, ref_two, "two audio parts")
# an image and a clip (transformers' image_audio case of tests/fixtures/omni: 43 prompt tokens)
IMG = os.path.join(ROOT, "image.png")
cmd = [MMC, "generate", "--model", MODEL, "--prompt", "Describe both.", "--max-new-tokens", "8", "--greedy", "--json",
       "--image", IMG, "--audio", WAV]
ref_ia = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
check(ref_ia["prompt_tokens"] == 43, "generate image+audio prompt: %d tokens, transformers 43" % ref_ia["prompt_tokens"])
b = body({"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(IMG)}}, "Describe both.")
b["messages"][0]["content"].insert(1, {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}})
s, j = req(b)
same(s, j, ref_ia, "image + audio")
# text only on the omni model (the packed text prefill path): equal to generate without --audio
s, j = req(body(None, "Both?"))
same(s, j, ref2, "text only")

# --- concurrent: audio and text requests decoded in one batch each get their sequential answer
results = {}
def worker(k, bd):
    results[k] = req(bd)
bodies = {"a%d" % i: body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}) for i in range(3)}
bodies.update({"t%d" % i: body(None, "Both?") for i in range(2)})
ths = [threading.Thread(target=worker, args=(k, bd)) for k, bd in bodies.items()]
[t.start() for t in ths]
[t.join() for t in ths]
for k, (s, j) in sorted(results.items()):
    same(s, j, ref if k[0] == "a" else ref2, "concurrent %s" % k)

# --- refusals: 400s in OpenAI's shape naming the part
P = "messages.[0].content.[0]"
s, j = req(body({"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}))
check(is_error(s, j, "invalid_audio_format", P), "bad base64: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": {"data": wav, "format": "aiff"}}))
check(is_error(s, j, "unsupported_audio_format", P, "aiff"), "unsupported format: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": {"format": "wav"}}))
check(is_error(s, j, None, P, "input_audio.data"), "no data: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": "abc"}))
check(is_error(s, j, None, P, "input_audio must be an object"), "input_audio a string: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": {"data": base64.b64encode(os.urandom(3000)).decode(),
                                                          "format": "mp3"}}))
check(is_error(s, j, "invalid_audio", "messages", P), "undecodable bytes: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": {"data": b64(LONG), "format": "wav"}}))
check(is_error(s, j, "audio_too_long", "messages", "2.2 s of audio is longer than the 1 s allowed"),
      "a 2.2 s clip over --max-audio-seconds 1: %s %s" % (s, j))
three = body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}})
three["messages"][0]["content"][1:1] = [{"type": "audio_url", "audio_url": {"url": "audio.wav"}}] * 2
s, j = req(three)
check(is_error(s, j, "too_many_audios", "messages"), "3 audios over --max-audios 2: %s %s" % (s, j))
s, j = req(body({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}}))
check(is_error(s, j, "invalid_audio_url", P, "does not fetch audio URLs"), "http URL: %s %s" % (s, j))
s, j = req(body({"type": "audio_url", "audio_url": {"url": "/etc/passwd"}}))
check(is_error(s, j, "invalid_audio_url", P, "media root"), "a path outside the media root: %s %s" % (s, j))
s, j = req(body({"type": "audio_url", "audio_url": {"url": "data:audio/wav,abc"}}))
check(is_error(s, j, None, P, "only base64 data URIs"), "a non-base64 data URI: %s %s" % (s, j))
s, j = req(body({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}, "x"), )
check(s == 200, "the server still answers after the refusals: %s" % s)

print("serve_audio_check: %d/%d checks passed" % (n_checks - len(fails), n_checks))
sys.exit(1 if fails else 0)
