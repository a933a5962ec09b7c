#!/usr/bin/env bash
# test_pp_qlora.sh — QLoRA under pipeline parallelism (model.quantization nf4 + model.lora with
# parallel.pipeline_parallel) against one-process QLoRA, compared by `test_pp_schedule compare` (every
# step's loss, the last checkpoint's adapters and their AdamW state). The whole model's projections are
# quantised to NF4 and the adapters attached before each stage keeps its layers (trainer.c lora_first),
# so a stage's NF4 codes and absmax scales are the one process's (quantisation is per 64-value block of
# each weight); the other layers' NF4 weights are freed with them (mmc_pp_trim_qwen2_at):
#   - pp=2 on the tiny Qwen2, LoRA dropout 0.1: bit-identical;
#   - DualPipeV at pp=2 on a 4-layer model with double quantisation: bit-identical;
#   - pp=2 x dp=2 ZeRO-1 (4 ranks, no dropout): losses within 1e-6, adapters within 5e-5 (the replicas'
#     gradients are summed in another order; as test_pp_lora's pp2 x dp2);
#   - resume: pp=2 for 2 steps, resumed in one process: bit-identical;
#   - control: one process without NF4 (plain LoRA) must differ from the pp=2 QLoRA run.
# Skipped (exit 77) without mpirun or an MPI build.
set -u
. tests/pp_util.sh   # pp_setup, run1, runN, cmp_runs
pp_setup test_pp_qlora
EXACT="0 0 0 0"
CLOSE="1e-6 5e-5 1e-7 1e-3"
QL="quantization: {method: nf4}, lora: {r: 4, alpha: 8, dropout: 0.1, targets: [q_proj, v_proj, o_proj, gate_proj, down_proj]}"
cfg() {  # cfg NAME MODEL_KEY MODEL BATCH
  cat > "$W/$1.yaml" <<YAML
model: {$2: $3, dtype: f32, $QL}
data: {train: synthetic, seq_len: 16, batch_size: $4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 4, seed: 7, log_every: 1, save_every: 2, keep_last: 1, output_dir: $W/$1}
YAML
}
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' tests/fixtures/qwen2/tiny/config.json > "$W/l4.json"
cfg ref path tests/fixtures/qwen2/tiny 4
cfg ref4 init "$W/l4.json" 4
PP2="--set parallel.pipeline_parallel=2"
run1 "$W/ref.yaml"
grep -q "QLoRA NF4" "$W/train.log" || { echo "FAIL: the one-process run did not quantise"; fail=1; }
runN 2 "$W/ref.yaml" $PP2 --set training.output_dir="$W/pp2"
cmp_runs "QLoRA pp=2 (dropout 0.1) vs 1 process" ref pp2 "$EXACT"
# control: the same run without quantisation must be told apart from the pp=2 QLoRA one
run1 "$W/ref.yaml" --set model.quantization.method=none --set training.output_dir="$W/lora"
if "$TEST_PP" compare "$W/lora" "$W/pp2" 1e-6 1e-6 1e-7 1e-3 >"$out" 2>&1; then
  echo "FAIL: LoRA without NF4 matches the pp=2 QLoRA run: $(cat "$out")"; fail=1
else echo "control (LoRA without NF4 vs QLoRA pp=2) differs, as it should"; fi
DQ="--set model.quantization.double_quant=true"
run1 "$W/ref4.yaml" $DQ
runN 2 "$W/ref4.yaml" $DQ $PP2 --set parallel.pipeline_schedule=dualpipev --set training.output_dir="$W/dpv2"
cmp_runs "QLoRA (double quant) DualPipeV pp=2 vs 1 process" ref4 dpv2 "$EXACT"
ND="--set model.lora.dropout=0"
run1 "$W/ref.yaml" $ND --set training.output_dir="$W/refnd"
runN 4 "$W/ref.yaml" $ND $PP2 --set parallel.zero=1 --set training.output_dir="$W/pp2dp2"
cmp_runs "QLoRA pp=2 x dp=2 ZeRO-1 (4 ranks, no dropout) vs 1 process" refnd pp2dp2 "$CLOSE"
runN 2 "$W/ref.yaml" $PP2 --set training.output_dir="$W/r21" --set training.steps=2 &&
  run1 "$W/ref.yaml" --set training.output_dir="$W/r21" --resume
cmp_runs "QLoRA pp=2 2 steps, resumed in 1 process" ref r21 "$EXACT"
[ $fail = 0 ] && echo "test_pp_qlora: passed" || echo "test_pp_qlora: FAILED"
exit $fail
