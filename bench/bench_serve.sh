#!/usr/bin/env bash
# bench_serve.sh — `mmc serve` under load: output tokens/s and p50/p99 TTFT and inter-token latency at
# 1, 4 and 16 concurrent streaming clients (bench/bench_serve.py), with continuous batching and, for
# comparison, the one-request-at-a-time engine (--no-batching). The model: Qwen2-0.5B's layer shapes at
# reduced depth, random init (bench_serve_model), with the tiny Qwen2 fixture's tokenizer.
# usage: bench/bench_serve.sh [LAYERS=4] [ROUNDS=2] [MAX_TOKENS=32] [LEVELS=1,4,16]
#
# Shared-prefix scenario (bench/bench_serve_prefix.py): CLIENTS concurrent streaming clients whose prompts
# share one system prompt of about PREFIX tokens, with the prefix cache, without it (--no-prefix-cache),
# and without it but with chunked prefill (--prefill-chunk 256); prints TTFT and output tok/s and the
# ratios cached / uncached.
# usage: bench/bench_serve.sh prefix [LAYERS=4] [CLIENTS=16] [ROUNDS=1] [MAX_TOKENS=16] [PREFIX=512]
#
# Long-prompt scenario (bench/bench_serve_chunk.py): CLIENTS streams decoding while one prompt of PROMPT tokens
# arrives, whole (--prefill-chunk 0) and chunked: the streams' inter-token latency during its prefill.
# usage: bench/bench_serve.sh chunk [LAYERS=4] [CLIENTS=4] [MAX_TOKENS=96] [PROMPT=1024] [CHUNK=128]
# THREADS=N in the environment: the server's --threads (default: all cores).
set -eu
B=${BUILD:-build}
W=$(mktemp -d /tmp/mmc_bench_serve.XXXXXX)
SPID=
trap '[ -n "$SPID" ] && kill $SPID 2>/dev/null; rm -rf "$W"' EXIT
start_server() {   # serve flags...
  rm -f "$W/err"   # else the last server's port may be read before the new one truncates it
  "$B/mmc" serve --model "$W" --port 0 --max-queue 256 --max-connections 256 ${THREADS:+--threads $THREADS} "$@" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null); [ -n "$PORT" ] && break; sleep 0.1
  done
}
if [ "${1:-}" = prefix ]; then
  LAYERS=${2:-4} CLIENTS=${3:-16} ROUNDS=${4:-1} NTOK=${5:-16} PREFIX=${6:-512}
  "$B/bench_serve_model" "$W" "$LAYERS"
  cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); model: Qwen2-0.5B layer shapes x $LAYERS layers, f32, vocab 1392"
  declare -A R
  for mode in cache no-cache no-cache-chunked; do
    flags=(--max-tokens 64)
    [ $mode != cache ] && flags+=(--no-prefix-cache)
    [ $mode = no-cache-chunked ] && flags+=(--prefill-chunk 256)
    start_server "${flags[@]}"
    echo "== $mode (${flags[*]})"
    out=$(python3 bench/bench_serve_prefix.py "$PORT" "$CLIENTS" "$ROUNDS" "$NTOK" "$PREFIX")
    echo "$out" | grep -v '^RESULT'
    R[$mode]=$(echo "$out" | sed -n 's/^RESULT //p')
    kill -TERM $SPID; wait $SPID || true; SPID=
  done
  python3 - "${R[cache]}" "${R[no-cache]}" <<'PY'
import sys
c, n = [list(map(float, a.split())) for a in sys.argv[1:3]]
print("prefix cache vs none: throughput %.2fx, TTFT p50 %.2fx lower, p99 %.2fx lower" % (c[0] / n[0], n[1] / c[1], n[2] / c[2]))
PY
  exit 0
fi
if [ "${1:-}" = chunk ]; then
  LAYERS=${2:-4} CLIENTS=${3:-4} NTOK=${4:-96} PROMPT=${5:-1024} CHUNK=${6:-128}
  "$B/bench_serve_model" "$W" "$LAYERS"
  cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); model: Qwen2-0.5B layer shapes x $LAYERS layers, f32, vocab 1392"
  for chunk in 0 "$CHUNK"; do
    start_server --max-tokens 256 --prefill-chunk "$chunk"
    echo "== --prefill-chunk $chunk"
    python3 bench/bench_serve_chunk.py "$PORT" "$CLIENTS" "$NTOK" "$PROMPT"
    kill -TERM $SPID; wait $SPID || true; SPID=
  done
  exit 0
fi
LAYERS=${1:-4} ROUNDS=${2:-2} NTOK=${3:-32} LEVELS=${4:-1,4,16}
"$B/bench_serve_model" "$W" "$LAYERS"
cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); model: Qwen2-0.5B layer shapes x $LAYERS layers, f32, vocab 1392"
for mode in batching no-batching; do
  flags=(); [ $mode = no-batching ] && flags=(--no-batching)
  start_server "${flags[@]}"
  echo "== $mode"
  python3 bench/bench_serve.py "$PORT" "$LEVELS" "$ROUNDS" "$NTOK"
  kill -TERM $SPID; wait $SPID || true; SPID=
done
