#!/usr/bin/env bash
# bench_serve.sh — `mmc serve` under load: output tokens/s and p50/p99 TTFT and inter-token latency at
# 1, 4 and 16 concurrent streaming clients (bench/bench_serve.py), with continuous batching and, for
# comparison, the one-request-at-a-time engine (--no-batching). The model: Qwen2-0.5B's layer shapes at
# reduced depth, random init (bench_serve_model), with the tiny Qwen2 fixture's tokenizer.
# usage: bench/bench_serve.sh [LAYERS=4] [ROUNDS=2] [MAX_TOKENS=32] [LEVELS=1,4,16]
set -eu
LAYERS=${1:-4} ROUNDS=${2:-2} NTOK=${3:-32} LEVELS=${4:-1,4,16}
B=${BUILD:-build}
W=$(mktemp -d /tmp/mmc_bench_serve.XXXXXX)
SPID=
trap '[ -n "$SPID" ] && kill $SPID 2>/dev/null; rm -rf "$W"' EXIT
"$B/bench_serve_model" "$W" "$LAYERS"
cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); model: Qwen2-0.5B layer shapes x $LAYERS layers, f32, vocab 1392"
for mode in batching no-batching; do
  flags=(); [ $mode = no-batching ] && flags=(--no-batching)
  rm -f "$W/err"   # else the last server's port may be read before the new one truncates it
  "$B/mmc" serve --model "$W" --port 0 --max-queue 256 --max-connections 256 "${flags[@]}" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null); [ -n "$PORT" ] && break; sleep 0.1
  done
  echo "== $mode"
  python3 bench/bench_serve.py "$PORT" "$LEVELS" "$ROUNDS" "$NTOK"
  kill -TERM $SPID; wait $SPID || true; SPID=
done
