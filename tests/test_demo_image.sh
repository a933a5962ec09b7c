#!/usr/bin/env bash
# test_demo_image.sh — the image-generation demo (`make run-image` = scripts/demo_image.sh) and its
# tools (`mmc image-demo`, `mmc train-vae`), in a temporary folder. Two parts, two ctest cases:
#   short  (`make test`): the judge itself — reference renderings of the held-out prompts agree
#          with their captions on every attribute (1.0), the same images judged against captions
#          with left and right swapped agree on none (side 0.0), so the judge can fail; malformed
#          inputs (a val line without "colour", a metadata line without "file_name", a resolution
#          the VAE cannot take, a missing option) fail with messages naming the file / option;
#          `mmc train-vae` halves its reconstruction error within 40 steps; then
#          the whole pipeline on a tiny schedule (200 images, 5 VAE steps, 10 DiT steps, its
#          control, 8 prompts, no VLM), checking that every stage runs and writes its files
#          (no agreement target);
#   full   (`make test-demos`, ctest label demo): the demo with its defaults and DEMO_CHECK=1 (pixel
#          colour >= 0.90, side >= 0.85; the VLM's colour >= 0.90 and shape >= 0.70; the control at
#          chance: colour <= 0.45, side <= 0.70). The VLM is runs/demo/model's newest checkpoint,
#          trained first by scripts/demo.sh (about 20 minutes) when there is none.
# No Python: the JSON is read with sed / grep.
set -u
PART=${1:-short}
case $PART in short|full) ;; *) echo "test_demo_image: no part named '$PART'"; exit 1 ;; esac
MMC=${MMC:-build/mmc}
[ -x "$MMC" ] || { echo "test_demo_image: skipped: no mmc binary at $MMC"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_demo_image.XXXXXX); trap 'rm -rf "$W"' EXIT
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
if [ "$PART" = full ]; then
  DEMO_RUN="$W/run" DEMO_CHECK=1 bash scripts/demo_image.sh "$(dirname "$MMC")" && exit 0
  echo "FAIL: the image demo missed its targets"; exit 1
fi
fail=0
bad() { echo "FAIL: $*"; fail=1; }
ok() { echo "ok: $*"; }
num() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1"; }

# the judge on reference renderings, and against swapped sides
D=$W/data
"$MMC" image-demo data --out "$D" --train 24 --val 12 --size 32 --seed 3 >/dev/null || bad "image-demo data"
[ "$(wc -l < "$D/val.jsonl")" = 12 ] && [ "$(wc -l < "$D/train/metadata.jsonl")" = 24 ] \
  && [ "$(wc -l < "$D/train_shuffled/metadata.jsonl")" = 24 ] && ok "data: 24 training lines, 12 prompts" || bad "data line counts"
grep -q '"a blue square on the right"' "$D/train/metadata.jsonl" && bad "a held-out caption is in the training set" \
  || ok "held-out captions are not in training"
grep -q '"caption": "a blue square on the right"' "$D/val.jsonl" && ok "held-out captions are the prompts" || bad "val prompts"
"$MMC" image-demo judge --val "$D/val.jsonl" --images "$D/val_ref" --out "$W/jref" --grid "$W/grid.png" >/dev/null \
  || bad "judge on references"
for k in colour side shape_pixels; do
  [ "$(num "$W/jref/judge.json" $k)" = 1.0000 ] && ok "references: $k 1.0" || bad "references: $k $(cat "$W/jref/judge.json")"
done
[ -s "$W/grid.png" ] && [ "$(wc -l < "$W/jref/vlm_questions.jsonl")" = 24 ] && [ -s "$W/jref/vlm/val_000011.png" ] \
  && ok "grid, 24 VLM questions, 56-px copies" || bad "judge outputs"
sed -e 's/"left"/"TMP"/; s/"right"/"left"/; s/"TMP"/"right"/' "$D/val.jsonl" > "$W/swapped.jsonl"
"$MMC" image-demo judge --val "$W/swapped.jsonl" --images "$D/val_ref" --out "$W/jsw" >/dev/null || bad "judge swapped"
[ "$(num "$W/jsw/judge.json" side)" = 0.0000 ] && ok "swapped sides: side 0.0" || bad "swapped: $(cat "$W/jsw/judge.json")"

# malformed input
expect() {   # expect RC PATTERN CMD...
  local rc=$1 pat=$2; shift 2
  "$@" > "$W/out" 2>&1; local got=$?
  [ $got = "$rc" ] && grep -q -- "$pat" "$W/out" && ok "rc $rc: $pat" || bad "$* -> rc $got (want $rc, '$pat'): $(cat "$W/out")"
}
sed '2s/"colour": "[a-z]*", //' "$D/val.jsonl" > "$W/nocolour.jsonl"
expect 1 "nocolour.jsonl:2: expected" "$MMC" image-demo judge --val "$W/nocolour.jsonl" --images "$D/val_ref" --out "$W/j2"
expect 1 "val_000000.png" "$MMC" image-demo judge --val "$D/val.jsonl" --images "$W/nowhere" --out "$W/j3"
mkdir -p "$W/bad"; echo '{"text": "a red circle"}' > "$W/bad/metadata.jsonl"
V=examples/image_demo/pipe/vae/config.json
expect 1 'metadata.jsonl:1: expected a JSON object with a "file_name"' "$MMC" train-vae --data "$W/bad" --config $V --out "$W/v0"
expect 1 "not a multiple of the VAE's downscale 4" "$MMC" train-vae --data "$D/train" --config $V --out "$W/v0" --resolution 30
expect 2 "are required" "$MMC" train-vae --data "$D/train" --out "$W/v0"
expect 2 "unknown action" "$MMC" image-demo draw --out "$W/x"

# train-vae learns: on the 24 training images at 32 px, the logged reconstruction error of the last
# 10 steps is under half that of the first 10 (measured: 0.61 -> 0.058), and the folder it writes
# loads back (its config has the measured shift / scaling factors)
"$MMC" train-vae --data "$D/train" --config $V --out "$W/vae" --resolution 32 --steps 40 --batch 8 --log-every 10 \
  > "$W/vae.log" 2>&1 || bad "train-vae: $(tail -3 "$W/vae.log")"
m0=$(sed -n 's/.*step 10\/40  mse \([0-9.]*\).*/\1/p' "$W/vae.log"); m1=$(sed -n 's/.*step 40\/40  mse \([0-9.]*\).*/\1/p' "$W/vae.log")
awk -v a="$m0" -v b="$m1" 'BEGIN { exit !(a != "" && b != "" && b < 0.5 * a) }' && ok "train-vae: mse $m0 -> $m1" \
  || bad "train-vae did not learn: mse $m0 -> $m1"
grep -q '"shift_factor"' "$W/vae/config.json" && [ -s "$W/vae/reconstructions.png" ] && ok "train-vae outputs" || bad "train-vae outputs"

# the whole demo on a tiny schedule
if DEMO_RUN="$W/run" DEMO_RES=32 DEMO_TRAIN=200 DEMO_VAL=8 DEMO_VAE_STEPS=5 DEMO_STEPS=10 DEMO_VLM=none \
     bash scripts/demo_image.sh "$(dirname "$MMC")" > "$W/log" 2>&1; then
  for f in vae/reconstructions.png vae/diffusion_pytorch_model.safetensors main/pipe/transformer/diffusion_pytorch_model.safetensors \
           main/grid.png main/gen/val_000007.png control/grid.png summary.json; do
    [ -s "$W/run/$f" ] || bad "the demo made no $f"
  done
  grep -q '"samples":8,' "$W/run/main/judge/judge.json" && grep -q '"samples":8,' "$W/run/control/judge/judge.json" \
    && ok "demo: 8 prompts generated and judged, control too: $(cat "$W/run/summary.json")" || bad "demo judge: $(tail -5 "$W/log")"
else
  tail -30 "$W/log"; bad "scripts/demo_image.sh (tiny schedule)"
fi
[ $fail = 0 ] && echo "test_demo_image short: passed"
exit $fail
