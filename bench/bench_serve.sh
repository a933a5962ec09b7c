#!/usr/bin/env bash
# bench_serve.sh — `mmc serve` under load (bench/bench_serve.py: streaming /v1/completions, greedy).
#
# Against llama.cpp (no arguments, as bench/run.sh runs it; or `llama`): the same model in `mmc serve` and in
# llama.cpp's server (llama-cpp-python[server], pinned in bench/bench_serve_requirements.txt, from the venv
# $MMC_BENCH_VENV, default /work/main/.venv-ref or .venv-ref) one after the other in this run, each alone on
# the machine, the same --threads: output tokens/s and p50/p99 time to first token and inter-token latency at
# 1, 4, 16 and 64 concurrent clients. The model: the language model of Qwen2-VL-2B at reduced depth
# (bench_serve_model ... qwen2-vl-2b: hidden 1536, intermediate 8960, 12/2 heads of 128; SERVE_LAYERS, default
# 2), random init, the tiny Qwen2 fixture's vocabulary (1392); mmc serves it in f32 and, rounded to bf16, in
# bf16 (bench_serve_model ... bf16: the same values), converted to GGUF f32, bf16 and f16
# (bench/bench_serve_gguf.py; SERVE_GGUF=f32,bf16,f16 to choose) for llama.cpp. The case names without a
# suffix: mmc f32 against llama.cpp on the f32 GGUF; _bf16 / _f16: mmc bf16 against the 16-bit GGUF.
# JSON lines on stdout (bench/merge.py), the tables on stderr. SERVE_NTOK (32 new tokens a request),
# SERVE_LEVELS (1,4,16,64), SERVE_MIN_REQUESTS (4: the 1-client level runs 4 requests in a row, each
# other level one request per client). llama-cpp-python's server runs requests one at a time (no batching
# across requests): --interrupt_requests False so that a new request does not cut the running one.
# usage: bench/bench_serve.sh [llama]
#
# Batching vs one request at a time: 1, 4 and 16 concurrent streaming clients with continuous batching and
# with the one-request-at-a-time engine (--no-batching). The model: Qwen2-0.5B's layer shapes at reduced
# depth, random init (bench_serve_model), with the tiny Qwen2 fixture's tokenizer.
# usage: bench/bench_serve.sh [batching] LAYERS(4) [ROUNDS=2] [MAX_TOKENS=32] [LEVELS=1,4,16]
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
[ -n "${MMC:-}" ] && B=$(dirname "$MMC")   # bench/run.sh: MMC=BUILD/mmc
W=$(mktemp -d /tmp/mmc_bench_serve.XXXXXX)
SPID=
trap '[ -n "$SPID" ] && kill $SPID 2>/dev/null; rm -rf "$W"' EXIT
start_server() {   # serve flags...
  rm -f "$W/err"   # else the last server's port may be read before the new one truncates it
  "$B/mmc" serve --model "${MODEL:-$W}" --port 0 --max-queue 256 --max-connections 256 ${THREADS:+--threads $THREADS} "$@" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null); [ -n "$PORT" ] && break; sleep 0.1
  done
}
if [ $# = 0 ] || [ "${1:-}" = llama ]; then
  exec 3>&1 1>&2   # JSON lines to the caller's stdout (fd 3), everything else to stderr
  LAYERS=${SERVE_LAYERS:-2} NTOK=${SERVE_NTOK:-32} LEVELS=${SERVE_LEVELS:-1,4,16,64} GGUF=${SERVE_GGUF:-f32,bf16,f16}
  export MIN_REQUESTS=${SERVE_MIN_REQUESTS:-4}
  T=${MMC_BENCH_THREADS:-${THREADS:-$(nproc)}}
  VENV=${MMC_BENCH_VENV:-}
  [ -z "$VENV" ] && { [ -x /work/main/.venv-ref/bin/python ] && VENV=/work/main/.venv-ref || VENV=.venv-ref; }
  PY=$VENV/bin/python
  "$B/bench_serve_model" "$W" "$LAYERS" 1392 qwen2-vl-2b || exit 1
  cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); threads $T; model: Qwen2-VL-2B LM shapes x $LAYERS layers, vocab 1392; $NTOK new tokens a request"
  declare -A R
  MODEL=$W
  THREADS=$T start_server --max-tokens 256 --kv-memory 512
  [ -n "$PORT" ] || { echo "bench_serve: mmc serve did not start: $(cat "$W/err")"; exit 1; }
  echo "== mmc serve (f32, continuous batching)"
  out=$(python3 bench/bench_serve.py "$PORT" "$LEVELS" 1 "$NTOK"); echo "$out" | grep -v '^RESULT'
  R[mmc]=$(echo "$out" | sed -n 's/^RESULT //p')
  kill -TERM $SPID; wait $SPID || true; SPID=
  if [ "$GGUF" != f32 ]; then   # a 16-bit peer: mmc on bf16 weights too
    mkdir -p "$W/bf16"
    "$B/bench_serve_model" "$W/bf16" "$LAYERS" 1392 qwen2-vl-2b bf16 || exit 1
    cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/bf16/"
    MODEL=$W/bf16 THREADS=$T start_server --max-tokens 256 --kv-memory 512
    [ -n "$PORT" ] || { echo "bench_serve: mmc serve (bf16) did not start: $(cat "$W/err")"; exit 1; }
    echo "== mmc serve (bf16, continuous batching)"
    out=$(python3 bench/bench_serve.py "$PORT" "$LEVELS" 1 "$NTOK"); echo "$out" | grep -v '^RESULT'
    R[mmc_bf16]=$(echo "$out" | sed -n 's/^RESULT //p')
    kill -TERM $SPID; wait $SPID || true; SPID=
  fi
  have_llama=0
  if "$PY" -c 'import llama_cpp.server, gguf' 2>/dev/null; then
    have_llama=1
    LV=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
    for dt in ${GGUF//,/ }; do
      "$PY" bench/bench_serve_gguf.py "$W" "$W/model-$dt.gguf" "$dt" || { echo "bench_serve: GGUF $dt failed"; continue; }
      LPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      "$PY" -m llama_cpp.server --model "$W/model-$dt.gguf" --host 127.0.0.1 --port "$LPORT" --n_threads "$T" \
        --n_threads_batch "$T" --n_ctx 4096 --interrupt_requests False --verbose False >"$W/lout" 2>&1 &
      SPID=$!
      for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$LPORT/v1/models" >/dev/null 2>&1 && break
        kill -0 $SPID 2>/dev/null || break; sleep 0.1
      done
      echo "== llama.cpp server (llama-cpp-python $LV, GGUF $dt)"
      out=$(python3 bench/bench_serve.py "$LPORT" "$LEVELS" 1 "$NTOK"); echo "$out" | grep -v '^RESULT'
      R[$dt]=$(echo "$out" | sed -n 's/^RESULT //p')
      kill -TERM $SPID; wait $SPID || true; SPID=
      rm -f "$W/model-$dt.gguf"
    done
  else
    echo "bench_serve: no llama-cpp-python[server] / gguf in $VENV: mmc figures only ($VENV/bin/pip install -r bench/bench_serve_requirements.txt)"
  fi
  python3 - "$LAYERS" "$T" "${LV:-}" "${R[mmc]}" "${R[mmc_bf16]:-}" "${R[f32]:-}" "${R[bf16]:-}" "${R[f16]:-}" >&3 <<'PY'
import json, sys
layers, threads, lv = sys.argv[1], sys.argv[2], sys.argv[3]
def rows(s):
    return {int(r[0]): r for r in (list(map(float, l.split())) for l in s.splitlines() if l.strip())}
mmc, mmc16 = rows(sys.argv[4]), rows(sys.argv[5])
peers = {"f32": rows(sys.argv[6]), "bf16": rows(sys.argv[7]), "f16": rows(sys.argv[8])}
# itl: a request's mean inter-token latency, (last token - first) / (tokens - 1), p50 / p99 over requests
# (llama-cpp-python's server sends its chunks in bursts, so gaps between chunks would say little of its
# decode); gap_p99: the p99 of the gaps between streamed chunks (stalls a client sees)
what = [("tok_s", 4, "tok/s", "higher"), ("ttft_p50", 5, "s", "lower"), ("ttft_p99", 6, "s", "lower"),
        ("itl_p50", 9, "s", "lower"), ("itl_p99", 10, "s", "lower"), ("gap_p99", 8, "s", "lower")]
for c in sorted(mmc):
    for dt, p in peers.items():
        if dt != "f32" and not (p and c in mmc16):
            continue
        m = mmc[c] if dt == "f32" else mmc16[c]
        note = "Qwen2-VL-2B LM x %s layers, mmc %s, %s threads" % (layers, "f32" if dt == "f32" else "bf16", threads)
        for key, i, unit, better in what:
            if dt == "f16" and key not in ("tok_s", "itl_p50"):
                continue
            r = {"name": "serve_c%d_%s%s" % (c, key, "" if dt == "f32" else "_" + dt), "mmc": round(m[i], 6),
                 "unit": unit, "better": better, "note": note}
            if c in p:
                r["peer"] = round(p[c][i], 6)
                r["peer_note"] = "llama-cpp-python %s, GGUF %s" % (lv, dt)
            print(json.dumps(r))
if 1 in mmc and 16 in mmc:
    print(json.dumps({"name": "serve_c16_over_c1_mmc", "mmc": round(mmc[16][4] / mmc[1][4], 4), "unit": "x",
                      "better": "none", "note": "mmc's 16-client throughput / its single stream (goal >= 4)"}))
PY
  exit 0
fi
if [ "${1:-}" = batching ]; then shift; fi
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
  python3 bench/bench_serve.py "$PORT" "$LEVELS" "$ROUNDS" "$NTOK" | grep -v '^RESULT'
  kill -TERM $SPID; wait $SPID || true; SPID=
done
