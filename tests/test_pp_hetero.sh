#!/usr/bin/env bash
# test_pp_hetero.sh — the per-modality plan with the language model pipelined (src/train/trainer_pp_hetero.c):
# Qwen2-VL's vision tower data-parallel over all the job's ranks, each rank encoding its cost-balanced
# share of its LM replica's step, the features sent to the first stage and their gradient back, the
# tower's gradients summed over the world. `mmc launch` against one process on the same global batch
# (tiny Qwen2-VL from tests/fixtures/train/vl_tiny.json; 8 samples per step in micro-batches of 2, with
# one or two images of 7 sizes per sample and a text sample, so the shares are uneven; 3 AdamW steps),
# compared by `test_pp_schedule compare` (pp_util.sh):
#   vision dp4 | LM pp2 x dp2, vision dp4 | LM pp2 x tp2 (the tower's gradients are summed over the
#   ranks in another order than one process adds its images', AdamW turns that into a few 1e-6 where a
#   gradient is near zero): losses 1e-5 relative, weights 2e-4 max / 1e-6 mean, moments 1e-2 of scale
#   (test_tp's tolerances; measured figures printed);
#   LoRA r=4 on the tower (qkv, fc2) and the LM (adapters compared), the tower frozen, DualPipeV;
#   checkpoints: 2 steps at vision dp4 | pp2 x dp2 continued in one process, 1 process continued at
#   vision dp4 | pp2 x tp2;
#   the control: without the tower's gradient sum (MMC_TEST_PP_HETERO_NO_SUM) the compare must fail;
#   the images each rank encoded (every rank some, every image of the run once);
#   errors before any work, naming the key.
set -u
. tests/pp_util.sh
pp_setup test_pp_hetero
. tests/train_check.sh   # ok / bad (the error checks)
TOL="1e-5 2e-4 1e-6 1e-2"
q1() { printf '{"image": "%s", "conversations": [{"from": "human", "value": "<image>%s"}, {"from": "gpt", "value": "%s"}]}\n' "$1" "$2" "$3"; }
q2() { printf '{"image": ["%s", "%s"], "conversations": [{"from": "human", "value": "<image> and <image>\\n%s"}, {"from": "gpt", "value": "%s"}]}\n' "$1" "$2" "$3" "$4"; }
{ q1 rgb_37x53.png "What colour is it?" "Mostly red."
  q2 wide_900x100.jpg tall_100x900.png "Which is wider?" "The first."
  printf '{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}\n'
  q1 rgb_500x333.jpg "Describe the picture in a few words." "Smooth colour gradients."
  q2 rgb_640x480.jpg palette_P.png "Which has more colours?" "The first one."
  q1 exif6.jpg "Is it rotated?" "It was, by its EXIF tag."
  q2 grey_L.png rgb_37x53.png "Same size?" "No."
  q1 tall_100x900.png "And this one?" "A tall strip, grey at the top."; } > "$W/data.jsonl"
cat > "$W/ref.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32}
data: {train: $W/data.jsonl, image_root: tests/fixtures/image, max_pixels: 12544, min_pixels: 3136, seq_len: 160, batch_size: 8, micro_batch_size: 2, num_workers: 1, shuffle: false, bucket_window: 64}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/ref}
YAML
PPDP='--set parallel.pipeline_parallel=2 --set parallel.vision.data_parallel=4'
PPTP="$PPDP --set parallel.tensor_parallel=2"
# images (patches) per rank from the run's last line: each rank some, every image of the run (3 steps x
# 10) encoded once
shares() {  # shares WHAT
  local l; l=$(grep 'images (patches) the vision tower encoded' "$W/train.log" | tail -1 | sed 's/.*per rank://')
  if [ -n "$l" ] && echo "$l" | awk '{s = 0; for (i = 1; i <= NF; i += 2) {if ($i + 0 < 1) exit 1; s += $i} exit s != 30}'; then
    echo "$1: images (patches) per rank:$l"
  else echo "FAIL: $1: images per rank '$l' (each rank some, 30 in all)"; fail=1; fi
}

run1 "$W/ref.yaml"
: > "$W/train.log"
runN 4 "$W/ref.yaml" $PPDP --set training.output_dir="$W/pd"
grep -m1 'per-modality plan: vision tower data-parallel over 4 ranks, language model pipeline parallelism 2' "$W/train.log" |
  cut -c1-200 || { echo "FAIL: no per-modality start-up line"; fail=1; }
shares "vision dp4 | LM pp2 x dp2"
cmp_runs "vision dp4 | LM pp2 x dp2 (4 ranks) vs 1 process" ref pd "$TOL"
: > "$W/train.log"
runN 4 "$W/ref.yaml" $PPTP --set training.output_dir="$W/pt"
shares "vision dp4 | LM pp2 x tp2"
cmp_runs "vision dp4 | LM pp2 x tp2 (4 ranks) vs 1 process" ref pt "$TOL"
# the control: each rank's partial tower gradients not summed -> must not pass
MMC_TEST_PP_HETERO_NO_SUM=1 runN 4 "$W/ref.yaml" $PPDP --set training.output_dir="$W/ns"
if "$TEST_PP" compare "$W/ref" "$W/ns" $TOL >"$out" 2>&1; then
  echo "FAIL: the control without the tower's gradient sum passed the compare"; fail=1
elif grep -q 'weights max abs diff' "$out"; then
  echo "control without the tower's gradient sum: fails as it must ($(grep 'weights max abs diff' "$out" | cut -c1-130))"
else echo "FAIL: the control run left nothing to compare"; cat "$out"; fail=1; fi

# checkpoints are the one-process ones: 2 steps at the plan continued in one process, and back
runN 4 "$W/ref.yaml" $PPDP --set training.output_dir="$W/r41" --set training.steps=2 --set training.save_every=2
run1 "$W/ref.yaml" --set training.output_dir="$W/r41" --resume
cmp_runs "vision dp4 | LM pp2 x dp2, 2 steps, resumed in 1 process" ref r41 "$TOL"
run1 "$W/ref.yaml" --set training.output_dir="$W/r14" --set training.steps=2 --set training.save_every=2
runN 4 "$W/ref.yaml" $PPTP --set training.output_dir="$W/r14" --resume
cmp_runs "1 process 2 steps, resumed at vision dp4 | LM pp2 x tp2" ref r14 "$TOL"
# LoRA on the tower (fused qkv, fc2) and the language model: the tower's adapters' gradients summed
LORA=(--set 'model.lora={r: 4, alpha: 8, dropout: 0.0, targets: [qkv, fc2, q_proj, v_proj, down_proj]}')
run1 "$W/ref.yaml" "${LORA[@]}" --set training.output_dir="$W/refL"
runN 4 "$W/ref.yaml" "${LORA[@]}" $PPDP --set training.output_dir="$W/pdL"
cmp_runs "LoRA on tower and LM, vision dp4 | LM pp2 x dp2 vs 1 process (adapters)" refL pdL "$TOL"
# the tower (and merger) frozen: only the features travel, no tower backward
FRZ='--set model.freeze=[vision_tower,merger]'
run1 "$W/ref.yaml" $FRZ --set training.output_dir="$W/refF"
runN 4 "$W/ref.yaml" $FRZ $PPTP --set training.output_dir="$W/ptF"
cmp_runs "tower frozen, vision dp4 | LM pp2 x tp2 vs 1 process" refF ptF "$TOL"
# other schedules on a 4-layer variant: the features leave before the step and return after it
sed 's/"num_hidden_layers": 2/"num_hidden_layers": 4/' tests/fixtures/train/vl_tiny.json > "$W/vl4.json"
L4=(--set model.init="$W/vl4.json")
run1 "$W/ref.yaml" "${L4[@]}" --set training.output_dir="$W/ref4"
runN 2 "$W/ref.yaml" "${L4[@]}" --set parallel.pipeline_parallel=2 --set parallel.vision.data_parallel=2 \
  --set parallel.pipeline_schedule=dualpipev --set training.output_dir="$W/dpv"
cmp_runs "DualPipeV, vision dp2 | LM pp2 vs 1 process (4 layers)" ref4 dpv "$TOL"
runN 4 "$W/ref.yaml" "${L4[@]}" $PPDP --set parallel.pipeline_virtual=2 --set parallel.zero=1 --set training.output_dir="$W/il"
cmp_runs "interleaved (2 chunks) x ZeRO-1, vision dp4 | LM pp2 x dp2 vs 1 process (4 layers)" ref4 il "$TOL"

# ZeRO-3 (the stage's parameters, the tower's among them, gathered before the tower runs) and an
# evaluation set (its batches are not shared: the first stage encodes them), eval loss one process's
EV=(--set data.eval="$W/data.jsonl" --set training.eval_every=3)
run1 "$W/ref.yaml" "${EV[@]}" --set training.output_dir="$W/ev1"
runN 4 "$W/ref.yaml" "${EV[@]}" $PPTP --set training.output_dir="$W/ev4"
runN 4 "$W/ref.yaml" $PPDP --set parallel.zero=3 --set training.output_dir="$W/z3"
cmp_runs "ZeRO-3, vision dp4 | LM pp2 x dp2 vs 1 process" ref z3 "$TOL"
e1=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev1/metrics.jsonl" 2>/dev/null); e4=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev4/metrics.jsonl" 2>/dev/null)
if [ -n "$e1" ] && python3 -c "import sys; a, b = (float(x.split()[-1]) for x in sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(a))" "$e1" "$e4"; then
  echo "vision dp4 | LM pp2 x tp2 data.eval: $e4 (one process: $e1)"
else echo "FAIL: vision dp4 | LM pp2 x tp2 data.eval: '$e4' vs one process '$e1'"; fail=1; fi
# Qwen2.5-VL (window attention in the tower, HF directory, untied) at vision dp2 | LM pp2
pp_q25_yaml "$W/q25.yaml" "$W/q1"
run1 "$W/q25.yaml"
runN 2 "$W/q25.yaml" --set parallel.pipeline_parallel=2 --set parallel.vision.data_parallel=2 --set training.output_dir="$W/q2"
cmp_runs "Qwen2.5-VL, vision dp2 | LM pp2 vs 1 process" q1 q2 "$TOL"

# errors before any work, each naming the key
err() {  # err WHAT PATTERN CMD...
  local what=$1 pat=$2; shift 2
  if "$@" >"$out" 2>&1; then echo "FAIL: $what: accepted"; fail=1
  elif grep -q -- "$pat" "$out"; then echo "refused ($what): $(grep -m1 -- "$pat" "$out" | sed 's/^mmc: [a-z]*: [^ ]*: //')"
  else echo "FAIL: $what: unexpected message:"; cat "$out"; fail=1; fi
}
err "with the tower as a stage of its own" "parallel.pipeline_vision_stage: true with parallel.vision data-parallel" \
  "$MMC" train "$W/ref.yaml" $PPDP --set parallel.pipeline_vision_stage=true
err "with context parallelism" "pipeline_parallel 2, with context_parallel > 1: not supported yet" \
  "$MMC" train "$W/ref.yaml" $PPDP --set parallel.context_parallel=2
err "ranks do not add up" "data_parallel 3 = 3 ranks, but the language model's plan spans 4" \
  timeout -k 10 60 "$MMC" launch -n 4 "$W/ref.yaml" --set parallel.pipeline_parallel=2 --set parallel.vision.data_parallel=3

echo "test_pp_hetero: $([ "$fail" = 0 ] && echo passed || echo FAILED)"
[ "$fail" = 0 ]
