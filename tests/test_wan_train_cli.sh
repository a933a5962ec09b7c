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
# (The loss itself is checked against diffusers + PEFT by test_wan train_lora; the checks this test shares with
# test_wan_i2v_train_cli.sh are tests/wan_train_cli_lib.sh's.)
source "$(dirname "$0")/wan_train_cli_lib.sh"
P=tests/fixtures/wan/pipe
wan_setup "$P"
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
wan_check_resume "$T/run"           # steps 3-4 from checkpoint-2 and the cache, bit for bit
wan_check_truncated_cache "$T/run"  # encoded again, the same losses
# the adapter generates
expect_rc 0 "$MMC" generate-video --model "$P" --prompt "a square" --frames 5 --height 16 --width 16 --steps 2 \
  --lora "$T/run/checkpoint-4/pytorch_lora_weights.safetensors" --output "$T/gen/"
# with the reference venv: diffusers' WanPipeline.load_lora_weights takes the adapter whole
wan_check_diffusers_load WanPipeline "$P" "$T/run/checkpoint-4/pytorch_lora_weights.safetensors"
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
wan_done test_wan_train_cli
