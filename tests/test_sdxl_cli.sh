#!/usr/bin/env bash
# test_sdxl_cli.sh — `mmc generate-image` on the tiny StableDiffusionXLPipeline folder written by diffusers
# (tests/fixtures/sdxl, tools/ref/gen_sdxl.py): model_index.json's _class_name takes the SDXL path; from
# diffusers' own initial noise (--latents) with a negative prompt and CFG 3 the PNG equals diffusers'
# image within 1/255 per channel (its numerics: test_sdxl_pipeline); the tEXt chunks name the pipeline;
# seeded runs repeat; --scheduler swaps the scheduler; an SD 1.x folder runs with its PNDM scheduler and with DDIM,
# one with an unsupported scheduler asks for --scheduler; sizes the VAE and UNet cannot take name the
# nearest valid size; options not wired for SDXL are usage errors. `mmc train` on the SDXL folder (the DDPM
# objective): a LoRA run with offset noise and a validation image, generate-image --lora with the adapter (and
# diffusers' load_lora_weights reading it, with the reference venv), data parallelism giving the one-process
# losses, aspect-ratio buckets, a full min-SNR v_prediction run resumed bit-exactly; an SD 1.x LoRA run.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=tests/fixtures/sdxl
[ -f "$P/expected.safetensors" ] || { echo "test_sdxl_cli: skipped: fixtures absent (tools/ref/gen_sdxl.py)"; exit 77; }
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }

# diffusers' latents_b (the initial noise of its image_c) as --latents reads them: tensor "latents"
expect_rc 0 "$MMC" generate-image --model $P --prompt "a photo of a red circle" --negative-prompt "green left" \
  --guidance 3 --steps 3 --width 24 --height 16 --latents $P/cli_latents.safetensors --out "$T/c.png" --json
if grep -q '"steps": 3' "$T/out" && [ -s "$T/c.png" ]; then ok; else bad "no image or JSON: $(cat "$T/out")"; fi
if grep -aq "mmc generate-image (StableDiffusionXLPipeline)" "$T/c.png"; then ok; else bad "PNG lacks the pipeline name"; fi
# pixels against the PNG diffusers saved from the same noise (a system python3's zlib decodes both; the
# check is skipped without one, test_sdxl_pipeline compares the floats either way)
if command -v python3 >/dev/null; then
  if python3 tests/pngcmp.py "$T/c.png" $P/cli_expected.png >"$T/cmp" 2>&1
  then ok; else bad "PNG differs from diffusers': $(cat "$T/cmp")"; fi
fi
expect_rc 0 "$MMC" generate-image --model $P --prompt "a photo of a red circle" --width 24 --height 16 --steps 4 \
  --seed 7 --out "$T/s1.png"
expect_rc 0 "$MMC" generate-image --model $P --prompt "a photo of a red circle" --width 24 --height 16 --steps 4 \
  --seed 7 --out "$T/s2.png"
if cmp -s "$T/s1.png" "$T/s2.png"; then ok; else bad "the same seed gave different images"; fi
expect_rc 0 "$MMC" generate-image --model $P --prompt "a photo of a red circle" --width 24 --height 16 --steps 4 \
  --seed 8 --out "$T/s3.png"
if cmp -s "$T/s1.png" "$T/s3.png"; then bad "different seeds gave the same image"; else ok; fi
# --scheduler swaps the folder's scheduler (diffusers' pipe.scheduler = Cls.from_config(...)): the
# ancestral one draws noise, so a different image from the same seed; an absent config is an error
expect_rc 0 "$MMC" generate-image --model $P --prompt "a photo of a red circle" --width 24 --height 16 --steps 4 \
  --seed 7 --scheduler tests/fixtures/schedulers/ea_sdxl --out "$T/ea.png"
if [ -s "$T/ea.png" ] && ! cmp -s "$T/s1.png" "$T/ea.png"; then ok; else bad "--scheduler made no (different) image"; fi
expect_rc 1 "$MMC" generate-image --model $P --prompt "x" --width 24 --height 16 --scheduler "$T" --out "$T/x.png"
expect_err "scheduler_config.json"
expect_rc 2 "$MMC" generate-image --model tests/fixtures/sd3_pipe --prompt "x" --scheduler "$T" --out "$T/x.png"
expect_err "StableDiffusionPipeline folders only"
# a size the VAE (factor 2) and the UNet (2 levels: 2) cannot take
expect_rc 1 "$MMC" generate-image --model $P --prompt "x" --width 22 --height 16 --steps 1 --out "$T/x.png"
expect_err "nearest valid size is 24x16"
expect_rc 1 "$MMC" generate-image --model $P --prompt "x" --width 24 --height 16 --lora /nonexistent --out "$T/x.png"
expect_err "cannot apply --lora"
# a StableDiffusionPipeline (SD 1.x) folder runs with its PNDM scheduler and with DDIM; a copy whose scheduler
# mmc does not run (LMSDiscreteScheduler) opens and asks for --scheduler
S=tests/fixtures/sd15_pipe
expect_rc 0 "$MMC" generate-image --model $S --prompt "a red circle" --steps 3 --out "$T/sdp.png"
cp -r $S "$T/lms" && sed -i 's/PNDMScheduler/LMSDiscreteScheduler/' "$T/lms/model_index.json" "$T/lms/scheduler/scheduler_config.json"
expect_rc 1 "$MMC" generate-image --model "$T/lms" --prompt "a red circle" --steps 2 --out "$T/sd.png"
expect_err "LMSDiscreteScheduler"
expect_err "\-\-scheduler DIR"
expect_rc 0 "$MMC" generate-image --model "$T/lms" --prompt "a red circle" --steps 2 --scheduler $S/scheduler_ddim \
  --out "$T/sd.png"
expect_rc 0 "$MMC" generate-image --model $S --prompt "a red circle" --width 24 --height 16 --steps 2 \
  --scheduler $S/scheduler_ddim --out "$T/sd.png"
if grep -aq "mmc generate-image (StableDiffusionPipeline)" "$T/sd.png"; then ok; else bad "SD PNG lacks the pipeline name"; fi
# single-file checkpoints (tests/fixtures/sdxl_single: their numerics in test_sdxl_single_file): --model FILE with
# the --config folder of configs and tokenizers; without --config the error says to pass it; --config with a folder
F=tests/fixtures/sdxl_single
expect_rc 0 "$MMC" generate-image --model $F/sdxl.safetensors --config $P --prompt "a red circle" --width 24 --height 16 \
  --steps 2 --seed 3 --out "$T/sf.png"
if grep -aq "mmc generate-image (StableDiffusionXLPipeline)" "$T/sf.png" && ! cmp -s "$T/sf.png" "$T/s1.png"; then ok
else bad "single-file PNG"; fi
expect_rc 0 "$MMC" generate-image --model $F/sd15.safetensors --config $S --scheduler $S/scheduler_ddim \
  --prompt "a red circle" --width 24 --height 16 --steps 2 --out "$T/sf15.png"
if grep -aq "mmc generate-image (StableDiffusionPipeline)" "$T/sf15.png"; then ok; else bad "SD 1.x single-file PNG"; fi
expect_rc 1 "$MMC" generate-image --model $F/sdxl.safetensors --prompt "x" --width 24 --height 16 --out "$T/x.png"
expect_err "\-\-config DIR"
expect_rc 1 "$MMC" generate-image --model $F/sdxl.safetensors --config $S --prompt "x" --width 24 --height 16 --out "$T/x.png"
expect_err "StableDiffusionPipeline"
expect_rc 2 "$MMC" generate-image --model $P --config $P --prompt "x" --out "$T/x.png"
expect_err "single-file"
# a kohya / A1111 LoRA file (numerics: test_sdxl_kohya_lora) through --lora FILE:SCALE, on the folder and on a
# single file; a file in no LoRA naming names its first key
K=tests/fixtures/sdxl_kohya
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle" --width 24 --height 16 --steps 2 --seed 3 \
  --lora $K/sdxl_sgm_names.safetensors:0.8 --out "$T/kohya.png"
if [ -s "$T/kohya.png" ] && ! cmp -s "$T/kohya.png" "$T/s1.png"; then ok; else bad "kohya LoRA made no (different) image"; fi
expect_rc 0 "$MMC" generate-image --model $F/sdxl.safetensors --config $P --prompt "a red circle" --width 24 --height 16 \
  --steps 2 --lora $K/sdxl_diffusers_names.safetensors --out "$T/kohya_sf.png"
expect_rc 1 "$MMC" generate-image --model $P --prompt "x" --width 24 --height 16 --lora $F/expected.safetensors --out "$T/x.png"
expect_err "cannot apply --lora"
# img2img (numerics: test_sdxl_img2img) from diffusers' own PNG: SDXL (StableDiffusionXLImg2ImgPipeline in the PNG),
# strength changes the image; the refiner folder with --init-image and its aesthetic scores, and without it a usage
# error; a strength that leaves no step names --strength
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle" --init-image $P/cli_expected.png --strength 0.6 \
  --steps 5 --width 24 --height 16 --out "$T/i2i_a.png"
if grep -aq "StableDiffusionXLImg2ImgPipeline" "$T/i2i_a.png"; then ok; else bad "img2img PNG lacks the pipeline name"; fi
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle" --init-image $P/cli_expected.png --strength 0.9 \
  --steps 5 --width 24 --height 16 --out "$T/i2i_b.png"
if cmp -s "$T/i2i_a.png" "$T/i2i_b.png"; then bad "--strength made no difference"; else ok; fi
R=tests/fixtures/sdxl_refiner
expect_rc 0 "$MMC" generate-image --model $R --prompt "a red circle" --init-image "$T/i2i_a.png" --steps 4 \
  --aesthetic-score 7 --negative-aesthetic-score 2 --width 24 --height 16 --out "$T/ref.png"
expect_rc 2 "$MMC" generate-image --model $R --prompt "a red circle" --steps 4 --width 24 --height 16 --out "$T/x.png"
expect_err "init-image"
expect_rc 1 "$MMC" generate-image --model $P --prompt "x" --init-image $P/cli_expected.png --strength 0.1 --steps 5 \
  --width 24 --height 16 --out "$T/x.png"
expect_err "\-\-strength"
expect_rc 0 "$MMC" generate-image --model $S --scheduler $S/scheduler_ddim --prompt "a red circle" --steps 4 \
  --init-image $P/cli_expected.png --width 24 --height 16 --out "$T/sdi2i.png"
if grep -aq "StableDiffusionImg2ImgPipeline" "$T/sdi2i.png"; then ok; else bad "SD img2img PNG lacks the pipeline name"; fi
# a folder saved from StableDiffusionImg2ImgPipeline (its model_index.json class) runs the same way
cp -r $S "$T/sdimg" && sed -i 's/"StableDiffusionPipeline"/"StableDiffusionImg2ImgPipeline"/' "$T/sdimg/model_index.json"
expect_rc 0 "$MMC" generate-image --model "$T/sdimg" --scheduler $S/scheduler_ddim --prompt "a red circle" --steps 4 \
  --init-image $P/cli_expected.png --width 24 --height 16 --out "$T/sdi2i_b.png"
if grep -aq "StableDiffusionImg2ImgPipeline" "$T/sdi2i_b.png"; then ok; else bad "Img2Img folder PNG"; fi
# ---- mmc train on the SDXL pipeline (the DDPM objective of train_text_to_image_(lora_)sdxl.py): LoRA on the
# scripts' targets with offset noise and a validation image; generate-image --lora with the result; diffusers'
# load_lora_weights reads the adapter; full fine-tuning with min-SNR v_prediction, resumed bit-exactly; SD 1.x
PY=${MMC_REF_PY:-.venv-ref/bin/python}
cat >"$T/xl.yaml" <<YAML
model:
  path: $P
  lora: {r: 4, alpha: 4, targets: [to_q, to_k, to_v, to_out.0]}
data: {train: tests/fixtures/flux/imagefolder, resolution: 32, batch_size: 2}
diffusion: {noise_offset: 0.05}
flow_matching: {validation_prompt: a red circle on the left, validation_steps: 2}
optimizer: {lr: 1.0e-3, weight_decay: 1.0e-2}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/xlrun, seed: 7}
YAML
expect_rc 0 "$MMC" train "$T/xl.yaml"
[ -s "$T/xlrun/checkpoint-4/pytorch_lora_weights.safetensors" ] && ok || bad "SDXL LoRA checkpoint: $(ls "$T/xlrun/checkpoint-4" 2>&1)"
[ -s "$T/xlrun/validation/step-000004.png" ] && grep -aq "a red circle on the left" "$T/xlrun/validation/step-000004.png" && ok \
  || bad "SDXL validation image: $(ls "$T/xlrun" "$T/xlrun/validation" 2>&1)"
nl=$(grep -c '"loss"' "$T/xlrun/metrics.jsonl" 2>/dev/null)
[ "$nl" = 4 ] && ok || bad "SDXL metrics.jsonl has $nl loss lines, want 4"
grep -q '"loss": \(nan\|inf\)' "$T/xlrun/metrics.jsonl" && bad "SDXL: non-finite loss" || ok
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle on the left" --width 32 --height 32 --steps 2 \
  --seed 3 --lora "$T/xlrun/checkpoint-4" --out "$T/xllora.png"
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle on the left" --width 32 --height 32 --steps 2 \
  --seed 3 --out "$T/xlbase.png"
[ -s "$T/xllora.png" ] && ! cmp -s "$T/xllora.png" "$T/xlbase.png" && ok || bad "--lora changed nothing"
if [ -x "$PY" ]; then
  "$PY" - "$P" "$T/xlrun/checkpoint-4" >"$T/py" 2>&1 <<'PYEOF' && ok || bad "diffusers cannot load mmc's SDXL adapter: $(tail -5 "$T/py")"
import sys, torch
from diffusers import StableDiffusionXLPipeline
pipe = StableDiffusionXLPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[2])
n = sum(1 for k in pipe.unet.state_dict() if "lora_A" in k)
assert n > 0, n
print("loaded", n)
PYEOF
else
  echo "test_sdxl_cli: no reference venv ($PY): the diffusers load of mmc's adapter is skipped"
fi
sed -e "/lora:/d" -e "s|output_dir: $T/xlrun|output_dir: $T/xlfull|" -e "/validation_/d" -e "/flow_matching/d" \
    -e "s|diffusion: .*|diffusion: {snr_gamma: 5, prediction_type: v_prediction}|" \
    -e "s|steps: 4, save_every: 2|steps: 3, save_every: 2|" "$T/xl.yaml" >"$T/xlfull.yaml"
expect_rc 0 "$MMC" train "$T/xlfull.yaml"
[ -s "$T/xlfull/checkpoint-3/diffusion_pytorch_model.safetensors" ] && [ -s "$T/xlfull/checkpoint-3/config.json" ] && ok \
  || bad "SDXL full checkpoint: $(ls "$T/xlfull/checkpoint-3" 2>&1)"
cp -r "$T/xlfull" "$T/xlfull2" && rm -rf "$T/xlfull2/checkpoint-3"
sed "s|$T/xlfull|$T/xlfull2|" "$T/xlfull.yaml" >"$T/xlfull2.yaml"
expect_rc 0 "$MMC" train "$T/xlfull2.yaml" --resume
cmp -s "$T/xlfull/checkpoint-3/diffusion_pytorch_model.safetensors" "$T/xlfull2/checkpoint-3/diffusion_pytorch_model.safetensors" \
  && ok || bad "SDXL: the resumed UNet differs from the uninterrupted run's"
# data parallelism: 2 ranks x 1 micro-batch draw what 1 process x 2 micro-batches draws (per-sample streams)
if command -v mpirun >/dev/null 2>&1 && [ "${MMC_SANITIZED:-0}" != 1 ]; then
  sed -e "s|output_dir: $T/xlrun|output_dir: $T/dp1|" -e "/validation_/d" -e "/flow_matching/d" -e "s|steps: 4, save_every: 2|steps: 2, save_every: 0|" \
      -e "s|batch_size: 2}|batch_size: 2, micro_batch_size: 1}|" "$T/xl.yaml" >"$T/dp.yaml"
  expect_rc 0 "$MMC" train "$T/dp.yaml"
  export OMPI_MCA_orte_tmpdir_base="$T" MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-120}
  expect_rc 0 timeout -k 10 300 "$MMC" launch -n 2 "$T/dp.yaml" --set training.output_dir=$T/dp2 --set parallel.data_parallel=2
  a=$(grep -o '"loss": [^,]*' "$T/dp1/metrics.jsonl"); b=$(grep -o '"loss": [^,]*' "$T/dp2/metrics.jsonl" 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "SDXL: 2-rank losses [$b] differ from 1 process [$a]"
else
  echo "test_sdxl_cli: no mpirun (or a sanitized build): the data-parallel check is skipped"
fi
# aspect-ratio buckets: the 70x50 image goes to the wide bucket (its time_ids: original size, crop (0, 0), the bucket)
printf '%s\n' '{"image": "../flux/imagefolder/00.png", "caption": "a red circle"}' \
  '{"image": "../flux/imagefolder/01.png", "caption": "a blue square"}' \
  '{"image": "../image/rgba.png", "caption": "a wide picture"}' >"$T/bk.jsonl"
cat >"$T/bk.yaml" <<YAML
model: {path: $P, lora: {r: 2, alpha: 2, targets: [to_q, to_v]}}
data: {train: $T/bk.jsonl, image_root: tests/fixtures/flux, resolution: 32, batch_size: 1, aspect_ratio_buckets: "32,32;32,48"}
optimizer: {lr: 1.0e-3}
training: {steps: 3, log_every: 1, output_dir: $T/bk, seed: 3}
YAML
expect_rc 0 "$MMC" train "$T/bk.yaml"
grep -q "32x48: 1" "$T/err" && ok || bad "SDXL buckets: $(grep -i bucket "$T/err")"
# a bad prediction_type names the key
sed "s|diffusion: .*|diffusion: {prediction_type: x0}|" "$T/xlfull.yaml" >"$T/badpt.yaml"
expect_rc 1 "$MMC" train "$T/badpt.yaml"
expect_err "prediction_type"
# SD 1.x (StableDiffusionPipeline, PNDM scheduler, no added conditioning): a LoRA run
sed -e "s|path: $P|path: $S|" -e "s|output_dir: $T/xlrun|output_dir: $T/sdrun|" -e "/validation_/d" -e "/flow_matching/d" \
    "$T/xl.yaml" >"$T/sd.yaml"
expect_rc 0 "$MMC" train "$T/sd.yaml"
[ -s "$T/sdrun/checkpoint-4/pytorch_lora_weights.safetensors" ] && ok || bad "SD LoRA checkpoint: $(cat "$T/err" | tail -3)"
expect_rc 0 "$MMC" generate-image --model $S --prompt "a red circle" --steps 2 --width 32 --height 32 \
  --lora "$T/sdrun/checkpoint-4" --out "$T/sdlora.png"
echo "test_sdxl_cli: $((n - fail)) of $n checks passed"
[ "$fail" = 0 ]
