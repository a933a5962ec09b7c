#!/usr/bin/env bash
# test_serve_tools.sh — tools / tool_choice in `mmc serve` (tests/serve_tools_check.py): the tiny Qwen2 served
# (its context widened to 4096 positions) with the Qwen3 chat template of the template fixtures: the tools prompt equals transformers' rendering
# (a fixture of tools/ref/gen_template.py), forced tool calls (required, named; streamed) come back as OpenAI
# tool_calls with valid arguments, none / auto, and the 400s of malformed tools; then forced calls and a
# json_schema response_format through the official openai client (tests/serve_tools_openai_check.py) when
# the venv of test_serve_openai.sh exists.
set -u
MMC=${MMC:-build/mmc}
F=tests/fixtures/template/cli
[ -x "$MMC" ] || { echo "test_serve_tools: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_tools: skipped: no python3 (standard library client)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_tools.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
# the tiny Qwen2 with a 4096-position context (its 512 cannot hold the tools prompt of this tokenizer)
M=$W/model
mkdir -p "$M"
for f in model.safetensors tokenizer.json tokenizer_config.json; do ln -s "$PWD/tests/fixtures/qwen2/chat/$f" "$M/$f"; done
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = 4096; json.dump(c, open(sys.argv[2], "w"))' \
  tests/fixtures/qwen2/chat/config.json "$M/config.json"
"$MMC" serve --model "$M" --chat-template $F/model/chat_template.jinja --port 0 --max-tokens 256 \
  >"$W/out" 2>"$W/err" &
SPID=$!
PORT=
for _ in $(seq 600); do
  PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null)
  [ -n "$PORT" ] && break
  kill -0 $SPID 2>/dev/null || break
  sleep 0.1
done
[ -n "$PORT" ] || { echo "FAIL: the server did not start: $(cat "$W/err")" >&2; exit 1; }
fail=0
timeout 120 python3 tests/serve_tools_check.py "$PORT" "$F" || fail=1
# the same through the official openai client, when test_serve_openai's venv has it
V=${MMC_CLIENT_VENV:-.venv-client}
if "$V/bin/python" -c 'import openai' 2>/dev/null; then
  timeout 120 "$V/bin/python" tests/serve_tools_openai_check.py "$PORT" "$F" || fail=1
else
  echo "test_serve_tools: the openai client part skipped: no $V (tests/test_serve_openai.sh makes it)"
fi
kill -TERM $SPID; wait $SPID; rc=$?; SPID=
[ $rc -eq 0 ] || { fail=1; echo "FAIL: the server exited $rc: $(tail -3 "$W/err")" >&2; }
[ $fail -eq 0 ] && echo "test_serve_tools: all passed" || echo "test_serve_tools: failed"
exit $fail
