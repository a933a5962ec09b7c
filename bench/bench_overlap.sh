#!/usr/bin/env bash
# bench_overlap.sh — communication overlap (README "Selective recompute, activation
# offload and communication overlap"), as JSON
# lines (bench/run.sh runs it; MMC_BENCH_FILTER=bench_overlap for this case alone). `mmc train` on a
# synthetic 8-layer Qwen2 (hidden 256, MLP 512, 128 tokens per row, 8 rows per step, 1 thread per
# rank), each figure against the same run without the overlap (the "peer" column):
#  - overlap_pp2_recv_wait_share: pipeline_parallel 2, receives posted two ops ahead
#    (pipeline_early_recv: true) against posted when their op runs: the ranks' mean time
#    blocked in pipeline receives in the last step over the median step time; _step_s: that step;
#  - overlap_tp2_step_s: tensor_parallel 2, the o / down all-reduces in 4 row chunks overlapped
#    with the next chunk's GEMM (tp_comm_chunks 4) against one all-reduce after the GEMM.
# Steps 2-5's median. Skipped (nothing printed) without mpirun or an MPI build.
set -uo pipefail
MMC=${MMC:-build/mmc}
command -v mpirun >/dev/null 2>&1 || { echo "bench_overlap: no mpirun" >&2; exit 0; }
"$MMC" launch --help 2>&1 | grep -q mpirun || { echo "bench_overlap: mmc built without MPI" >&2; exit 0; }
W=$(mktemp -d); trap '[ -n "${BENCH_OVERLAP_KEEP:-}" ] || rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W" OMP_NUM_THREADS=1   # one thread per rank: the ranks share the cores
source "$(dirname "$0")/l8_run.sh"
write_l8_run "$W"
run() {  # run NAME SETTINGS...
  local n=$1; shift
  timeout 300 "$MMC" launch -n 2 "$W/run.yaml" "$@" --set training.output_dir="$W/$n" >"$W/$n.log" 2>&1 ||
    { tail "$W/$n.log" >&2; exit 1; }
}
run ppe --set parallel.pipeline_parallel=2 --set parallel.pipeline_early_recv=true
run ppl --set parallel.pipeline_parallel=2 --set parallel.pipeline_early_recv=false
run tpc --set parallel.tensor_parallel=2 --set parallel.tp_comm_chunks=4
run tp1 --set parallel.tensor_parallel=2
python3 - "$W" <<'PY'
import json, re, sys
W = sys.argv[1]
def step(s):
    tps = sorted(json.loads(l)["tokens_per_s"] for l in open(f"{W}/{s}/metrics.jsonl") if '"loss"' in l)[1:]
    return 8 * 128 / tps[len(tps) // 2]
def wait(s):
    w = [float(x) for x in re.findall(r"([0-9.]+) s waiting in receives", open(f"{W}/{s}.log").read())]
    return sum(w) / len(w)
note = "8-layer Qwen2 hidden 256, 8 x 128 tokens per step, median of steps 2-5 (waits: step 5), 1 thread per rank"
se, sl = step("ppe"), step("ppl")
print(json.dumps({"name": "overlap_pp2_recv_wait_share", "mmc": wait("ppe") / se, "peer": wait("ppl") / sl, "unit": "",
                  "better": "lower", "peer_note": "mmc, receives posted when their op runs", "note": note}))
print(json.dumps({"name": "overlap_pp2_step_s", "mmc": se, "peer": sl, "unit": "s", "better": "lower",
                  "peer_note": "mmc, receives posted when their op runs", "note": note}))
print(json.dumps({"name": "overlap_tp2_step_s", "mmc": step("tpc"), "peer": step("tp1"), "unit": "s", "better": "lower",
                  "peer_note": "mmc, one all-reduce after each row-parallel GEMM", "note": note + ", tp_comm_chunks 4"}))
PY
