"""serve_tools_openai_check.py — tools and response_format of `mmc serve` through the official `openai` client
(the venv of tests/test_serve_openai.sh; run by tests/test_serve_tools.sh when it exists): a forced tool call
(non-streamed: message.tool_calls typed objects; streamed: the client's ChoiceDeltaToolCall chunks), and a
json_schema response_format whose content json.loads and matches. usage: serve_tools_openai_check.py PORT FIXTURE_DIR"""
import json
import sys

import openai

PORT, F = int(sys.argv[1]), sys.argv[2]
TOOLS = json.load(open(F + "/tools.json"))
client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % PORT, api_key="none")
MODEL = client.models.list().data[0].id
fails = 0


def check(cond, what):
    global fails
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


name = TOOLS[0]["function"]["name"]
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=120, seed=5, temperature=1.0,
                                   tool_choice={"type": "function", "function": {"name": name}})
calls = r.choices[0].message.tool_calls or []
check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == name and
      isinstance(json.loads(calls[0].function.arguments), dict) and calls[0].id.startswith("call_"),
      "forced call through the client: %s" % r)
got = []
for chunk in client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=120, seed=6,
                                            temperature=1.0, tool_choice="required", stream=True):
    for ch in chunk.choices:
        got += ch.delta.tool_calls or []
check(len(got) == 1 and got[0].function.name in [t["function"]["name"] for t in TOOLS],
      "streamed tool call through the client: %s" % got)
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "temp": {"type": "number"}},
          "required": ["city", "temp"]}
r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=80, temperature=1.0, seed=2,
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "weather", "schema": schema}})
o = json.loads(r.choices[0].message.content)
check(set(o) == {"city", "temp"} and isinstance(o["city"], str) and len(o["city"]) <= 12 and
      isinstance(o["temp"], (int, float)), "json_schema through the client: %r" % r.choices[0].message.content)
try:
    client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
            "a": {"oneOf": [{"type": "string"}]}}}}})
    check(False, "an unsupported schema was accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "'oneOf'" in str(e), "unsupported schema: %s" % e)
print("serve_tools_openai_check: openai %s, %d failures" % (openai.__version__, fails))
sys.exit(1 if fails else 0)
