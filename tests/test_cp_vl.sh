#!/usr/bin/env bash
# test_cp_vl.sh — context parallelism for Qwen2-VL and Qwen2.5-VL (mmc_cp_qwen2_vl_loss, src/parallel/cp.c):
# the vision tower replicated over the cp group, its features scattered into the whole row, the
# 3-D M-RoPE positions computed on the whole row, then each rank keeping its shard (Ulysses: contiguous;
# ring: zigzag, padded); the features' gradient all-reduced over the group before the tower's backward.
# `mmc train` against one process: Qwen2-VL (224x224 images = 64 placeholders per image, so image runs
# cross the shard boundaries; mixed text / image micro-batches) Ulysses cp=2 and ring cp=3 (odd, row
# padded); Qwen2.5-VL (window attention tower, images in every row) ring cp=2; packed rows (B 1,
# cu_seqlens with a padding tail) Ulysses cp=2; LoRA on the tower (fused qkv) and the LM, ring cp=2;
# cp=2 x dp=2 (mmc launch -n 4); 2 steps at cp=2 resumed in one process. The Qwen2-VL runs also evaluate
# (data.eval every 2 steps: each rank of the first replica's group scores its shard of the eval rows,
# the group sums them; the eval loss within 1e-6 relative of one process's, measured <= 6.2e-8) and keep
# an EMA (training.ema_decay 0.9: every rank of a group holds the same weights and so the same EMA;
# ema.safetensors within the weights' tolerances, measured as the weights: 4.4e-6 Ulysses, 2.8e-5 ring).
# Tolerances (full fine-tuning, test_pp_schedule compare): losses 1e-5 relative, weights 1e-4 absolute
# max and 1e-7 mean, AdamW moments 1e-3 of each tensor's scale. Measured: losses <= 2.1e-7, weights
# mean <= 1.6e-8, moments <= 6.1e-5; weights max 1.4e-6 .. 9e-6 under Ulysses, 2.7e-5 .. 6e-5 under
# ring (AdamW turns the kernels' 1e-7 gradient rounding into that on entries whose gradient is near
# 0, as in test_cp.sh). Without the features' all-reduce the tower drifts by 2e-2 and the moments
# by 0.9 of scale. LoRA (tp_worker compare, adapters): measured 5.6e-7. Skipped (exit 77) without
# mpirun or an MPI build.
set -u
MMC=${MMC:-build/mmc}
BIN=$(dirname "$MMC")
CMP=$BIN/test_pp_schedule; TPW=$BIN/tp_worker
. tests/mpi_util.sh
mpi_setup test_cp_vl "$TPW" "$CMP"   # exits 77 without mpirun / an MPI build; MPIRUN, W, out, fail
TOL="1e-5 1e-4 1e-7 1e-3"

run1() { "$MMC" train "$@" >>"$W/train.log" 2>&1; }
runN() { local n=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$n" "$MMC" train "$@" >>"$W/train.log" 2>&1; }
cmp_runs() {  # cmp_runs WHAT REF RUN
  if "$CMP" compare "$W/$2" "$W/$3" $TOL >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
cmp_eval() {  # cmp_eval WHAT REF RUN: every eval_loss within 1e-6 relative
  local a b
  a=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/$2/metrics.jsonl" 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
  b=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/$3/metrics.jsonl" 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
  if [ -n "$a" ] && python3 -c "import sys; a, b = (list(map(float, x.split())) for x in sys.argv[1:]); sys.exit(len(a) != len(b) or any(abs(x - y) > 1e-6 * abs(x) for x, y in zip(a, b)))" "$a" "$b"; then
    echo "$1: eval_loss $b(one process: $a)"
  else echo "FAIL: $1: eval_loss '$b' vs one process '$a'"; fail=1; fi
}
cat > "$W/vl.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32}
data: {train: tests/fixtures/data/mixed.jsonl, eval: tests/fixtures/data/mixed.jsonl, max_pixels: 50176, min_pixels: 50176, seq_len: 256, batch_size: 4, micro_batch_size: 2, num_workers: 1, shuffle: false, bucket_window: 64}
parallel: {context_parallel: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, eval_every: 2, ema_decay: 0.9, save_every: 0, keep_last: 1, output_dir: $W/ref}
YAML
CP2="--set parallel.context_parallel=2"
RING="--set parallel.context_parallel_mode=ring"
run1 "$W/vl.yaml" || { echo "FAIL: Qwen2-VL reference run"; tail "$W/train.log"; fail=1; }
runN 2 "$W/vl.yaml" $CP2 --set training.output_dir="$W/u2" || { echo "FAIL: Qwen2-VL Ulysses cp=2 run"; tail "$W/train.log"; fail=1; }
cmp_runs "Qwen2-VL Ulysses cp=2 (tower replicated, image runs across the shards) vs 1 process" ref u2
runN 3 "$W/vl.yaml" --set parallel.context_parallel=3 $RING --set training.output_dir="$W/r3" ||
  { echo "FAIL: Qwen2-VL ring cp=3 run"; tail "$W/train.log"; fail=1; }
cmp_runs "Qwen2-VL ring cp=3 (zigzag shards, rows padded to a multiple of 6) vs 1 process" ref r3
cmp_eval "data.eval under Ulysses cp=2" ref u2
cmp_eval "data.eval under ring cp=3" ref r3

cat > "$W/q25.yaml" <<YAML
model: {path: tests/fixtures/qwen2_vl/q25_v5, dtype: f32}
data: {train: tests/fixtures/train/vl_batch.safetensors, batch_size: 2, micro_batch_size: 1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 0, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/q25ref}
YAML
run1 "$W/q25.yaml" && runN 2 "$W/q25.yaml" $CP2 $RING --set training.output_dir="$W/q25r2" ||
  { echo "FAIL: Qwen2.5-VL runs"; tail "$W/train.log"; fail=1; }
cmp_runs "Qwen2.5-VL (window-attention tower, HF directory) ring cp=2 vs 1 process" q25ref q25r2

PK="--set data.packing=true"
run1 "$W/vl.yaml" $PK --set training.output_dir="$W/pk1" && runN 2 "$W/vl.yaml" $PK $CP2 --set training.output_dir="$W/pk2" ||
  { echo "FAIL: packed runs"; tail "$W/train.log"; fail=1; }
cmp_runs "Qwen2-VL packed rows (positions restart per segment, padding tail) Ulysses cp=2 vs 1 process" pk1 pk2

VLORA='lora: {r: 4, alpha: 8, dropout: 0.0, targets: [qkv, proj, fc1, fc2, q_proj, o_proj, up_proj, down_proj]}'
sed "s/dtype: f32}/dtype: f32, $VLORA}/" "$W/vl.yaml" > "$W/vlL.yaml"
run1 "$W/vlL.yaml" --set training.output_dir="$W/L1" && runN 2 "$W/vlL.yaml" $CP2 $RING --set training.output_dir="$W/L2" ||
  { echo "FAIL: LoRA runs"; tail "$W/train.log"; fail=1; }
if "$TPW" compare "$W/L1" "$W/L2" >"$out" 2>&1; then
  echo "Qwen2-VL LoRA on the tower (fused qkv) and the LM, ring cp=2 vs 1 process (adapters): $(cat "$out")"
else echo "FAIL: LoRA ring cp=2:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi

timeout 120 "$MMC" launch -n 4 "$W/vl.yaml" $CP2 --set training.output_dir="$W/cpdp" >>"$W/train.log" 2>&1 ||
  { echo "FAIL: cp2 x dp2 run (mmc launch -n 4)"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc launch -n 4: Qwen2-VL Ulysses cp=2 x dp=2 vs 1 process" ref cpdp
cmp_eval "data.eval under cp=2 x dp=2 (the first replica's group evaluates)" ref cpdp

runN 2 "$W/vl.yaml" $CP2 --set training.output_dir="$W/res" --set training.steps=2 &&
  run1 "$W/vl.yaml" --set training.output_dir="$W/res" --resume || { echo "FAIL: resume runs"; tail "$W/train.log"; fail=1; }
cmp_runs "Qwen2-VL cp=2 2 steps, resumed in one process" ref res

[ $fail = 0 ] && echo "test_cp_vl: passed" || echo "test_cp_vl: FAILED"
exit $fail
