#!/usr/bin/env bash
# Run every benchmark (build/bench_*) and every PyTorch peer (bench/peer_*.py) with the same
# thread count, merge by case name into build/bench/results.json and print a table.
# results.json: {"machine": mmc info --system + measured peaks, "peers": bench/torch_config.py,
# "cases": [...]} (bench/merge.py).
# Usage: bench/run.sh [BUILD_DIR] [REF_VENV]   (MMC_BENCH_FILTER=regex to run a subset)
set -uo pipefail
BUILD=${1:-build}
VENV=${2:-.venv-ref}
THREADS=${MMC_BENCH_THREADS:-$(nproc)}
FILTER=${MMC_BENCH_FILTER:-.}
export OMP_NUM_THREADS=$THREADS MMC_BENCH_THREADS=$THREADS MMC_BENCH_VENV=$VENV
# the wait policy the mmc command uses by default (tools/mmc.c), for both sides: spinning OpenMP
# threads on a shared host cost a many-region decode step up to 10x (README "Whisper")
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export MMC_REF_PY="$VENV/bin/python"   # bench_video writes its clip with it (PyAV)
mkdir -p "$BUILD/bench"
RAW="$BUILD/bench/raw.jsonl"
: > "$RAW"
# the machine (CPU, ISA flags, caches, mmc's GEMM kernels and blocking) and the peers' kernel
# paths head results.json (merge.py adds the FMA peak and read bandwidth bench_gemm measures)
MACHINE="$BUILD/bench/machine.json" PEERS="$BUILD/bench/peers.json"
rm -f "$MACHINE" "$PEERS"
"$BUILD/mmc" info --system --json > "$MACHINE" 2>/dev/null || { echo "bench: mmc info --system failed" >&2; rm -f "$MACHINE"; }
for b in "$BUILD"/bench_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b")
  echo "$name" | grep -qE "$FILTER" || continue
  echo "bench: $name" >&2
  "$b" >> "$RAW" || echo "bench: $name failed (exit $?)" >&2
done
# shell benchmarks (bench/bench_*.sh, e.g. multi-process runs under mpirun): same JSON lines
for b in bench/bench_*.sh; do
  [ -f "$b" ] || continue
  echo "$(basename "$b")" | grep -qE "$FILTER" || continue
  echo "bench: $(basename "$b")" >&2
  MMC="$BUILD/mmc" bash "$b" >> "$RAW" || echo "bench: $b failed (exit $?)" >&2
done
PY="$VENV/bin/python"
if [ -x "$PY" ]; then
  "$PY" bench/torch_config.py > "$PEERS" 2>/dev/null || { echo "bench: torch_config.py failed" >&2; rm -f "$PEERS"; }
  for p in bench/peer_*.py; do
    [ -f "$p" ] || continue
    echo "$(basename "$p")" | grep -qE "$FILTER" || continue
    echo "peer:  $(basename "$p")" >&2
    "$PY" "$p" >> "$RAW" || echo "peer: $p failed (exit $?)" >&2
  done
else
  echo "bench: no PyTorch venv at $VENV (run 'make fixtures' to create it); peers skipped" >&2
fi
UPDATE=""
[ "$FILTER" != "." ] && UPDATE="--update"   # a filtered run refreshes part of results.json
python3 bench/merge.py "$RAW" "$BUILD/bench/results.json" $UPDATE --machine "$MACHINE" --peers "$PEERS"
