#!/usr/bin/env bash
# test_demo.sh — end to end, the README's main job (`make run` = scripts/demo.sh) in a
# temporary folder: the synthetic dataset, a tiny Qwen2-VL trained from scratch with
# examples/demo.yaml, `mmc eval --json` on the validation split, the controls and answers to
# fresh images. Two parts, two ctest cases:
#   short  (`make test`): 300 steps on 4000 samples and a 100-step control; the model must
#          learn one question type to >= chance + 0.20, a skill that needs the image (the same
#          model on blanked images at chance). Measured (Zen 5, AVX-512): count 0.69 (chance
#          0.33; 0.34 on blanked images); colour, shape, left/right still at their priors — with
#          4000 samples the colour-only curriculum stage is 31 steps, and count, a global
#          property of the image, is learned first;
#   full   (`make test-demos`, ctest label demo): the whole demo, 4000 steps and its default
#          control (a quarter as many steps); the issue's targets: colour and shape >= 0.90,
#          count and left/right >= 0.75.
# Both assert the controls: the same recipe trained on blanked images, evaluated on blanked
# images, does no better than chance on any question type (<= CAP below), and it did learn
# the answer format (colour, the curriculum's first stage, >= 0.12: a broken run, all wrong,
# cannot pass as "at chance"); the trained model on blanked images is capped the same way.
# 100 samples per type: the caps sit ~3 standard deviations above chance. Measured, short
# control: colour 0.25, shape 0.33, count 0, left/right 0.5 (count is barely in its 100 steps). Training is deterministic for the seed, so this is not a flaky
# threshold. Under the sanitizers (make test-asan) the short part runs every stage on a
# shorter schedule without the accuracy targets. No Python: the JSON is read with sed.
set -u
PART=${1:-all}
case $PART in short|full|all) ;; *) echo "test_demo: no part named '$PART'"; exit 1 ;; esac
MMC=${MMC:-build/mmc}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
TYPES="colour shape count leftright"
declare -A CHANCE=([colour]=0.25 [shape]=0.33 [count]=0.33 [leftright]=0.50)
declare -A CAP=([colour]=0.40 [shape]=0.50 [count]=0.50 [leftright]=0.65)

# acc FILE TYPE: that question type's accuracy in an `mmc eval --json` summary (one line)
acc() { sed -n 's/.*"by_type":{\([^}]*\)}.*/\1/p' "$1" | tr ',' '\n' | sed -n "s/^\"$2\":\(.*\)/\1/p"; }
# within A LO HI: LO <= A <= HI as numbers (an absent or null A is not)
within() { awk -v a="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(a != "" && a != "null" && a + 0 >= lo && a + 0 <= hi) }'; }

fail=0
bad() { echo "FAIL: $*"; fail=1; }

run_part() {   # run_part NAME STEPS TRAIN CONTROL_STEPS TARGETS ("type=min ..." or "any=margin")
  local name=$1 steps=$2 train=$3 control=$4 targets=$5 run=$W/$1
  local sets=()
  [ -n "$steps" ] && sets+=(DEMO_STEPS="$steps")
  [ -n "$train" ] && sets+=(DEMO_TRAIN="$train")
  [ -n "$control" ] && sets+=(DEMO_CONTROL_STEPS="$control")
  echo "== test_demo $name: ${sets[*]:-the defaults}"
  if ! env "${sets[@]}" DEMO_RUN="$run" bash scripts/demo.sh "$(dirname "$MMC")" > "$run.log" 2>&1; then
    tail -40 "$run.log"; bad "$name: scripts/demo.sh"; return
  fi
  grep "training wall time" "$run.log"
  local files=(eval.json eval_blank_images.json eval_control.json)
  [ "${MMC_HAVE_CAIRO:-1}" = 1 ] && files+=(model/loss.png) || echo "test_demo $name: skipped: the loss plot check (built without cairo)"
  for f in "${files[@]}"; do [ -s "$run/$f" ] || bad "$name: the demo made no $f"; done
  grep -c "(truth:" "$run.log" | grep -qx 8 && echo "ok: $name: 8 answers to fresh images" || bad "$name: fresh-image answers"
  [ $fail = 0 ] || { tail -30 "$run.log"; return; }
  if [ -z "$targets" ]; then echo "ok: $name: every stage ran (no accuracy targets under the sanitizers)"; return; fi
  local t a want
  echo "accuracy by type: $(sed -n 's/.*"by_type":\({[^}]*}\).*/\1/p' "$run/eval.json")"
  echo "  blanked images: $(sed -n 's/.*"by_type":\({[^}]*}\).*/\1/p' "$run/eval_blank_images.json")"
  echo "  control (trained and evaluated on blanked images): $(sed -n 's/.*"by_type":\({[^}]*}\).*/\1/p' "$run/eval_control.json")"
  for tw in $targets; do
    t=${tw%=*} want=${tw#*=}
    if [ "$t" = any ]; then   # the type learned best above its chance rate, and it needs the image
      t=$(for u in $TYPES; do awk -v u=$u -v a="$(acc "$run/eval.json" $u)" -v c=${CHANCE[$u]} 'BEGIN { print a - c, u }'; done \
          | sort -g | tail -1 | cut -d' ' -f2)
      want=$(awk -v c=${CHANCE[$t]} -v m="$want" 'BEGIN { print c + m }')
    fi
    a=$(acc "$run/eval.json" "$t")
    within "$a" "$want" 1 && echo "ok: $name: $t $a >= $want" || bad "$name: $t accuracy $a < $want"
  done
  for t in $TYPES; do
    a=$(acc "$run/eval_blank_images.json" "$t")
    within "$a" 0 "${CAP[$t]}" && echo "ok: $name: blanked images, $t $a <= ${CAP[$t]}" \
      || bad "$name: the trained model on blanked images: $t $a > ${CAP[$t]} (chance ${CHANCE[$t]})"
    a=$(acc "$run/eval_control.json" "$t")
    within "$a" 0 "${CAP[$t]}" && echo "ok: $name: control, $t $a <= ${CAP[$t]} (chance ${CHANCE[$t]})" \
      || bad "$name: control $t $a > ${CAP[$t]} (chance ${CHANCE[$t]}): it answers without the image"
  done
  a=$(acc "$run/eval_control.json" colour)
  within "$a" 0.12 1 && echo "ok: $name: the control learned the answer format (colour $a)" \
    || bad "$name: control colour $a < 0.12: the control run is broken, not at chance"
}

if [ "$PART" != full ]; then
  if [ "${MMC_SANITIZED:-0}" = 1 ]; then run_part short 60 800 20 ""
  else run_part short 300 4000 100 "any=0.20"; fi
fi
if [ "$PART" != short ] && [ "${MMC_SANITIZED:-0}" = 1 ]; then
  echo "test_demo full: skipped: a sanitizer build would take hours (the short part ran every stage)"
  [ "$PART" = full ] && exit 77
elif [ "$PART" != short ]; then
  run_part full "" "" "" "colour=0.90 shape=0.90 count=0.75 leftright=0.75"
  # the judge of `make run-image` (test_demo_image_full runs after this one) is this model: handed over
  # as runs/demo/model when no earlier `make run` left one, so it is not trained twice
  if [ $fail = 0 ] && [ ! -d runs/demo/model ] && [ -d "$W/full/model" ]; then
    mkdir -p runs/demo && cp -r "$W/full/model" runs/demo/model && echo "test_demo full: model kept as runs/demo/model"
  fi
fi
[ $fail = 0 ] && echo "test_demo $PART: passed" || echo "test_demo $PART: FAILED"
exit $fail
