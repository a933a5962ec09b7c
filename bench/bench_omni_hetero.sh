#!/usr/bin/env bash
# bench_omni_hetero.sh — Qwen2.5-Omni thinker at tensor parallelism 2: the audio encoder and vision tower
# replicated on both tp ranks (each encodes every clip and image) against the per-modality plan
# (parallel.audio / parallel.vision {data_parallel: 2}: each encodes its share, features all-gathered,
# encoder gradients summed over tp). A thinker from the test fixture's config with a bigger audio
# encoder (d_model 256, 4 layers, n_window 50) and LM (hidden 128), everything trained, 8 samples of
# 1-2 clips of 0.5-8 s and 0-2 images per step in micro-batches of 4; REPS x (A, B) alternating in one
# invocation, median step time of steps 2..STEPS of each. Usage: bash bench/bench_omni_hetero.sh [REPS]
set -u
MMC=${MMC:-build/mmc}
. tests/mpi_util.sh
mpi_setup bench_omni_hetero "$MMC"
REPS=${1:-2}; STEPS=${STEPS:-4}
F=$PWD/tests/fixtures; BASE=$F/omni/thinker
python3 - "$BASE/config.json" "$W/cfg.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c['text_config'].update(num_key_value_heads=2, vocab_size=1400, hidden_size=128, intermediate_size=256,
                        num_attention_heads=4)
c['text_config']['rope_parameters']['mrope_section'] = [4, 6, 6]
c['audio_config'].update(d_model=256, encoder_layers=4, encoder_attention_heads=4, encoder_ffn_dim=1024,
                         n_window=50, output_dim=128)
c['vision_config'].update(hidden_size=64, intermediate_size=128, out_hidden_size=128)
json.dump(c, open(sys.argv[2], 'w'))
PY
A=("$F/omni_train/a0.wav" "$F/omni_train/a1.wav" "$F/omni/video_audio.wav" "$F/whisper/tones_8s.flac"
   "$F/spoken/colour.wav" "$F/audio/tone.wav" "$F/omni/audio.wav" "$F/spoken/count.wav")
for i in 0 1 2 3 4 5 6 7; do
  a=${A[$i]} b=${A[$(( (i + 3) % 8 ))]}
  case $((i % 3)) in
    0) echo "{\"messages\": [{\"role\": \"user\", \"content\": \"<audio><audio>Compare.\"}, {\"role\": \"assistant\", \"content\": \"The second is longer.\"}], \"audios\": [\"$a\", \"$b\"]}" ;;
    1) echo "{\"messages\": [{\"role\": \"user\", \"content\": \"<image><audio>Answer.\"}, {\"role\": \"assistant\", \"content\": \"It is green.\"}], \"audios\": [\"$a\"], \"images\": [\"$F/omni_train/img0.png\"]}" ;;
    2) echo "{\"messages\": [{\"role\": \"user\", \"content\": \"<audio><image>What?\"}, {\"role\": \"assistant\", \"content\": \"Shapes.\"}], \"audios\": [\"$a\"], \"images\": [\"$F/e2e/shapes_160x120.png\"]}" ;;
  esac
done > "$W/data.jsonl"
cat > "$W/run.yaml" <<YAML
model: {init: $W/cfg.json, tokenizer: $BASE, dtype: f32, freeze: []}
data: {train: $W/data.jsonl, batch_size: 8, micro_batch_size: 4, shuffle: false, num_workers: 0, seq_len: 1024}
parallel: {tensor_parallel: 2}
optimizer: {type: adamw, lr: 1.0e-3, schedule: constant}
training: {steps: $STEPS, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/out}
YAML
med() {  # median step seconds of steps 2.. from metrics.jsonl (batch / samples_per_s)
  python3 -c "
import json, sys
s = sorted(8 / json.loads(l)['samples_per_s'] for l in open(sys.argv[1]) if 'samples_per_s' in l and json.loads(l)['step'] > 1)
print('%.3f' % s[len(s) // 2])" "$W/out/metrics.jsonl"
}
run() {  # run LABEL [--set ...]
  local l=$1; shift
  timeout 600 "${MPIRUN[@]}" -np 2 "$MMC" train "$W/run.yaml" "$@" >"$W/log" 2>&1 || { echo "FAIL: $l"; tail "$W/log"; exit 1; }
  echo "$l $(med)"
}
echo "load: $(uptime | sed 's/.*load average: //')"
for r in $(seq "$REPS"); do
  run replicated
  run shared --set 'parallel.audio.data_parallel=2' --set 'parallel.vision.data_parallel=2'
  grep "per rank" "$W/log" | sed 's/^mmc train: per-modality plan: /  /'
done | tee "$W/res"
python3 -c "
import statistics, sys
r = {}
for l in open(sys.argv[1]):
    k, *v = l.split()
    if k in ('replicated', 'shared'): r.setdefault(k, []).append(float(v[0]))
a, b = statistics.median(r['replicated']), statistics.median(r['shared'])
pairs = [y / x for x, y in zip(r['replicated'], r['shared'])]
print('median step: replicated %.3f s, shared %.3f s: shared / replicated = %.2f (pairs: %s, median %.2f)' %
      (a, b, b / a, ' '.join('%.2f' % p for p in pairs), statistics.median(pairs)))" "$W/res"
echo "load: $(uptime | sed 's/.*load average: //')"
