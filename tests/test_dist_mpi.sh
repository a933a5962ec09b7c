#!/usr/bin/env bash
# test_dist_mpi.sh — the MPI communicator on 2 and 4 processes (tests/dist_mpi_worker.c):
# every collective against its serial definition, overlap, groups; then a rank that stops
# participating must make the others abort within the timeout, naming it. Skipped (exit 77)
# when mpirun or the worker (built only when CMake finds MPI) is missing.
set -u
MMC=${MMC:-build/mmc}
WORKER=${DIST_WORKER:-$(dirname "$MMC")/dist_mpi_worker}
if ! command -v mpirun >/dev/null 2>&1; then echo "test_dist_mpi: skipped: no mpirun on PATH"; exit 77; fi
if [ ! -x "$WORKER" ]; then echo "test_dist_mpi: skipped: no $WORKER (built without MPI)"; exit 77; fi
export OMP_NUM_THREADS=1
# OpenMPI keeps process-lifetime allocations; LeakSanitizer would flag them in ASan builds
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
fail=0
W=$(mktemp -d); out=$W/out; trap 'rm -rf "$W"' EXIT
# its own OpenMPI session directory: concurrent mpiruns (ctest -j runs the MPI tests side by
# side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to mkdir was
# unable to create the desired directory ... File exists", then orte_init fails)
export OMPI_MCA_orte_tmpdir_base="$W"
for np in 2 4; do
  if timeout 120 "${MPIRUN[@]}" -np $np "$WORKER" >"$out" 2>&1; then
    echo "np=$np: $(grep -c 'all .* checks passed' "$out") ranks passed; $(grep overlap "$out")"
  else
    echo "FAIL: collectives on $np ranks:"; cat "$out"; fail=1
  fi
done
# hang: rank 2 of 3... use 4 ranks, rank 3 sleeps; timeout 2 s
t0=$(date +%s)
timeout 60 "${MPIRUN[@]}" -np 4 "$WORKER" hang 3 2 >"$out" 2>&1
rc=$?; t1=$(date +%s)
if [ $rc = 0 ]; then echo "FAIL: the hang run exited 0"; cat "$out"; fail=1
elif [ $rc = 124 ]; then echo "FAIL: the hang was not detected within 60 s"; cat "$out"; fail=1
elif ! grep -q "timeout: all_reduce #2 on group 'world'.*waiting on rank 3" "$out"; then
  echo "FAIL: no message naming rank 3:"; cat "$out"; fail=1
else
  echo "hang: detected in $((t1 - t0)) s (timeout 2 s): $(grep -m1 'waiting on rank 3' "$out" | cut -c1-200)"
fi
[ $fail = 0 ] && echo "test_dist_mpi: passed" || echo "test_dist_mpi: FAILED"
exit $fail
