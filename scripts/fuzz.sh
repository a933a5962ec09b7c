#!/usr/bin/env bash
# fuzz.sh BUILD_DIR [SECONDS] — run every libFuzzer target in BUILD_DIR (built with
# -DMMC_FUZZ=ON, see `make fuzz`) for SECONDS each (default 60), starting from the seed
# corpus fuzz/corpus/<target>/ (new inputs go to a scratch copy, the seeds stay as they
# are), with the dictionary fuzz/<target>.dict when there is one (JSON keys: mutations that
# keep the file parseable reach the loaders). Fails on the first crash, leak or sanitizer
# report; the reproducer is left in BUILD_DIR/fuzz-artifacts/.
set -euo pipefail
BUILD=${1:?usage: fuzz.sh BUILD_DIR [SECONDS]}
SECS=${2:-60}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ART="$BUILD/fuzz-artifacts"
mkdir -p "$ART"
shopt -s nullglob
targets=("$BUILD"/fuzz_*)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz.sh: no fuzz_* executables in $BUILD (configure with -DMMC_FUZZ=ON)" >&2; exit 1; }
status=0
for exe in "${targets[@]}"; do
  [ -x "$exe" ] && [ -f "$exe" ] || continue
  name=$(basename "$exe"); short=${name#fuzz_}
  work="$BUILD/fuzz-corpus/$short"
  mkdir -p "$work"
  dirs=("$work")
  [ -d "$ROOT/fuzz/corpus/$short" ] && dirs+=("$ROOT/fuzz/corpus/$short")
  dict=()
  [ -f "$ROOT/fuzz/$short.dict" ] && dict=(-dict="$ROOT/fuzz/$short.dict")
  echo "fuzz: $name for ${SECS}s"
  if ! ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
       "$exe" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
              -artifact_prefix="$ART/$short-" -print_final_stats=1 \
              "${dict[@]}" "${dirs[@]}" >"$ART/$short.log" 2>&1; then
    echo "fuzz: $name FAILED — see $ART/$short.log"; tail -n 40 "$ART/$short.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$ART/$short.log" | tail -n 2 | sed "s/^/  /"
  fi
done
exit $status
