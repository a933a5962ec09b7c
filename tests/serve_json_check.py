"""serve_json_check.py — response_format of `mmc serve` (tests/test_serve_json.sh) on a tiny model with random
weights, whose free text is never JSON: with response_format json_schema every choice (greedy and sampled, n=3,
streamed and not) parses as JSON and satisfies the schema (checked here: types, required keys, no others, enum,
maxLength, maxItems, nested object); json_object gives a JSON object; the same request without response_format
does not give JSON (so the constraint is what makes it valid); a schema outside the supported subset, an unknown
type and a json_schema without a name get OpenAI-style 400s naming the problem. With --no-batching (the server
runs requests one at a time and cannot constrain) response_format is a 400 unsupported_parameter.
Python's standard library only. usage: serve_json_check.py PORT [--no-batching]"""
import http.client
import json
import sys

PORT = int(sys.argv[1])
NO_BATCH = "--no-batching" in sys.argv
fails = 0

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "member": {"type": "boolean"},
    "level": {"enum": ["low", "mid", "high"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "zip": {"type": "integer"}},
             "required": ["city"]}},
    "required": ["name", "age", "level", "home"], "additionalProperties": False}


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def post(body):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if body.get("stream"):
        texts = {}
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: {"):
                for ch in json.loads(line[6:])["choices"]:
                    texts[ch["index"]] = texts.get(ch["index"], "") + (ch["delta"].get("content") or "")
        c.close()
        return r.status, {"choices": [{"message": {"content": texts[i]}} for i in sorted(texts)]}
    j = json.loads(r.read())
    c.close()
    return r.status, j


def valid(o):
    if not isinstance(o, dict) or set(o) - set(SCHEMA["properties"]) or not {"name", "age", "level", "home"} <= set(o):
        return False
    if not isinstance(o["name"], str) or len(o["name"]) > 10:
        return False
    if not isinstance(o["age"], int) or isinstance(o["age"], bool):
        return False
    if "height" in o and (not isinstance(o["height"], (int, float)) or isinstance(o["height"], bool)):
        return False
    if "member" in o and not isinstance(o["member"], bool):
        return False
    if o["level"] not in ("low", "mid", "high"):
        return False
    if "tags" in o and (not isinstance(o["tags"], list) or len(o["tags"]) > 3 or
                        any(not isinstance(t, str) or len(t) > 5 for t in o["tags"])):
        return False
    h = o["home"]
    if not isinstance(h, dict) or set(h) - {"city", "zip"} or not isinstance(h.get("city"), str) or len(h["city"]) > 8:
        return False
    return "zip" not in h or (isinstance(h["zip"], int) and not isinstance(h["zip"], bool))


msgs = [{"role": "user", "content": "Describe a person as JSON."}]
rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
if NO_BATCH:
    st, j = post({"messages": msgs, "max_tokens": 150, "response_format": rf})
    check(st == 400 and j["error"]["code"] == "unsupported_parameter" and j["error"]["param"] == "response_format",
          "response_format without the batching engine: %s %s" % (st, j))
else:
    n_valid = 0
    for body in ({"temperature": 0}, {"temperature": 1.0, "seed": 7, "n": 3}, {"temperature": 1.0, "seed": 8, "n": 2,
                                                                                  "stream": True}):
        st, j = post(dict(body, messages=msgs, max_tokens=150, response_format=rf))
        check(st == 200, "json_schema request: %s %s" % (st, j))
        for ch in j.get("choices", []):
            text = ch["message"]["content"]
            try:
                o = json.loads(text)
            except ValueError:
                o = None
            check(o is not None and valid(o), "not a valid person (%s): %r" % (body, text))
            n_valid += o is not None and valid(o)
    st, j = post({"messages": msgs, "max_tokens": 80, "temperature": 1.0, "seed": 3,
                  "response_format": {"type": "json_object"}})
    text = j["choices"][0]["message"]["content"] if st == 200 else None
    try:
        o = json.loads(text)
    except (TypeError, ValueError):
        o = None
    check(isinstance(o, dict), "json_object: %s %r" % (st, text))
    st, j = post({"messages": msgs, "max_tokens": 40, "temperature": 0})
    free = j["choices"][0]["message"]["content"]
    try:
        json.loads(free)
        is_json = True
    except ValueError:
        is_json = False
    check(st == 200 and not is_json, "the unconstrained answer is JSON already (the test would prove nothing): %r" % free)
    bad = [({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {
               "a": {"type": "string", "pattern": "^x"}}}}}, "response_format", "invalid_json_schema", "'pattern'"),
           ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {
               "a": {"anyOf": [{"type": "string"}]}}}}}, "response_format", "invalid_json_schema", "'anyOf'"),
           ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "array"}}}, "response_format",
            "invalid_json_schema", "type object"),
           ({"type": "xml"}, "response_format.type", "invalid_value", "'xml'"),
           ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name", None,
            "Missing required parameter")]
    for rfb, param, code, needle in bad:
        st, j = post({"messages": msgs, "max_tokens": 10, "response_format": rfb})
        e = j.get("error", {})
        check(st == 400 and e.get("param") == param and e.get("code") == code and needle in e.get("message", ""),
              "bad response_format %s: %s %s" % (rfb, st, j))
    print("serve_json_check: %d of 6 constrained choices valid; %d failures" % (n_valid, fails))
sys.exit(1 if fails else 0)
