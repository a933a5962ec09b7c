"""serve_tools_check.py — tools / tool_choice of `mmc serve` (tests/test_serve_tools.sh), on the tiny Qwen2 with
the Qwen3 chat template of the template fixtures (tests/fixtures/template/cli/model), Python's standard library:
 - the prompt with tools and a tool-call history (tests/fixtures/template/cli/tools*.json, arguments sent as
   OpenAI's JSON strings and as objects) is transformers' apply_chat_template rendering
   (expected_tools_nothink.txt, written by tools/ref/gen_template.py, less its empty think block): the chat
   answer, greedy, equals the raw completion of that text, token for token;
 - tool_choice "required" and a named function: the answer is one tool call (finish_reason "tool_calls",
   message.tool_calls with an id, the function's name, arguments a JSON string that satisfies the function's
   parameters), streamed as a tool_calls delta with no "<tool_call>" text in the content;
 - tool_choice "none" renders no tools (fewer prompt tokens) and "auto" on this random model answers text;
 - malformed tools / tool_choice get OpenAI-style 400s.
usage: serve_tools_check.py PORT FIXTURE_DIR"""
import http.client
import json
import sys

PORT, F = int(sys.argv[1]), sys.argv[2]
fails = 0
TOOLS = json.load(open(F + "/tools.json"))
HIST = json.load(open(F + "/tools_messages.json"))
EXPECT = open(F + "/expected_tools_nothink.txt").read()


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def post(path, body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if body.get("stream"):
        ev = [json.loads(l.decode()[6:]) for l in r if l.startswith(b"data: {")]
        c.close()
        return r.status, ev
    j = json.loads(r.read())
    c.close()
    return r.status, j


# 1. rendering parity: chat with tools == raw completion of transformers' text
think = "<think>\n\n</think>\n\n"
check(EXPECT.endswith(think), "the fixture ends with the empty think block")
raw = EXPECT[:-len(think)]
st, ref = post("/v1/completions", {"prompt": raw, "max_tokens": 12, "temperature": 0})
hist_str = json.loads(json.dumps(HIST))
for m in hist_str:
    for tc in m.get("tool_calls", []):
        tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
for label, msgs in (("object arguments", HIST), ("string arguments", hist_str)):
    st2, got = post("/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice": "auto",
                                              "max_tokens": 12, "temperature": 0})
    ok = st == 200 and st2 == 200 and got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
    gtext = got["choices"][0]["message"]["content"] if st2 == 200 else None
    check(ok and (gtext == ref["choices"][0]["text"] or got["choices"][0]["finish_reason"] == "tool_calls"),
          "%s: chat with tools %s %s vs the raw completion of transformers' rendering %s %s"
          % (label, st2, got, st, ref))
n_tools_prompt = got["usage"]["prompt_tokens"] if st2 == 200 else 0

# 2. forced calls
user = [{"role": "user", "content": "What is the weather in Paris?"}]
params = {t["function"]["name"]: t["function"].get("parameters") for t in TOOLS}


def valid_args(name, a):
    p = params.get(name) or {}
    if not isinstance(a, dict):
        return False
    props = p.get("properties", {})
    if set(a) - set(props) or not set(p.get("required", [])) <= set(a):
        return False
    for k, v in a.items():
        s = props[k]
        if "enum" in s and v not in s["enum"]:
            return False
        t = s.get("type")
        if t == "string" and not isinstance(v, str) or t == "integer" and not isinstance(v, int) or \
           t == "number" and not isinstance(v, (int, float)) or t == "boolean" and not isinstance(v, bool):
            return False
    return True


first = TOOLS[0]["function"]["name"]
for choice in ("required", {"type": "function", "function": {"name": first}}):
    for seed in (1, 2):
        st, j = post("/v1/chat/completions", {"messages": user, "tools": TOOLS, "tool_choice": choice,
                                              "max_tokens": 120, "temperature": 1.0, "seed": seed})
        ch = j["choices"][0] if st == 200 else {}
        calls = ch.get("message", {}).get("tool_calls") or []
        ok = st == 200 and ch["finish_reason"] == "tool_calls" and len(calls) == 1
        if ok:
            c = calls[0]
            fn = c["function"]
            try:
                args = json.loads(fn["arguments"])
            except ValueError:
                args = None
            ok = c["id"].startswith("call_") and c["type"] == "function" and fn["name"] in params and \
                (choice == "required" or fn["name"] == first) and \
                (valid_args(fn["name"], args) if choice != "required" else isinstance(args, dict))
        check(ok, "tool_choice %s seed %d: %s %s" % (choice, seed, st, j))
# streamed
st, ev = post("/v1/chat/completions", {"messages": user, "tools": TOOLS, "stream": True, "max_tokens": 120,
                                       "tool_choice": {"type": "function", "function": {"name": first}}, "seed": 3,
                                       "temperature": 1.0})
deltas = [e["choices"][0] for e in ev if e.get("choices")]
text = "".join(d["delta"].get("content") or "" for d in deltas)
tcs = [tc for d in deltas for tc in d["delta"].get("tool_calls", [])]
fin = [d["finish_reason"] for d in deltas if d.get("finish_reason")]
check(st == 200 and "<tool_call>" not in text and len(tcs) == 1 and tcs[0]["index"] == 0 and
      tcs[0]["function"]["name"] == first and valid_args(first, json.loads(tcs[0]["function"]["arguments"])) and
      fin == ["tool_calls"], "streamed forced call: %s %s" % (st, ev))

# 3. none and auto
st, j = post("/v1/chat/completions", {"messages": HIST, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4})
check(st == 200 and j["usage"]["prompt_tokens"] < n_tools_prompt and not j["choices"][0]["message"].get("tool_calls"),
      "tool_choice none: %s %s (with tools: %d prompt tokens)" % (st, j, n_tools_prompt))
st, j = post("/v1/chat/completions", {"messages": user, "tools": TOOLS, "max_tokens": 8, "temperature": 0})
check(st == 200 and j["choices"][0]["finish_reason"] in ("stop", "length") and
      isinstance(j["choices"][0]["message"]["content"], str), "tool_choice auto (default): %s %s" % (st, j))

# 4. errors
bad = [({"tool_choice": "required"}, "tool_choice", None),
       ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
       ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "invalid_value"),
       ({"tools": [{"type": "function"}]}, "tools[0]", None),
       ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
           "a": {"type": "string", "format": "date"}}}}}], "tool_choice": "required"}, "tools", "invalid_function_parameters"),
       ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.[0].tool_calls", None)]
st, j = post("/v1/completions", {"prompt": "x", "max_tokens": 2, "tools": TOOLS})
check(st == 400 and j["error"]["param"] == "tools", "tools on /v1/completions: %s %s" % (st, j))
for extra, param, code in bad:
    body = dict({"messages": user, "max_tokens": 4}, **extra)
    st, j = post("/v1/chat/completions", body)
    e = j.get("error", {}) if isinstance(j, dict) else {}
    check(st == 400 and e.get("param") == param and e.get("code") == code, "%s: %s %s" % (extra, st, j))
print("serve_tools_check: %d failures" % fails)
sys.exit(1 if fails else 0)
