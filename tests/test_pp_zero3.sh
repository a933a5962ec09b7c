#!/usr/bin/env bash
# test_pp_zero3.sh — ZeRO-3 under pipeline parallelism (parallel.zero 3 with parallel.pipeline_parallel):
# each stage's trained parameters live as 1/dp fp32 master shards on the stage's data-parallel ranks
# between steps; the whole stage, as one unit, is all-gathered (in the model's dtype, rounded as the
# one-process trainer rounds its masters) for a step's micro-batches — 1F1B runs a micro-batch's backward
# after other micro-batches' forwards, so per-layer resharding would gather every layer twice per
# micro-batch (torchtitan keeps FSDP units gathered under pp likewise) — then the gradients are
# reduce-scattered within the stage's dp group and the full parameters and gradients freed
# (trainer_pp.c, mmc_dp_gather_stage / mmc_dp_reduce_grads). Compared by `test_pp_schedule compare`:
#   f32 pp2 x dp2 zero3 vs pp2 x dp2 zero0: losses 1e-6 relative, weights 1e-6, moments 1e-3 of scale
#        (measured: bit-identical); vs one process: losses 1e-5, weights 4e-6 (the dp sum's order);
#   tied embeddings (4 layers; the first and last stage sum the embedding's gradient first) vs 1 process;
#   bf16 (fp32 masters sharded) vs pp2 x dp2 zero0 in bf16, masters included: within the f32 tolerances
#        (measured: bit-identical); a bf16 zero3 checkpoint (parameters, masters and moments gathered
#        into the single-process layout) resumed at pp2 x dp2 zero0: the same;
#   Qwen2-VL (tower on stage 0) with data.eval: losses and weights vs one process (test_pp's VL
#        tolerances), the eval loss within 1e-6 (every rank evaluates on the gathered parameters);
#   rank 0 holds at most half its step's peak of parameter bytes between steps; the start-up line
#   names the sharding.
# Skipped (exit 77) without mpirun or an MPI build.
set -u
. tests/pp_util.sh   # pp_setup, run1, runN, cmp_runs
pp_setup test_pp_zero3
pp_zero_common   # ref (4 steps, one process) and z0 (pp2 x dp2 ZeRO-0); cfg, tied, NEAR, CLOSE, PP2
run1 "$W/tied.yaml"
runN 4 "$W/ref.yaml" $PP2 --set parallel.zero=3 --set training.output_dir="$W/z3"
# the parameters are sharded between steps: rank 0 holds less than the step's peak (the gathered stage)
mem=$(grep "rank 0 holds" "$W/train.log" | tail -n 1)
held=$(echo "$mem" | sed -n 's/.*holds \([0-9]*\) bytes of parameters.*/\1/p')
peak=$(echo "$mem" | sed -n 's/.*peaks during steps: \([0-9]*\) of parameters.*/\1/p')
if [ -n "$held" ] && [ -n "$peak" ] && [ $((2 * held)) -le "$peak" ]; then
  echo "zero3 memory: rank 0 holds $held bytes of parameters between steps, $peak at the step's peak"
else echo "FAIL: zero3 does not shard the stage's parameters: $mem"; fail=1; fi
cmp_runs "pp2 x dp2 zero3 vs zero0" z0 z3 "$NEAR"
cmp_runs "pp2 x dp2 zero3 vs 1 process" ref z3 "$CLOSE"
runN 4 "$W/tied.yaml" $PP2 --set parallel.zero=3 --set training.output_dir="$W/tiedz3"
cmp_runs "tied embeddings, pp2 x dp2 zero3 vs 1 process" tied tiedz3 "$CLOSE"
# bf16 (fp32 masters sharded; the bf16 weights gathered as the trainer rounds them): zero3 = zero0
BF="--set model.dtype=bf16"
runN 4 "$W/ref.yaml" $BF $PP2 --set training.output_dir="$W/b0"
runN 4 "$W/ref.yaml" $BF $PP2 --set parallel.zero=3 --set training.output_dir="$W/b3"
cmp_runs "bf16 pp2 x dp2 zero3 vs zero0 (masters included)" b0 b3 "$NEAR"
runN 4 "$W/ref.yaml" $BF $PP2 --set parallel.zero=3 --set training.steps=2 --set training.output_dir="$W/rb"
runN 4 "$W/ref.yaml" $BF $PP2 --set training.output_dir="$W/rb" --resume
cmp_runs "bf16 pp2 x dp2 zero3 2 steps, resumed at pp2 x dp2 zero0" b0 rb "$NEAR"
# Qwen2-VL (the vision tower on stage 0, gathered with it) with data.eval: every rank of the split
# model evaluates on the gathered parameters; the eval loss within 1e-6 of one process's
cat > "$W/vl.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32}
data: {train: tests/fixtures/data/mixed.jsonl, eval: tests/fixtures/data/mixed.jsonl, max_pixels: 3136, min_pixels: 3136, seq_len: 128, batch_size: 4, micro_batch_size: 1, num_workers: 1, shuffle: false, bucket_window: 64}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 2, seed: 7, log_every: 1, save_every: 2, eval_every: 2, keep_last: 1, output_dir: $W/vl}
YAML
run1 "$W/vl.yaml"
runN 4 "$W/vl.yaml" $PP2 --set parallel.zero=3 --set training.output_dir="$W/vlz3"
cmp_runs "Qwen2-VL pp2 x dp2 zero3 vs 1 process" vl vlz3 "1e-5 4e-5 1e-6 1e-2"
e1=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/vl/metrics.jsonl" 2>/dev/null); e2=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/vlz3/metrics.jsonl" 2>/dev/null)
if [ -n "$e1" ] && [ -n "$e2" ] && python3 -c "import sys; a, b = (float(x.split()[-1]) for x in sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * abs(a))" "$e1" "$e2"; then
  echo "Qwen2-VL data.eval at pp2 x dp2 zero3: $e2 (one process: $e1)"
else echo "FAIL: Qwen2-VL data.eval at pp2 x dp2 zero3: '$e2' vs one process '$e1'"; fail=1; fi
grep -q "ZeRO-3 over each stage's 2 data-parallel ranks" "$W/train.log" || { echo "FAIL: no pp x ZeRO-3 start-up line"; fail=1; }
[ $fail = 0 ] && echo "test_pp_zero3: passed" || echo "test_pp_zero3: FAILED"
exit $fail
