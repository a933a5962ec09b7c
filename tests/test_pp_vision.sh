#!/usr/bin/env bash
# test_pp_vision.sh — the vision tower as a pipeline stage of its own (parallel.pipeline_vision_stage,
# src/train/trainer_pp.c): stage 0 runs only Qwen2-VL's / Qwen2.5-VL's tower, merger and token
# embedding and sends the embeddings with the image features spliced in; their gradient comes back
# and runs the tower's backward; the decoder layers split over stages 1 .. P-1. `mmc launch` against
# one process with the same gradient accumulation, compared by `test_pp_schedule compare` (losses of
# every step, the last checkpoint's weights or adapters and their AdamW state):
#   - Qwen2.5-VL (HF directory, untied) full fine-tuning, tower trainable, pp=2: bit-identical
#     (1F1B accumulates every gradient in the one process's order);
#   - Qwen2-VL (tied embeddings: the first and last stage sum the embedding's two gradient halves, in
#     another order than one process) on mixed text / image batches, tower trainable at pp=2, tower
#     and merger frozen at pp=3 (one decoder layer per stage): losses within 1e-6 relative, weights
#     within 5e-5 absolute and 1e-7 on average, moments within 1e-3 of each tensor's scale (measured
#     4.6e-9, 1.9e-7, 4.5e-10, 6.5e-7); x tp=2 + sequence parallelism (4 ranks) against tp=2 + sp alone
#     within the same (measured 0, 1.3e-7);
#   - LoRA: Qwen2.5-VL adapters on the tower and the language model (pp=2) and Qwen2-VL adapters on
#     the language model only with dropout 0.1 (pp=3: stage 0 trains nothing): bit-identical, PEFT layout;
#   - checkpoints: pp=2 for 2 steps resumed in one process, one process resumed at pp=3: exact;
#   - data.eval at pp=2: the evaluation loss within 1e-6 of one process's; training.ema_decay:
#     ema.safetensors byte for byte one process's;
#   - errors before any work: with DualPipeV, interleaving, a pipeline_layers list of P entries, a text model.
# Skipped (exit 77) without mpirun or an MPI build.
set -u
. tests/pp_util.sh   # run1, runN, cmp_runs (test_pp_schedule compare), pp_q25_yaml
pp_setup test_pp_vision   # exits 77 without mpirun / an MPI build
EXACT="0 0 0 0"
CLOSE="1e-6 5e-5 1e-7 1e-3"
VS="--set parallel.pipeline_vision_stage=true"
PP2="--set parallel.pipeline_parallel=2"
PP3="--set parallel.pipeline_parallel=3"
cat > "$W/vl.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32}
data: {train: tests/fixtures/data/mixed.jsonl, max_pixels: 3136, min_pixels: 3136, seq_len: 128, batch_size: 4, micro_batch_size: 1, num_workers: 1, shuffle: false, bucket_window: 64}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/vl1}
YAML
pp_q25_yaml "$W/q25.yaml" "$W/q1"

# full fine-tuning
run1 "$W/q25.yaml"
runN 2 "$W/q25.yaml" $PP2 $VS --set training.output_dir="$W/q2"
cmp_runs "Qwen2.5-VL tower stage + 1 decoder stage (pp=2) vs 1 process" q1 q2 "$EXACT"
grep -m1 'stage layers: vision tower' "$W/train.log" | cut -c1-260
run1 "$W/vl.yaml"
runN 2 "$W/vl.yaml" $PP2 $VS --set training.output_dir="$W/vl2"
cmp_runs "Qwen2-VL (tied) tower stage, pp=2 vs 1 process" vl1 vl2 "$CLOSE"
TP=(--set parallel.tensor_parallel=2 --set parallel.sequence_parallel=true)
runN 2 "$W/vl.yaml" "${TP[@]}" --set training.output_dir="$W/tp2"
runN 4 "$W/vl.yaml" "${TP[@]}" $PP2 $VS --set training.output_dir="$W/tp2vs"
cmp_runs "Qwen2-VL tower stage x tp=2 + sp (4 ranks) vs tp=2 + sp" tp2 tp2vs "$CLOSE"
FZ=(--set "model.freeze=[vision_tower, merger]")
run1 "$W/vl.yaml" "${FZ[@]}" --set training.output_dir="$W/fz1"
runN 3 "$W/vl.yaml" $PP3 $VS "${FZ[@]}" --set training.output_dir="$W/fz3"
cmp_runs "Qwen2-VL frozen tower + merger on its own stage, pp=3 vs 1 process" fz1 fz3 "$CLOSE"

# LoRA
sed 's/dtype: f32}/dtype: f32, lora: {r: 4, alpha: 8, targets: [qkv, attn.proj, q_proj, v_proj, down_proj]}}/' \
  "$W/q25.yaml" > "$W/q25L.yaml"
run1 "$W/q25L.yaml" --set training.output_dir="$W/qL1"
runN 2 "$W/q25L.yaml" $PP2 $VS --set training.output_dir="$W/qL2"
cmp_runs "Qwen2.5-VL LoRA on the tower and the LM, tower stage pp=2 vs 1 process" qL1 qL2 "$EXACT"
sed 's/dtype: f32}/dtype: f32, lora: {r: 4, alpha: 8, dropout: 0.1, targets: [q_proj, v_proj, o_proj, down_proj]}}/' \
  "$W/vl.yaml" > "$W/vlL.yaml"
run1 "$W/vlL.yaml" --set training.output_dir="$W/vL1"
runN 3 "$W/vlL.yaml" $PP3 $VS --set training.output_dir="$W/vL3"
cmp_runs "Qwen2-VL LoRA on the LM only (the tower stage trains nothing), pp=3 vs 1 process" vL1 vL3 "$EXACT"
for f in adapter_config.json adapter_model.safetensors; do
  [ -s "$W/vL3/checkpoint-3/$f" ] || { echo "FAIL: the pp=3 LoRA checkpoint lacks $f"; fail=1; }
done

# checkpoints: resumed across layouts
runN 2 "$W/q25.yaml" $PP2 $VS --set training.output_dir="$W/rs1" --set training.steps=2
run1 "$W/q25.yaml" --set training.output_dir="$W/rs1" --resume
cmp_runs "Qwen2.5-VL tower stage pp=2 for 2 steps, resumed in one process" q1 rs1 "$EXACT"
run1 "$W/q25.yaml" --set training.output_dir="$W/rs3" --set training.steps=2
runN 3 "$W/q25.yaml" $PP3 $VS --set training.output_dir="$W/rs3" --resume
cmp_runs "Qwen2.5-VL one process for 2 steps, resumed with the tower stage at pp=3" q1 rs3 "$EXACT"

# data.eval and EMA
EV=(--set data.eval=tests/fixtures/data/mixed.jsonl --set training.eval_every=2 --set training.steps=2)
run1 "$W/vl.yaml" "${EV[@]}" --set training.output_dir="$W/ev1"
runN 2 "$W/vl.yaml" $PP2 $VS "${EV[@]}" --set training.output_dir="$W/ev2"
e1=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev1/metrics.jsonl" 2>/dev/null); e2=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev2/metrics.jsonl" 2>/dev/null)
if [ -n "$e1" ] && [ -n "$e2" ] && python3 -c "import sys; a, b = (float(x.split()[-1]) for x in sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * abs(a))" "$e1" "$e2"; then
  echo "Qwen2-VL data.eval, tower stage pp=2: $e2 (one process: $e1)"
else echo "FAIL: Qwen2-VL data.eval, tower stage: '$e2' vs one process '$e1'"; fail=1; fi
EMA=(--set training.ema_decay=0.9 --set training.save_every=3)
run1 "$W/q25.yaml" "${EMA[@]}" --set training.output_dir="$W/em1"
runN 2 "$W/q25.yaml" $PP2 $VS "${EMA[@]}" --set training.output_dir="$W/em2"
if [ -s "$W/em1/checkpoint-3/ema.safetensors" ] && cmp -s "$W/em1/checkpoint-3/ema.safetensors" "$W/em2/checkpoint-3/ema.safetensors"; then
  echo "Qwen2.5-VL training.ema_decay, tower stage pp=2: ema.safetensors identical to one process's"
else echo "FAIL: the EMA at the tower stage differs from one process's"; fail=1; fi

# errors before any work
expect_err() {  # expect_err WHAT PATTERN NP YAML...
  local what=$1 pat=$2 np=$3; shift 3
  if [ "$np" = 1 ]; then "$MMC" train "$@" >"$out" 2>&1
  else timeout 60 "$MMC" launch -n "$np" "$@" >"$out" 2>&1; fi
  local rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "$pat" "$out"; then echo "error ($what): $(grep -m1 "$pat" "$out" | cut -c1-300)"
  else echo "FAIL: $what: rc $rc, no '$pat':"; cat "$out"; fail=1; fi
}
expect_err "with DualPipeV" "pipeline_vision_stage: true with pipeline_schedule dualpipev: not supported" 1 "$W/vl.yaml" $PP2 $VS \
  --set parallel.pipeline_schedule=dualpipev
expect_err "with interleaving" "pipeline_vision_stage: true with pipeline_virtual > 1: not supported" 1 "$W/vl.yaml" $PP2 $VS \
  --set parallel.pipeline_virtual=2
expect_err "without stages" "pipeline_vision_stage: true needs pipeline_parallel 2 or more" 1 "$W/vl.yaml" $VS
expect_err "P layer counts" "2 entries but pipeline_parallel 2 with pipeline_vision_stage makes 1 decoder stages" 1 "$W/vl.yaml" \
  $PP2 $VS --set "parallel.pipeline_layers=[1, 1]"
expect_err "more decoder stages than layers" "the 2 decoder layers split over the 3 stages after it" 4 "$W/vl.yaml" \
  --set parallel.pipeline_parallel=4 $VS
cat > "$W/text.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 2, micro_batch_size: 1}
training: {steps: 1, output_dir: $W/text}
YAML
expect_err "a text model" "pipeline_vision_stage puts a vision tower on a stage of its own, but the model has none" 2 \
  "$W/text.yaml" $PP2 $VS

[ $fail = 0 ] && echo "test_pp_vision: passed" || echo "test_pp_vision: FAILED"
exit $fail
