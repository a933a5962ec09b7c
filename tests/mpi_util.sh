# mpi_util.sh — sourced by the multi-rank tests after `set -u`: `mpi_setup NAME WORKER...` exits 77
# (ctest's skip) without mpirun or one of the worker binaries (built only when CMake finds MPI), and
# sets what every such test uses: one OpenMP thread a rank, LeakSanitizer off (OpenMPI keeps
# process-lifetime allocations that an ASan build would flag), MPIRUN (an array: oversubscribed, not
# bound, as root where the tests run as root), fail=0, a scratch folder W (removed at exit) with
# out=$W/out, and OpenMPI's session directory inside it: concurrent mpiruns (ctest -j runs the MPI
# tests side by side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to
# mkdir was unable to create the desired directory ... File exists", then orte_init fails).
mpi_setup() {
  local name=$1 w; shift
  if ! command -v mpirun >/dev/null 2>&1; then echo "$name: skipped: no mpirun on PATH"; exit 77; fi
  for w in "$@"; do
    if [ ! -x "$w" ]; then echo "$name: skipped: no $w (built without MPI)"; exit 77; fi
  done
  export OMP_NUM_THREADS=1
  export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
  MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS)
  [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
  fail=0
  W=$(mktemp -d); out=$W/out
  trap 'rm -rf "$W"' EXIT
  export OMPI_MCA_orte_tmpdir_base="$W"
}
