#!/usr/bin/env bash
# test_dist_mpi.sh — the MPI communicator on 2 and 4 processes (tests/dist_mpi_worker.c):
# every collective against its serial definition, overlap, groups; then a rank that stops
# participating must make the others abort within the timeout, naming it. Skipped (exit 77)
# when mpirun or the worker (built only when CMake finds MPI) is missing.
set -u
MMC=${MMC:-build/mmc}
WORKER=${DIST_WORKER:-$(dirname "$MMC")/dist_mpi_worker}
. "$(dirname "$0")/mpi_util.sh"   # (the session directory and the rest: see there)
mpi_setup test_dist_mpi "$WORKER"
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
