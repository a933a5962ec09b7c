# vlm_parallel_util.sh — sourced by test_llava_parallel / test_internvl_parallel (and, for its runners,
# test_internlm2_parallel, which writes its own cfg and runs vlm_modes with it) after `set -u`:
# `vlm_setup NAME` runs mpi_setup with tp_worker (exit 77 without mpirun or an MPI build) and sets WORKER;
# `cfg NAME PARALLEL [lora|tower] [MODEL]` writes a 3-step run of tests/fixtures/$VLM_FIXTURES/MODEL
# (default $VLM_MODEL) on $VLM_DATA in micro-batches of 1 ($VLM_BATCH per step) with the given
# `parallel:` keys (lora: r 4 on the LM's and projector's linears; tower: nothing frozen);
# run1 NAME (one process), runn NAME N (N ranks), cmp_runs REF RUN (`tp_worker compare`);
# vlm_modes: tp2, tp2 + sp, pp2, Ulysses / ring cp2 (2 ranks) and tp2 x pp2 (4) against one process.
. tests/mpi_util.sh
vlm_setup() {
  MMC=${MMC:-build/mmc}
  WORKER=${TP_WORKER:-$(dirname "$MMC")/tp_worker}
  mpi_setup "$1" "$WORKER"
}
cfg() {  # cfg NAME PARALLEL [lora|tower] [MODEL]
  local extra=""
  [ "${3:-}" = lora ] && extra=", lora: {r: 4, alpha: 8, targets: [q_proj, v_proj, down_proj, linear_1, linear_2]}"
  [ "${3:-}" = tower ] && extra=", freeze: []"
  cat > "$W/$1.yaml" <<YAML
model: {path: tests/fixtures/$VLM_FIXTURES/${4:-$VLM_MODEL}, dtype: f32$extra}
data: {train: $VLM_DATA, batch_size: $VLM_BATCH, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}
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
vlm_modes() {
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
}
