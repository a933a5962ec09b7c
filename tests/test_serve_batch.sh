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
. tests/serve_util.sh

run() { serve_check tests/serve_batch_check.py "$@"; }   # MODEL IMAGE|- [check flags] -- [serve flags]

run tests/fixtures/e2e/q2_v5 "$IMG" -- --max-tokens 256
run tests/fixtures/qwen2/chat - -- --max-tokens 256
run tests/fixtures/llava/hub - -- --max-tokens 256
run tests/fixtures/internvl/v5 - -- --max-tokens 256
run tests/fixtures/e2e/q2_v5 "$IMG" --expect-preempt -- --max-tokens 256 --kv-block-size 4 --kv-blocks 30
[ $fail -eq 0 ] && echo "test_serve_batch: all passed" || echo "test_serve_batch: $fail failed"
exit $((fail > 0))
