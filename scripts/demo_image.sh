#!/usr/bin/env bash
# demo_image.sh — the image-generation demo (`make run-image`): write captioned `mmc synth` shapes
# ("a red circle on the left", 48x48; 6 of the 24 colour-shape-side combinations held out of
# training), train a tiny AutoencoderKL from scratch (`mmc train-vae`), assemble a FluxPipeline
# folder around it, train a tiny Flux-shaped DiT from scratch on the VAE's latents
# (examples/image_demo.yaml), generate one image per held-out prompt, and judge them twice: pixel
# statistics (`mmc image-demo judge`: dominant colour, side of the centroid; writes the grid PNG)
# and the understanding model of `make run` (`mmc eval` on "What colour is the circle?" / "What
# shape is the red object?" per image; trained first by scripts/demo.sh where its checkpoint is
# absent). The control: the same recipe trained on the same images with the captions shuffled
# must stay at chance. Usage: bash scripts/demo_image.sh [BUILD_DIR]
#
# Knobs (environment): DEMO_RUN (output folder, default runs/image_demo), DEMO_TRAIN (training
# images, default 4000), DEMO_VAL (held-out prompts, default 48), DEMO_VAE_STEPS (default 400),
# DEMO_STEPS (DiT steps, default: the YAML's), DEMO_RES (image side, default: the YAML's 48), DEMO_CONTROL=0 (skip the control), DEMO_DIT_THREADS, DEMO_VLM
# (the understanding model's checkpoint; default: the newest under runs/demo/model, trained with
# scripts/demo.sh when there is none), DEMO_VLM=none (skip that judge), DEMO_CHECK=1 (exit 1
# below the targets: pixel colour >= 0.90, side >= 0.85, VLM shape >= 0.70 (colour >= 0.90);
# the control's pixel colour <= 0.45 and side <= 0.70, chance being 0.25 and 0.5).
set -euo pipefail
BUILD=${1:-build}
MMC="$BUILD/mmc"
RUN=${DEMO_RUN:-runs/image_demo}
DATA=$RUN/data
CFG=examples/image_demo.yaml
BASE=examples/image_demo/pipe        # the FluxPipeline folder: frozen token-embedding CLIP + T5, configs (tools/ref/gen_image_demo.py)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
[ -x "$MMC" ] || { echo "demo_image: $MMC not found; run 'make build' first" >&2; exit 1; }

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
STEPS=${DEMO_STEPS:-$(sed -n 's/^  steps: *\([0-9]*\).*/\1/p' $CFG)}
WARMUP=$(sed -n 's/^  warmup_steps: *\([0-9]*\).*/\1/p' $CFG)
[ "$STEPS" -ge "$WARMUP" ] || WARMUP=$((STEPS / 2))
NTRAIN=${DEMO_TRAIN:-4000}
NVAL=${DEMO_VAL:-48}
VAE_STEPS=${DEMO_VAE_STEPS:-400}
RES=${DEMO_RES:-$(sed -n 's/^  resolution: *\([0-9]*\).*/\1/p' $CFG)}
SEQ=$(sed -n 's/^  max_sequence_length: *\([0-9]*\).*/\1/p' $CFG)
GEN_STEPS=20
t_start=$(date +%s)
mkdir -p "$RUN"

step "1/7 captioned shapes: $NTRAIN training images (${RES}x${RES}), $NVAL prompts of the 6 held-out captions"
rm -rf "$DATA"
"$MMC" image-demo data --out "$DATA" --train "$NTRAIN" --val "$NVAL" --size "$RES" --seed 0
head -n 2 "$DATA/train/metadata.jsonl"

step "2/7 a tiny AutoencoderKL from scratch ($VAE_STEPS steps): $BASE/vae/config.json"
t0=$(date +%s)
rm -rf "$RUN/vae"
"$MMC" train-vae --data "$DATA/train" --config "$BASE/vae/config.json" --out "$RUN/vae" \
    --resolution "$RES" --steps "$VAE_STEPS" --log-every 100 2>&1 | tee "$RUN/vae.log"
echo "VAE wall time: $(($(date +%s) - t0)) s; held-out reconstructions: $RUN/vae/reconstructions.png"

# the pipeline folder: examples/image_demo/pipe with the trained VAE; its transformer/ holds the
# untrained DiT while training (model.init builds a fresh one from its config and reads nothing
# else of it) and the trained DiT after
pipe() {   # pipe DIR
    rm -rf "$1"; mkdir -p "$1"
    cp -r "$BASE"/. "$1/"
    cp "$RUN/vae/config.json" "$RUN/vae/diffusion_pytorch_model.safetensors" "$1/vae/"
}

train_dit() {   # train_dit NAME METADATA_DIR: trains RUN/NAME/pipe's transformer
    local dir=$RUN/$1
    pipe "$dir/pipe"
    rm -rf "$dir/dit"
    local t0; t0=$(date +%s)
    "$MMC" train $CFG --set model.path="$dir/pipe" --set data.train="$2" --set training.output_dir="$dir/dit" \
        --set training.steps="$STEPS" --set optimizer.warmup_steps="$WARMUP" --set training.save_every="$STEPS" \
        --set data.resolution="$RES"
    echo "DiT training wall time: $(($(date +%s) - t0)) s"
    local ck; ck=$(ls -d "$dir"/dit/checkpoint-* | sort -t- -k2 -n | tail -1)
    rm -rf "$dir/pipe/transformer"
    mkdir -p "$dir/pipe/transformer"
    cp "$ck/config.json" "$ck/diffusion_pytorch_model.safetensors" "$dir/pipe/transformer/"
}

generate() {   # generate NAME: one image per prompt of val.jsonl into RUN/NAME/gen, then the pixel judge
    local dir=$RUN/$1 i=0 cap seed
    rm -rf "$dir/gen"; mkdir -p "$dir/gen"
    while IFS= read -r line; do
        cap=$(printf '%s' "$line" | sed 's/.*"caption": "\([^"]*\)".*/\1/')
        seed=$(printf '%s' "$line" | sed 's/.*"seed": \([0-9]*\).*/\1/')
        "$MMC" generate-image --model "$dir/pipe" --prompt "$cap" --width "$RES" --height "$RES" --steps $GEN_STEPS \
            --seed "$seed" --max-sequence-length "$SEQ" --out "$dir/gen/val_$(printf '%06d' $i).png" >/dev/null 2>&1
        i=$((i + 1))
    done < "$DATA/val.jsonl"
    "$MMC" image-demo judge --val "$DATA/val.jsonl" --images "$dir/gen" --out "$dir/judge" --grid "$dir/grid.png"
}

# The control's DiT trains beside the main one, each on half the cores: a model this small does
# not scale past one core (2-core Intel host, quiet: 509 samples/s on one thread, ~400 on two), so
# two side by side take the time of one. DEMO_DIT_THREADS sets the threads of each.
DIT_THREADS=${DEMO_DIT_THREADS:-$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))}
ctl_pid=
trap '[ -z "$ctl_pid" ] || kill "$ctl_pid" 2>/dev/null || true' EXIT
if [ "${DEMO_CONTROL:-1}" != 0 ]; then
    (export OMP_NUM_THREADS=$DIT_THREADS; train_dit control "$DATA/train_shuffled") > "$RUN/control.log" 2>&1 &
    ctl_pid=$!
fi
step "3/7 a tiny Flux-shaped DiT from scratch on the VAE's latents ($STEPS steps, $DIT_THREADS threads; the control's beside it): $CFG"
(export OMP_NUM_THREADS=$DIT_THREADS; train_dit main "$DATA/train")

step "4/7 one image per held-out prompt ($GEN_STEPS Euler steps), judged by pixel statistics"
echo "\$ mmc generate-image --model $RUN/main/pipe --prompt \"$(sed -n '1s/.*"caption": "\([^"]*\)".*/\1/p' "$DATA/val.jsonl")\" --width $RES --height $RES ..."
generate main
echo "grid of prompts and images: $RUN/main/grid.png"

ctl_c=null ctl_s=null
if [ "${DEMO_CONTROL:-1}" != 0 ]; then
    step "5/7 control: the same recipe on the same images with shuffled captions (chance: colour 0.25, side 0.5)"
    wait "$ctl_pid" || { ctl_pid=; tail -20 "$RUN/control.log"; exit 1; }   # trained beside the main DiT
    ctl_pid=
    grep "wall time" "$RUN/control.log"
    generate control
    ctl_c=$(sed -n 's/.*"colour":\([0-9.]*\).*/\1/p' "$RUN/control/judge/judge.json")
    ctl_s=$(sed -n 's/.*"side":\([0-9.]*\).*/\1/p' "$RUN/control/judge/judge.json")
fi

vlm_c=null vlm_s=null ref_c=null ref_s=null cv_c=null cv_s=null
VLM=${DEMO_VLM:-}
if [ "$VLM" != none ]; then
    step "6/7 the understanding model of 'make run' judges the same images (colour and shape questions)"
    latest() { local c; c=$(ls -d "$1"/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1) || true
               [ -n "$c" ] || return 1; if [ -f "$c/config.json" ]; then echo "$c"; else echo "$c/model"; fi; }
    if [ -z "$VLM" ]; then
        if ! VLM=$(latest runs/demo/model); then
            echo "no checkpoint under runs/demo/model: training it first (scripts/demo.sh, about 20 minutes on 2 cores)"
            DEMO_RUN=runs/demo bash scripts/demo.sh "$BUILD" > "$RUN/vlm_demo.log" 2>&1 || { tail -20 "$RUN/vlm_demo.log"; exit 1; }
            VLM=$(latest runs/demo/model)
        fi
    fi
    echo "model: $VLM"
    "$MMC" eval --model "$VLM" --data "$RUN/main/judge/vlm_questions.jsonl" --json --out "$RUN/main/judge/vlm_predictions.jsonl" \
        | tee "$RUN/main/judge/vlm.json"
    by=$(sed -n 's/.*"by_type":{\([^}]*\)}.*/\1/p' "$RUN/main/judge/vlm.json")
    vlm_c=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"colour":\(.*\)/\1/p')
    vlm_s=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"shape":\(.*\)/\1/p')
    # the judge's own accuracy: the same questions on reference renderings of the same prompts
    "$MMC" image-demo judge --val "$DATA/val.jsonl" --images "$DATA/val_ref" --out "$RUN/ref_judge" >/dev/null
    "$MMC" eval --model "$VLM" --data "$RUN/ref_judge/vlm_questions.jsonl" --json > "$RUN/ref_judge/vlm.json"
    by=$(sed -n 's/.*"by_type":{\([^}]*\)}.*/\1/p' "$RUN/ref_judge/vlm.json")
    ref_c=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"colour":\(.*\)/\1/p')
    ref_s=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"shape":\(.*\)/\1/p')
    echo "the same questions on reference renderings of the prompts (the judge's own accuracy): colour $ref_c, shape $ref_s"
    if [ -s "$RUN/control/judge/vlm_questions.jsonl" ]; then   # and on the control's images (chance 0.25, 0.33)
        "$MMC" eval --model "$VLM" --data "$RUN/control/judge/vlm_questions.jsonl" --json > "$RUN/control/judge/vlm.json"
        by=$(sed -n 's/.*"by_type":{\([^}]*\)}.*/\1/p' "$RUN/control/judge/vlm.json")
        cv_c=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"colour":\(.*\)/\1/p')
        cv_s=$(printf '%s' "$by" | tr ',' '\n' | sed -n 's/^"shape":\(.*\)/\1/p')
        echo "the same questions on the control's images: colour $cv_c, shape $cv_s (chance 0.25, 0.33)"
    fi
fi

step "7/7 summary"
px_c=$(sed -n 's/.*"colour":\([0-9.]*\).*/\1/p' "$RUN/main/judge/judge.json")
px_s=$(sed -n 's/.*"side":\([0-9.]*\).*/\1/p' "$RUN/main/judge/judge.json")
px_sh=$(sed -n 's/.*"shape_pixels":\([0-9.]*\).*/\1/p' "$RUN/main/judge/judge.json")
printf '{"pixels":{"colour":%s,"side":%s,"shape":%s},"vlm":{"colour":%s,"shape":%s},"vlm_on_references":{"colour":%s,"shape":%s},"control_pixels":{"colour":%s,"side":%s},"control_vlm":{"colour":%s,"shape":%s},"seconds":%d}\n' \
    "$px_c" "$px_s" "$px_sh" "$vlm_c" "$vlm_s" "$ref_c" "$ref_s" "$ctl_c" "$ctl_s" "$cv_c" "$cv_s" $(($(date +%s) - t_start)) | tee "$RUN/summary.json"
echo "held-out prompts: pixel colour $px_c (target >= 0.90), side $px_s (>= 0.85), shape by pixels $px_sh;" \
     "VLM colour $vlm_c, shape $vlm_s (>= 0.70); control colour $ctl_c, side $ctl_s (chance 0.25, 0.5)"
echo "grid: $RUN/main/grid.png   pipeline: $RUN/main/pipe (mmc generate-image --model $RUN/main/pipe --width $RES --height $RES --max-sequence-length $SEQ --prompt ...)"
if [ "${DEMO_CHECK:-0}" = 1 ]; then
    awk -v c="$px_c" -v s="$px_s" 'BEGIN {exit !(c + 0 >= 0.9 && s + 0 >= 0.85)}' || { echo "demo_image: pixel judge below target" >&2; exit 1; }
    [ "$vlm_s" = null ] || awk -v c="$vlm_c" -v s="$vlm_s" 'BEGIN {exit !(c + 0 >= 0.9 && s + 0 >= 0.7)}' \
        || { echo "demo_image: VLM judge below target" >&2; exit 1; }
    [ "$ctl_c" = null ] || awk -v c="$ctl_c" -v s="$ctl_s" 'BEGIN {exit !(c + 0 <= 0.45 && s + 0 <= 0.7)}' \
        || { echo "demo_image: the control is above chance" >&2; exit 1; }
fi
