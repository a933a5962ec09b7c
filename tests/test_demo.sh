#!/usr/bin/env bash
# test_demo.sh — end to end, the README's main job (`make run` = scripts/demo.sh) in a
# temporary folder: the synthetic dataset, a tiny Qwen2-VL trained from scratch with
# examples/demo.yaml (the full 4000 steps: a few minutes on 2 cores), `mmc eval --json` on
# the validation split, the blanked-image control and answers to fresh images. The trainer
# must learn the task (issue targets: colour and shape >= 0.90, count and left/right >= 0.75)
# and the answers must need the image (the same model on blanked images stays near chance:
# colour <= 0.40, shape and count <= 0.50, left/right <= 0.65; 100 samples per type).
# Training is deterministic for the seed, so this is not a flaky threshold.
set -u
MMC=${MMC:-build/mmc}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# Under the sanitizers (make test-asan) the full run would take an hour: run every stage of
# the script on a short schedule, without the accuracy targets.
SHORT=()
[ "${MMC_SANITIZED:-0}" = 1 ] && SHORT=(DEMO_STEPS=60 DEMO_TRAIN=800)
if ! env "${SHORT[@]}" DEMO_RUN="$W/demo" DEMO_CONTROL_STEPS=0 bash scripts/demo.sh "$(dirname "$MMC")" > "$W/demo.log" 2>&1; then
  tail -40 "$W/demo.log"; echo "FAIL: scripts/demo.sh"; exit 1
fi
grep "training wall time" "$W/demo.log"
if [ ${#SHORT[@]} -gt 0 ]; then
  for f in eval.json eval_blank_images.json model/loss.png; do
    [ -s "$W/demo/$f" ] || { echo "FAIL: short demo made no $f"; exit 1; }
  done
  echo "ok: short demo (sanitizer build) ran every stage"; exit 0
fi
python3 - "$W/demo/eval.json" "$W/demo/eval_blank_images.json" <<'PY' || { tail -30 "$W/demo.log"; exit 1; }
import json, sys
real, blank = (json.load(open(p))["by_type"] for p in sys.argv[1:3])
need = {"colour": 0.90, "shape": 0.90, "count": 0.75, "leftright": 0.75}
cap = {"colour": 0.40, "shape": 0.50, "count": 0.50, "leftright": 0.65}
bad = [f"{t}: {real.get(t)} < {v}" for t, v in need.items() if real.get(t, 0) < v]
bad += [f"blank {t}: {blank.get(t)} > {v}" for t, v in cap.items() if blank.get(t, 1) > v]
print("accuracy by type:", real, "| blanked images:", blank)
if bad: print("FAIL:", "; ".join(bad)); sys.exit(1)
print("ok: the demo model meets the targets and needs the image")
PY
grep -c "(truth:" "$W/demo.log" | grep -q 8 && echo "ok: 8 answers to fresh images" || { echo "FAIL: fresh-image answers"; exit 1; }
[ -f "$W/demo/model/loss.png" ] && echo "ok: loss plot" || { echo "FAIL: no loss plot"; exit 1; }
