#!/usr/bin/env bash
# test_moe_tp.sh — Qwen2-MoE with expert parallelism composed with tensor and data parallelism
# (Megatron-LM's grid: tp fastest, then data; the expert-parallel groups are expert_parallel
# consecutive data-parallel ranks at the same tp rank, and every expert is split over tp like the
# dense MLP — expert tensor parallelism at the attention's size), against one process on the same
# global batch (tests/fixtures/moe/tiny: 3 layers, 4 experts top-2, moe_intermediate 16, shared 24):
#   tp2          (2 ranks: the decoder and every expert split in two)          6 AdamW steps
#   tp2 x ep2    (4 ranks: tp 2 x dp 2, each dp pair an ep group: 2 experts per rank, each half)
#   tp2 x dp2    (4 ranks, ep 1: experts split over tp, replicated over dp)
#   the tp2 x ep2 checkpoint (gathered over tp, then ep: HF names, every expert whole) continued
#   2 steps in one process against the single process's run continued from its own checkpoint
#   errors: tp that does not divide moe_intermediate_size, sequence_parallel with expert_parallel
# Tolerances as test_tp.sh (the all-reduces add partial products in another order): losses 1e-5
# relative; the checkpoint's weights 2e-4 max absolute (lr 3e-3; AdamW turns rounding in
# near-zero gradients into lr-sized steps). Measured on this machine: printed below.
# About 25 s on 2 cores at load 18.
set -u
MMC=${MMC:-build/mmc}
F=tests/fixtures/moe
[ -x "$MMC" ] || { echo "test_moe_tp: skipped: no mmc binary at $MMC"; exit 77; }
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$(dirname "$MMC")/dist_mpi_worker" ]; then
  echo "test_moe_tp: skipped: no mpirun, or mmc built without MPI"; exit 77
fi
W=$(mktemp -d /tmp/mmc_test_moe_tp.XXXXXX); trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-60} OMPI_MCA_orte_tmpdir_base="$W"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
. tests/train_check.sh   # ok / bad, losses, maxrel, within, stdiff
L=(timeout -k 10 120 "$MMC" launch)

# 4 micro-batches of 16 synthetic tokens per step: 1 per rank at dp 4, 2 at dp 2, 4 at dp 1
cat > "$W/run.yaml" <<YAML
model: {path: $F/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.1, schedule: cosine, warmup_steps: 1, grad_clip: 1.0}
training: {steps: 6, seed: 3, log_every: 1, save_every: 6, output_dir: $W/one}
YAML
"$MMC" train "$W/run.yaml" 2> "$W/one.log" || { tail -20 "$W/one.log"; bad "single-process run failed"; }
losses "$W/one.log" > "$W/one.txt"

check() {   # name, launch args...: the run's losses and final checkpoint against the single process
  local name=$1; shift
  if "${L[@]}" "$@" --set training.output_dir="$W/$name" > "$W/$name.out" 2> "$W/$name.log"; then
    losses "$W/$name.log" > "$W/$name.txt"
    local d w
    d=$(maxrel "$W/$name.txt" "$W/one.txt")
    w=$(stdiff "$W/$name/checkpoint-6/model.safetensors" "$W/one/checkpoint-6/model.safetensors")
    echo "$name: losses vs single process $d relative; checkpoint max |w - w_single| $w"
    within "$d" 1e-5 && [ "$(wc -l < "$W/$name.txt")" = 6 ] && ok || bad "$name losses differ by $d"
    within "$w" 2e-4 && ok || bad "$name checkpoint differs from the single process's by $w"
  else tail -20 "$W/$name.log"; bad "$name training failed"; fi
}
check tp2 -n 2 "$W/run.yaml" --set parallel.tensor_parallel=2
check tp2ep2 -n 4 "$W/run.yaml" --set parallel.tensor_parallel=2 --set parallel.expert_parallel=2
grep -q "tensor parallelism 2 x data parallelism 2" "$W/tp2ep2.log" && ok || bad "tp2 x ep2: no tp 2 x dp 2 start-up line"
check tp2dp2 -n 4 "$W/run.yaml" --set parallel.tensor_parallel=2

# the tp2 x ep2 checkpoint in one process: the same 2 steps as the single process's checkpoint continued
if [ -f "$W/tp2ep2/checkpoint-6/model.safetensors" ]; then
  for src in one tp2ep2; do
    "$MMC" train "$W/run.yaml" --set model.path="$W/$src/checkpoint-6" --set training.steps=2 \
      --set training.output_dir="$W/c_$src" 2> "$W/c_$src.log" || tail -5 "$W/c_$src.log"
    losses "$W/c_$src.log" > "$W/c_$src.txt"
  done
  d=$(maxrel "$W/c_tp2ep2.txt" "$W/c_one.txt")
  echo "tp2 x ep2 checkpoint continued in one process: losses vs the single process's checkpoint $d relative"
  within "$d" 1e-5 && [ "$(wc -l < "$W/c_one.txt")" = 2 ] && ok || bad "tp2 x ep2 checkpoint continued: $d"
fi

# errors before any work: tp 3 does not divide moe_intermediate_size 16 (nor the heads: the decoder's
# check comes first); sequence parallelism with expert parallelism
"${L[@]}" -n 2 "$W/run.yaml" --set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true \
  --set parallel.expert_parallel=2 --set training.output_dir="$W/e1" > "$W/e1.out" 2> "$W/e1.log" \
  && bad "sequence_parallel with expert_parallel was accepted" \
  || { grep -q "expert_parallel.*sequence_parallel is not supported" "$W/e1.log" && ! grep -q "^step " "$W/e1.log" && ok \
       || { tail -5 "$W/e1.log"; bad "sp/ep message"; }; }
mkdir -p "$W/odd"; cp $F/tiny/* "$W/odd/"
sed -i 's/"moe_intermediate_size": 16/"moe_intermediate_size": 15/' "$W/odd/config.json"
"${L[@]}" -n 2 "$W/run.yaml" --set model.path="$W/odd" --set parallel.tensor_parallel=2 \
  --set training.output_dir="$W/e2" > "$W/e2.out" 2> "$W/e2.log" && bad "tp 2 over moe_intermediate_size 15 was accepted" \
  || { grep -q "tensor_parallel 2 does not divide moe_intermediate_size 15" "$W/e2.log" && ! grep -q "^step " "$W/e2.log" && ok \
       || { tail -5 "$W/e2.log"; bad "moe_intermediate_size message"; }; }

echo "test_moe_tp: $((n - fail)) of $n checks passed"
[ $fail = 0 ]
