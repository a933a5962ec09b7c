#!/usr/bin/env bash
# test_moe_pp_ep.sh — expert parallelism inside a pipeline (parallel.expert_parallel with
# parallel.pipeline_parallel, trainer_pp.c): each stage's data-parallel group is carved into
# expert-parallel groups, so a stage's Qwen2-MoE layers keep 1/ep of their experts and exchange routed
# rows within the group through all-to-all (ep.c) while 1F1B runs; dense gradients are summed over the
# stage's dp group, each expert's over the ranks holding it; a checkpoint gathers every expert (the
# Hugging Face layout of one process). Against one process on the same global batch, compared by
# `test_pp_schedule compare` (every step's loss, the last checkpoint's weights and AdamW moments), on a
# 4-layer variant of tests/fixtures/moe/tiny (seeded init; 4 experts top-2, aux loss 0.05):
#   pp2 x ep2 (4 ranks), 1F1B: losses within 1e-5 relative, weights within 4e-6, moments within 1e-3 of
#                each tensor's scale (the exchange adds the expert outputs in another order), and the
#                capacity statistics (moe_load) of every step the one process's;
#   interleaved  pipeline_virtual 2, and DualPipeV with recompute (8 micro-batches): the same tolerances;
#   control      rank 0 holds fewer trained parameters than at pp2 x dp2 without ep (half the experts);
#   resume       pp2 x ep2's checkpoint-2 resumed in one process, and one process's at pp2 x ep2;
#   errors       ep not dividing a stage's data-parallel ranks (pp2 x ep2 on 2 ranks): refused.
# About 15 s on 2 cores.
set -u
MMC=${MMC:-build/mmc}
TEST_PP=${TEST_PP:-$(dirname "$MMC")/test_pp_schedule}
F=tests/fixtures/moe
. tests/mpi_util.sh
mpi_setup test_moe_pp_ep "$MMC" "$TEST_PP" "$(dirname "$MMC")/dist_mpi_worker"
export MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-60}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
CLOSE="1e-5 4e-6 1e-7 1e-3"
cmp_runs() {  # cmp_runs WHAT REF RUN
  if "$TEST_PP" compare "$W/$2" "$W/$3" $CLOSE >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; fail=1; fi
}
one() { local name=$1; shift; "$MMC" train "$@" --set training.output_dir="$W/$name" 2> "$W/$name.log" \
          || { tail -5 "$W/$name.log"; echo "FAIL: $name (one process)"; fail=1; }; }
many() { local n=$1 name=$2; shift 2; timeout -k 10 120 "$MMC" launch -n "$n" "$@" --set training.output_dir="$W/$name" \
           > "$W/$name.out" 2> "$W/$name.log" || { tail -8 "$W/$name.log"; echo "FAIL: $name ($n ranks)"; fail=1; }; }
python3 - $F/tiny/config.json "$W/l4.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4; c["layer_types"] = ["full_attention"] * 4
json.dump(c, open(sys.argv[2], "w"), indent=1)
PYEOF
cat > "$W/run.yaml" <<YAML
model: {init: $W/l4.json, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.1, schedule: cosine, warmup_steps: 1, grad_clip: 1.0}
training: {steps: 4, seed: 3, log_every: 1, save_every: 2, output_dir: $W/unused}
YAML
PPEP=(--set parallel.pipeline_parallel=2 --set parallel.expert_parallel=2)
one one "$W/run.yaml"
grep -q "moe_load" "$W/one.log" || { echo "FAIL: the one-process run is not a MoE run"; fail=1; }
many 4 ppep "$W/run.yaml" "${PPEP[@]}"
cmp_runs "pp2 x ep2 (4 ranks, 1F1B) vs 1 process" one ppep
grep -q "expert parallelism 2 inside each pipeline stage" "$W/ppep.log" || { echo "FAIL: no pp x ep start-up line"; fail=1; }
moe_load() { sed -n 's/^step \([0-9]*\)\/.*\(moe_load .*\)/\1 \2/p' "$1"; }
if [ "$(moe_load "$W/ppep.log" | wc -l)" = 4 ] && [ "$(moe_load "$W/ppep.log")" = "$(moe_load "$W/one.log")" ]; then
  echo "capacity statistics (moe_load) of every step: as one process's"
else echo "FAIL: pp2 x ep2's capacity statistics differ: $(moe_load "$W/ppep.log" | head -2)"; fail=1; fi
many 4 ppdp "$W/run.yaml" --set parallel.pipeline_parallel=2
tp() { sed -n 's/^mmc train: \([0-9]*\) trainable parameters.*/\1/p' "$1"; }
if [ -n "$(tp "$W/ppep.log")" ] && [ "$(tp "$W/ppep.log")" -lt "$(tp "$W/ppdp.log")" ]; then
  echo "control: rank 0 trains $(tp "$W/ppep.log") parameters at pp2 x ep2, $(tp "$W/ppdp.log") at pp2 x dp2"
else echo "FAIL: pp2 x ep2 does not split the experts ($(tp "$W/ppep.log") vs $(tp "$W/ppdp.log") parameters)"; fail=1; fi
many 4 ppepv "$W/run.yaml" "${PPEP[@]}" --set parallel.pipeline_virtual=2
cmp_runs "interleaved pp2 x ep2 vs 1 process" one ppepv
one one8 "$W/run.yaml" --set data.batch_size=8
many 4 ppepd "$W/run.yaml" "${PPEP[@]}" --set data.batch_size=8 --set parallel.pipeline_schedule=dualpipev --set model.recompute=full
cmp_runs "DualPipeV pp2 x ep2 with recompute vs 1 process" one8 ppepd
# resume across layouts from checkpoint-2 (the Hugging Face layout with every expert)
cp -r "$W/ppep" "$W/rone"; rm -rf "$W/rone/checkpoint-4"; sed -i '3,$d' "$W/rone/metrics.jsonl"
one rone "$W/run.yaml" --resume
cmp_runs "pp2 x ep2 resumed at step 2 in one process" one rone
cp -r "$W/one" "$W/rppep"; rm -rf "$W/rppep/checkpoint-4"; sed -i '3,$d' "$W/rppep/metrics.jsonl"
many 4 rppep "$W/run.yaml" "${PPEP[@]}" --resume
cmp_runs "one process resumed at step 2 at pp2 x ep2" one rppep
# ep must divide each stage's data-parallel ranks
if timeout -k 10 60 "$MMC" launch -n 2 "$W/run.yaml" "${PPEP[@]}" --set training.output_dir="$W/e1" >/dev/null 2>"$W/e1.log"; then
  echo "FAIL: pp2 x ep2 on 2 ranks accepted"; fail=1
elif ! grep -q "expert_parallel 2 does not divide the 1 data-parallel ranks" "$W/e1.log"; then
  echo "FAIL: pp2 x ep2 on 2 ranks: $(grep -m1 'mmc' "$W/e1.log")"; fail=1
fi
[ $fail = 0 ] && echo "test_moe_pp_ep: passed" || echo "test_moe_pp_ep: FAILED"
exit $fail
