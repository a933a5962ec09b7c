#!/usr/bin/env bash
# bench_pp.sh — pipeline schedules (mmc_pp.h): DualPipeV against 1F1B, as JSON lines (bench/run.sh
# runs it; MMC_BENCH_FILTER=bench_pp for this case alone). The "peer" column is mmc's own 1F1B
# over the same stages and micro-batches, the schedule a user would otherwise pick:
#  - pp_dualpipev_p<P>_m<M>_sim_bubble: the simulator's idle share of a step (mmc_pp_simulate_dualpipev
#    against mmc_pp_simulate; forward : input gradient : weight gradient = 1 : 1 : 1, transfers free);
#  - pp_dualpipev_p2_m8_recv_wait_share: a measured run, `mmc train` at pipeline_parallel 2 on a
#    synthetic 8-layer Qwen2 (hidden 256, 128 tokens, 8 micro-batches per step): the ranks' mean
#    time blocked in pipeline receives in the last step over the median step time (the measured
#    bubble; a rank idle at the step's end waits in the gradient-norm all-reduce instead, which
#    this does not count);
#  - pp_dualpipev_p2_m8_step_s: the median time of steps 2-5.
# Skipped (nothing printed) without mpirun or an MPI build.
set -uo pipefail
MMC=${MMC:-build/mmc}
TPS=$(dirname "$MMC")/test_pp_schedule
command -v mpirun >/dev/null 2>&1 || { echo "bench_pp: no mpirun" >&2; exit 0; }
"$MMC" launch --help 2>&1 | grep -q mpirun || { echo "bench_pp: mmc built without MPI" >&2; exit 0; }
[ -x "$TPS" ] || { echo "bench_pp: no $TPS" >&2; exit 0; }
W=$(mktemp -d); trap '[ -n "${BENCH_PP_KEEP:-}" ] || rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W" OMP_NUM_THREADS=1   # one thread per rank: the ranks share the cores
for pm in "2 4" "2 8" "4 8" "4 16" "8 16" "8 32"; do "$TPS" bubble $pm; done >"$W/sim.out" || exit 1
source "$(dirname "$0")/l8_run.sh"
write_l8_run "$W"
for s in 1f1b dualpipev; do
  timeout 300 "$MMC" launch -n 2 "$W/run.yaml" --set parallel.pipeline_parallel=2 --set parallel.pipeline_schedule=$s \
    --set training.output_dir="$W/$s" >"$W/$s.log" 2>&1 || { tail "$W/$s.log" >&2; exit 1; }
done
python3 - "$W" <<'PY'
import json, re, sys
W = sys.argv[1]
for l in open(f"{W}/sim.out"):
    P, M, d, o = re.search(r"P (\d+) M (\d+): dualpipev ([0-9.]+) 1f1b ([0-9.]+)", l).groups()
    print(json.dumps({"name": f"pp_dualpipev_p{P}_m{M}_sim_bubble", "mmc": float(d), "peer": float(o), "unit": "",
                      "better": "lower", "peer_note": "mmc 1F1B, same P and M",
                      "note": "simulated idle share, F:B:W 1:1:1, transfers free"}))
def run(s):
    tps = sorted(json.loads(l)["tokens_per_s"] for l in open(f"{W}/{s}/metrics.jsonl") if '"loss"' in l)[1:]
    step = 8 * 128 / tps[len(tps) // 2]   # the median of steps 2..5 (the machine may be shared)
    waits = [float(x) for x in re.findall(r"([0-9.]+) s waiting in receives", open(f"{W}/{s}.log").read())]
    return step, sum(waits) / len(waits) / step
s1, w1 = run("1f1b")
sd, wd = run("dualpipev")
note = "pp 2, 8-layer Qwen2 hidden 256, 8 x 128 tokens per step, median of steps 2-5 (waits: step 5), 1 thread per rank"
print(json.dumps({"name": "pp_dualpipev_p2_m8_recv_wait_share", "mmc": wd, "peer": w1, "unit": "", "better": "lower",
                  "peer_note": "mmc 1F1B", "note": note}))
print(json.dumps({"name": "pp_dualpipev_p2_m8_step_s", "mmc": sd, "peer": s1, "unit": "s", "better": "lower",
                  "peer_note": "mmc 1F1B", "note": note}))
PY
