# pp_util.sh — sourced by the pipeline tests that drive `mmc train` / `mmc launch` and compare runs with
# test_pp_schedule (test_pp_zero, test_pp_zero3, test_pp_qlora) after `set -u`: `pp_setup NAME` runs
# mpi_setup (exit 77 without mpirun or an MPI build; MPIRUN, W, out, fail) with MMC and TEST_PP set, and
# defines run1 (one process), runN N (N ranks through mmc launch) and cmp_runs WHAT REF RUN TOLERANCES
# (test_pp_schedule compare: losses, weights max / mean, AdamW moments), each failure logged and counted.
. tests/mpi_util.sh
pp_setup() {
  MMC=${MMC:-build/mmc}
  TEST_PP=${TEST_PP:-$(dirname "$MMC")/test_pp_schedule}
  mpi_setup "$1" "$MMC" "$TEST_PP" "$(dirname "$MMC")/dist_mpi_worker"
  export MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-60}
}
run1() { "$MMC" train "$@" >>"$W/train.log" 2>&1 || { echo "FAIL: one process: $*"; tail -n 20 "$W/train.log"; fail=1; }; }
runN() { local n=$1; shift; timeout -k 10 120 "$MMC" launch -n "$n" "$@" >>"$W/train.log" 2>&1 ||
           { echo "FAIL: $n ranks: $*"; tail -n 30 "$W/train.log"; fail=1; }; }
cmp_runs() {  # cmp_runs WHAT REF RUN TOLERANCES
  if "$TEST_PP" compare "$W/$2" "$W/$3" $4 >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
