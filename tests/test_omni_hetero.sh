#!/usr/bin/env bash
# test_omni_hetero.sh — per-modality plans for the Qwen2.5-Omni thinker (README "Per-modality plans"):
# the audio encoder (parallel.audio) and the vision tower (parallel.vision) data-parallel over all the
# job's ranks while the language model runs at tensor_parallel x data_parallel. Each tp rank encodes
# its share of the micro-batch's clips (balanced by mel frames) and images (by patches), the features
# are all-gathered over the tp group and the encoders' weight gradients summed over it.
# A fresh thinker from the fixture's config (num_key_value_heads 2, vocabulary 1400: tp divides them),
# 4 samples with 6 clips of 5 lengths (0.5 s to 2.2 s) and 4 images of 3 sizes in micro-batches of 2,
# 3 AdamW steps, everything trained (model.freeze: []), against one process (`tp_worker compare`:
# losses 1e-5 relative, weights 2e-4 max / 1e-6 mean, AdamW moments 1e-2 of scale):
#   audio dp2 | LM tp2; audio + vision dp4 | LM tp2 x dp2 (4 ranks), also at ZeRO-1; LoRA (the LM's and
#   both encoders' linears) at audio + vision dp2; the audio encoder frozen; 2 steps at audio dp2
#   continued in one process; controls: the encoders' gradient sum over tp left out
#   (MMC_HETERO_NO_REDUCE=1) must fail the comparison; each rank encodes only its share (the run's
#   per-rank counts add up to the batch's clips, none holds them all).
set -u
. tests/vlm_parallel_util.sh
vlm_setup test_omni_hetero
F=$PWD/tests/fixtures; BASE=$F/omni/thinker
python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['text_config'].update(num_key_value_heads=2, vocab_size=1400); json.dump(c, open(sys.argv[2], 'w'))" \
  $BASE/config.json "$W/cfg.json"
cat > "$W/data.jsonl" <<JSONL
{"messages": [{"role": "user", "content": "<audio><audio>Which is longer?"}, {"role": "assistant", "content": "The second."}], "audios": ["$F/omni_train/a0.wav", "$F/omni_train/a1.wav"]}
{"messages": [{"role": "user", "content": "<image><audio>Answer the spoken question."}, {"role": "assistant", "content": "It is green."}], "audios": ["$F/omni/video_audio.wav"], "images": ["$F/omni_train/img0.png"]}
{"messages": [{"role": "user", "content": "<audio><image>What is shown?"}, {"role": "assistant", "content": "Shapes."}], "audios": ["$F/omni/audio.wav"], "images": ["$F/e2e/shapes_160x120.png"]}
{"messages": [{"role": "user", "content": "<image><image><audio><audio>Compare."}, {"role": "assistant", "content": "A tone, twice."}], "audios": ["$F/audio/tone.wav", "$F/omni_train/a1.wav"], "images": ["$F/image/rgb_37x53.png", "$F/omni_train/img0.png"]}
JSONL
CLIPS=6
ocfg() {  # ocfg NAME PARALLEL [EXTRA model keys] [FROZEN components] [OUTPUT dir name]
  cat > "$W/$1.yaml" <<YAML
model: {init: $W/cfg.json, tokenizer: $BASE, dtype: f32, freeze: [${4:-}] ${3:-}}
data: {train: $W/data.jsonl, batch_size: 4, micro_batch_size: 2, shuffle: false, num_workers: 0, seq_len: 512}
parallel: {$2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/${5:-$1}}
YAML
}
LORA=", lora: {r: 4, alpha: 8, targets: [q_proj, v_proj, down_proj, fc1, fc2, proj]}"
ocfg ref "data_parallel: 1"
ocfg a2 "tensor_parallel: 2, audio: {data_parallel: 2}"
ocfg av4 "tensor_parallel: 2, data_parallel: 2, audio: {data_parallel: 4}, vision: {data_parallel: 4}"
ocfg z4 "tensor_parallel: 2, data_parallel: 2, zero: 1, audio: {data_parallel: 4}, vision: {data_parallel: 4}"
ocfg lref "data_parallel: 1" "$LORA"
ocfg l2 "tensor_parallel: 2, audio: {data_parallel: 2}, vision: {data_parallel: 2}" "$LORA"
ocfg fref "data_parallel: 1" "" audio
ocfg fa2 "tensor_parallel: 2, audio: {data_parallel: 2}" "" audio
ocfg r2 "tensor_parallel: 2, audio: {data_parallel: 2}"
ocfg r1 "data_parallel: 1" "" "" r2
ocfg c2 "tensor_parallel: 2, audio: {data_parallel: 2}"
ocfg d2 "data_parallel: 2, audio: {data_parallel: 2}"
run1 ref; runn a2 2; cmp_runs ref a2
share=$(grep -m1 "audio clips (mel frames) the audio encoder encoded" "$W/train.log")
echo "$share" | python3 -c "
import re, sys
line = sys.stdin.read(); n = [int(x) for x in re.findall(r' (\d+) \(', line)]
ok = len(n) == 2 and sum(n) == 3 * $CLIPS and 0 < min(n) and max(n) < sum(n)
print(('' if ok else 'FAIL: ') + 'audio dp2 | LM tp2, 3 steps x $CLIPS clips:', line.split('plan: ')[-1].strip())
sys.exit(0 if ok else 1)" || fail=1
grep -q "per-modality plan: audio encoder data-parallel over 2 ranks" "$W/train.log" || { echo "FAIL: no start-up line"; fail=1; }
: >"$W/train.log"
runn av4 4; cmp_runs ref av4
grep "per-modality plan: .*per rank" "$W/train.log" | sed 's/^mmc train: per-modality plan: /av4: /'
runn z4 4; cmp_runs ref z4
run1 lref; runn l2 2; cmp_runs lref l2
run1 fref; runn fa2 2; cmp_runs fref fa2
# without language tp the audio plan is the job's data parallelism (said at start-up)
runn d2 2; cmp_runs ref d2
grep -q "is the job's data parallelism" "$W/train.log" || { echo "FAIL: audio dp2 | LM dp2: no start-up line"; fail=1; }
# resume: 2 steps at audio dp2 | tp2, the 3rd in one process
timeout 120 "${MPIRUN[@]}" -np 2 "$MMC" train "$W/r2.yaml" --set training.steps=2 >>"$W/train.log" 2>&1 &&
  "$MMC" train "$W/r1.yaml" --resume >>"$W/train.log" 2>&1 ||
  { echo "FAIL: resume runs"; tail -n 20 "$W/train.log"; fail=1; }
cmp_runs ref r2
# control: without the audio encoder's gradient sum over the tp group the run must differ
MPIRUN+=(-x MMC_HETERO_NO_REDUCE)
MMC_HETERO_NO_REDUCE=1 runn c2 2
if "$WORKER" compare "$W/ref" "$W/c2" >"$out" 2>&1; then echo "FAIL: control (no gradient sum) passed"; fail=1
else echo "control: without the encoder's gradient sum over tp: $(grep -m1 -i 'diff\|fail' "$out")"; fi
[ $fail = 0 ] && echo "test_omni_hetero: passed" || echo "test_omni_hetero: FAILED"
exit $fail
