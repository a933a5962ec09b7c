#!/usr/bin/env bash
# test_serve_openai.sh — `mmc serve` driven by the official `openai` Python client (the version
# pinned in tools/ref/requirements.txt, in a small venv .venv-client that this test creates with
# pip when missing: only `openai` and its dependencies). tests/serve_openai_check.py checks
# models.list, chat.completions.create (plain, streaming with include_usage, an image data URI:
# greedy text equal to `mmc generate`'s), completions.create (plain and streaming) and the
# client's exceptions for the server's errors (AuthenticationError, BadRequestError,
# NotFoundError). Skipped (77) when the venv cannot be made (no python3 venv, or PyPI is not
# reachable).
set -u
MMC=${MMC:-build/mmc}
M=tests/fixtures/e2e/q2_v5
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
V=${MMC_CLIENT_VENV:-.venv-client}
[ -x "$MMC" ] || { echo "test_serve_openai: skipped: no mmc binary at $MMC"; exit 77; }
pin=$(grep -E '^openai==' tools/ref/requirements.txt)
[ -n "$pin" ] || { echo "test_serve_openai: no openai pin in tools/ref/requirements.txt" >&2; exit 1; }
want=${pin#openai==}
have=$("$V/bin/python" -c 'import openai; print(openai.__version__)' 2>/dev/null)
if [ "$have" != "$want" ]; then
  py=$(command -v python3) || { echo "test_serve_openai: skipped: no python3"; exit 77; }
  { [ -x "$V/bin/python" ] || "$py" -m venv "$V"; } >/dev/null 2>&1 &&
    timeout 300 "$V/bin/pip" install -q --disable-pip-version-check "$pin" >/tmp/mmc_venv_client.$$ 2>&1
  have=$("$V/bin/python" -c 'import openai; print(openai.__version__)' 2>/dev/null)
  if [ "$have" != "$want" ]; then
    echo "test_serve_openai: skipped: cannot install $pin into $V: $(tail -2 /tmp/mmc_venv_client.$$ 2>/dev/null)"
    rm -f /tmp/mmc_venv_client.$$
    exit 77
  fi
  rm -f /tmp/mmc_venv_client.$$
fi
W=$(mktemp -d /tmp/mmc_test_serve_openai.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
KEY=sk-openai-test-$$
expected=$("$MMC" generate --model "$M" --image "$IMG" --prompt "What colour is the square?" --max-new-tokens 8 \
  --greedy --json 2>/dev/null | "$V/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["text"], end="")')
"$MMC" serve --model "$M" --port 0 --api-key "$KEY" >"$W/out" 2>"$W/err" &
SPID=$!
PORT=
for _ in $(seq 600); do
  PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null)
  [ -n "$PORT" ] && break
  kill -0 $SPID 2>/dev/null || break
  sleep 0.1
done
[ -n "$PORT" ] || { echo "FAIL: mmc serve did not start: $(cat "$W/err")" >&2; exit 1; }
timeout 300 "$V/bin/python" tests/serve_openai_check.py "$PORT" "$KEY" q2_v5 "$IMG" "$expected"; rc=$?
kill -TERM $SPID
wait $SPID; src=$?; SPID=
[ $src = 0 ] || { echo "FAIL: the server exited $src after SIGTERM" >&2; rc=1; }
[ $rc = 0 ] && echo "test_serve_openai: passed ($pin)"
exit $rc
