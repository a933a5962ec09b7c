#!/usr/bin/env bash
# test_pp_lora.sh — LoRA under pipeline parallelism (parallel.pipeline_parallel with model.lora)
# against one process, compared by `test_pp_schedule compare` (losses of every step, the adapters
# of the last checkpoint and their AdamW state). The adapters are attached to the whole model
# before each stage keeps its layers, so they start as one process's (A and the dropout streams),
# and each micro-batch's dropout masks come from (seed, step, micro-batch) as in one process:
#   - pp=2 on the tiny Qwen2 with LoRA dropout 0.1: bit-identical;
#   - interleaved (pipeline_virtual 2) and DualPipeV at pp=2 on a 4-layer model: bit-identical;
#   - pp=2 x tp=2 (4 ranks): bit-identical to tp=2 alone;
#   - pp=2 x dp=2 (4 ranks, no dropout: replicas draw their own masks): losses within 1e-6,
#     adapters within 5e-5 (the replicas' gradients are summed in another order);
#   - Qwen2.5-VL with adapters on the vision tower (stage 0) and the language model: bit-identical;
#   - resume: pp=2 for 2 steps then pp=2 / one process, one process then pp=2: bit-identical;
#   - the checkpoint is PEFT's layout (adapter_config.json + adapter_model.safetensors with every
#     stage's adapters), byte-for-byte the same tensors as one process's.
# Skipped (exit 77) without mpirun or an MPI build.
set -u
MMC=${MMC:-build/mmc}
TEST_PP=${TEST_PP:-$(dirname "$MMC")/test_pp_schedule}
if ! command -v mpirun >/dev/null 2>&1; then echo "test_pp_lora: skipped: no mpirun on PATH"; exit 77; fi
if ! "$MMC" launch --help 2>&1 | grep -q mpirun || [ ! -x "$TEST_PP" ]; then
  echo "test_pp_lora: skipped: mmc built without MPI"; exit 77
fi
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
fail=0
W=$(mktemp -d); out=$W/out; trap 'rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W"
EXACT="0 0 0 0"
CLOSE="1e-6 5e-5 1e-7 1e-3"
LORA="lora: {r: 4, alpha: 8, dropout: 0.1, targets: [q_proj, v_proj, o_proj, down_proj]}"
cfg() {  # cfg NAME MODEL_KEY MODEL BATCH STEPS
  cat > "$W/$1.yaml" <<YAML
model: {$2: $3, dtype: f32, $LORA}
data: {train: synthetic, seq_len: 16, batch_size: $4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: $5, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
run1() { "$MMC" train "$@" >>"$W/train.log" 2>&1 || { echo "FAIL: one process: $*"; tail -n 20 "$W/train.log"; fail=1; }; }
runN() { local n=$1; shift; timeout 120 "$MMC" launch -n "$n" "$@" >>"$W/train.log" 2>&1 ||
           { echo "FAIL: $n ranks: $*"; tail -n 30 "$W/train.log"; fail=1; }; }
cmp_runs() {  # cmp_runs WHAT REF RUN TOLERANCES
  if "$TEST_PP" compare "$W/$2" "$W/$3" $4 >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' tests/fixtures/qwen2/tiny/config.json > "$W/l4.json"
cfg ref path tests/fixtures/qwen2/tiny 4 4
cfg ref4 init "$W/l4.json" 4 4
PP2="--set parallel.pipeline_parallel=2"
run1 "$W/ref.yaml"; run1 "$W/ref4.yaml"
runN 2 "$W/ref.yaml" $PP2 --set training.output_dir="$W/pp2"
cmp_runs "LoRA pp=2 (dropout 0.1) vs 1 process" ref pp2 "$EXACT"
for f in adapter_config.json adapter_model.safetensors; do
  [ -s "$W/pp2/checkpoint-4/$f" ] || { echo "FAIL: pp=2 checkpoint lacks $f"; fail=1; }
done
runN 2 "$W/ref4.yaml" $PP2 --set parallel.pipeline_virtual=2 --set training.output_dir="$W/ppv2"
cmp_runs "LoRA interleaved pp=2 x 2 chunks vs 1 process" ref4 ppv2 "$EXACT"
runN 2 "$W/ref4.yaml" $PP2 --set parallel.pipeline_schedule=dualpipev --set training.output_dir="$W/dpv2"
cmp_runs "LoRA DualPipeV pp=2 vs 1 process" ref4 dpv2 "$EXACT"
runN 2 "$W/ref.yaml" --set parallel.tensor_parallel=2 --set training.output_dir="$W/tp2"
runN 4 "$W/ref.yaml" --set parallel.tensor_parallel=2 $PP2 --set training.output_dir="$W/tp2pp2"
cmp_runs "LoRA pp=2 x tp=2 (4 ranks) vs tp=2" tp2 tp2pp2 "$EXACT"
ND="--set model.lora.dropout=0"
run1 "$W/ref.yaml" $ND --set training.output_dir="$W/refnd"
runN 4 "$W/ref.yaml" $ND $PP2 --set training.output_dir="$W/pp2dp2"
cmp_runs "LoRA pp=2 x dp=2 (4 ranks, no dropout) vs 1 process" refnd pp2dp2 "$CLOSE"
# Qwen2.5-VL: adapters on the tower's qkv / proj (stage 0) and the language model's projections
cat > "$W/q25ref.yaml" <<YAML
model: {path: tests/fixtures/qwen2_vl/q25_v5, dtype: f32, lora: {r: 4, alpha: 8, targets: [qkv, attn.proj, q_proj, v_proj, down_proj]}}
data: {train: tests/fixtures/train/vl_batch.safetensors, batch_size: 2, micro_batch_size: 1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 0, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/q25ref}
YAML
run1 "$W/q25ref.yaml"; runN 2 "$W/q25ref.yaml" $PP2 --set training.output_dir="$W/q25pp2"
cmp_runs "Qwen2.5-VL LoRA (tower + LM) pp=2 vs 1 process" q25ref q25pp2 "$EXACT"
# resume across layouts
runN 2 "$W/ref4.yaml" $PP2 --set training.output_dir="$W/r22" --set training.steps=2 &&
  cp -r "$W/r22" "$W/r21" && runN 2 "$W/ref4.yaml" $PP2 --set training.output_dir="$W/r22" --resume
cmp_runs "LoRA pp=2 2 steps, resumed at pp=2" ref4 r22 "$EXACT"
run1 "$W/ref4.yaml" --set training.output_dir="$W/r21" --resume
cmp_runs "LoRA pp=2 2 steps, resumed in 1 process" ref4 r21 "$EXACT"
run1 "$W/ref4.yaml" --set training.output_dir="$W/r12" --set training.steps=2 &&
  runN 2 "$W/ref4.yaml" $PP2 --set training.output_dir="$W/r12" --resume
cmp_runs "LoRA 1 process 2 steps, resumed at pp=2" ref4 r12 "$EXACT"
[ $fail = 0 ] && echo "test_pp_lora: passed" || echo "test_pp_lora: FAILED"
exit $fail
