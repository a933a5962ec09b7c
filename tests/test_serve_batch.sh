#!/usr/bin/env bash
# test_serve_batch.sh — continuous batching in `mmc serve`: 8 concurrent clients with different
# prompts and lengths (raw completions, and chats with an image on the Qwen2-VL checkpoint) each get
# exactly `mmc generate --greedy`'s text and token count (tests/serve_batch_check.py), on the tiny
# Qwen2-VL of test_e2e_cli (M-RoPE, vision prefill then batched LM decode), the tiny Qwen2 text
# model, and the LLaVA (Llama LM) and InternVL (Qwen2 LM) fixtures with text prompts; then again
# on Qwen2-VL with a KV pool so small (--kv-blocks 30 of 4 positions: 120; the longest request
# needs 104) that sequences must be preempted and recomputed: outputs unchanged,
# mmc_preemptions_total > 0, no block left in use.
set -u
MMC=${MMC:-build/mmc}
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
[ -x "$MMC" ] || { echo "test_serve_batch: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_batch: skipped: no python3 (standard library client)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_batch.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0

run() {   # MODEL IMAGE|- [check flags] -- [serve flags]
  local model=$1 img=$2; shift 2
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  rm -f "$W/err"   # else the last server's port may be read before the new one truncates it
  "$MMC" serve --model "$model" --port 0 "$@" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null)
    [ -n "$PORT" ] && break
    kill -0 $SPID 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$PORT" ]; then echo "FAIL: the server did not start: $(cat "$W/err")" >&2; fail=$((fail+1)); return; fi
  timeout 300 python3 tests/serve_batch_check.py "$PORT" "$MMC" "$model" "$img" "${flags[@]}" \
    || { fail=$((fail+1)); echo "FAIL: $model $*" >&2; }
  kill -TERM $SPID; wait $SPID; rc=$?; SPID=
  [ $rc -eq 0 ] || { fail=$((fail+1)); echo "FAIL: the server exited $rc: $(tail -3 "$W/err")" >&2; }
}

run tests/fixtures/e2e/q2_v5 "$IMG" -- --max-tokens 256
run tests/fixtures/qwen2/chat - -- --max-tokens 256
run tests/fixtures/llava/hub - -- --max-tokens 256
run tests/fixtures/internvl/v5 - -- --max-tokens 256
run tests/fixtures/e2e/q2_v5 "$IMG" --expect-preempt -- --max-tokens 256 --kv-block-size 4 --kv-blocks 30
[ $fail -eq 0 ] && echo "test_serve_batch: all passed" || echo "test_serve_batch: $fail failed"
exit $((fail > 0))
