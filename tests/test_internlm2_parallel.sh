#!/usr/bin/env bash
# test_internlm2_parallel.sh — text InternLM2 (tests/fixtures/internlm2_train/tiny: the remote code's layout,
# one packed attention.wqkv per layer grouped per KV head [Hkv x (G + 2) x D], biased wqkv / wo, linear
# rope_scaling, 4 heads / 2 KV heads) under tensor (+ sequence), pipeline and context (Ulysses, ring)
# parallelism on 2 ranks (and tp2 x pp2 on 4) against one process: tp splits wqkv's rows by KV group (each rank whole
# groups: their query heads, key and value) and gathers them back into the packed layout on save.
# 4 steps of 2 micro-batches of tests/fixtures/internlm2_train/batch.safetensors; `tp_worker compare`:
# every loss within 1e-5 relative, the weights (the remote code's names) within 2e-4 (mean 1e-6), the
# AdamW moments within 1e-2 of their scale; LoRA (r 4 on wqkv, wo, w1, w2, w3: PEFT's one lora_B over
# the packed rows, split by KV group) under tp and pp. Skipped (exit 77) without mpirun or the worker.
set -u
. tests/vlm_parallel_util.sh   # vlm_setup, run1, runn, cmp_runs (its cfg is replaced below: a text model)
vlm_setup test_internlm2_parallel
F=tests/fixtures/internlm2_train
cfg() {  # cfg NAME PARALLEL [lora]
  local extra=""
  [ -n "${3:-}" ] && extra=", lora: {r: 4, alpha: 8, targets: [wqkv, wo, w1, w2, w3]}"
  cat > "$W/$1.yaml" <<YAML
model: {path: $F/tiny, dtype: f32$extra}
data: {train: $F/batch.safetensors, batch_size: 2, micro_batch_size: 1}
parallel: {$2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 4, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
vlm_modes   # tp2, tp2 + sp, pp2, Ulysses / ring cp2 and tp2 x pp2 (4 ranks), with the cfg above
# the tp checkpoint holds the packed wqkv whole, under the remote code's names
hdr=$(head -c 20000 "$W/tp2/checkpoint-4/model.safetensors" 2>/dev/null | tr -d '\0')
case "$hdr" in *'"model.layers.0.attention.wqkv.weight"'*'"output.weight"'*|*'"output.weight"'*'"model.layers.0.attention.wqkv.weight"'*)
  echo "tp2 checkpoint: packed wqkv and output.weight under their names" ;;
  *) echo "FAIL: the tp2 checkpoint lacks model.layers.0.attention.wqkv.weight or output.weight"; fail=1 ;; esac
cfg lref "data_parallel: 1" lora
cfg ltp2 "tensor_parallel: 2" lora
cfg lpp2 "pipeline_parallel: 2" lora
run1 lref
for n in ltp2 lpp2; do runn $n 2; cmp_runs lref $n; done
exit $fail
