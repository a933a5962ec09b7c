#!/usr/bin/env bash
# test_serve_load.sh — load and abuse tests of `mmc serve` over loopback (tests/serve_load_check.py,
# Python's standard library only) on the tiny Qwen2 of tests/fixtures/qwen2/chat with its context widened
# to 16384 positions (so that a ~10k-token prompt fits): rounds of 1/4/16/64 concurrent streaming clients,
# every answer equal to `mmc generate --greedy`'s, the server's RSS flat across rounds; malformed JSON,
# wrong types, huge base64, bodies over the limit, truncated bodies, slow-loris clients (cut off after
# --client-timeout 5), clients leaving mid-stream, a ~10k-token prompt (completed) and a ~20k one (400),
# more requests than --max-connections (503): each gets its 4xx or its cancellation, and a normal request
# after each gets its exact answer. Then SIGTERM: exit 0 (under ASan+UBSan, MMC_SANITIZED=1 with the
# build-asan binary, also no leak at exit).
# usage: test_serve_load.sh [quick|long]   quick (make test): ~25 s on 2 quiet cores; long (ctest label
# demo, test_serve_load_long): 8 rounds of 256 requests per level.
set -u
MODE=${1:-quick}
MMC=${MMC:-build/mmc}
[ -x "$MMC" ] || { echo "test_serve_load: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_load: skipped: no python3 (standard library client)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_load.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
M=$W/model
mkdir -p "$M"
for f in model.safetensors tokenizer.json tokenizer_config.json; do ln -s "$PWD/tests/fixtures/qwen2/chat/$f" "$M/$f"; done
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = 16384; json.dump(c, open(sys.argv[2], "w"))' \
  tests/fixtures/qwen2/chat/config.json "$M/config.json"
CT=5 MAXC=72   # 5 s: a client of the load rounds stalled 2 s between connect and send at load 17 (niced)
# --kv-memory 16: 2048 blocks of 16 positions (the 10k prompt, 72 streams' first tokens); --max-queue
# above the 72 connections so that a full queue (429) does not mask the connection limit (503), and
# --max-batch too, so that the 72 streams holding the connections all run
"$MMC" serve --model "$M" --port 0 --client-timeout $CT --max-connections $MAXC --max-queue 96 --max-batch 96 \
  --max-body-bytes 4194304 --max-tokens 2048 --kv-memory 16 >"$W/out" 2>"$W/err" &
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
timeout 900 python3 tests/serve_load_check.py "$PORT" "$SPID" "$MMC" "$M" $CT $MAXC "$MODE" || fail=1
kill -TERM $SPID; wait $SPID; rc=$?; SPID=
[ $rc -eq 0 ] || { fail=1; echo "FAIL: the server exited $rc after SIGTERM: $(tail -20 "$W/err")" >&2; }
[ $fail -eq 0 ] && echo "test_serve_load ($MODE): all passed" || echo "test_serve_load ($MODE): failed"
exit $fail
