#!/usr/bin/env bash
# test_serve_json.sh — response_format (json_schema, json_object) by constrained decoding in `mmc serve`, on the
# tiny Qwen2 fixture (random weights: its free text is never JSON, so the mask is what makes every answer valid):
# tests/serve_json_check.py checks that every choice parses and satisfies the schema, and the 400s of
# unsupported schemas; then with --no-batching, that response_format is refused (400) instead of ignored.
set -u
MMC=${MMC:-build/mmc}
[ -x "$MMC" ] || { echo "test_serve_json: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_json: skipped: no python3 (standard library client)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_json.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0

run() {   # [check flags] -- [serve flags]
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  rm -f "$W/err"
  "$MMC" serve --model tests/fixtures/qwen2/chat --port 0 "$@" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null)
    [ -n "$PORT" ] && break
    kill -0 $SPID 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$PORT" ]; then echo "FAIL: the server did not start: $(cat "$W/err")" >&2; fail=$((fail+1)); return; fi
  timeout 120 python3 tests/serve_json_check.py "$PORT" "${flags[@]}" || { fail=$((fail+1)); echo "FAIL: $*" >&2; }
  kill -TERM $SPID; wait $SPID; rc=$?; SPID=
  [ $rc -eq 0 ] || { fail=$((fail+1)); echo "FAIL: the server exited $rc: $(tail -3 "$W/err")" >&2; }
}

run -- --max-tokens 256
run --no-batching -- --max-tokens 256 --no-batching
[ $fail -eq 0 ] && echo "test_serve_json: all passed" || echo "test_serve_json: $fail failed"
exit $((fail > 0))
