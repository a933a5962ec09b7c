# pp_util.sh — sourced by the pipeline tests that drive `mmc train` / `mmc launch` and compare runs with
# test_pp_schedule (test_pp_zero, test_pp_zero3, test_pp_qlora) after `set -u`: `pp_setup NAME` runs
# mpi_setup (exit 77 without mpirun or an MPI build; MPIRUN, W, out, fail) with MMC and TEST_PP set, and
# defines run1 (one process), runN N (N ranks through mmc launch) and cmp_runs WHAT REF RUN TOLERANCES
# (test_pp_schedule compare: losses, weights max / mean, AdamW moments), each failure logged and counted;
# pp_zero_common: the ZeRO tests' configs (cfg NAME MODEL_KEY MODEL STEPS; ref: the tiny Qwen2, tied: a
# 4-layer tied-embedding init), their one-process run and the pp2 x dp2 ZeRO-0 run z0, tolerances NEAR / CLOSE;
# pp_q25_yaml FILE OUTPUT_DIR: the Qwen2.5-VL fixture's 3-step run (test_pp_vision, test_pp_hetero).
. tests/mpi_util.sh
pp_setup() {
  MMC=${MMC:-build/mmc}
  TEST_PP=${TEST_PP:-$(dirname "$MMC")/test_pp_schedule}
  mpi_setup "$1" "$MMC" "$TEST_PP" "$(dirname "$MMC")/dist_mpi_worker"
  export MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-60}
}
run1() { "$MMC" train "$@" >>"$W/train.log" 2>&1 || { echo "FAIL: one process: $*"; tail -n 20 "$W/train.log"; fail=1; }; }
runN() { local n=$1; shift; timeout -k 10 120 "$MMC" launch -n "$n" "$@" >>"$W/train.log" 2>&1 ||
           { echo "FAIL: $n ranks: $*"; tail -n 30 "$W/train.log"; fail=1; }; }
cmp_runs() {  # cmp_runs WHAT REF RUN TOLERANCES
  if "$TEST_PP" compare "$W/$2" "$W/$3" $4 >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
pp_q25_yaml() {  # the Qwen2.5-VL HF fixture (window attention in the tower, untied), 3 AdamW steps
  cat > "$1" <<YAML
model: {path: tests/fixtures/qwen2_vl/q25_v5, dtype: f32}
data: {train: tests/fixtures/train/vl_batch.safetensors, batch_size: 2, micro_batch_size: 1}
optimizer: {type: adamw, lr: 2.0e-3, weight_decay: 0.1, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 0, log_every: 1, save_every: 0, keep_last: 1, output_dir: $2}
YAML
}
pp_zero_common() {
  NEAR="1e-6 1e-6 1e-7 1e-3"
  CLOSE="1e-5 4e-6 1e-7 1e-3"
  cfg() {  # cfg NAME MODEL_KEY MODEL STEPS
    cat > "$W/$1.yaml" <<YAML
model: {$2: $3, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 4, micro_batch_size: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.1, schedule: cosine, warmup_steps: 1, grad_clip: 0.5}
training: {steps: $4, seed: 5, log_every: 1, save_every: 2, keep_last: 1, output_dir: $W/$1}
YAML
  }
  sed -e 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' -e 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' \
    tests/fixtures/qwen2/tiny/config.json > "$W/tied4.json"
  cfg ref path tests/fixtures/qwen2/tiny 4
  cfg tied init "$W/tied4.json" 4
  PP2="--set parallel.pipeline_parallel=2"
  run1 "$W/ref.yaml"
  runN 4 "$W/ref.yaml" $PP2 --set training.output_dir="$W/z0"
}
