#!/usr/bin/env bash
# test_omni_parallel.sh — the Qwen2.5-Omni thinker under tensor parallelism: the language model split
# (column-parallel q/k/v and gate/up, row-parallel o/down, vocab-parallel head and loss), the audio
# encoder and the vision tower whole on every rank of the tp group (the same inputs and the same
# whole feature gradient on each: no reduction). A fresh thinker from the fixture's config with
# num_key_value_heads 2 and a vocabulary of 1400 (tp must divide both), trained on the fixture's
# audio (+ image) records against one process (`tp_worker compare`: losses 1e-5 relative, weights
# 2e-4 max / 1e-6 mean, AdamW moments 1e-2 of scale):
#   tp2 (LM trained, encoders frozen); tp2 with every part trained (model.freeze: []); the same with
#   sequence parallelism; LoRA on the LM and both encoders' linears; tp2 x dp2 at ZeRO-1 (4 ranks);
#   a tp2 checkpoint continued in one process; pipeline parallelism refused by name.
set -u
MMC=${MMC:-build/mmc}
TPW=$(dirname "$MMC")/tp_worker
. tests/mpi_util.sh
mpi_setup test_omni_parallel "$TPW"
F=tests/fixtures/omni_train; BASE=tests/fixtures/omni/thinker
python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['text_config'].update(num_key_value_heads=2, vocab_size=1400); json.dump(c, open(sys.argv[2], 'w'))" \
  $BASE/config.json "$W/cfg.json"
cat > "$W/t.yaml" <<YAML
model: {init: $W/cfg.json, tokenizer: $BASE, dtype: f32}
data: {train: $F/data.jsonl, batch_size: 2, micro_batch_size: 1, shuffle: false, num_workers: 1, seq_len: 512}
parallel: {tensor_parallel: 2}
optimizer: {lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 4, log_every: 1, save_every: 0, output_dir: $W/t2, seed: 0}
YAML
run1() { "$MMC" train "$W/t.yaml" --set parallel.tensor_parallel=1 "$@" >>"$W/train.log" 2>&1; }
runN() { local n=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$n" "$MMC" train "$W/t.yaml" "$@" >>"$W/train.log" 2>&1; }
cmp_runs() {  # cmp_runs WHAT REF RUN
  if "$TPW" compare "$W/$2" "$W/$3" >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
O() { echo "--set training.output_dir=$W/$1"; }
run1 $(O t1) && runN 2 || { echo "FAIL: tp2 runs"; tail "$W/train.log"; fail=1; }
grep -q "tensor parallelism 2 x data parallelism 1" "$W/train.log" || { echo "FAIL: no tp start-up line"; fail=1; }
cmp_runs "Omni thinker tp=2 (LM trained) vs 1 process" t1 t2
ALL=(--set 'model.freeze=[]')
run1 "${ALL[@]}" $(O a1) && runN 2 "${ALL[@]}" $(O a2) && runN 2 "${ALL[@]}" --set parallel.sequence_parallel=true $(O as2) ||
  { echo "FAIL: tp2 runs with the encoders trained"; tail "$W/train.log"; fail=1; }
cmp_runs "Omni thinker tp=2, LM + audio encoder + vision tower trained, vs 1 process" a1 a2
cmp_runs "the same with sequence parallelism" a1 as2
LT=(--set model.lora.r=4 --set model.lora.alpha=8 --set 'model.lora.targets=[q_proj,k_proj,v_proj,o_proj,up_proj,down_proj,fc1,fc2]')
run1 "${LT[@]}" $(O l1) && runN 2 "${LT[@]}" $(O l2) || { echo "FAIL: LoRA runs"; tail "$W/train.log"; fail=1; }
cmp_runs "Omni thinker LoRA (LM, audio encoder and vision tower linears) tp=2 vs 1 process (adapters)" l1 l2
runN 4 --set parallel.zero=1 $(O z4) || { echo "FAIL: tp2 x dp2 ZeRO-1 run"; tail "$W/train.log"; fail=1; }
run1 --set data.batch_size=2 $(O z1) || fail=1
cmp_runs "Omni thinker tp=2 x dp=2 ZeRO-1 (4 ranks) vs 1 process" z1 z4
runN 2 --set training.steps=2 $(O r) && run1 $(O r) --resume || { echo "FAIL: resume runs"; tail "$W/train.log"; fail=1; }
cmp_runs "Omni thinker tp=2 2 steps, continued in 1 process" t1 r
if runN 2 --set parallel.tensor_parallel=1 --set parallel.pipeline_parallel=2 $(O pp); then echo "FAIL: pp accepted"; fail=1
elif grep -q "pipeline parallelism and ZeRO-3 are not supported for qwen2_5_omni_thinker" "$W/train.log"; then echo "refused: pipeline parallelism"
else echo "FAIL: pp: unexpected message"; tail -5 "$W/train.log"; fail=1; fi
[ $fail = 0 ] && echo "test_omni_parallel: passed" || echo "test_omni_parallel: FAILED"
exit $fail
