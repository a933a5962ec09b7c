#!/usr/bin/env bash
# test_wan_i2v_train_cli.sh — `mmc train` on the tiny WanImageToVideoPipeline folder (tests/fixtures/wan_i2v/pipe,
# tools/ref/gen_wan_i2v.py) with a JSONL of videos (tests/fixtures/video: 5 frames sampled uniformly, 16x16 crop);
# each clip conditioned on its first frame (prepare_latents' condition and the CLIP image states):
#  - LoRA on attn1/attn2 to_q/to_k/to_v/to_out.0, attn2's add_k_proj / add_v_proj and the FFN: finite losses,
#    a diffusers-layout adapter in each checkpoint that `mmc generate-video --image --lora` loads and, with the
#    reference venv, diffusers' WanImageToVideoPipeline.load_lora_weights loads exactly;
#  - validation videos from the first clip's first frame (PNG frames);
#  - a resumed run (from the cached encodings) repeats the uninterrupted one's losses and adapter bit for bit;
#    a truncated cache is encoded again (the same losses);
#  - full fine-tuning writes an I2V transformer folder;
#  - max_sequence_length other than 512 and a first-last-frame folder are errors saying why.
# (The loss itself is checked against diffusers + PEFT by test_wan train_i2v.)
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=tests/fixtures/wan_i2v/pipe
[ -f "$P/model_index.json" ] && [ -f tests/fixtures/video/moving.mp4 ] || { echo "fixtures absent; skipping"; exit 77; }
"$MMC" --help 2>&1 | grep -q "generate-video" || { echo "mmc without video support; skipping"; exit 77; }
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }
losses() { grep -o '"loss": [^,]*' "$1" 2>/dev/null | tail -"$2"; }

V=$PWD/tests/fixtures/video
cat >"$T/data.jsonl" <<J
{"video": "$V/moving.mp4", "caption": "a square moving right"}
{"video": "$V/moving.mkv", "text": "a moving square"}
J
cat >"$T/run.yaml" <<YAML
model:
  path: $P
  lora: {r: 4, alpha: 4, targets: [to_q, to_k, to_v, to_out.0, add_k_proj, add_v_proj, ffn.net.0.proj, ffn.net.2]}
data: {train: $T/data.jsonl, resolution: 16, num_frames: 5, batch_size: 2, micro_batch_size: 1}
flow_matching: {max_sequence_length: 512, validation_prompt: a red square, validation_every: 2, validation_steps: 2}
optimizer: {lr: 1.0e-3, weight_decay: 1.0e-4}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/run, seed: 5}
YAML
expect_rc 0 "$MMC" train "$T/run.yaml"
expect_err "videos encoded to 4x2x2x2 latents, captions to 512 tokens"
expect_err "LoRA r=4 alpha=4 on 24 modules"
f="$T/run/checkpoint-4/pytorch_lora_weights.safetensors"
[ -s "$f" ] && grep -aq "transformer.blocks.1.attn2.add_k_proj.lora_B.weight" "$f" && grep -aq "transformer.blocks.0.attn1.to_q.lora_A.weight" "$f" \
  && ok || bad "checkpoint-4 lacks the diffusers-layout adapter: $(ls "$T/run/checkpoint-4" 2>&1)"
nl=$(grep -c '"loss"' "$T/run/metrics.jsonl" 2>/dev/null)
[ "$nl" = 4 ] && ok || bad "metrics.jsonl has $nl loss lines, want 4"
grep -q '"loss": \(nan\|inf\)' "$T/run/metrics.jsonl" && bad "non-finite loss: $(cat "$T/run/metrics.jsonl")" || ok
for s in 2 4; do
  nf=$(ls "$T/run/validation/step-00000$s/" 2>/dev/null | grep -c '^frame_.*\.png$')
  [ "$nf" = 5 ] && ok || bad "validation video of step $s has $nf frames, want 5"
done
# resume from checkpoint-2 (the encodings from the cache): steps 3-4 repeat exactly
cp -r "$T/run" "$T/run2"; rm -rf "$T/run2/checkpoint-4"
sed "s|$T/run,|$T/run2,|" "$T/run.yaml" >"$T/run2.yaml"
expect_rc 0 "$MMC" train "$T/run2.yaml" --resume
expect_err "encoded videos from the cache"
a=$(losses "$T/run/metrics.jsonl" 2); b=$(losses "$T/run2/metrics.jsonl" 2)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "resumed losses differ: [$a] vs [$b]"
cmp -s "$f" "$T/run2/checkpoint-4/pytorch_lora_weights.safetensors" && ok || bad "resumed adapter differs"
# a truncated cache is not trusted: the videos are encoded again, the same losses follow
cp -r "$T/run" "$T/run3"; rm -rf "$T/run3/checkpoint-"* "$T/run3/metrics.jsonl" "$T/run3/validation"
head -c 100 "$T/run/cache/wan_data.safetensors" >"$T/run3/cache/wan_data.safetensors"
sed "s|$T/run,|$T/run3,|" "$T/run.yaml" >"$T/run3.yaml"
expect_rc 0 "$MMC" train "$T/run3.yaml"
expect_err "videos encoded to"
a=$(losses "$T/run/metrics.jsonl" 4); b=$(losses "$T/run3/metrics.jsonl" 4)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "losses after re-encoding a truncated cache [$b] differ from [$a]"
# the adapter generates from an image
expect_rc 0 "$MMC" generate-video --model "$P" --image "$P/input.png" --prompt "a square" --frames 5 --height 16 --width 16 \
  --steps 2 --lora "$f" --output "$T/gen/"
PY=${MMC_REF_PY:-.venv-ref/bin/python}
if [ -x "$PY" ]; then
  "$PY" - "$P" "$f" >"$T/py" 2>&1 <<'PYEOF' && ok || bad "diffusers cannot load mmc's Wan I2V adapter: $(tail -5 "$T/py")"
import sys, torch
from safetensors.torch import load_file
from diffusers import WanImageToVideoPipeline
pipe = WanImageToVideoPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[2], adapter_name="mmc")
sd = load_file(sys.argv[2])
mods = dict(pipe.transformer.named_modules())
for k, v in sd.items():
    name, ab = k[len("transformer."):].rsplit(".lora_", 1)
    assert torch.equal(getattr(mods[name], "lora_" + ab[0])["mmc"].weight, v), k
n = sum(1 for m in mods.values() if hasattr(m, "lora_A") and "mmc" in m.lora_A)
assert 2 * n == len(sd), (n, len(sd))
print("loaded", len(sd), "tensors")
PYEOF
fi
# full fine-tuning: an I2V transformer folder
sed -e "/lora:/d" -e "s|output_dir: $T/run,|output_dir: $T/full,|" -e "s|steps: 4, save_every: 2|steps: 1, save_every: 1|" \
    -e "s|, validation_prompt: a red square, validation_every: 2, validation_steps: 2||" "$T/run.yaml" >"$T/full.yaml"
expect_rc 0 "$MMC" train "$T/full.yaml"
[ -s "$T/full/checkpoint-1/diffusion_pytorch_model.safetensors" ] && grep -q '"image_dim": 12' "$T/full/checkpoint-1/config.json" \
  && ok || bad "full checkpoint: $(ls "$T/full/checkpoint-1" 2>&1)"
# errors
sed -e "s|max_sequence_length: 512|max_sequence_length: 8|" -e "s|output_dir: $T/run,|output_dir: $T/bad,|" "$T/run.yaml" >"$T/bad.yaml"
expect_rc 1 "$MMC" train "$T/bad.yaml"
expect_err "max_sequence_length 8: image-to-video trains with 512"
sed -e "s|path: $P|path: tests/fixtures/wan_flf2v/pipe|" -e "s|output_dir: $T/run,|output_dir: $T/bad2,|" "$T/run.yaml" >"$T/bad2.yaml"
expect_rc 1 "$MMC" train "$T/bad2.yaml"
expect_err "first-last-frame (FLF2V) transformer: training is wired"
echo "test_wan_i2v_train_cli: $((n - fail))/$n checks passed"
[ "$fail" = 0 ]
