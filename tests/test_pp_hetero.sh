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
#   the images each rank encoded (all ranks some, every image of the run once per replica);
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
# images (patches) per rank from the run's last line: each rank some
shares() {  # shares WHAT
  local l; l=$(grep 'images (patches) the vision tower encoded' "$W/train.log" | tail -1 | sed 's/.*per rank://')
  if [ -n "$l" ] && echo "$l" | awk '{for (i = 1; i <= NF; i += 2) if ($i + 0 < 1) exit 1}'; then
    echo "$1: images (patches) per rank:$l"
  else echo "FAIL: $1: images per rank '$l' (each rank some)"; fail=1; fi
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

echo "test_pp_hetero: $([ "$fail" = 0 ] && echo passed || echo FAILED)"
[ "$fail" = 0 ]
