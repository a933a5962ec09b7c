#!/usr/bin/env bash
# test_plan_cli.sh — `mmc plan` on the tiny Qwen2 (a smoke test; the model's arithmetic is
# test_plan.c, its accuracy bench/bench_plan.sh): the table and the explanation; --write gives a
# YAML that `mmc train` loads, with the chosen layout in parallel: and the micro-batch set; --json
# lists only layouts the trainer accepts (tp 4 is refused by the tiny model's 2 KV heads, cp with
# tp by the run config's rules); --device cpu with a fresh calibration cache on one rank; and the
# errors (missing --gpus, unknown device / interconnect, a model that does not fit, a malformed cache);
# Qwen2-VL gets context-parallel layouts.
set -u
MMC=${MMC:-build/mmc}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
cat > "$W/run.yaml" <<YAML
# the tiny model, 8 rows of 16 tokens
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 8, micro_batch_size: 1}
parallel:
  data_parallel: 1
  zero: 0
optimizer: {type: adamw, lr: 1.0e-3}
training: {steps: 2, output_dir: $W/out}
YAML
out=$("$MMC" plan "$W/run.yaml" --gpus 4 --gpu-mem 1 --top 5 --write "$W/chosen.yaml" 2>&1)
echo "$out" | head -12
echo "$out" | grep -q "layouts accepted" && echo "$out" | grep -q "^why:" && echo "$out" | grep -q "^1\. dp" &&
  ok "table and explanation" || bad "table and explanation"
best=$(echo "$out" | awk '$1 == "1" {print $2; exit}')
dp=${best#dp}
grep -q "^  data_parallel: $dp$" "$W/chosen.yaml" && grep -c "^parallel:" "$W/chosen.yaml" | grep -qx 1 &&
  ok "--write: parallel: replaced ($best)" ||
  { bad "--write"; cat "$W/chosen.yaml"; }
mb=$(echo "$out" | awk '$1 == "1" {for (i = 1; i <= NF; i++) if ($i ~ /^mb[0-9]+$/) {print substr($i, 3); exit}}')
grep -q "micro_batch_size: $mb}" "$W/chosen.yaml" && ok "--write: micro_batch_size $mb" || bad "--write micro_batch_size $mb"
# the written file is a valid run config the trainer reads (mmc launch --print checks it without running)
if "$MMC" launch --help >/dev/null 2>&1 && "$MMC" launch -n 4 "$W/chosen.yaml" --print >"$W/launch.txt" 2>&1; then
  ok "launch --print accepts the written config"
else
  grep -q "mpirun" "$W/launch.txt" && bad "launch --print: $(cat "$W/launch.txt")" || echo "launch --print: skipped (no mpirun)"
fi
"$MMC" plan "$W/run.yaml" --gpus 4 --json > "$W/all.jsonl" 2>&1
python3 - "$W/all.jsonl" <<'PY' && ok "--json: only accepted layouts, ranked" || bad "--json"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and all(r["dp"] * r["tp"] * r["pp"] * r["cp"] == 4 for r in rows)
assert not any(r["tp"] == 4 for r in rows), "tp 4 cannot split 2 KV heads"
assert not any(r["cp"] > 1 and (r["tp"] > 1 or r["pp"] > 1) for r in rows), "cp composes with dp only"
assert not any(r["zero"] == 3 for r in rows), "ZeRO-3 needs bf16 weights"
fit = [r["step_s"] for r in rows if r["fits"]]
assert fit == sorted(fit)
PY
"$MMC" plan "$W/run.yaml" --gpus 1 --device cpu --host-share 1 --calib "$W/cal.txt" --top 2 >"$W/cpu.txt" 2>&1 &&
  grep -q "^stack " "$W/cal.txt" && grep -q "^head " "$W/cal.txt" && ok "--device cpu: kernels measured and cached" ||
  { bad "--device cpu"; cat "$W/cpu.txt"; }
"$MMC" plan "$W/run.yaml" --gpus 2 --device cpu --calib "$W/cal.txt" >"$W/e.txt" 2>&1
[ $? = 1 ] && grep -q "calibrate-net" "$W/e.txt" && ok "cpu without network calibration: says what to run" || bad "$(cat "$W/e.txt")"
echo "linear 1 2" >> "$W/cal.txt"
"$MMC" plan "$W/run.yaml" --gpus 1 --device cpu --calib "$W/cal.txt" >"$W/e.txt" 2>&1
[ $? = 1 ] && grep -q "cal.txt:[0-9]*:.*delete the file" "$W/e.txt" && ok "malformed cache: file:line" || bad "$(cat "$W/e.txt")"
"$MMC" plan "$W/run.yaml" >"$W/e.txt" 2>&1
[ $? = 2 ] && grep -q -- "--gpus" "$W/e.txt" && ok "missing --gpus" || bad "$(cat "$W/e.txt")"
"$MMC" plan "$W/run.yaml" --gpus 2 --device tpu >"$W/e.txt" 2>&1
[ $? = 2 ] && grep -q "h100, h200, a100 or cpu" "$W/e.txt" && ok "unknown device" || bad "$(cat "$W/e.txt")"
"$MMC" plan "$W/run.yaml" --gpus 2 --interconnect ethernet >"$W/e.txt" 2>&1
[ $? = 2 ] && grep -q "nvlink, ib or pcie" "$W/e.txt" && ok "unknown interconnect" || bad "$(cat "$W/e.txt")"
"$MMC" plan "$W/run.yaml" --gpus 2 --gpu-mem 0.001 --seq 4096 --batch 16 >"$W/e.txt" 2>&1
[ $? = 1 ] && grep -q "nothing fits" "$W/e.txt" && ok "nothing fits: says the smallest need" || bad "$(cat "$W/e.txt")"
"$MMC" plan "$W/run.yaml" --gpus 3 >"$W/e.txt" 2>&1
[ $? = 1 ] && grep -q "no layout" "$W/e.txt" && ok "3 ranks: no layout, with the first reason" || bad "$(cat "$W/e.txt")"
# recompute modes: at 8192 tokens the tiny model fits 0.05 GiB only with full recompute (none and
# attention-only do not); the planner then also lists the fewest recomputed layers that fit (rc1,
# faster than rc), and --write sets model.recompute and model.recompute_layers in the file
sed 's/dtype: f32}/dtype: f32, recompute: none, recompute_layers: 0}/' "$W/run.yaml" > "$W/rc.yaml"
"$MMC" plan "$W/rc.yaml" --gpus 1 --seq 8192 --batch 8 --gpu-mem 0.05 --json > "$W/rc.jsonl" 2>&1
python3 - "$W/rc.jsonl" <<'PY' && ok "recompute modes: none / attention / full / rcN ranked" || bad "recompute modes: $(head -c 600 "$W/rc.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
mb1 = {(r["recompute"], r["recompute_layers"]): r for r in rows if r["micro_batch"] == 1}
assert set(mb1) == {("none", 0), ("attention", 0), ("full", 0), ("full", 1)}, sorted(mb1)
assert not mb1["none", 0]["fits"] and mb1["full", 0]["fits"] and mb1["full", 1]["fits"]
assert mb1["attention", 0]["mem_act"] < mb1["none", 0]["mem_act"]
assert mb1["full", 1]["step_s"] < mb1["full", 0]["step_s"] and mb1["full", 1]["recompute_s"] < mb1["full", 0]["recompute_s"]
assert rows[0]["layout"].endswith("rc1"), rows[0]["layout"]
PY
"$MMC" plan "$W/rc.yaml" --gpus 1 --seq 8192 --batch 8 --gpu-mem 0.05 --write "$W/rc_w.yaml" >/dev/null 2>&1 &&
  grep -q "recompute: full, recompute_layers: 1}" "$W/rc_w.yaml" && ok "--write: recompute full, 1 layer" ||
  bad "--write recompute: $(grep recompute "$W/rc_w.yaml")"
"$MMC" plan --help | grep -q -- "--interconnect" && ok "--help" || bad "--help"
# Qwen2-VL trains under context parallelism (tower replicated, test_cp_vl.sh): cp layouts are
# proposed, each paying the whole tower and the features' gradient all-reduce over the group
cat > "$W/vl.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32}
data: {train: tests/fixtures/data/mixed.jsonl, max_pixels: 50176, min_pixels: 50176, seq_len: 256, batch_size: 4, micro_batch_size: 2}
training: {steps: 2, output_dir: $W/vlout}
YAML
"$MMC" plan "$W/vl.yaml" --gpus 2 --json > "$W/vl.jsonl" 2>&1
python3 - "$W/vl.jsonl" <<'PY' && ok "Qwen2-VL: cp layouts proposed" || bad "Qwen2-VL cp layouts: $(head -3 "$W/vl.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cp = [r for r in rows if r["cp"] == 2]
assert cp and all(r["cp_comm_s"] > 0 for r in cp), "no cp=2 layout for Qwen2-VL"
PY
# the vision tower on a pipeline stage of its own (parallel.pipeline_vision_stage, test_pp_vision.sh):
# proposed for Qwen2-VL at pp 2 (tower | both layers) and pp 3 (tower | 1 | 1), plain 1F1B only, never for
# a text model; at pp 3 the layers split over 2 stages, where without it 3 stages do not divide 2 layers
"$MMC" plan "$W/vl.yaml" --gpus 3 --json > "$W/vl3.jsonl" 2>&1
python3 - "$W/vl.jsonl" "$W/vl3.jsonl" "$W/all.jsonl" <<'PY' && ok "Qwen2-VL: vision-stage layouts proposed" || bad "vision stage: $(head -3 "$W/vl3.jsonl")"
import json, sys
rows2, rows3, text = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
v2 = [r for r in rows2 if r["vision_stage"]]
v3 = [r for r in rows3 if r["vision_stage"]]
assert v2 and all(r["pp"] == 2 and r["vpp"] == 1 and r["pp_comm_s"] > 0 for r in v2)
assert v3 and all(r["pp"] == 3 and r["vpp"] == 1 for r in v3)
assert not any(r["pp"] == 3 and not r["vision_stage"] for r in rows3), "3 stages cannot split 2 layers"
assert not any(r["vision_stage"] for r in text)
PY
# Qwen2.5-Omni (examples/qwen2_5_omni_7b_plan.yaml): only tp x dp at ZeRO 0-2 (what the trainer takes for the
# thinker); the per-modality plan shares the audio encoder with the tower (vision-dpN+audio), models less
# time than its replicated twin, and --write gives both encoders {data_parallel: N}
"$MMC" plan examples/qwen2_5_omni_7b_plan.yaml --gpus 8 --json > "$W/omni.jsonl" 2>&1
"$MMC" plan examples/qwen2_5_omni_7b_plan.yaml --gpus 8 --write "$W/omni_w.yaml" > /dev/null 2>&1
python3 - "$W/omni.jsonl" "$W/omni_w.yaml" <<'PY' && ok "Qwen2.5-Omni: encoders data-parallel layouts" || bad "Qwen2.5-Omni plan: $(head -3 "$W/omni.jsonl")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and all(r["pp"] == 1 and r["cp"] == 1 and r["zero"] <= 2 for r in rows)
het = [r for r in rows if r["layout"].endswith("vision-dp8+audio")]
assert het and all(r["tp"] > 1 for r in het)
by = {r["layout"]: r for r in rows}
for r in het:
    twin = by.get(r["layout"].replace(" vision-dp8+audio", ""))
    assert twin is None or r["step_s"] < twin["step_s"], (r, twin)
w = open(sys.argv[2]).read()
assert ("vision-dp8+audio" not in rows[0]["layout"]) or ("audio: {data_parallel: 8}" in w and "vision: {data_parallel: 8}" in w), w
PY
exit $fail
