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
# (MMC_BENCH_THREADS, default all cores), one process at a time.
# Pairs (mmc / llama.cpp, bits per weight of the decoder linears): f32 / F32 (32 / 32), int8 / Q8_0
# (8 + 32/K, K = 1536 or 8960 / 8.5), nf4 / Q4_K_M (4.5 / about 4.9: Q4_K with Q6_K for some tensors).
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
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); threads $T; model: Qwen2-VL-2B LM shapes x $LAYERS layers, vocab 1392; $NTOK decode tokens, best of $ROUNDS"
MMC_OUT=$(OMP_NUM_THREADS=$T "$B/bench_quant" "$W" "$NTOK" "$ROUNDS" "$PLEN" f32 int8 nf4) || exit 1
echo "$MMC_OUT" | sed 's/^/mmc /'
declare -A P
if "$PY" -c 'import llama_cpp, gguf' 2>/dev/null; then
  LV=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
  "$PY" bench/bench_serve_gguf.py "$W" "$W/f32.gguf" f32 || exit 1
  P[f32]=$("$PY" bench/bench_quant_llama.py decode "$W/f32.gguf" "$NTOK" "$T" "$ROUNDS" "$PLEN")
  for q in q8_0 q4_k_m; do
    "$PY" bench/bench_quant_llama.py quantize "$W/f32.gguf" "$W/$q.gguf" "$q" "$T" >/dev/null 2>&1 || { echo "bench_quant: llama.cpp quantise $q failed"; continue; }
    P[$q]=$("$PY" bench/bench_quant_llama.py decode "$W/$q.gguf" "$NTOK" "$T" "$ROUNDS" "$PLEN")
    rm -f "$W/$q.gguf"
  done
  echo "llama.cpp (llama-cpp-python $LV): f32 ${P[f32]:-?} q8_0 ${P[q8_0]:-?} q4_k_m ${P[q4_k_m]:-?} tok/s"
else
  echo "bench_quant: no llama-cpp-python / gguf in $VENV: mmc figures only"
fi
python3 - "$LAYERS" "$T" "$MMC_OUT" "${P[f32]:-}" "${P[q8_0]:-}" "${P[q4_k_m]:-}" "$(cut -d' ' -f1 /proc/loadavg)" >&3 <<'PY'
import json, sys
layers, threads, out, load = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[7]
mmc = {l.split()[0]: float(l.split()[1]) for l in out.splitlines() if l.strip()}
peer = dict(zip(["f32", "q8_0", "q4_k_m"], sys.argv[4:7]))
for m, p in [("f32", "f32"), ("int8", "q8_0"), ("nf4", "q4_k_m")]:
    case = {"name": "quant_decode_%s_vs_%s" % (m, p), "mmc": mmc[m], "unit": "tok/s", "better": "higher",
            "note": "Qwen2-VL-2B LM x %s layers, single stream, %s threads, load %s" % (layers, threads, load)}
    if peer[p]:
        case["peer"] = float(peer[p])
        print("%-28s mmc %8.2f  llama.cpp %8.2f tok/s  ratio %.2f" % (case["name"], mmc[m], case["peer"], mmc[m] / case["peer"]),
              file=sys.stderr)
    print(json.dumps(case))
PY
