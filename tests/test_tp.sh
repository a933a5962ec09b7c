#!/usr/bin/env bash
# test_tp.sh — tensor parallelism (mmc_tp.h) on 2 ranks against one process
# (tests/tp_worker.c): the tiny Qwen2 (untied, then tied embeddings) trained 5 steps at tp=2
# reproduces the single-process losses (1e-5 relative) and final weights (5e-5 absolute);
# the gathered checkpoint loads at tp=1 and at tp=2; then tp2 x dp2 on 4 ranks. Skipped (exit 77) when mpirun or the
# worker (built only when CMake finds MPI) is missing.
set -u
MMC=${MMC:-build/mmc}
WORKER=${TP_WORKER:-$(dirname "$MMC")/tp_worker}
if ! command -v mpirun >/dev/null 2>&1; then echo "test_tp: skipped: no mpirun on PATH"; exit 77; fi
if [ ! -x "$WORKER" ]; then echo "test_tp: skipped: no $WORKER (built without MPI)"; exit 77; fi
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
fail=0
W=$(mktemp -d); out=$W/out; trap 'rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W"   # its own OpenMPI session directory (see test_dist_mpi.sh)
for fx in tiny tiny_tied; do
  if timeout 120 "${MPIRUN[@]}" -np 2 "$WORKER" tests/fixtures/qwen2/$fx 2 "$W/ckpt_$fx" 5 >"$out" 2>&1 &&
     [ "$(grep -c 'all .* tp checks passed' "$out")" = 2 ]; then
    echo "$fx: $(grep 'tp parity' "$out")"
    echo "$fx: $(grep 'tp checkpoint' "$out")"
  else
    echo "FAIL: tp=2 on $fx:"; cat "$out"; fail=1
  fi
done
# tp2 x dp2 on 4 ranks: two replicas of a 2-way split, gradients summed over the dp group
if timeout 120 "${MPIRUN[@]}" -np 4 "$WORKER" tests/fixtures/qwen2/tiny 2 "$W/ckpt_dp" 5 >"$out" 2>&1 &&
   [ "$(grep -c 'all .* tp checks passed' "$out")" = 4 ]; then
  echo "tiny: $(grep 'tp parity' "$out")"
else
  echo "FAIL: tp=2 x dp=2:"; cat "$out"; fail=1
fi
grep -m1 'tp validation' "$out"
[ $fail = 0 ] && echo "test_tp: passed" || echo "test_tp: FAILED"
exit $fail
