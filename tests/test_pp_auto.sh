#!/usr/bin/env bash
# test_pp_auto.sh — pipeline stage boundaries from measured layer costs (parallel.pipeline_layers: auto,
# the default; src/train/trainer_pp.c, mmc_pp_auto_split in src/parallel/pp.c, the costs from the
# planner's calibration, mmc_plan_pp_measure in src/parallel/plan.c). The tiny Qwen2 with 4 or 8 layers
# and a 4096-token vocabulary: lm_head + cross-entropy over it cost several layers (measured here
# ~5 layers worth), so the last stage takes fewer layers than an even split gives it:
#   - pp=2, 4 layers: stages 3|1 (the even 2|2 would leave the last stage 2 layers + the head), the same
#     losses, weights and AdamW moments as one process (bit-identical: 1F1B accumulates in its order);
#   - pp=3, 4 layers (3 does not divide 4: without auto an error): 1|2|1, bit-identical;
#   - DualPipeV pp=2, 8 layers: virtual stages 2|2|3|1 (rank 0's chunk 1 holds the head), bit-identical;
#   - an explicit pipeline_layers list still decides ([2, 2]: no measurement), `even` too;
#   - the split is logged with each stage's modelled ms and the imbalance; the measured costs go to the
#     planner's calibration cache ($XDG_CACHE_HOME/mmc/plan-cpu.txt, here in the test's folder).
# Which split wins depends only on the head costing more than ~1.2 (pp=2), ~2 (DualPipeV) layers and
# less than ~30 layers (the even split is kept when it is within 3 % of the best): robust to the
# noise of a shared host. Skipped (exit 77) without mpirun or an MPI build.
set -u
. tests/pp_util.sh   # pp_setup, run1, runN, cmp_runs
pp_setup test_pp_auto
export XDG_CACHE_HOME="$W/cache"   # a calibration cache of its own: measured by this test
EXACT="0 0 0 0"
for L in 4 8; do
  sed -e "s/\"num_hidden_layers\": 2/\"num_hidden_layers\": $L/" -e 's/"vocab_size": 320/"vocab_size": 4096/' tests/fixtures/qwen2/tiny/config.json > "$W/v$L.json"
  cat > "$W/v$L.yaml" <<YAML
model: {init: $W/v$L.json, dtype: f32}
data: {train: synthetic, seq_len: 32, batch_size: 4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.1, schedule: cosine, warmup_steps: 1, grad_clip: 0.5}
training: {steps: 3, seed: 5, log_every: 1, save_every: 3, keep_last: 1, output_dir: $W/one$L}
YAML
done
split_is() {  # split_is WHAT EXPECTED: the last auto line of the log names that split
  local got
  got=$(grep 'pipeline: .*stages .* layers (auto, measured' "$W/train.log" | tail -n 1)
  if echo "$got" | grep -q "stages $2 layers (auto, measured"; then echo "$1: ${got#mmc train: }"
  else echo "FAIL: $1: expected stages $2, got: ${got:-no auto line}"; fail=1; fi
}
run1 "$W/v4.yaml"
runN 2 "$W/v4.yaml" --set parallel.pipeline_parallel=2 --set training.output_dir="$W/pp2"
split_is "pp=2, 4 layers, vocabulary 4096 (even: 2|2)" "3|1"
grep -q 'stage layers: \[0, 3) \[3, 4)' "$W/train.log" || { echo "FAIL: pp=2 did not run layers [0, 3) [3, 4)"; fail=1; }
cmp_runs "auto pp=2 vs 1 process" one4 pp2 "$EXACT"
runN 3 "$W/v4.yaml" --set parallel.pipeline_parallel=3 --set data.batch_size=3 --set training.output_dir="$W/pp3"
split_is "pp=3, 4 layers (3 does not divide 4)" "1|2|1"
run1 "$W/v4.yaml" --set data.batch_size=3 --set training.output_dir="$W/one4b3"
cmp_runs "auto pp=3 vs 1 process" one4b3 pp3 "$EXACT"
run1 "$W/v8.yaml"
runN 2 "$W/v8.yaml" --set parallel.pipeline_parallel=2 --set parallel.pipeline_schedule=dualpipev \
  --set parallel.pipeline_layers=auto --set training.output_dir="$W/dpv"
split_is "DualPipeV pp=2, 8 layers (virtual stages down | up)" "2|2|3|1"
cmp_runs "auto DualPipeV pp=2 vs 1 process" one8 dpv "$EXACT"
# an explicit list decides; `even` is the even split; neither measures
n0=$(grep -c '(auto, measured' "$W/train.log")
runN 2 "$W/v4.yaml" --set parallel.pipeline_parallel=2 --set "parallel.pipeline_layers=[2, 2]" --set training.output_dir="$W/l22"
grep -q 'stage layers: \[0, 2) \[2, 4)' "$W/train.log" || { echo "FAIL: pipeline_layers [2, 2] not kept"; fail=1; }
runN 2 "$W/v4.yaml" --set parallel.pipeline_parallel=2 --set parallel.pipeline_layers=even --set training.output_dir="$W/ev"
[ "$(grep -c 'stage layers: \[0, 2) \[2, 4)' "$W/train.log")" = 2 ] || { echo "FAIL: pipeline_layers even not even"; fail=1; }
[ "$(grep -c '(auto, measured' "$W/train.log")" = "$n0" ] || { echo "FAIL: an explicit split measured the layers"; fail=1; }
cmp_runs "pipeline_layers [2, 2] vs 1 process" one4 l22 "$EXACT"
# the costs were measured with the planner's calibration and kept in its cache
for k in stack head; do
  grep -q "^$k " "$XDG_CACHE_HOME/mmc/plan-cpu.txt" 2>/dev/null || { echo "FAIL: no '$k' entry in the calibration cache"; fail=1; }
done
[ $fail = 0 ] && echo "test_pp_auto: passed" || echo "test_pp_auto: FAILED"
exit $fail
