#!/usr/bin/env bash
# test_serve_image_prefix.sh — prefix caching of image prompts in `mmc serve` on the tiny Qwen2-VL and
# Qwen2.5-VL (tests/serve_image_prefix_check.py): a repeated image (same bytes as a data: URI, another question) takes the
# cached blocks keyed by the image's content hash and its vision features from the encoder cache (no new vision
# encode in /metrics), another image of the same size does not take them, and every greedy answer equals a fresh
# --no-prefix-cache server's token for token.
set -u
MMC=${MMC:-build/mmc}
. tests/serve_util.sh
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
[ -x "$MMC" ] || { echo "test_serve_image_prefix: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_image_prefix: skipped: no python3"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_image_prefix.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
start() {   # NAME [serve flags]: sets PORT
  local name=$1; shift
  serve_start "$W/$name" --model $M --max-tokens 32 "$@"; local ok=$?
  PIDS+=($SPID)
  [ $ok = 0 ] || { echo "FAIL: the server ($name) did not start: $(cat "$W/$name.err")" >&2; exit 1; }
}
rc=0
for M in tests/fixtures/e2e/q2_v5 tests/fixtures/e2e/q25_v5; do
  start cached; PA=$PORT
  start fresh --no-prefix-cache; PB=$PORT
  timeout 120 python3 tests/serve_image_prefix_check.py "$PA" "$PB" "$IMG" || { echo "FAIL: $M" >&2; rc=1; }
  for p in "${PIDS[@]}"; do kill -TERM "$p"; wait "$p" || { echo "FAIL: a server exited $? after SIGTERM" >&2; rc=1; }; done
  PIDS=()
done
[ $rc -eq 0 ] && echo "test_serve_image_prefix: passed"
exit $rc
