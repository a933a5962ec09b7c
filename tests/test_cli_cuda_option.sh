#!/usr/bin/env bash
# test_cli_cuda_option.sh — there is no CUDA backend yet, so -DMMC_CUDA=ON must stop CMake at
# configure time with that message rather than build a CPU-only mmc that looks like a GPU build.
set -u
command -v cmake >/dev/null 2>&1 || { echo "skip: no cmake"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_cuda_option.XXXXXX)
trap 'rm -rf "$W"' EXIT
cmake -S . -B "$W" -DMMC_CUDA=ON >"$W.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "no CUDA backend yet" "$W.log"; then
  rm -f "$W.log"; echo "test_cli_cuda_option: ok (configure refused)"; exit 0
fi
echo "FAIL: cmake -DMMC_CUDA=ON exited $rc without 'no CUDA backend yet':"; tail -20 "$W.log"; rm -f "$W.log"; exit 1
