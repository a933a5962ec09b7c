#!/usr/bin/env bash
# test_pp_zero.sh — ZeRO-1/2 under pipeline parallelism (parallel.zero with parallel.pipeline_parallel; ZeRO-3:
# test_pp_zero3.sh):
# each stage's optimizer state (and, ZeRO-2, its gradients between steps) sharded over the stage's
# data-parallel group, the buckets reduce-scattered within it after the step's last micro-batch
# (trainer_pp.c, mmc_dp_reduce_grads). Compared by `test_pp_schedule compare` (every step's loss, the
# last checkpoint's weights and AdamW moments):
#   pp2 x dp2 zero1 / zero2 (4 ranks) vs pp2 x dp2 zero0: losses within 1e-6 relative, weights within
#        1e-6 (a reduce-scatter sums in another order than the all-reduce), moments within 1e-3 of scale;
#   the same vs one process: losses 1e-5, weights 4e-6 (as test_moe_pp's pp2 x dp2);
#   tied embeddings (4 layers, tie_word_embeddings, the first and last stage sum the embedding's
#        gradient before their reduce-scatters; the norm counts it once), interleaved (pipeline_virtual
#        2) pp2 x dp2 zero1 vs one process;
#   checkpoints: pp2 x dp2 zero1 for 2 steps (the moments gathered over each stage's dp group into
#        the single-process checkpoint), resumed in one process and at pp2 zero0: vs the 4-step
#        one-process run, same tolerances;
#   a sharded ZeRO checkpoint (dp2 zero1) resumed at pp2 x dp2 zero1.
# Skipped (exit 77) without mpirun or an MPI build.
set -u
. tests/pp_util.sh   # pp_setup, run1, runN, cmp_runs
pp_setup test_pp_zero
pp_zero_common   # ref (4 steps, one process) and z0 (pp2 x dp2 ZeRO-0); cfg, tied, NEAR, CLOSE, PP2
runN 4 "$W/ref.yaml" $PP2 --set parallel.zero=1 --set training.output_dir="$W/z1"
runN 4 "$W/ref.yaml" $PP2 --set parallel.zero=2 --set training.output_dir="$W/z2"
cmp_runs "pp2 x dp2 zero1 vs zero0" z0 z1 "$NEAR"
cmp_runs "pp2 x dp2 zero2 vs zero0" z0 z2 "$NEAR"
cmp_runs "pp2 x dp2 zero1 vs 1 process" ref z1 "$CLOSE"
cmp_runs "pp2 x dp2 zero2 vs 1 process" ref z2 "$CLOSE"
grep -q "ZeRO-2 over each stage's 2 data-parallel ranks" "$W/train.log" ||
  { echo "FAIL: no ZeRO-under-pipeline start-up line"; fail=1; }
run1 "$W/tied.yaml"
runN 4 "$W/tied.yaml" $PP2 --set parallel.pipeline_virtual=2 --set parallel.zero=1 --set training.output_dir="$W/tiedv"
cmp_runs "tied embeddings, interleaved pp2 x dp2 zero1 vs 1 process" tied tiedv "$CLOSE"
# checkpoints written at pp2 x dp2 zero1, resumed in one process and at pp2 zero0
runN 4 "$W/ref.yaml" $PP2 --set parallel.zero=1 --set training.steps=2 --set training.output_dir="$W/r1"
[ -s "$W/r1/checkpoint-2/optimizer.safetensors" ] || { echo "FAIL: pp x zero checkpoint lacks optimizer.safetensors"; fail=1; }
cp -r "$W/r1" "$W/rp"
run1 "$W/ref.yaml" --set training.output_dir="$W/r1" --resume
cmp_runs "pp2 x dp2 zero1 2 steps, resumed in 1 process" ref r1 "$CLOSE"
runN 2 "$W/ref.yaml" $PP2 --set training.output_dir="$W/rp" --resume
cmp_runs "pp2 x dp2 zero1 2 steps, resumed at pp2 zero0" ref rp "$CLOSE"
# a sharded ZeRO checkpoint (dp2 zero1: optimizer.rank<R>-of-2 + manifest) resumed at pp2 x dp2 zero1
runN 2 "$W/ref.yaml" --set parallel.zero=1 --set training.steps=2 --set training.output_dir="$W/rs"
[ -s "$W/rs/checkpoint-2/optimizer_manifest.json" ] || { echo "FAIL: dp2 zero1 wrote no sharded checkpoint"; fail=1; }
runN 4 "$W/ref.yaml" $PP2 --set parallel.zero=1 --set training.output_dir="$W/rs" --resume
cmp_runs "dp2 zero1 (sharded) 2 steps, resumed at pp2 x dp2 zero1" ref rs "$CLOSE"
[ $fail = 0 ] && echo "test_pp_zero: passed" || echo "test_pp_zero: FAILED"
exit $fail
