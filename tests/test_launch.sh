#!/usr/bin/env bash
# test_launch.sh — `mmc launch -n N RUN.yaml`: the mpirun command it builds (flags, threads per
# rank, config checked once before any process starts, a clear error when mpirun is missing),
# and a tiny 2-rank training through it that equals the same run under a hand-written mpirun
# (loss lines identical, final weights byte-identical). Two parts, two ctest cases:
# `test_launch.sh cmdline` and `test_launch.sh mpi` (skipped, exit 77, when mpirun or MPI support
# is missing); without an argument both run.
set -u
PART=${1:-all}
case $PART in cmdline|mpi|all) ;; *) echo "test_launch: no part named '$PART'"; exit 1 ;; esac
MMC=${MMC:-build/mmc}
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# its own OpenMPI session directory: concurrent mpiruns (ctest -j runs the MPI tests side by
# side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to mkdir was
# unable to create the desired directory ... File exists", then orte_init fails)
export OMPI_MCA_orte_tmpdir_base="$W"
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
cat > "$W/run.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 8, micro_batch_size: 2}
parallel: {zero: 1, timeout: 120}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}
training: {steps: 4, seed: 7, log_every: 1, save_every: 0, output_dir: $W/a}
YAML
if [ "$PART" != mpi ]; then
# the command line (no processes started)
out=$(MMC_MPIRUN=/bin/true OMP_NUM_THREADS=3 "$MMC" launch -n 2 "$W/run.yaml" --set training.steps=2 --print -- --mca btl self 2>&1)
echo "$out" | grep -q -- "-np 2 .*--bind-to none .*-x OMP_NUM_THREADS --mca btl self .*mmc train $W/run.yaml --set parallel.data_parallel=2 --set training.steps=2" \
  && echo "$out" | grep -q "OMP_NUM_THREADS=3" && ok "mpirun command line" || bad "command line: $out"
if [ "$(id -u)" = 0 ]; then echo "$out" | grep -q -- "--allow-run-as-root" && ok "--allow-run-as-root as root" || bad "root flag: $out"; fi
echo "$out" | grep -q -- "--oversubscribe" && bad "oversubscribe with 2 ranks: $out" || ok "no --oversubscribe when N <= cores"
out=$(MMC_MPIRUN=/bin/true "$MMC" launch -n 64 "$W/run.yaml" --set data.batch_size=128 --print 2>&1)
echo "$out" | grep -q -- "--oversubscribe" && ok "--oversubscribe when N > cores" || bad "no oversubscribe: $out"
out=$(MMC_MPIRUN=/bin/true "$MMC" launch -n 2 "$W/run.yaml" --set training.threads=5 --print 2>&1)
echo "$out" | grep -q "OMP_NUM_THREADS=5" && ok "threads per rank from training.threads" || bad "threads: $out"
out=$(MMC_MPIRUN=/bin/true "$MMC" launch -n 3 "$W/run.yaml" --print 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "does not divide into data_parallel 3" && ok "bad layout refused before launching" \
  || bad "bad layout (rc $rc): $out"
out=$(PATH=/nonexistent MMC_MPIRUN= "$MMC" launch -n 2 "$W/run.yaml" 2>&1); rc=$?
[ $rc = 1 ] && echo "$out" | grep -q "mpirun not found" && ok "missing mpirun: clear error" || bad "missing mpirun (rc $rc): $out"
"$MMC" train --print-config | grep -q "timeout" && ok "parallel.timeout is a config key" || bad "no parallel.timeout key"
fi
[ "$PART" = cmdline ] && exit $fail

skip() {   # the MPI part cannot run here: a skip (77) when it was the part asked for
  echo "test_launch mpi: skipped: $*"
  [ "$PART" = mpi ] && exit 77
  exit $fail
}
command -v mpirun >/dev/null 2>&1 || skip "no mpirun on PATH (apt-get install openmpi-bin)"
[ -x "$(dirname "$MMC")/dist_mpi_worker" ] || skip "built without MPI (apt-get install libopenmpi-dev, reconfigure)"
export OMP_NUM_THREADS=1
"$MMC" launch -n 2 "$W/run.yaml" > "$W/a.log" 2>&1 || { cat "$W/a.log"; bad "mmc launch -n 2 run"; }
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
"${MPIRUN[@]}" -np 2 "$MMC" train "$W/run.yaml" --set parallel.data_parallel=2 --set training.output_dir="$W/b" \
  > "$W/b.log" 2>&1 || { cat "$W/b.log"; bad "mpirun -np 2 run"; }
grep "^step " "$W/a.log" | sed 's/ tok\/s.*//' > "$W/a.lines"; grep "^step " "$W/b.log" | sed 's/ tok\/s.*//' > "$W/b.lines"
[ "$(wc -l < "$W/a.lines")" = 4 ] && cmp -s "$W/a.lines" "$W/b.lines" && ok "launch = mpirun: 4 loss lines identical" \
  || { bad "loss lines differ"; diff "$W/a.lines" "$W/b.lines"; }
cmp -s "$W/a/checkpoint-4/model.safetensors" "$W/b/checkpoint-4/model.safetensors" && ok "launch = mpirun: final weights byte-identical" \
  || bad "final weights differ"
grep -q "2 data-parallel ranks" "$W/a.log" && ok "2 ranks ran" || bad "not 2 ranks: $(head -5 "$W/a.log")"
[ $fail = 0 ] && echo "test_launch: passed" || echo "test_launch: FAILED"
exit $fail
