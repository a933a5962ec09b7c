#!/usr/bin/env bash
# test_bench_json.sh — bench/run.sh's results.json names its machine: a tiny fake run (a build
# folder holding this mmc and one fake bench_ binary that prints bench_gemm's fma_peak /
# mem_read_bw lines and a case) must give {"machine": mmc info --system + "measured" peaks,
# "peers", "cases": [...]}, the case with its figures, and --update (a filtered run) must keep
# the cases and machine of the file before it, also from an old-format file (a bare list).
# Needs python3 (merge.py); skipped without it. The peers' torch part is left out (no venv).
set -u
MMC=${MMC:-build/mmc}
command -v python3 >/dev/null || { echo "test_bench_json: skipped: no python3 (bench/merge.py needs it)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_bench_json.XXXXXX)
trap 'rm -rf "$W"' EXIT
ln -s "$(cd "$(dirname "$MMC")" && pwd)/$(basename "$MMC")" "$W/mmc"
cat > "$W/bench_fake" <<'EOS'
#!/bin/sh
echo '{"name": "fma_peak", "mmc": 500.5, "unit": "GFLOP/s", "better": "higher"}'
echo '{"name": "mem_read_bw", "mmc": 50.25, "unit": "GB/s", "better": "higher"}'
echo '{"name": "fake_case", "mmc": 2.0, "peer": 1.0, "unit": "GFLOP/s", "better": "higher"}'
EOS
chmod +x "$W/bench_fake"
fail=0
check() { if python3 -c "import json,sys; d=json.load(open(sys.argv[1])); $1" "$W/bench/results.json"; then :; else
  echo "FAIL: $2" >&2; fail=$((fail+1)); fi; }
MMC_BENCH_FILTER=fake bash bench/run.sh "$W" "$W/no-venv" > "$W/log" 2>&1 || { echo "FAIL: run.sh exited $?" >&2; cat "$W/log"; exit 1; }
check 'assert list(d) == ["machine", "peers", "cases"], list(d)' "results.json keys"
check 'm = d["machine"]; assert m["cpu"]["vendor"] and "avx512_bf16" in m["isa"] and (m["caches"]["L1d"] is None or m["caches"]["L1d"]["size"] > 0)' "machine cpu/isa/caches"
check 'assert d["machine"]["measured"] == {"fma_peak_gflops": 500.5, "mem_read_bw_gbs": 50.25}, d["machine"]["measured"]' "measured peaks"
check 'assert d["machine"]["gemm"]["f32"]["kc"] > 0 and d["machine"]["threads"] >= 1' "gemm kernels, threads"
check 'c = {r["name"]: r for r in d["cases"]}; assert c["fake_case"]["ratio"] == 2.0' "case merged with ratio"
grep -q "^machine: " "$W/log" || { echo "FAIL: table lacks the machine line" >&2; fail=$((fail+1)); }
# an old-format file (a bare list) is read by --update, and becomes the new format
echo '[{"name": "old_case", "mmc": 1.0, "unit": "x", "better": "higher"}]' > "$W/bench/results.json"
MMC_BENCH_FILTER=fake bash bench/run.sh "$W" "$W/no-venv" > "$W/log" 2>&1
check 'names = [r["name"] for r in d["cases"]]; assert "old_case" in names and "fake_case" in names, names' "--update keeps old cases"
check 'assert d["machine"]["cpu"]["family"] >= 0' "--update writes the machine"
[ $fail = 0 ] && echo "test_bench_json: all checks passed" || exit 1
