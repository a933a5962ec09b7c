#!/usr/bin/env bash
# test_wan_train_cli.sh — `mmc train` on the tiny WanPipeline folder (tests/fixtures/wan/pipe, tools/ref/gen_wan.py)
# with a JSONL of videos (tests/fixtures/video: FFmpeg-decoded, 5 frames sampled uniformly, 16x16 centre crop):
#  - LoRA on attn1/attn2 to_q/to_k/to_v/to_out.0 and ffn.net.0.proj / ffn.net.2: finite losses, a
#    diffusers-layout adapter (transformer.<module>.lora_A.weight) in each checkpoint that
#    `mmc generate-video --lora` loads; the encoded videos cached (a second run skips the encoders);
#  - a truncated cache is encoded again (the same losses);
#  - with the reference venv, diffusers' WanPipeline.load_lora_weights loads the adapter exactly;
#  - a resumed run repeats the uninterrupted one's losses and adapter bit for bit;
#  - validation videos (PNG frames, the first in TensorBoard) leave the losses unchanged;
#  - model.recompute: full gives the same losses;
#  - 2 data-parallel ranks (mmc launch) give the one process's losses;
#  - full fine-tuning writes a transformer folder and resumes from it bit for bit;
#  - a malformed JSONL line, a missing video and a frame count that is not 4k + 1 are errors naming them.
# (The loss itself is checked against diffusers + PEFT by test_wan train_lora.)
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=tests/fixtures/wan/pipe
[ -f "$P/model_index.json" ] && [ -f tests/fixtures/video/moving.mp4 ] || { echo "fixtures absent; skipping"; exit 77; }
"$MMC" --help 2>&1 | grep -q "generate-video" || { echo "mmc without video support; skipping"; exit 77; }
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }

V=$PWD/tests/fixtures/video
cat >"$T/data.jsonl" <<J
{"video": "$V/moving.mp4", "caption": "a square moving right"}
{"video": "$V/moving.mkv", "text": "a moving square"}
J
cat >"$T/run.yaml" <<YAML
model:
  path: $P
  lora: {r: 4, alpha: 4, targets: [to_q, to_k, to_v, to_out.0, ffn.net.0.proj, ffn.net.2]}
data: {train: $T/data.jsonl, resolution: 16, num_frames: 5, batch_size: 2, micro_batch_size: 1}
flow_matching: {max_sequence_length: 8}
optimizer: {lr: 1.0e-3, weight_decay: 1.0e-4}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/run, seed: 5}
YAML
expect_rc 0 "$MMC" train "$T/run.yaml"
expect_err "videos encoded to 4x2x2x2 latents"
for s in 2 4; do
  f="$T/run/checkpoint-$s/pytorch_lora_weights.safetensors"
  [ -s "$f" ] && grep -aq "transformer.blocks.1.attn2.to_out.0.lora_B.weight" "$f" && grep -aq "transformer.blocks.0.ffn.net.0.proj.lora_A.weight" "$f" \
    && ok || bad "checkpoint-$s lacks the diffusers-layout adapter: $(ls "$T/run/checkpoint-$s" 2>&1)"
done
nl=$(grep -c '"loss"' "$T/run/metrics.jsonl" 2>/dev/null)
[ "$nl" = 4 ] && ok || bad "metrics.jsonl has $nl loss lines, want 4"
grep -q '"loss": \(nan\|inf\)' "$T/run/metrics.jsonl" && bad "non-finite loss: $(cat "$T/run/metrics.jsonl")" || ok
# resume from checkpoint-2: steps 3-4 repeat exactly, from the cache
cp -r "$T/run" "$T/run2"
rm -rf "$T/run2/checkpoint-4"
sed "s|$T/run|$T/run2|" "$T/run.yaml" >"$T/run2.yaml"
expect_rc 0 "$MMC" train "$T/run2.yaml" --resume
expect_err "resumed at step 2"
expect_err "encoded videos from the cache"
a=$(grep -o '"loss": [^,]*' "$T/run/metrics.jsonl" | tail -2); b=$(grep -o '"loss": [^,]*' "$T/run2/metrics.jsonl" | tail -2)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "resumed losses differ: [$a] vs [$b]"
cmp -s "$T/run/checkpoint-4/pytorch_lora_weights.safetensors" "$T/run2/checkpoint-4/pytorch_lora_weights.safetensors" \
  && ok || bad "resumed adapter differs from the uninterrupted run's"
# a truncated cache is not trusted: the videos are encoded again, the same losses follow
cp -r "$T/run" "$T/run3"; rm -rf "$T/run3/checkpoint-"* "$T/run3/metrics.jsonl"
head -c 100 "$T/run/cache/wan_data.safetensors" >"$T/run3/cache/wan_data.safetensors"
sed "s|$T/run,|$T/run3,|" "$T/run.yaml" >"$T/run3.yaml"
expect_rc 0 "$MMC" train "$T/run3.yaml"
expect_err "videos encoded to"
a=$(grep -o '"loss": [^,]*' "$T/run/metrics.jsonl"); b=$(grep -o '"loss": [^,]*' "$T/run3/metrics.jsonl" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "losses after re-encoding a truncated cache [$b] differ from [$a]"
# the adapter generates
expect_rc 0 "$MMC" generate-video --model "$P" --prompt "a square" --frames 5 --height 16 --width 16 --steps 2 \
  --lora "$T/run/checkpoint-4/pytorch_lora_weights.safetensors" --output "$T/gen/"
# with the reference venv: diffusers' WanPipeline.load_lora_weights takes the adapter whole (every
# lora_A / lora_B of the file lands in the transformer's PEFT layers, none left over)
PY=${MMC_REF_PY:-.venv-ref/bin/python}
if [ -x "$PY" ]; then
  "$PY" - "$P" "$T/run/checkpoint-4/pytorch_lora_weights.safetensors" >"$T/py" 2>&1 <<'PYEOF' && ok || bad "diffusers cannot load mmc's Wan adapter: $(tail -5 "$T/py")"
import sys, torch
from safetensors.torch import load_file
from diffusers import WanPipeline
pipe = WanPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[2], adapter_name="mmc")
sd = load_file(sys.argv[2])
mods = dict(pipe.transformer.named_modules())
for k, v in sd.items():
    name, ab = k[len("transformer."):].rsplit(".lora_", 1)
    layer = getattr(mods[name], "lora_" + ab[0])["mmc"]
    assert torch.equal(layer.weight, v), k
print("loaded", len(sd), "tensors")
PYEOF
fi
# data parallelism: 2 ranks x 1 micro-batch draw what 1 process x 2 micro-batches draws (per-sample streams)
if command -v mpirun >/dev/null 2>&1 && [ "${MMC_SANITIZED:-0}" != 1 ]; then
  sed -e "s|steps: 4, save_every: 2|steps: 2, save_every: 0|" -e "s|output_dir: $T/run,|output_dir: $T/dp1,|" "$T/run.yaml" >"$T/dp.yaml"
  expect_rc 0 "$MMC" train "$T/dp.yaml"
  export OMPI_MCA_orte_tmpdir_base="$T" MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-120}
  expect_rc 0 timeout -k 10 300 "$MMC" launch -n 2 "$T/dp.yaml" --set training.output_dir=$T/dp2 --set parallel.data_parallel=2
  a=$(grep -o '"loss": [^,]*' "$T/dp1/metrics.jsonl"); b=$(grep -o '"loss": [^,]*' "$T/dp2/metrics.jsonl" 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "2-rank losses [$b] differ from 1 process [$a]"
else
  echo "test_wan_train_cli: no mpirun (or a sanitized build): the data-parallel check is skipped"
fi
# validation videos: PNG frames of the prompt every step (and the first frame in TensorBoard); the losses unchanged
sed -e "s|output_dir: $T/run,|output_dir: $T/val,|" -e "s|steps: 4, save_every: 2|steps: 2, save_every: 0|" \
    -e "s|flow_matching: {max_sequence_length: 8}|flow_matching: {max_sequence_length: 8, validation_prompt: a red square, validation_every: 1, validation_steps: 2}|" \
    "$T/run.yaml" >"$T/val.yaml"
expect_rc 0 "$MMC" train "$T/val.yaml"
for s in 1 2; do
  nf=$(ls "$T/val/validation/step-00000$s/" 2>/dev/null | grep -c '^frame_.*\.png$')
  [ "$nf" = 5 ] && ok || bad "validation video of step $s has $nf frames, want 5: $(ls -R "$T/val/validation" 2>&1)"
done
ev=$(ls "$T"/val/tb/events.out.tfevents.* 2>/dev/null | head -1)
np=$(grep -ac "IHDR" "$ev" 2>/dev/null)
[ "${np:-0}" -ge 2 ] && ok || bad "TensorBoard events $ev: $np PNG images, want 2"
a=$(grep -o '"loss": [^,]*' "$T/run/metrics.jsonl" | head -2); b=$(grep -o '"loss": [^,]*' "$T/val/metrics.jsonl" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "losses with validation [$b] differ from [$a]"
# model.recompute: full (activation recompute) trains the same steps: the same losses
sed -e "s|output_dir: $T/run,|output_dir: $T/rc,|" -e "s|^model:|model:\n  recompute: full|" "$T/run.yaml" >"$T/rc.yaml"
expect_rc 0 "$MMC" train "$T/rc.yaml"
a=$(grep -o '"loss": [^,]*' "$T/run/metrics.jsonl"); b=$(grep -o '"loss": [^,]*' "$T/rc/metrics.jsonl" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "losses with recompute [$b] differ from [$a]"
# full fine-tuning: a transformer folder
sed -e "/lora:/d" -e "s|output_dir: $T/run,|output_dir: $T/full,|" -e "s|steps: 4, save_every: 2|steps: 2, save_every: 1|" "$T/run.yaml" >"$T/full.yaml"
expect_rc 0 "$MMC" train "$T/full.yaml"
[ -s "$T/full/checkpoint-2/diffusion_pytorch_model.safetensors" ] && [ -s "$T/full/checkpoint-2/config.json" ] \
  && ok || bad "full checkpoint: $(ls "$T/full/checkpoint-2" 2>&1)"
# ... and resumes from its transformer folder: step 2 repeats exactly
cp -r "$T/full" "$T/full2"; rm -rf "$T/full2/checkpoint-2"
sed "s|$T/full,|$T/full2,|" "$T/full.yaml" >"$T/full2.yaml"
expect_rc 0 "$MMC" train "$T/full2.yaml" --resume
expect_err "resumed at step 1"
cmp -s "$T/full/checkpoint-2/diffusion_pytorch_model.safetensors" "$T/full2/checkpoint-2/diffusion_pytorch_model.safetensors" \
  && ok || bad "resumed full fine-tuning differs from the uninterrupted run's"
# errors
echo '{"video": "x.mp4"}' >"$T/bad.jsonl"
sed -e "s|$T/data.jsonl|$T/bad.jsonl|" -e "s|output_dir: $T/run,|output_dir: $T/bad,|" "$T/run.yaml" >"$T/bad.yaml"
expect_rc 1 "$MMC" train "$T/bad.yaml"
expect_err "bad.jsonl:1: expected a JSON object with a \"video\""
echo '{"video": "nope.mp4", "caption": "x"}' >"$T/bad.jsonl"
expect_rc 1 "$MMC" train "$T/bad.yaml"
expect_err "nope.mp4"
sed -e "s|num_frames: 5|num_frames: 6|" -e "s|output_dir: $T/run,|output_dir: $T/bad2,|" "$T/run.yaml" >"$T/bad2.yaml"
expect_rc 1 "$MMC" train "$T/bad2.yaml"
expect_err "num_frames"
sed -e "s|num_frames: 5|num_frames: 5, aspect_ratio_buckets: \"16,16;16,32\"|" -e "s|output_dir: $T/run,|output_dir: $T/bad3,|" "$T/run.yaml" >"$T/bad3.yaml"
expect_rc 1 "$MMC" train "$T/bad3.yaml"
expect_err "aspect_ratio_buckets"
echo "test_wan_train_cli: $((n - fail))/$n checks passed"
[ "$fail" = 0 ]
