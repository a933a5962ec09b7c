#!/usr/bin/env bash
# test_train_ref.sh — a short `mmc train` run whose outputs are checked with the reference
# tools (tools/ref/check_train_outputs.py): transformers loads the checkpoint, tensorboard's
# EventAccumulator reads the event file. Skipped without the Python reference environment
# (exit 77: ctest reports it as skipped), since `make test` must not need Python.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
if ! "$PY" -c "import transformers, tensorboard" 2>/dev/null; then
  echo "test_train_ref: skipped: no reference Python environment ($PY with transformers + tensorboard)"; exit 77
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cat > "$W/run.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 32, batch_size: 2, micro_batch_size: 1}
optimizer: {lr: 1.0e-3, schedule: linear, warmup_steps: 2}
training: {steps: 12, log_every: 2, save_every: 6, output_dir: $W/out}
YAML
"$MMC" train "$W/run.yaml" 2> "$W/log" || { cat "$W/log"; exit 1; }
if [ "${MMC_HAVE_CAIRO:-1}" = 1 ]; then   # cairo is optional: no plot without it
  head -c 4 "$W/out/loss.png" | grep -q PNG || { echo "FAIL: no loss.png"; exit 1; }
else
  echo "test_train_ref: skipped: the loss.png check (built without cairo)"
fi
"$PY" tools/ref/check_train_outputs.py "$W/out" || exit 1
# bf16 weights: the checkpoint is a bf16 HF directory that transformers loads as well
"$MMC" train "$W/run.yaml" --set model.dtype=bf16 --set training.output_dir="$W/bf" 2> "$W/log2" || { cat "$W/log2"; exit 1; }
"$PY" tools/ref/check_train_outputs.py "$W/bf" || exit 1
