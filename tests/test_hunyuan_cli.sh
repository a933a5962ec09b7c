#!/usr/bin/env bash
# test_hunyuan_cli.sh — `mmc generate-image` on the tiny HunyuanDiTPipeline folder written by diffusers
# (tests/fixtures/hunyuan/pipe, tools/ref/gen_hunyuan.py): model_index.json's _class_name takes the HunyuanDiT
# path; from diffusers' initial noise (--latents) with a negative prompt, CFG 5 and one DDPM step (whose variance
# noise is scaled by 1e-10, so mmc's draws do not matter) the PNG equals diffusers' within 1/255 per channel (the
# multi-step numerics with torch's draws: test_hunyuan); the tEXt chunks name the pipeline; seeded runs repeat;
# --guidance-rescale changes it; resolution binning maps 64 x 48 to 1024 x 768 (checked on the latents' shape
# error); options not wired are usage errors. Then `mmc train` on the folder (below).
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=tests/fixtures/hunyuan/pipe
[ -f "$P/cli_latents.safetensors" ] || { echo "test_hunyuan_cli: skipped: fixtures absent (tools/ref/gen_hunyuan.py)"; exit 77; }
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }

expect_rc 0 "$MMC" generate-image --model $P --prompt "a red sofa" --negative-prompt "cat" --steps 1 --width 48 \
  --height 64 --no-resolution-binning --latents $P/cli_latents.safetensors --out "$T/c.png" --json
if grep -q '"steps": 1' "$T/out" && [ -s "$T/c.png" ]; then ok; else bad "no image or JSON: $(cat "$T/out")"; fi
if grep -aq "mmc generate-image (HunyuanDiTPipeline)" "$T/c.png"; then ok; else bad "PNG lacks the pipeline name"; fi
if command -v python3 >/dev/null; then
  if python3 tests/pngcmp.py "$T/c.png" $P/cli_expected.png >"$T/cmp" 2>&1
  then ok; else bad "PNG differs from diffusers': $(cat "$T/cmp")"; fi
fi
# --guidance-rescale changes the image; out of [0, 1] it is a usage error
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red sofa" --negative-prompt "cat" --steps 1 --width 48 \
  --height 64 --no-resolution-binning --latents $P/cli_latents.safetensors --guidance-rescale 0.7 --out "$T/r.png"
if cmp -s "$T/c.png" "$T/r.png"; then bad "--guidance-rescale 0.7 left the image unchanged"; else ok; fi
expect_rc 2 "$MMC" generate-image --model $P --prompt "a cat" --guidance-rescale 2 --out "$T/x.png"
# seeded runs (mmc's noise) repeat
expect_rc 0 "$MMC" generate-image --model $P --prompt "a cute cat" --steps 2 --width 48 --height 64 \
  --no-resolution-binning --seed 7 --out "$T/s1.png"
expect_rc 0 "$MMC" generate-image --model $P --prompt "a cute cat" --steps 2 --width 48 --height 64 \
  --no-resolution-binning --seed 7 --out "$T/s2.png"
if cmp -s "$T/s1.png" "$T/s2.png"; then ok; else bad "the same seed gave different images"; fi
# binning (the default): 64 x 48 becomes 1024 x 768, so these latents no longer fit
expect_rc 1 "$MMC" generate-image --model $P --prompt "a cat" --steps 1 --width 48 --height 64 \
  --latents $P/cli_latents.safetensors --out "$T/b.png"
expect_err "128, 96"
expect_rc 2 "$MMC" generate-image --model $P --prompt "a cat" --true-cfg 2 --negative-prompt x --out "$T/x.png"
expect_err "not wired for HunyuanDiTPipeline"
# ---- mmc train on the HunyuanDiTPipeline folder (DDPM, the scheduler's v_prediction, min-SNR, offset noise; the
# step parity against diffusers + PEFT is test_hunyuan's part "train"): LoRA on both attentions and the
# feed-forward with a validation image, saved as PEFT's adapter on the transformer, resumed bit-exactly;
# generate-image --lora with it
# equals diffusers' pipeline with PEFT's load of that adapter (1/255, when the reference venv is there); full
# fine-tuning with recompute (and with 2 micro-batches of 1) gives the losses of the run without, and resumes
# bit-exactly; a validation prompt with prediction_type sample is an error
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
PY=${MMC_REF_PY:-.venv-ref/bin/python}
cat >"$T/hy.yaml" <<YAML
model:
  path: $P
  lora: {r: 4, alpha: 8, targets: [to_q, to_k, to_v, to_out.0, ff.net.0.proj, ff.net.2]}
data: {train: tests/fixtures/flux/imagefolder, resolution: 32, batch_size: 2}
diffusion: {noise_offset: 0.05, snr_gamma: 5}
flow_matching: {validation_prompt: a red sofa, validation_steps: 2}
optimizer: {lr: 3.0e-2, weight_decay: 1.0e-2}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/hyrun, seed: 7}
YAML
expect_rc 0 "$MMC" train "$T/hy.yaml"
C4=$T/hyrun/checkpoint-4
[ -s "$C4/adapter_model.safetensors" ] && grep -q '"HunyuanDiT\|transformer' "$C4/adapter_config.json" && ok \
  || bad "HunyuanDiT LoRA checkpoint: $(ls "$C4" 2>&1)"
[ -s "$T/hyrun/validation/step-000004.png" ] && grep -aq "a red sofa" "$T/hyrun/validation/step-000004.png" && ok \
  || bad "HunyuanDiT validation image: $(ls "$T/hyrun/validation" 2>&1)"
nl=$(grep -c '"loss"' "$T/hyrun/metrics.jsonl" 2>/dev/null)
[ "$nl" = 4 ] && ok || bad "HunyuanDiT metrics.jsonl has $nl loss lines, want 4"
grep -q '"loss": \(nan\|inf\)' "$T/hyrun/metrics.jsonl" && bad "HunyuanDiT: non-finite loss" || ok
cp -r "$T/hyrun" "$T/hyrun2" && rm -rf "$T/hyrun2/checkpoint-4"   # the LoRA run resumed from checkpoint-2
sed "s|$T/hyrun|$T/hyrun2|" "$T/hy.yaml" >"$T/hy2.yaml"
expect_rc 0 "$MMC" train "$T/hy2.yaml" --resume
cmp -s "$C4/adapter_model.safetensors" "$T/hyrun2/checkpoint-4/adapter_model.safetensors" && ok \
  || bad "HunyuanDiT: the resumed adapter differs from the uninterrupted run's"
GEN=(generate-image --model $P --prompt "a red sofa" --negative-prompt "cat" --steps 1 --width 48 --height 64
     --no-resolution-binning --latents $P/cli_latents.safetensors)
expect_rc 0 "$MMC" "${GEN[@]}" --lora "$C4" --out "$T/lora.png"
[ -s "$T/lora.png" ] && ! cmp -s "$T/lora.png" "$T/c.png" && ok || bad "--lora changed nothing"
expect_rc 0 "$MMC" "${GEN[@]}" --lora "$C4:0" --out "$T/lora0.png"
if command -v python3 >/dev/null; then   # (the PNGs' text chunks differ: compare the pixels)
  python3 tests/pngcmp.py "$T/lora0.png" "$T/c.png" >"$T/cmp" 2>&1 && ok || bad "--lora at scale 0 changed the image: $(cat "$T/cmp")"
fi
expect_rc 1 "$MMC" "${GEN[@]}" --lora "$T/nonexistent" --out "$T/x.png"
expect_err "cannot apply --lora"
# mmc merge: the adapter folded into a copy of the pipeline folder (written atomically); the merged folder
# generates --lora's image (1/255) and, with the reference venv, diffusers loads it: its transformer equals PEFT's
# merge_and_unload (1e-6) and its image mmc's (1/255); a second merge replaces it
expect_rc 0 "$MMC" merge --model $P --adapter "$C4" --out "$T/merged" --json
grep -q '"merged_weights": 40' "$T/out" && ok || bad "merge: $(cat "$T/out")"
[ -s "$T/merged/model_index.json" ] && [ -s "$T/merged/vae/diffusion_pytorch_model.safetensors" ] \
  && [ -s "$T/merged/transformer/diffusion_pytorch_model.safetensors" ] && ! ls -d "$T"/merged.* >/dev/null 2>&1 && ok \
  || bad "merged folder: $(ls -R "$T/merged" 2>&1 | head -20)"
expect_rc 0 "$MMC" generate-image --model "$T/merged" "${GEN[@]:3}" --out "$T/merged.png"
if command -v python3 >/dev/null; then
  python3 tests/pngcmp.py "$T/merged.png" "$T/lora.png" >"$T/cmp" 2>&1 && ok || bad "the merged folder's image differs from --lora's: $(cat "$T/cmp")"
fi
expect_rc 0 "$MMC" merge --model $P --adapter "$C4" --out "$T/merged"
# without --model: the adapter's base (the pipeline's transformer folder, as mmc train records it) -> the whole
# pipeline; --model the transformer folder -> that folder merged; the same weights either way
expect_rc 0 "$MMC" merge --adapter "$C4" --out "$T/merged2"
expect_err "writing the whole pipeline folder"
expect_rc 0 "$MMC" merge --model $P/transformer --adapter "$C4" --out "$T/merged_tr"
W=transformer/diffusion_pytorch_model.safetensors
[ -s "$T/merged2/model_index.json" ] && cmp -s "$T/merged/$W" "$T/merged2/$W" && cmp -s "$T/merged/$W" "$T/merged_tr/${W#*/}" \
  && cmp -s "$P/transformer/config.json" "$T/merged_tr/config.json" && ok \
  || bad "merges without --model / into the transformer folder differ: $(ls "$T/merged2" "$T/merged_tr" 2>&1)"
if [ -x "$PY" ]; then
  "$PY" - "$P" "$C4" "$T/peft.png" "$T/merged" "$T/peft_merged.png" >"$T/py" 2>&1 <<'PYEOF' && ok || bad "diffusers + PEFT on mmc's adapter: $(tail -5 "$T/py")"
import sys, torch
from safetensors.torch import load_file
from peft import PeftModel
from diffusers import HunyuanDiTPipeline
pipe = HunyuanDiTPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pm = PeftModel.from_pretrained(pipe.transformer, sys.argv[2])
n = sum(1 for k in pm.state_dict() if "lora_A" in k)
assert n == 40, n   # 4 blocks x (2 attentions x 4 + 2 ff)
pipe.transformer = pm.merge_and_unload()
lat = load_file(sys.argv[1] + "/cli_latents.safetensors")["latents"]
kw = dict(prompt="a red sofa", negative_prompt="cat", height=64, width=48, num_inference_steps=1, guidance_scale=5.0,
          use_resolution_binning=False)
pipe(latents=lat.clone(), **kw).images[0].save(sys.argv[3])
# `mmc merge`'s folder: diffusers loads it whole; its transformer equals PEFT's merge_and_unload (1e-6)
ref = pipe.transformer.state_dict()
mp = HunyuanDiTPipeline.from_pretrained(sys.argv[4], torch_dtype=torch.float32)
got = mp.transformer.state_dict()
assert set(got) == set(ref), set(got) ^ set(ref)
worst = max((got[k] - ref[k]).abs().max().item() for k in ref)
assert worst <= 1e-6, worst
mp(latents=lat.clone(), **kw).images[0].save(sys.argv[5])
print("merged folder: weights within", worst, "of PEFT's merge_and_unload")
PYEOF
  grep "merged folder" "$T/py" | sed "s/^/test_hunyuan_cli: /"
  python3 tests/pngcmp.py "$T/merged.png" "$T/peft_merged.png" >"$T/cmp" 2>&1 && ok \
    || bad "mmc's image from the merged folder differs from diffusers': $(cat "$T/cmp")"
  if python3 tests/pngcmp.py "$T/lora.png" "$T/peft.png" >"$T/cmp" 2>&1; then
    ok; echo "test_hunyuan_cli: --lora vs diffusers + PEFT: $(cat "$T/cmp")"
    python3 tests/pngcmp.py "$T/lora.png" "$T/c.png" | sed "s/^/test_hunyuan_cli: --lora vs the base: /"
  else bad "--lora image differs from diffusers + PEFT: $(cat "$T/cmp")"; fi
else
  echo "test_hunyuan_cli: no reference venv ($PY): the diffusers + PEFT load of mmc's adapter is skipped"
fi
# full fine-tuning (epsilon override), with and without recompute; resumed from checkpoint-2
sed -e "/lora:/d" -e "s|output_dir: $T/hyrun|output_dir: $T/hyfull|" -e "/validation_/d" -e "/flow_matching/d" \
    -e "s|diffusion: .*|diffusion: {prediction_type: epsilon}|" -e "s|lr: 3.0e-2|lr: 1.0e-3|" \
    -e "s|steps: 4, save_every: 2|steps: 3, save_every: 2|" "$T/hy.yaml" >"$T/hyfull.yaml"
expect_rc 0 "$MMC" train "$T/hyfull.yaml"
[ -s "$T/hyfull/checkpoint-3/diffusion_pytorch_model.safetensors" ] && [ -s "$T/hyfull/checkpoint-3/config.json" ] && ok \
  || bad "HunyuanDiT full checkpoint: $(ls "$T/hyfull/checkpoint-3" 2>&1)"
sed -e "s|$T/hyfull|$T/hyrc|" -e "s|^model:|model:\n  recompute: full|" "$T/hyfull.yaml" >"$T/hyrc.yaml"
expect_rc 0 "$MMC" train "$T/hyrc.yaml"
a=$(grep -o '"loss": [^,]*' "$T/hyfull/metrics.jsonl" | cut -d' ' -f2); b=$(grep -o '"loss": [^,]*' "$T/hyrc/metrics.jsonl" 2>/dev/null | cut -d' ' -f2)
if [ -n "$a" ] && paste <(echo "$a") <(echo "$b") | awk '{d = $1 - $2; if (d < 0) d = -d; if (!($2 != "" && d <= 1e-6 * ($1 < 0 ? -$1 : $1))) exit 1}'
then ok; else bad "HunyuanDiT: losses with recompute [$b] differ from those without [$a] (1e-6 relative)"; fi
# gradient accumulation: 2 micro-batches of 1 draw and average what one micro-batch of 2 does
sed -e "s|$T/hyfull|$T/hymb|" -e "s|batch_size: 2}|batch_size: 2, micro_batch_size: 1}|" "$T/hyfull.yaml" >"$T/hymb.yaml"
expect_rc 0 "$MMC" train "$T/hymb.yaml"
b=$(grep -o '"loss": [^,]*' "$T/hymb/metrics.jsonl" 2>/dev/null | cut -d' ' -f2)
if [ -n "$a" ] && paste <(echo "$a") <(echo "$b") | awk '{d = $1 - $2; if (d < 0) d = -d; if (!($2 != "" && d <= 1e-6 * ($1 < 0 ? -$1 : $1))) exit 1}'
then ok; else bad "HunyuanDiT: losses of 2 micro-batches [$b] differ from one batch's [$a] (1e-6 relative)"; fi
# prediction_type sample cannot be sampled by the pipeline: a validation prompt with it is an error naming both
sed -e "s|diffusion: .*|diffusion: {prediction_type: sample}|" "$T/hy.yaml" >"$T/hysample.yaml"
expect_rc 1 "$MMC" train "$T/hysample.yaml"
expect_err "prediction_type sample"
cp -r "$T/hyfull" "$T/hyfull2" && rm -rf "$T/hyfull2/checkpoint-3"
sed "s|$T/hyfull|$T/hyfull2|" "$T/hyfull.yaml" >"$T/hyfull2.yaml"
expect_rc 0 "$MMC" train "$T/hyfull2.yaml" --resume
cmp -s "$T/hyfull/checkpoint-3/diffusion_pytorch_model.safetensors" "$T/hyfull2/checkpoint-3/diffusion_pytorch_model.safetensors" \
  && ok || bad "HunyuanDiT: the resumed transformer differs from the uninterrupted run's"
echo "test_hunyuan_cli: $((n - fail)) of $n checks passed"
[ "$fail" = 0 ]
