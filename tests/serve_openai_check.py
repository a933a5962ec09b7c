#!/usr/bin/env python3
"""serve_openai_check.py — tests/test_serve_openai.sh's checks with the official `openai` Python
client (pinned in tools/ref/requirements.txt, installed in .venv-client) against a running
`mmc serve`: models.list, chat.completions.create (plain, streaming, with an image data URI),
completions.create, and the exceptions the client raises for the server's errors
(AuthenticationError for 401, BadRequestError for 400, NotFoundError for an unknown model).
Usage: serve_openai_check.py PORT API_KEY MODEL_ID IMAGE EXPECTED_TEXT"""
import base64, sys

import openai

PORT, KEY, MODEL, IMG, EXPECTED = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
base = "http://127.0.0.1:%s/v1" % PORT
client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr)


with open(IMG, "rb") as f:
    uri = "data:image/png;base64," + base64.b64encode(f.read()).decode()
messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                         {"type": "text", "text": "What colour is the square?"}]}]

models = client.models.list()
check([m.id for m in models.data] == [MODEL], "models.list: %s" % models)

r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
check(r.choices[0].message.content == EXPECTED, "chat with an image: %r != mmc generate's %r"
      % (r.choices[0].message.content, EXPECTED))
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8 and r.object == "chat.completion",
      "chat envelope %s" % r)

text_msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
plain = client.chat.completions.create(model=MODEL, messages=text_msgs, max_completion_tokens=6, temperature=0)
check(plain.usage.completion_tokens == 6 and plain.choices[0].message.role == "assistant", "plain chat %s" % plain)

parts, usage, finish = [], None, []
for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
    if chunk.usage:
        usage = chunk.usage
    for c in chunk.choices:
        parts.append(c.delta.content or "")
        if c.finish_reason:
            finish.append(c.finish_reason)
check("".join(parts) == EXPECTED, "streamed %r != %r" % ("".join(parts), EXPECTED))
check(finish == ["length"] and usage is not None and usage.completion_tokens == 8, "stream end %s %s" % (finish, usage))

c = client.completions.create(model=MODEL, prompt="The square is", max_tokens=5, temperature=0)
check(c.object == "text_completion" and c.usage.completion_tokens == 5 and isinstance(c.choices[0].text, str),
      "completions.create %s" % c)
cs = "".join(ch.choices[0].text for ch in client.completions.create(model=MODEL, prompt="The square is",
                                                                    max_tokens=5, temperature=0, stream=True))
check(cs == c.choices[0].text, "streamed completion %r != %r" % (cs, c.choices[0].text))

try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key raised nothing")
except openai.AuthenticationError as e:
    check(e.status_code == 401 and e.code == "invalid_api_key", "AuthenticationError %s" % e)
try:
    client.chat.completions.create(model=MODEL, messages=text_msgs, temperature=5)
    check(False, "temperature=5 raised nothing")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.param == "temperature", "BadRequestError %s" % e)
try:
    client.chat.completions.create(model=MODEL, messages=[])
    check(False, "empty messages raised nothing")
except openai.BadRequestError as e:
    check(e.param == "messages", "BadRequestError (messages) %s" % e)
try:
    client.chat.completions.create(model="no-such-model", messages=text_msgs)
    check(False, "an unknown model raised nothing")
except openai.NotFoundError as e:
    check(e.status_code == 404 and e.code == "model_not_found", "NotFoundError %s" % e)

print("serve_openai_check: %d failed" % len(fails))
sys.exit(1 if fails else 0)
