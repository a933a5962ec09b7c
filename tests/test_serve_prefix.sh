#!/usr/bin/env bash
# test_serve_prefix.sh — prefix caching and chunked prefill of `mmc serve` (tests/serve_prefix_check.py):
# chats sharing a ~240-token system prompt, one after another and then four at once, each get exactly
# `mmc generate --greedy`'s text and token count, and /metrics counts prefix-cache hits covering at least 80%
# of the shared prompt per later chat; the same answers with --no-prefix-cache (no hits) and with
# --prefill-chunk 16 (prompts prefilled over several steps while others decode); on the tiny Qwen2-VL,
# chats with the same system prompt and different images match `mmc generate` and never take each other's image blocks.
set -u
MMC=${MMC:-build/mmc}
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
[ -x "$MMC" ] || { echo "test_serve_prefix: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_prefix: skipped: no python3 (standard library client)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_prefix.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0
. tests/serve_util.sh

run() { serve_check tests/serve_prefix_check.py "$@"; }   # MODEL IMAGE|- [check flags] -- [serve flags]

run tests/fixtures/qwen2/chat - -- --max-tokens 64 --kv-block-size 8
run tests/fixtures/qwen2/chat - --expect-no-hits -- --max-tokens 64 --no-prefix-cache
run tests/fixtures/qwen2/chat - --expect-chunks -- --max-tokens 64 --prefill-chunk 16
run tests/fixtures/e2e/q2_v5 "$IMG" --expect-chunks -- --max-tokens 64 --prefill-chunk 32
[ $fail -eq 0 ] && echo "test_serve_prefix: all passed" || echo "test_serve_prefix: $fail failed"
exit $((fail > 0))
