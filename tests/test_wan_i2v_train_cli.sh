#!/usr/bin/env bash
# test_wan_i2v_train_cli.sh [i2v | flf2v] — `mmc train` on a tiny WanImageToVideoPipeline folder with a JSONL of
# videos (tests/fixtures/video: 5 frames sampled uniformly, 16x16 crop):
#   i2v    tests/fixtures/wan_i2v/pipe (tools/ref/gen_wan_i2v.py): each clip conditioned on its first frame
#          (prepare_latents' condition and the CLIP image states);
#   flf2v  tests/fixtures/wan_flf2v/pipe (tools/ref/gen_wan_flf2v.py, first-last-frame): on its first and last
#          sampled frames (the condition of [first, zeros, last], both frames' image states).
#  - LoRA on attn1/attn2 to_q/to_k/to_v/to_out.0, attn2's add_k_proj / add_v_proj and the FFN: finite losses,
#    a diffusers-layout adapter in each checkpoint that `mmc generate-video --image [--last-image] --lora` loads
#    and, with the reference venv, diffusers' WanImageToVideoPipeline.load_lora_weights loads exactly;
#  - validation videos from the first clip's frame(s) (PNG frames);
#  - a resumed run (from the cached encodings) repeats the uninterrupted one's losses and adapter bit for bit;
#  - i2v: a truncated cache is encoded again (the same losses); max_sequence_length other than 512 is an error
#    saying why;
#  - full fine-tuning writes an I2V (FLF2V: with pos_embed_seq_len) transformer folder.
# (The loss itself is checked against diffusers + PEFT by test_wan train_i2v / train_flf2v; the checks shared
# with test_wan_train_cli.sh are tests/wan_train_cli_lib.sh's.)
source "$(dirname "$0")/wan_train_cli_lib.sh"
MODE=${1:-i2v}
case "$MODE" in
  i2v)   P=tests/fixtures/wan_i2v/pipe; IMG=(--image "$P/input.png") ;;
  flf2v) P=tests/fixtures/wan_flf2v/pipe; IMG=(--image "$P/first.png" --last-image "$P/last.png") ;;
  *) echo "usage: $0 [i2v | flf2v]" >&2; exit 2 ;;
esac
NAME="test_wan_i2v_train_cli ($MODE)"
wan_setup "$P"

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
wan_check_resume "$T/run"
[ "$MODE" = i2v ] && wan_check_truncated_cache "$T/run"
# the adapter generates from the image(s)
expect_rc 0 "$MMC" generate-video --model "$P" "${IMG[@]}" --prompt "a square" --frames 5 --height 16 --width 16 \
  --steps 2 --lora "$f" --output "$T/gen/"
wan_check_diffusers_load WanImageToVideoPipeline "$P" "$f"
# full fine-tuning: an I2V / FLF2V transformer folder
sed -e "/lora:/d" -e "s|output_dir: $T/run,|output_dir: $T/full,|" -e "s|steps: 4, save_every: 2|steps: 1, save_every: 1|" \
    -e "s|, validation_prompt: a red square, validation_every: 2, validation_steps: 2||" "$T/run.yaml" >"$T/full.yaml"
expect_rc 0 "$MMC" train "$T/full.yaml"
want='"image_dim": 12'; [ "$MODE" = flf2v ] && want='"pos_embed_seq_len": 34'
[ -s "$T/full/checkpoint-1/diffusion_pytorch_model.safetensors" ] && grep -q "$want" "$T/full/checkpoint-1/config.json" \
  && ok || bad "full checkpoint: $(ls "$T/full/checkpoint-1" 2>&1)"
# errors
if [ "$MODE" = i2v ]; then
  sed -e "s|max_sequence_length: 512|max_sequence_length: 8|" -e "s|output_dir: $T/run,|output_dir: $T/bad,|" "$T/run.yaml" >"$T/bad.yaml"
  expect_rc 1 "$MMC" train "$T/bad.yaml"
  expect_err "max_sequence_length 8: image-to-video trains with 512"
fi
wan_done "$NAME"
