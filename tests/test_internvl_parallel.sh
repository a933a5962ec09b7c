#!/usr/bin/env bash
# test_internvl_parallel.sh — InternVL in transformers' layout (the tiny tests/fixtures/internvl/v5: an
# InternViT tower, a Qwen2 decoder of 4 heads / 2 KV heads) under tensor (+ sequence), pipeline and
# context (Ulysses, ring) parallelism on 2 ranks (tp2 x pp2: 4) against one process, on the tiles and
# text of tests/fixtures/internvl_train/data.jsonl: the tower and projector replicated on every rank of a
# tp / cp group (cp: the features' gradient summed over the group) or on the first pipeline stage, the
# decoder split. 3 steps of 2 micro-batches; `tp_worker compare`: every loss within 1e-5 relative, the
# weights within 2e-4 (mean 1e-6), the AdamW moments within 1e-2 of their scale. Full fine-tuning
# (tower frozen; cp also with the tower trained), LoRA (r 4 on the LM's and the projector's linears)
# under tp and pp. The error: tp not dividing the KV heads.
# Skipped (exit 77) without mpirun or the worker.
set -u
MMC=${MMC:-build/mmc}
WORKER=${TP_WORKER:-$(dirname "$MMC")/tp_worker}
. "$(dirname "$0")/mpi_util.sh"
mpi_setup test_internvl_parallel "$WORKER"
part=${1:-all}   # modes: tp / sp / pp / cp and tp x pp; more: the tower trained, LoRA and the errors
cfg() {  # cfg NAME PARALLEL [lora|tower] [MODEL]
  local extra=""
  [ "${3:-}" = lora ] && extra=", lora: {r: 4, alpha: 8, targets: [q_proj, v_proj, down_proj, linear_1, linear_2]}"
  [ "${3:-}" = tower ] && extra=", freeze: []"
  cat > "$W/$1.yaml" <<YAML
model: {path: tests/fixtures/${4:-internvl/v5}, dtype: f32$extra}
data: {train: tests/fixtures/internvl_train/data.jsonl, batch_size: 2, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}
parallel: {$2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
run1() { "$MMC" train "$W/$1.yaml" >>"$W/train.log" 2>&1 || { echo "FAIL: $1 (one process)"; tail -n 20 "$W/train.log"; fail=1; }; }
runn() { timeout 120 "${MPIRUN[@]}" -np "$2" "$MMC" train "$W/$1.yaml" >>"$W/train.log" 2>&1 ||
           { echo "FAIL: $1 ($2 ranks)"; tail -n 30 "$W/train.log"; fail=1; }; }
cmp_runs() {  # cmp_runs REF RUN
  if "$WORKER" compare "$W/$1" "$W/$2" >"$out" 2>&1; then echo "$2 vs one process: $(tail -n 1 "$out")"
  else echo "FAIL: $2 vs $1:"; cat "$out"; fail=1; fi
}
if [ "$part" = all ] || [ "$part" = modes ]; then
cfg ref "data_parallel: 1"
cfg tp2 "tensor_parallel: 2"
cfg sp2 "tensor_parallel: 2, sequence_parallel: true"
cfg pp2 "pipeline_parallel: 2"
cfg cpu2 "context_parallel: 2"
cfg cpr2 "context_parallel: 2, context_parallel_mode: ring"
cfg tpp4 "tensor_parallel: 2, pipeline_parallel: 2"
run1 ref
for n in tp2 sp2 pp2 cpu2 cpr2; do runn $n 2; cmp_runs ref $n; done
runn tpp4 4; cmp_runs ref tpp4
fi
if [ "$part" = all ] || [ "$part" = more ]; then
cfg tref "data_parallel: 1" tower
cfg tcp2 "context_parallel: 2" tower
cfg tpp2 "pipeline_parallel: 2" tower
run1 tref
for n in tcp2 tpp2; do runn $n 2; cmp_runs tref $n; done
cfg lref "data_parallel: 1" lora
cfg ltp2 "tensor_parallel: 2" lora
cfg lpp2 "pipeline_parallel: 2" lora
run1 lref
for n in ltp2 lpp2; do runn $n 2; cmp_runs lref $n; done
# the errors, before any work
cfg bad_tp "tensor_parallel: 4"
timeout 60 "${MPIRUN[@]}" -np 4 "$MMC" train "$W/bad_tp.yaml" >"$out" 2>&1
grep -q "tensor_parallel 4 does not divide num_key_value_heads 2" "$out" && echo "tp 4: refused, names the KV heads" ||
  { echo "FAIL: tp 4 not refused as expected:"; tail -n 5 "$out"; fail=1; }
fi
exit $fail
