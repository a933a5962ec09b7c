#!/usr/bin/env bash
# demo.sh — the built-in demo (`make run`): write the synthetic shapes dataset, train a tiny
# Qwen2-VL from scratch on this CPU (examples/demo.yaml), evaluate it on the validation split
# (accuracy by question type), run the control (the same model with blanked images must be
# at chance), answer questions about freshly generated images, and point at the checkpoint
# and the loss plot. Usage: bash scripts/demo.sh [BUILD_DIR]
#
# Knobs (environment): DEMO_RUN (output folder, default runs/demo), DEMO_STEPS (default: the
# YAML's), DEMO_TRAIN (training samples,
# default 40000), DEMO_CONTROL_STEPS (steps of the blank-image control run; default a
# quarter of the main run, 0 skips it — the model trained on real images is always also
# evaluated on blanked validation images).
set -euo pipefail
BUILD=${1:-build}
MMC="$BUILD/mmc"
RUN=${DEMO_RUN:-runs/demo}
DATA=$RUN/data
CFG=examples/demo.yaml
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[ -x "$MMC" ] || { echo "demo: $MMC not found; run 'make build' first" >&2; exit 1; }

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
latest_ckpt() {   # newest checkpoint-N under $1, as an HF model directory
    local c
    c=$(ls -d "$1"/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1) || true
    [ -n "$c" ] || return 1
    if [ -f "$c/config.json" ]; then echo "$c"; elif [ -f "$c/model/config.json" ]; then echo "$c/model"; else return 1; fi
}

STEPS=${DEMO_STEPS:-$(sed -n 's/^  steps: *\([0-9]*\).*/\1/p' $CFG)}
BATCH=$(sed -n 's/^  batch_size: *\([0-9]*\).*/\1/p' $CFG)
NTRAIN=${DEMO_TRAIN:-40000}
CONTROL_STEPS=${DEMO_CONTROL_STEPS:-$((STEPS / 4))}
# the config's warmup, or half the run where a short run (DEMO_STEPS, the sanitized test's
# 20-step control) is shorter than it: mmc train rejects warmup_steps > training.steps
WARMUP=$(sed -n 's/^  warmup_steps: *\([0-9]*\).*/\1/p' $CFG)
warmup_for() { [ "$1" -ge "$WARMUP" ] && echo "$WARMUP" || echo $(($1 / 2)); }
SETS=(--set training.steps=$STEPS --set optimizer.warmup_steps=$(warmup_for $STEPS) --set data.train=$DATA/train_curriculum.jsonl --set data.eval=$DATA/val.jsonl
      --set data.image_root=$DATA --set training.output_dir=$RUN/model)
# train_curriculum.jsonl = N/2 curriculum lines + the N samples once per epoch; the loader
# reads it in order, so write enough epochs for STEPS x BATCH samples (no second curriculum)
EPOCHS=$(( (STEPS * BATCH - NTRAIN / 2 + NTRAIN - 1) / NTRAIN ))
[ "$EPOCHS" -ge 1 ] || EPOCHS=1

step "1/6 synthetic dataset: $NTRAIN train + 400 val images (56x56, 1-3 shapes; colour/shape/count/left-right questions)"
"$MMC" synth --out $DATA --train "$NTRAIN" --val 400 --size 56 --seed 0 --epochs $EPOCHS
"$MMC" synth --out $RUN/data_blank --train "$NTRAIN" --val 400 --size 56 --seed 0 --epochs $EPOCHS --blank >/dev/null
head -n 2 $DATA/val.jsonl

if ! "$MMC" train --help >/dev/null 2>&1; then
    echo "demo: this build has no 'mmc train' yet; the dataset is in $DATA. Stopping here." >&2
    exit 1
fi

step "2/6 training a tiny Qwen2-VL from scratch ($STEPS steps, $OMP_NUM_THREADS threads): $CFG"
rm -rf $RUN/model
t0=$(date +%s)
"$MMC" train $CFG "${SETS[@]}"
t1=$(date +%s)
echo "training wall time: $((t1 - t0)) s"
MODEL=$(latest_ckpt $RUN/model) || { echo "demo: no checkpoint in $RUN/model" >&2; exit 1; }

step "3/6 evaluation on the validation split ($MODEL)"
"$MMC" eval --model "$MODEL" --data $DATA/val.jsonl --json --out $RUN/val_predictions.jsonl | tee $RUN/eval.json

step "4/6 control: the answers must need the image (chance: colour 0.25, shape 0.33, count 0.33, left/right 0.5)"
echo "trained model, validation images blanked:"
"$MMC" eval --model "$MODEL" --data $DATA/val.jsonl --json --blank-images | tee $RUN/eval_blank_images.json
if [ "$CONTROL_STEPS" -gt 0 ]; then
    echo "same recipe trained on blanked images ($CONTROL_STEPS steps), evaluated on blanked images:"
    rm -rf $RUN/control
    "$MMC" train $CFG --set training.steps=$CONTROL_STEPS --set optimizer.warmup_steps=$(warmup_for $CONTROL_STEPS) --set data.train=$RUN/data_blank/train_curriculum.jsonl \
        --set data.image_root=$RUN/data_blank --set data.eval=$RUN/data_blank/val.jsonl \
        --set training.output_dir=$RUN/control >$RUN/control.log 2>&1 || { echo "control run failed, see $RUN/control.log"; }
    if CONTROL=$(latest_ckpt $RUN/control); then
        "$MMC" eval --model "$CONTROL" --data $DATA/val.jsonl --json --blank-images | tee $RUN/eval_control.json
    fi
fi

step "5/6 questions about freshly generated images"
"$MMC" synth --out $RUN/fresh --train 0 --val 8 --size 56 --seed 2024 >/dev/null
if "$MMC" generate --model "$MODEL" --image $RUN/fresh/images/val_000000.png --prompt "How many shapes are there?" \
        --max-new-tokens 4 >/dev/null 2>&1; then
    for i in 0 1 2 3 4 5 6 7; do
        line=$(sed -n "$((i + 1))p" $RUN/fresh/val.jsonl)
        q=$(printf '%s' "$line" | sed 's/.*"content": "<image>\([^"]*\)".*"content": "\([^"]*\)".*/\1/')
        want=$(printf '%s' "$line" | sed 's/.*"content": "<image>\([^"]*\)".*"content": "\([^"]*\)".*/\2/')
        img=$RUN/fresh/images/val_$(printf '%06d' $i).png
        echo "\$ mmc generate --model $MODEL --image $img --prompt \"$q\""
        got=$("$MMC" generate --model "$MODEL" --image "$img" --prompt "$q" --max-new-tokens 8 2>/dev/null | tr -d '\n')
        printf '  -> %s   (truth: %s)\n' "$got" "$want"
    done
else
    echo "(mmc generate cannot take images in this build; answering with mmc eval --out instead)"
    "$MMC" eval --model "$MODEL" --data $RUN/fresh/val.jsonl --out $RUN/fresh/predictions.jsonl >/dev/null
    sed 's/.*"image": "\([^"]*\)".*"question": "<image>\([^"]*\)".*"reference": "\([^"]*\)".*"prediction": "\([^"]*\)".*/  \2 -> \4   (truth: \3)  [\1]/' \
        $RUN/fresh/predictions.jsonl
fi

step "6/6 artefacts"
echo "checkpoint (Hugging Face directory; transformers loads it): $MODEL"
for p in $RUN/model/loss.png "$MODEL/loss.png"; do [ -f "$p" ] && { echo "loss plot: $p"; break; }; done
echo "metrics: $RUN/model/metrics.jsonl   predictions: $RUN/val_predictions.jsonl   summary: $RUN/eval.json"
echo "try:  $MMC generate --model $MODEL --image $RUN/fresh/images/val_000000.png --prompt 'How many shapes are there?'"
