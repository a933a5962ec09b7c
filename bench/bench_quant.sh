#!/usr/bin/env bash
# bench_quant.sh — single-stream decode with quantised weights against llama.cpp at the same bits.
# The model: the language model of Qwen2-VL-2B at reduced depth (bench_serve_model ... qwen2-vl-2b: hidden
# 1536, intermediate 8960, 12/2 heads of 128; QUANT_LAYERS, default 4), random init, the tiny Qwen2
# fixture's vocabulary (1392, so that time is the layers', not a 150k-row lm_head's). mmc decodes it with
# its decoder linears in f32, int8 and NF4 (build/bench_quant: what `--quantize int8|nf4` does at load);
# llama.cpp (llama-cpp-python 0.3.36 from $MMC_BENCH_VENV, default /work/main/.venv-ref) decodes the same
# weights converted to an f32 GGUF (bench/bench_serve_gguf.py) and quantised by llama.cpp's own quantiser to
# Q8_0 and Q4_K_M (bench/bench_quant_llama.py). Both: a prompt of 8 fixed ids, then QUANT_NTOK (64) greedy
# tokens one at a time, tok/s of that decode, best of QUANT_ROUNDS (3), the same threads
# (MMC_BENCH_THREADS, default all cores), one process at a time, the two sides alternating within each round;
# and the same at 1 thread on each process's CPU-time clock (cases _1t_cpu: on a loaded host a process gets a
# share of the cores, and busy-waiting threads — llama.cpp's — keep a larger one than sleeping ones).
# Pairs (mmc / llama.cpp, bits per weight of the decoder linears): f32 / F32 (32 / 32), int8 / Q8_0
# (8 + 32/K, K = 1536 or 8960 / 8.51 from the file), nf4 / Q4_K_M (4.5 / 4.84: Q4_K with Q6_K for some tensors),
# and the 16-bit pairs bf16 / BF16 and bf16 / F16 (16 / 16): mmc on the same weights rounded to bf16
# (bench_serve_model ... bf16), llama.cpp on the f32 weights converted to a bf16 and an f16 GGUF
# (QUANT_BF16=0 leaves the 16-bit pairs out).
# JSON lines on stdout (bench/merge.py: quant_decode_<pair> with mmc, peer and the ratio), a table on stderr.
# usage: bench/bench_quant.sh   (MMC_BENCH_FILTER=bench_quant bash bench/run.sh build /work/main/.venv-ref)
set -eu
B=${BUILD:-build}
[ -n "${MMC:-}" ] && B=$(dirname "$MMC")   # bench/run.sh: MMC=BUILD/mmc
W=$(mktemp -d /tmp/mmc_bench_quant.XXXXXX)
trap 'rm -rf "$W"' EXIT
exec 3>&1 1>&2   # JSON lines to the caller's stdout (fd 3), everything else to stderr
LAYERS=${QUANT_LAYERS:-4} NTOK=${QUANT_NTOK:-64} ROUNDS=${QUANT_ROUNDS:-3} PLEN=8
T=${MMC_BENCH_THREADS:-$(nproc)}
VENV=${MMC_BENCH_VENV:-}
[ -z "$VENV" ] && { [ -x /work/main/.venv-ref/bin/python ] && VENV=/work/main/.venv-ref || VENV=.venv-ref; }
PY=$VENV/bin/python
"$B/bench_serve_model" "$W" "$LAYERS" 1392 qwen2-vl-2b || exit 1
cp tests/fixtures/qwen2/chat/tokenizer.json tests/fixtures/qwen2/chat/tokenizer_config.json "$W/"
BF=${QUANT_BF16:-1}
if [ "$BF" = 1 ]; then mkdir -p "$W/bf16" && "$B/bench_serve_model" "$W/bf16" "$LAYERS" 1392 qwen2-vl-2b bf16 || exit 1; fi
LQ="f32 q8_0 q4_k_m"; [ "$BF" = 1 ] && LQ="$LQ bf16 f16"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); threads $T; model: Qwen2-VL-2B LM shapes x $LAYERS layers, vocab 1392; $NTOK decode tokens, best of $ROUNDS"
# GGUFs first; then ROUNDS rounds, each running every mmc mode and every llama.cpp file once, so that
# both sides see the same host load (the machine is shared); the best round of each is kept
declare -A M P NOX
HAVE_LLAMA=0
if "$PY" -c 'import llama_cpp, gguf' 2>/dev/null; then
  HAVE_LLAMA=1
  LV=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
  "$PY" bench/bench_serve_gguf.py "$W" "$W/f32.gguf" f32 || exit 1
  for q in q8_0 q4_k_m; do
    "$PY" bench/bench_quant_llama.py quantize "$W/f32.gguf" "$W/$q.gguf" "$q" "$T" >/dev/null 2>&1 || { echo "bench_quant: llama.cpp quantise $q failed"; exit 1; }
  done
  if [ "$BF" = 1 ]; then
    for d in bf16 f16; do "$PY" bench/bench_serve_gguf.py "$W" "$W/$d.gguf" "$d" || exit 1; done
  fi
  echo "GGUF bytes: $(for q in $LQ; do printf '%s %s ' "$q" "$(stat -c %s "$W/$q.gguf")"; done)"
else
  echo "bench_quant: no llama-cpp-python / gguf in $VENV: mmc figures only"
fi
best() { python3 -c 'import sys; print(max(float(a) for a in sys.argv[1:] if a))' "$@"; }
# two clocks: wall at $T threads (what a user waits), and one thread's CPU time at 1 thread (_1t_cpu: the
# work a token costs, whatever share of the cores the loaded host gives each process)
for r in $(seq "$ROUNDS"); do
  for clk in wall cpu; do
    th=$T; [ $clk = cpu ] && th=1
    out=$(OMP_NUM_THREADS=$th MMC_BENCH_CPU_CLOCK=$([ $clk = cpu ] && echo 1 || echo 0) "$B/bench_quant" "$W" "$NTOK" 1 "$PLEN" f32 int8 nf4) || exit 1
    if [ "$BF" = 1 ]; then
      out="$out
$(OMP_NUM_THREADS=$th MMC_BENCH_CPU_CLOCK=$([ $clk = cpu ] && echo 1 || echo 0) "$B/bench_quant" "$W/bf16" "$NTOK" 1 "$PLEN" bf16)" || exit 1
    fi
    while read -r mode tps bytes; do M[$mode.$clk]=$(best "$tps" "${M[$mode.$clk]:-}"); done <<<"$out"
    if [ $HAVE_LLAMA = 1 ]; then
      for q in $LQ; do
        # a decode that dies (llama.cpp's AMX / repack buffers on the Intel kind: see bench_quant_llama.py) is
        # retried without llama.cpp's extra buffer types, and the case says so
        if [ -z "${NOX[$q]:-}" ] && tps=$("$PY" bench/bench_quant_llama.py decode "$W/$q.gguf" "$NTOK" "$th" 1 "$PLEN" $clk 2>/dev/null); then :
        else
          NOX[$q]=1
          tps=$(MMC_LLAMA_NO_EXTRA_BUFTS=1 "$PY" bench/bench_quant_llama.py decode "$W/$q.gguf" "$NTOK" "$th" 1 "$PLEN" $clk) || exit 1
        fi
        P[$q.$clk]=$(best "$tps" "${P[$q.$clk]:-}")
      done
    fi
    echo "round $r, $clk clock, $th thread(s) (load $(cut -d' ' -f1 /proc/loadavg)): mmc f32 ${M[f32.$clk]} int8 ${M[int8.$clk]} nf4 ${M[nf4.$clk]} bf16 ${M[bf16.$clk]:-?}; llama.cpp${LV:+ $LV} f32 ${P[f32.$clk]:-?} q8_0 ${P[q8_0.$clk]:-?} q4_k_m ${P[q4_k_m.$clk]:-?} bf16 ${P[bf16.$clk]:-?} f16 ${P[f16.$clk]:-?} tok/s (best so far)"
  done
done
ALL=$(for k in "${!M[@]}"; do echo "mmc $k ${M[$k]}"; done; for k in "${!P[@]}"; do echo "peer $k ${P[$k]}"; done)
python3 - "$LAYERS" "$T" "$ALL" "$(cut -d' ' -f1 /proc/loadavg)" "${!NOX[*]}" >&3 <<'PY'
import json, sys
layers, threads, load = sys.argv[1], sys.argv[2], sys.argv[4]
nox = set(sys.argv[5].split())   # GGUFs llama.cpp decoded without its extra buffer types (AMX / repack)
v = {}
for l in sys.argv[3].splitlines():
    side, key, val = l.split()
    v[(side, key)] = float(val)
for m, p in [("f32", "f32"), ("int8", "q8_0"), ("nf4", "q4_k_m"), ("bf16", "bf16"), ("bf16", "f16")]:
    for clk, sfx, th in [("wall", "", threads), ("cpu", "_1t_cpu", "1")]:
        mv, pv = v.get(("mmc", m + "." + clk)), v.get(("peer", p + "." + clk))
        if mv is None:
            continue
        case = {"name": "quant_decode_%s_vs_%s%s" % (m, p, sfx), "mmc": mv, "unit": "tok/s", "better": "higher",
                "note": "Qwen2-VL-2B LM x %s layers, single stream, %s thread(s)%s, load %s%s"
                        % (layers, th, ", CPU-time clock" if clk == "cpu" else "", load,
                           "; llama.cpp without its AMX / repack buffers (they crash on this CPU)" if p in nox else "")}
        if pv is not None:
            case["peer"] = pv
            print("%-34s mmc %8.2f  llama.cpp %8.2f tok/s  ratio %.2f" % (case["name"], mv, pv, mv / pv), file=sys.stderr)
        print(json.dumps(case))
PY
