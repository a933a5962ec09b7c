#!/usr/bin/env bash
# test_flux_cli.sh — `mmc generate-image` and `mmc train` on the tiny FluxPipeline (and SD3) folders written by
# diffusers (tests/fixtures/flux/pipe, tools/ref/gen_flux.py):
#  - from diffusers' own initial noise (--latents), with a negative prompt and true CFG 1.5, the PNG
#    equals the one diffusers saved within 1/255 per channel (float differences of ~4e-6 may round a
#    pixel the other way), and its tEXt chunks hold the prompt and the settings;
#  - --init-image (img2img) runs and records its strength;
#  - --batch writes one file per image; sizes the VAE cannot take name the nearest valid size;
#    bad options are usage errors;
#  - `mmc train` fine-tunes a LoRA on the transformer from an HF imagefolder (metadata.jsonl):
#    finite losses, validation images of a prompt every 3 steps, diffusers-layout adapter files in the checkpoints, a resumed run that repeats
#    the uninterrupted one's losses exactly, 2 data-parallel ranks with the one process's losses, and
#    generate-image --lora on the result;
#  - with the reference venv: diffusers' load_lora_weights reads mmc's adapter and generates the image
#    mmc generates with it (within 1/255);
#  - the timestep densities (uniform / none, mode and its scale, logit_normal and its mean) and the
#    sigma_sqrt weighting reach the trainer; the EMA weights follow diffusers' EMAModel decay.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
PY=${MMC_REF_PY:-.venv-ref/bin/python}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
P=tests/fixtures/flux/pipe
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }

# PNG -> "W H" then one byte value per line, with the tEXt chunks on stderr (stdlib only: zlib, struct)
png_dump() { python3 - "$1" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, texts = 8, b"", []
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8]); body = data[pos + 8:pos + 8 + n]; pos += 12 + n
    if kind == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT": idat += body
    elif kind == b"tEXt": k, v = body.split(b"\0", 1); texts.append((k.decode("latin-1"), v.decode("utf-8")))
assert depth == 8 and ctype == 2, "8-bit RGB expected"
raw, bpp, stride, out, prev = zlib.decompress(idat), 3, w * 3, [], bytearray(w * 3)
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    out += line; prev = line
print(w, h)
print("\n".join(map(str, out)))
for k, v in texts: print(f"{k}={v}", file=sys.stderr)
PY
}

# ---- generate-image against diffusers' PNG
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle on the left" --negative-prompt green \
  --true-cfg 1.5 --guidance 2 --steps 2 --width 48 --height 32 --max-sequence-length 16 \
  --latents $P/cli_latents.safetensors --out "$T/img.png" --json
grep -q '"peak_rss_mib"' "$T/out" && grep -q '"s_per_step"' "$T/out" && ok || bad "--json lacks timings/memory: $(cat "$T/out")"
png_dump "$T/img.png" >"$T/got.txt" 2>"$T/text.txt" && ok || bad "cannot decode mmc's PNG"
png_dump $P/cli_expected.png >"$T/want.txt" 2>/dev/null
res=$(paste "$T/got.txt" "$T/want.txt" | awk 'NR == 1 { if ($1 != $3 || $2 != $4) size = 1; next }
  { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; if (d > 1) bad++; if (d > 0) diff++; n++ }
  END { printf "%d %d %d %d", size + 0, bad + 0, diff + 0, m }')
set -- $res
[ "$1" = 0 ] && [ "$2" = 0 ] && ok || bad "image differs from diffusers': size mismatch $1, $2 channels off by > 1 (max $4)"
echo "generate-image vs diffusers: $3 of $(($(wc -l < "$T/want.txt") - 1)) channel values differ (max $4/255)"
grep -q "^prompt=a red circle on the left$" "$T/text.txt" && grep -q "^negative_prompt=green$" "$T/text.txt" \
  && grep -q "^true_cfg=1.5$" "$T/text.txt" && grep -q "^steps=2$" "$T/text.txt" && ok \
  || bad "PNG text chunks: $(cat "$T/text.txt")"
# --batch: one file per image, from the seed
expect_rc 0 "$MMC" generate-image --model $P --prompt "a blue square" --steps 1 --width 32 --height 32 \
  --max-sequence-length 16 --batch 2 --seed 3 --out "$T/b.png"
[ -s "$T/b.png" ] && [ -s "$T/b-1.png" ] && ok || bad "--batch 2 did not write b.png and b-1.png: $(ls "$T")"
# the two images differ (noise drawn image by image) and say which they are; the first is the one image
# --batch 1 makes from the same seed (within 1/255: the batch may change the kernels' blocking)
png_dump "$T/b.png" >"$T/b0.txt" 2>"$T/b0t.txt"; png_dump "$T/b-1.png" >"$T/b1.txt" 2>"$T/b1t.txt"
grep -q "^image_index=0$" "$T/b0t.txt" && grep -q "^image_index=1$" "$T/b1t.txt" && grep -q "^seed=3$" "$T/b1t.txt" \
  && ! cmp -s "$T/b0.txt" "$T/b1.txt" && ok || bad "--batch 2: the images should differ and carry image_index 0 / 1 and seed 3"
expect_rc 0 "$MMC" generate-image --model $P --prompt "a blue square" --steps 1 --width 32 --height 32 \
  --max-sequence-length 16 --seed 3 --out "$T/b_one.png"
png_dump "$T/b_one.png" >"$T/bo.txt" 2>/dev/null
res=$(paste "$T/b0.txt" "$T/bo.txt" | awk 'NR > 1 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { print m + 0 }')
[ -s "$T/bo.txt" ] && [ "$res" -le 1 ] && ok || bad "--batch 2's first image is $res/255 off the --batch 1 image of the same seed"
# img2img from a PNG of another size (resized with lanczos), the strength in the text chunks
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle" --init-image $P/init.png --strength 0.5 \
  --steps 4 --width 48 --height 32 --max-sequence-length 16 --out "$T/i2i.png"
png_dump "$T/i2i.png" >/dev/null 2>"$T/text.txt" && grep -q "^strength=0.5$" "$T/text.txt" && ok || bad "img2img PNG: $(cat "$T/text.txt")"
expect_rc 1 "$MMC" generate-image --model $P --prompt x --init-image $P/init.png --strength 0 --steps 4 --width 48 --height 32
expect_err "no denoising step"
# sizes and options
expect_rc 1 "$MMC" generate-image --model $P --prompt x --width 50 --height 32
expect_err "nearest valid size is 52x32"
expect_rc 2 "$MMC" generate-image --model $P --prompt x --true-cfg 2
expect_err "needs --negative-prompt"
expect_rc 2 "$MMC" generate-image --model $P
expect_err "prompt"
expect_rc 1 "$MMC" generate-image --model tests/fixtures/flux/transformer_s --prompt x
expect_err "model_index.json"

# ---- an SD3 folder takes the SD3 path (classifier-free guidance); its numerics: test_sd3_pipeline
S=tests/fixtures/sd3_pipe
expect_rc 0 "$MMC" generate-image --model $S --prompt "a photo of a red circle" --width 48 --height 32 --steps 2 \
  --guidance 4.5 --max-sequence-length 12 --out "$T/sd3.png" --json
png_dump "$T/sd3.png" >/dev/null 2>"$T/text.txt" && grep -q "^software=mmc generate-image (StableDiffusion3Pipeline)$" "$T/text.txt" \
  && ok || bad "SD3 PNG: $(cat "$T/text.txt")"
expect_rc 0 "$MMC" generate-image --model $S --prompt "a photo of a red circle" --width 48 --height 32 --steps 2 \
  --guidance 1 --max-sequence-length 12 --lora $S/lora:0.5 --out "$T/sd3l.png"
expect_rc 2 "$MMC" generate-image --model $S --prompt x --width 48 --height 32 --true-cfg 2 --negative-prompt y
expect_err "Flux pipelines only"
# SD3 img2img (StableDiffusion3Img2ImgPipeline; numerics: test_sd3_pipeline): a PNG of another size, the default
# strength 0.6 in the text chunks, injected noise, a strength that leaves no step, one out of range
expect_rc 0 "$MMC" generate-image --model $S --prompt "a photo of a red circle" --width 48 --height 32 --steps 3 \
  --guidance 4.5 --max-sequence-length 12 --init-image $P/init.png --out "$T/sd3i.png"
png_dump "$T/sd3i.png" >/dev/null 2>"$T/text.txt" && grep -q "^strength=0.6$" "$T/text.txt" \
  && grep -q "^software=mmc generate-image (StableDiffusion3Img2ImgPipeline)$" "$T/text.txt" && ok \
  || bad "SD3 img2img PNG: $(cat "$T/text.txt")"
python3 - "$T/noise.safetensors" <<'PY'
import json, struct, sys
n = 1 * 4 * 16 * 24; h = json.dumps({"latents": {"dtype": "F32", "shape": [1, 4, 16, 24], "data_offsets": [0, 4 * n]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%df" % n, *[((i * 37) % 17 - 8) / 8.0 for i in range(n)]))
PY
expect_rc 0 "$MMC" generate-image --model $S --prompt "a photo of a red circle" --width 48 --height 32 --steps 3 \
  --guidance 1 --max-sequence-length 12 --init-image $P/init.png --strength 0.9 --latents "$T/noise.safetensors" \
  --out "$T/sd3n1.png"
expect_rc 0 "$MMC" generate-image --model $S --prompt "a photo of a red circle" --width 48 --height 32 --steps 3 \
  --guidance 1 --max-sequence-length 12 --init-image $P/init.png --strength 0.9 --latents "$T/noise.safetensors" \
  --seed 5 --out "$T/sd3n2.png"
png_dump "$T/sd3n1.png" >"$T/n1.txt" 2>/dev/null; png_dump "$T/sd3n2.png" >"$T/n2.txt" 2>/dev/null
[ -s "$T/n1.txt" ] && ! cmp -s "$T/n1.txt" "$T/n2.txt" && ok || bad "SD3 img2img: the VAE sample should follow --seed"
expect_rc 1 "$MMC" generate-image --model $S --prompt x --width 48 --height 32 --steps 4 --max-sequence-length 12 \
  --init-image $P/init.png --strength 0
expect_err "no denoising step"
expect_rc 2 "$MMC" generate-image --model $S --prompt x --width 48 --height 32 --init-image $P/init.png --strength 1.5

# ---- mmc train: LoRA on the transformer from an image folder
cat >"$T/run.yaml" <<YAML
model:
  path: $P
  lora: {r: 4, alpha: 4, targets: [to_q, to_k, to_v, to_out.0, proj_mlp]}
data:
  train: tests/fixtures/flux/imagefolder
  resolution: 32
  batch_size: 2
  micro_batch_size: 1
flow_matching:
  weighting_scheme: logit_normal
  guidance: 1.0
  max_sequence_length: 16
  validation_prompt: a red circle on the left
  validation_every: 3
  validation_steps: 2
optimizer: {lr: 1.0e-3, weight_decay: 1.0e-4}
training: {steps: 6, save_every: 3, log_every: 1, output_dir: $T/run, seed: 5, ema_decay: 0.9}
YAML
expect_rc 0 "$MMC" train "$T/run.yaml"
for s in 3 6; do
  [ -s "$T/run/checkpoint-$s/pytorch_lora_weights.safetensors" ] && ok || bad "checkpoint-$s lacks the adapter: $(ls "$T/run/checkpoint-$s" 2>&1)"
done
for s in 3 6; do
  f="$T/run/validation/step-00000$s.png"
  png_dump "$f" >/dev/null 2>"$T/text.txt" && grep -q "^step=$s$" "$T/text.txt" && ok || bad "validation image $f: $(ls "$T/run" "$T/run/validation" 2>&1)"
done
nl=$(grep -c '"loss"' "$T/run/metrics.jsonl" 2>/dev/null)
[ "$nl" = 6 ] && ok || bad "metrics.jsonl has $nl loss lines, want 6"
# the validation images are in the TensorBoard event file too (PNG records)
ev=$(ls "$T"/run/tb/events.out.tfevents.* 2>/dev/null | head -1)
np=$(grep -ac "IHDR" "$ev" 2>/dev/null)
[ "${np:-0}" -ge 2 ] && ok || bad "TensorBoard events $ev: $np PNG images, want 2"
if [ -x "$PY" ]; then
  "$PY" - "$ev" "$T/run/validation" >"$T/py" 2>&1 <<'PY' && ok || bad "tensorboard cannot read the validation images: $(tail -5 "$T/py")"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"images": 0})
acc.Reload()
ims = acc.Images("validation/image")
assert [e.step for e in ims] == [3, 6], [e.step for e in ims]
for e in ims:
    png = open(f"{sys.argv[2]}/step-{e.step:06d}.png", "rb").read()
    assert e.encoded_image_string == png and e.width == 32 and e.height == 32, e.step
print("images", [e.step for e in ims])
PY
fi
grep -q '"loss": \(nan\|inf\)' "$T/run/metrics.jsonl" && bad "non-finite loss: $(cat "$T/run/metrics.jsonl")" || ok
# resume from checkpoint-3: steps 4-6 repeat exactly
cp -r "$T/run" "$T/run2"
rm -rf "$T/run2/checkpoint-6"
sed "s|$T/run|$T/run2|" "$T/run.yaml" >"$T/run2.yaml"
expect_rc 0 "$MMC" train "$T/run2.yaml" --resume
expect_err "encoded samples from the cache"     # the encoders do not run again
a=$(grep -o '"loss": [^,]*' "$T/run/metrics.jsonl" | tail -3); b=$(grep -o '"loss": [^,]*' "$T/run2/metrics.jsonl" | tail -3)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "resumed losses differ: [$a] vs [$b]"
cmp -s "$T/run/checkpoint-6/pytorch_lora_weights.safetensors" "$T/run2/checkpoint-6/pytorch_lora_weights.safetensors" \
  && ok || bad "resumed adapter differs from the uninterrupted run's"
cmp -s "$T/run/checkpoint-6/ema.safetensors" "$T/run2/checkpoint-6/ema.safetensors" && ok \
  || bad "resumed EMA weights differ from the uninterrupted run's: $(ls "$T/run2/checkpoint-6")"
# data parallelism: 2 ranks x 1 micro-batch draw what 1 process x 2 micro-batches draws (per-sample
# streams), so the losses are equal
if command -v mpirun >/dev/null 2>&1 && [ "${MMC_SANITIZED:-0}" != 1 ]; then
  sed -e "s|steps: 6, save_every: 3|steps: 3, save_every: 0|" -e "s|output_dir: $T/run|output_dir: $T/dp1|" \
      -e "/validation_/d" "$T/run.yaml" >"$T/dp.yaml"
  expect_rc 0 "$MMC" train "$T/dp.yaml"
  # its own OpenMPI session directory (ctest -j runs other MPI tests beside this one) and a watchdog
  export OMPI_MCA_orte_tmpdir_base="$T" MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-120}
  expect_rc 0 timeout -k 10 300 "$MMC" launch -n 2 "$T/dp.yaml" --set training.output_dir=$T/dp2 --set parallel.data_parallel=2
  a=$(grep -o '"loss": [^,]*' "$T/dp1/metrics.jsonl"); b=$(grep -o '"loss": [^,]*' "$T/dp2/metrics.jsonl" 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "2-rank losses [$b] differ from 1 process [$a]"
else
  echo "test_flux_cli: no mpirun (or a sanitized build): the data-parallel check is skipped"
fi
# the timestep densities and loss weightings reach the trainer (their formulas: test_flux): first-step
# losses from the same seed and data. uniform and none are one density; mode's scale and logit_normal's
# mean change the timesteps drawn; sigma_sqrt weights the same draws as uniform by sigma^-2 >= 1, so
# its loss is larger. And the EMA (diffusers' EMAModel: decay 0 at the first update, then
# min(ema_decay, k / (k + 9))): after step 1 it is the adapter, after step 2 (2/11) a1 + (9/11) a2.
sed -e "s|steps: 6, save_every: 3|steps: 1, save_every: 0|" -e "s|output_dir: $T/run|output_dir: $T/dn|" \
    -e "/validation_/d" "$T/run.yaml" >"$T/dens.yaml"
first_loss() { grep -m1 -o '"loss": [^,]*' "$T/$1/metrics.jsonl" 2>/dev/null | sed 's/"loss": //'; }
dens() { local name=$1; shift; expect_rc 0 "$MMC" train "$T/dens.yaml" --set training.output_dir="$T/$name" "$@"; }
dens d_uni --set flow_matching.weighting_scheme=uniform --set training.steps=2 --set training.save_every=1
dens d_none --set flow_matching.weighting_scheme=none
dens d_mode --set flow_matching.weighting_scheme=mode
dens d_mode0 --set flow_matching.weighting_scheme=mode --set flow_matching.mode_scale=0
dens d_ln --set flow_matching.weighting_scheme=logit_normal
dens d_ln3 --set flow_matching.weighting_scheme=logit_normal --set flow_matching.logit_mean=3
dens d_ss --set flow_matching.weighting_scheme=sigma_sqrt
l_uni=$(first_loss d_uni) l_none=$(first_loss d_none) l_mode=$(first_loss d_mode) l_mode0=$(first_loss d_mode0)
l_ln=$(first_loss d_ln) l_ln3=$(first_loss d_ln3) l_ss=$(first_loss d_ss) l_run=$(first_loss run)
echo "first-step losses: uniform $l_uni none $l_none mode $l_mode mode(scale 0) $l_mode0 logit_normal $l_ln" \
     "(mean 3: $l_ln3) sigma_sqrt $l_ss"
[ -n "$l_uni" ] && [ "$l_uni" = "$l_none" ] && ok || bad "uniform ($l_uni) and none ($l_none) should draw the same timesteps"
[ -n "$l_ln" ] && [ "$l_ln" = "$l_run" ] && ok || bad "logit_normal: a 1-step run's loss $l_ln differs from the same run's first step $l_run"
for pair in "$l_mode $l_uni mode/uniform" "$l_mode $l_mode0 mode_scale" "$l_ln $l_ln3 logit_mean" "$l_ln $l_uni logit_normal/uniform"; do
  set -- $pair
  [ -n "$1" ] && [ -n "$2" ] && [ "$1" != "$2" ] && ok || bad "$3: the first-step losses should differ ($1 vs $2)"
done
awk -v a="$l_ss" -v b="$l_uni" 'BEGIN { exit !(a != "" && b != "" && a + 0 > b + 0) }' && ok \
  || bad "sigma_sqrt's loss $l_ss should exceed uniform's $l_uni (the same draws weighted by sigma^-2)"
python3 - "$T/d_uni" >"$T/ema" 2>&1 <<'PY' && ok || bad "EMA weights: $(tail -3 "$T/ema")"
import json, struct, sys
def load(path, prefix=""):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v["dtype"]); s, e = v["data_offsets"]
        out[k[len(prefix):] if k.startswith(prefix) else k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
d = sys.argv[1]
a1, a2 = (load(f"{d}/checkpoint-{s}/pytorch_lora_weights.safetensors", "transformer.") for s in (1, 2))
e1, e2 = (load(f"{d}/checkpoint-{s}/ema.safetensors") for s in (1, 2))
assert set(e1) == set(a1) == set(e2) and len(e1) == 24, (sorted(e1)[:3], sorted(a1)[:3])
scale = max(abs(x) for v in a2.values() for x in v)
w1 = max(abs(x - y) for k in a1 for x, y in zip(e1[k], a1[k]))
w2 = max(abs(x - (2 / 11 * y + 9 / 11 * z)) for k in a1 for x, y, z in zip(e2[k], a1[k], a2[k]))
moved = max(abs(y - z) for k in a1 for y, z in zip(a1[k], a2[k]) )
assert w1 <= 1e-6 * scale and w2 <= 1e-6 * scale and moved > 1e-4 * scale, (w1, w2, moved, scale)
print("ema: step 1 off the adapter by %.2e, step 2 off (2/11) a1 + (9/11) a2 by %.2e (max|a| %.3f)" % (w1, w2, scale))
PY
cat "$T/ema"
# a malformed metadata.jsonl line is an error naming the file and line, before any training
mkdir -p "$T/badset" && printf '{"file_name": "00.png", "text": "ok"}\n{"file_name": 3}\n' >"$T/badset/metadata.jsonl"
sed -e "s|train: tests/fixtures/flux/imagefolder|train: $T/badset|" -e "s|output_dir: $T/run|output_dir: $T/bad|" "$T/run.yaml" >"$T/bad.yaml"
expect_rc 1 "$MMC" train "$T/bad.yaml"
expect_err "metadata.jsonl:2: expected a JSON object"
# aspect-ratio buckets (diffusers' "h,w;h,w" strings): images of three shapes, each resized to its
# nearest bucket; micro-batches of one bucket; the run resumes exactly
printf '%s\n' '{"image": "../flux/imagefolder/00.png", "caption": "a red circle"}' \
  '{"image": "../flux/imagefolder/01.png", "caption": "a blue square"}' \
  '{"image": "../image/rgba.png", "caption": "a wide picture"}' \
  '{"image": "../image/rgb_500x333.jpg", "caption": "a wide photo"}' \
  '{"image": "../image/grey_alpha_LA.png", "caption": "a tall picture"}' >"$T/buckets.jsonl"
cat >"$T/bk.yaml" <<YAML
model: {path: $P, lora: {r: 2, alpha: 2, targets: [to_q, to_v]}}
data: {train: $T/buckets.jsonl, image_root: tests/fixtures/flux, resolution: 32, batch_size: 2, aspect_ratio_buckets: "32,32;24,40;40,24"}
flow_matching: {max_sequence_length: 16}
optimizer: {lr: 1.0e-3}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/bk, seed: 3}
YAML
expect_rc 0 "$MMC" train "$T/bk.yaml"
expect_err "aspect-ratio buckets: 32x32: 3 24x40: 2 40x24: 0"
grep -q '"loss": \(nan\|inf\)' "$T/bk/metrics.jsonl" && bad "buckets: non-finite loss" || ok
cp -r "$T/bk" "$T/bk2" && rm -rf "$T/bk2/checkpoint-4"
sed "s|$T/bk|$T/bk2|" "$T/bk.yaml" >"$T/bk2.yaml"
expect_rc 0 "$MMC" train "$T/bk2.yaml" --resume
a=$(grep -o '"loss": [^,]*' "$T/bk/metrics.jsonl" | tail -2); b=$(grep -o '"loss": [^,]*' "$T/bk2/metrics.jsonl" | tail -2)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "buckets: resumed losses differ: [$a] vs [$b]"
sed "s|aspect_ratio_buckets: \"32,32;24,40;40,24\"|aspect_ratio_buckets: \"32,30\"|" "$T/bk.yaml" >"$T/bk3.yaml"
expect_rc 1 "$MMC" train "$T/bk3.yaml"
expect_err "bucket 32,30 must be a multiple of 4"
sed "s|aspect_ratio_buckets: \"32,32;24,40;40,24\"|aspect_ratio_buckets: \"32x32\"|" "$T/bk.yaml" >"$T/bk4.yaml"
expect_rc 1 "$MMC" train "$T/bk4.yaml"
expect_err "expected \"height,width;height,width;...\""
# from scratch: model.init gives the transformer (random init), the pipeline folder the rest; full
# checkpoints are the transformer folder, which generate-image's pipeline can load
cat >"$T/init.yaml" <<YAML
model: {path: $P, init: $P/transformer/config.json}
data: {train: tests/fixtures/flux/imagefolder, resolution: 32, batch_size: 2}
flow_matching: {max_sequence_length: 16}
optimizer: {lr: 1.0e-3}
training: {steps: 2, log_every: 1, output_dir: $T/init, seed: 3}
YAML
expect_rc 0 "$MMC" train "$T/init.yaml"
[ -s "$T/init/checkpoint-2/diffusion_pytorch_model.safetensors" ] && [ -s "$T/init/checkpoint-2/config.json" ] && ok \
  || bad "from-scratch checkpoint lacks the transformer folder: $(ls "$T/init/checkpoint-2" 2>&1)"
# the trained adapter generates
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle on the left" --steps 2 --width 32 --height 32 \
  --max-sequence-length 16 --lora "$T/run/checkpoint-6:0.8" --out "$T/lora.png"
# diffusers reads it (with the reference venv) and generates what mmc generates with it: the CLI case
# above (diffusers' latents, negative prompt, true CFG) with the adapter at scale 40 on both sides (the
# adapter enters both linearly; after 6 steps at scale 1 it moves the image by < 2/255, too little to
# tell a dropped adapter from a loaded one)
LS=40
expect_rc 0 "$MMC" generate-image --model $P --prompt "a red circle on the left" --negative-prompt green \
  --true-cfg 1.5 --guidance 2 --steps 2 --width 48 --height 32 --max-sequence-length 16 \
  --latents $P/cli_latents.safetensors --lora "$T/run/checkpoint-6:$LS" --out "$T/lora_mmc.png"
if [ -x "$PY" ]; then
  "$PY" - "$P" "$T/run/checkpoint-6" "$LS" "$T/lora_diffusers.png" >"$T/py" 2>&1 <<'PY' && ok || bad "diffusers cannot load mmc's adapter: $(tail -5 "$T/py")"
import sys, torch
from diffusers import FluxPipeline
from safetensors.torch import load_file
pipe = FluxPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[2])
n = sum(1 for k in pipe.transformer.state_dict() if "lora_A" in k)
assert n == 4 + 2 * 4, n   # to_q/k/v/to_out.0 of the double block; to_q/k/v + proj_mlp of 2 single blocks
lat = load_file(sys.argv[1] + "/cli_latents.safetensors")["latents"]
pipe(prompt="a red circle on the left", negative_prompt="green", true_cfg_scale=1.5, height=32, width=48,
     num_inference_steps=2, guidance_scale=2.0, latents=lat, max_sequence_length=16,
     joint_attention_kwargs={"scale": float(sys.argv[3])}).images[0].save(sys.argv[4])
print("loaded", n)
PY
  png_dump "$T/lora_mmc.png" >"$T/lm.txt" 2>/dev/null; png_dump "$T/lora_diffusers.png" >"$T/ld.txt" 2>/dev/null
  png_dump $P/cli_expected.png >"$T/l0.txt" 2>/dev/null
  res=$(paste "$T/lm.txt" "$T/ld.txt" "$T/l0.txt" | awk 'NR > 1 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d
    e = $1 - $3; if (e < 0) e = -e; if (e > 1) moved++; if (e > em) em = e } END { printf "%d %d %d", m, moved + 0, em }')
  set -- $res
  [ -s "$T/ld.txt" ] && [ "$1" -le 1 ] && [ "$2" -ge 20 ] && ok \
    || bad "mmc's adapter in diffusers: image $1/255 off mmc's (want <= 1); the adapter moves $2 channel values by > 1 (want >= 20)"
  echo "mmc's LoRA in diffusers: max $1/255 off mmc's image; the adapter moves $2 channel values (max $3/255)"
else
  echo "test_flux_cli: no reference venv ($PY): the diffusers load of mmc's adapter is skipped"
fi
# ---- mmc train on the SD3 pipeline: LoRA with a validation image, then full fine-tuning with a resume
cat >"$T/sd3.yaml" <<YAML
model:
  path: $S
  lora: {r: 4, alpha: 4, targets: [attn.to_q, attn.to_k, attn.to_v, attn.to_out.0, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj, attn.to_add_out]}
data: {train: tests/fixtures/flux/imagefolder, resolution: 32, batch_size: 2}
flow_matching:
  weighting_scheme: logit_normal
  max_sequence_length: 12
  validation_prompt: a red circle on the left
  validation_steps: 2
optimizer: {lr: 1.0e-3, weight_decay: 1.0e-4}
training: {steps: 4, save_every: 2, log_every: 1, output_dir: $T/sd3run, seed: 7}
YAML
expect_rc 0 "$MMC" train "$T/sd3.yaml"
[ -s "$T/sd3run/checkpoint-4/pytorch_lora_weights.safetensors" ] && ok || bad "SD3 LoRA checkpoint: $(ls "$T/sd3run/checkpoint-4" 2>&1)"
png_dump "$T/sd3run/validation/step-000004.png" >/dev/null 2>"$T/text.txt" && grep -q "^step=4$" "$T/text.txt" && ok \
  || bad "SD3 validation image: $(ls "$T/sd3run" "$T/sd3run/validation" 2>&1)"
nl=$(grep -c '"loss"' "$T/sd3run/metrics.jsonl" 2>/dev/null)
[ "$nl" = 4 ] && ok || bad "SD3 metrics.jsonl has $nl loss lines, want 4"
grep -q '"loss": \(nan\|inf\)' "$T/sd3run/metrics.jsonl" && bad "SD3: non-finite loss" || ok
expect_rc 0 "$MMC" generate-image --model $S --prompt "a red circle on the left" --width 32 --height 32 --steps 2 \
  --guidance 1 --max-sequence-length 12 --lora "$T/sd3run/checkpoint-4" --out "$T/sd3lora.png"
sed -e "/lora:/d" -e "s|output_dir: $T/sd3run|output_dir: $T/sd3full|" -e "/validation_/d" \
    -e "s|steps: 4, save_every: 2|steps: 3, save_every: 2|" "$T/sd3.yaml" >"$T/sd3full.yaml"
expect_rc 0 "$MMC" train "$T/sd3full.yaml"
[ -s "$T/sd3full/checkpoint-3/diffusion_pytorch_model.safetensors" ] && ok || bad "SD3 full checkpoint: $(ls "$T/sd3full/checkpoint-3" 2>&1)"
cp -r "$T/sd3full" "$T/sd3full2" && rm -rf "$T/sd3full2/checkpoint-3"
sed "s|$T/sd3full|$T/sd3full2|" "$T/sd3full.yaml" >"$T/sd3full2.yaml"
expect_rc 0 "$MMC" train "$T/sd3full2.yaml" --resume
cmp -s "$T/sd3full/checkpoint-3/diffusion_pytorch_model.safetensors" "$T/sd3full2/checkpoint-3/diffusion_pytorch_model.safetensors" \
  && ok || bad "SD3: the resumed transformer differs from the uninterrupted run's"
if [ -x "$PY" ]; then
  "$PY" - "$S" "$T/sd3run/checkpoint-4" >"$T/py" 2>&1 <<'PY' && ok || bad "diffusers cannot load mmc's SD3 adapter: $(tail -5 "$T/py")"
import sys, torch
from diffusers import StableDiffusion3Pipeline
pipe = StableDiffusion3Pipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[2])
n = sum(1 for k in pipe.transformer.state_dict() if "lora_A" in k)
assert n > 0, n
print("loaded", n)
PY
fi
echo "test_flux_cli: $((n - fail)) of $n checks passed"
[ $fail = 0 ]
