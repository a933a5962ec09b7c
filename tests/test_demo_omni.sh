#!/usr/bin/env bash
# test_demo_omni.sh — the spoken-question demo (`make run-omni` = scripts/demo_omni.sh) in a
# temporary folder. Two parts, two ctest cases:
#   short  (`make test`): the whole pipeline on a small schedule — 200 training questions (the
#          curriculum: 260 as text, then 800 spoken), 10 steps of a thinker from scratch (8 on text,
#          2 spoken; all of it trainable, as the demo), `mmc eval` on 20 held-out-voice questions and
#          on their silent control, one `mmc generate` — checking that every stage runs and reports
#          (eval JSON with 20 samples, 10 per question type: the demo's colour and shape questions;
#          the heard-word line), the first held-out answers printed, one `mmc generate`, no question
#          text in the user turn; no accuracy target (~30 s at load 20);
#   full   (`make test-demos`, label demo): the demo with its defaults and DEMO_CHECK=1: accuracy
#          >= 0.9 on held-out voices, the silent control <= 0.40 (chance 0.31; 8.3 CPU-minutes).
# Skipped (77) without espeak-ng. No Python: the JSON is read with grep.
set -u
PART=${1:-short}
case $PART in short|full) ;; *) echo "test_demo_omni: no part named '$PART'"; exit 1 ;; esac
MMC=${MMC:-build/mmc}
[ -x "$MMC" ] || { echo "test_demo_omni: skipped: no mmc binary at $MMC"; exit 77; }
command -v espeak-ng > /dev/null || { echo "test_demo_omni: skipped: espeak-ng is not installed"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_demo_omni.XXXXXX); trap 'rm -rf "$W"' EXIT
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
if [ "$PART" = full ]; then
  DEMO_RUN="$W/run" DEMO_CHECK=1 bash scripts/demo_omni.sh "$(dirname "$MMC")" && exit 0
  echo "FAIL: the omni demo missed its targets"; exit 1
fi
if ! DEMO_RUN="$W/run" DEMO_TRAIN=200 DEMO_VAL=20 DEMO_STEPS=10 bash scripts/demo_omni.sh "$(dirname "$MMC")" > "$W/log" 2>&1; then
  cat "$W/log"; echo "FAIL: the short omni demo failed"; exit 1
fi
fail=0
for f in eval.json eval_silent.json; do
  grep -q '"samples":20,' "$W/run/$f" && grep -q '"by_type_samples":{"colour":10,"shape":10}' "$W/run/$f" ||
    { echo "FAIL: $f: $(cat "$W/run/$f")"; fail=1; }
done
[ -s "$W/run/val_predictions.jsonl" ] || { echo "FAIL: no predictions"; fail=1; }
[ "$(grep -c 'wpm)'$'\t''.* -> ' "$W/log")" = 4 ] || { echo "FAIL: the first held-out answers are not shown"; fail=1; }
grep -q "prompt tokens" "$W/log" || { echo "FAIL: mmc generate did not answer"; fail=1; }
# the curriculum: text questions first (60 colour + 200), then spoken (10 steps of 32 reach 60 of them)
grep -q '^training sequence: 1060 questions, 800 of them spoken$' "$W/log" || { echo "FAIL: $(grep 'training sequence' "$W/log")"; fail=1; }
[ "$(grep -c '^{"messages": \[{"role": "user", "content": "<image>What' "$W/run/data/train_curriculum_spoken.jsonl" | head -1)" = 260 ] &&
  sed -n '261p' "$W/run/data/train_curriculum_spoken.jsonl" | grep -q '"content": "<image><audio>"' || { echo "FAIL: not 260 text questions then spoken ones"; fail=1; }
grep -q '^question heard (the restated subject right), by type: colour [0-9.]*, shape [0-9.]*$' "$W/log" || { echo "FAIL: no heard-word report"; fail=1; }
grep -q '"question": "What colour is the [a-z]*?".*' "$W/run/data/val_spoken.jsonl" &&
  ! grep -q '"content": "[^"]*What' "$W/run/data/val_spoken.jsonl" || { echo "FAIL: a question in the text prompt"; fail=1; }
[ $fail = 0 ] && echo "test_demo_omni short: passed"
exit $fail
