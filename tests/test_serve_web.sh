#!/usr/bin/env bash
# test_serve_web.sh — `mmc serve`'s chat page (GET /, src/serve/web/chat.html compiled in) in a
# headless browser: Debian's chromium (/usr/bin/chromium; `.ci/run` installs it, it is not in
# scripts/bootstrap.sh) driven by Playwright from PyPI (pinned below, installed into the small
# client venv .venv-client that test_serve_openai also uses; Playwright's own browser download is
# never used). tests/serve_web_check.py: the page loads without console errors, an image attached
# by the file input + greedy 8 tokens stream into the page and equal `mmc generate --greedy`'s text
# (exact), a second turn carries the history, Stop cuts a 2000-token generation (/metrics: fewer
# than 2000 completion tokens, no running sequence). Screenshot: build/serve_web.png.
# Skipped (77) without chromium, python3 venv or PyPI.
set -u
MMC=${MMC:-build/mmc}
M=tests/fixtures/e2e/q2_v5
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
V=${MMC_CLIENT_VENV:-.venv-client}
PIN=playwright==1.65.2
SHOT=${MMC_WEB_SCREENSHOT:-$(dirname "$MMC")/serve_web.png}
[ -x "$MMC" ] || { echo "test_serve_web: skipped: no mmc binary at $MMC"; exit 77; }
[ -x /usr/bin/chromium ] || { echo "test_serve_web: skipped: no /usr/bin/chromium (apt-get install chromium; .ci/run does)"; exit 77; }
want=${PIN#playwright==}
pwver() { "$V/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))' 2>/dev/null; }
if [ "$(pwver)" != "$want" ]; then
  py=$(command -v python3) || { echo "test_serve_web: skipped: no python3"; exit 77; }
  { [ -x "$V/bin/python" ] || "$py" -m venv "$V"; } >/dev/null 2>&1 &&
    timeout 300 "$V/bin/pip" install -q --disable-pip-version-check "$PIN" >/tmp/mmc_venv_web.$$ 2>&1
  if [ "$(pwver)" != "$want" ]; then
    echo "test_serve_web: skipped: cannot install $PIN into $V: $(tail -2 /tmp/mmc_venv_web.$$ 2>/dev/null)"
    rm -f /tmp/mmc_venv_web.$$
    exit 77
  fi
  rm -f /tmp/mmc_venv_web.$$
fi
W=$(mktemp -d /tmp/mmc_test_serve_web.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
KEY=sk-web-test-$$
expected=$("$MMC" generate --model "$M" --image "$IMG" --prompt "What colour is the square?" --max-new-tokens 8 \
  --greedy --json 2>/dev/null | "$V/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["text"], end="")')
[ -n "$expected" ] || { echo "FAIL: mmc generate gave no text" >&2; exit 1; }
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
# the page is public (no key), the API is not
code=$(curl -s -o "$W/page" -w '%{http_code} %{content_type}' "http://127.0.0.1:$PORT/")
[ "$code" = "200 text/html; charset=utf-8" ] && cmp -s "$W/page" src/serve/web/chat.html ||
  { echo "FAIL: GET / answered '$code' or not the page's bytes" >&2; exit 1; }
timeout 120 "$V/bin/python" tests/serve_web_check.py "$PORT" "$KEY" q2_v5 "$IMG" "$expected" "$SHOT"; rc=$?
kill -TERM $SPID
wait $SPID; src=$?; SPID=
[ $src = 0 ] || { echo "FAIL: the server exited $src after SIGTERM" >&2; rc=1; }
[ $rc = 0 ] && echo "test_serve_web: passed ($PIN, $(/usr/bin/chromium --version 2>/dev/null)); screenshot: $SHOT"
exit $rc
