#!/usr/bin/env bash
# test_generate_video_cli.sh — `mmc generate-video` on the tiny WanPipeline folder written by diffusers
# (tests/fixtures/wan/pipe, tools/ref/gen_wan.py):
#  - from diffusers' own initial noise (--latents), 2 steps without guidance, into a folder of PNG frames:
#    every frame equals the uint8 frame diffusers hands export_to_video (output_type="np", truncated)
#    within 1/255 per channel (float differences of ~5e-6 may truncate a value the other way), and
#    settings.json holds the prompt, frames, fps;
#  - --lora (WanPipeline.save_lora_weights' file) changes the frames and is recorded;
#  - MP4 (H.264), GIF and lossless MKV outputs by extension, with --json timings; CFG with a negative prompt;
#  - image to video with a WanImageToVideoPipeline folder (--image): frames equal diffusers' within 1/255;
#    --image refused by a text-to-video folder and required by an image-to-video one;
#  - first-last-frame to video (--image + --last-image on an FLF2V folder): frames equal diffusers' within 1/255;
#    --last-image required by an FLF2V folder and refused by the others;
#  - a frame count that is not 4k + 1 and a size the VAE cannot take name the nearest valid value;
#    latents of the wrong shape name the shape; bad options are usage errors; --help lists the options.
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
P=tests/fixtures/wan/pipe
if [ ! -f $P/cli_latents.safetensors ]; then echo "fixtures absent (tools/ref/gen_wan.py); skipping"; exit 77; fi
if ! command -v python3 >/dev/null; then echo "python3 (stdlib only) is needed to read the PNGs; skipping"; exit 77; fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(tail -3 "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(tail -3 "$T/err")"; fi; }
ARGS=(--model $P --width 48 --height 32 --frames 9 --max-sequence-length 12)

# PNG frames of two folders -> "frames values differing max bad" (stdlib only: zlib, struct)
png_cmp() { python3 - "$1" "$2" <<'PY'
import os, struct, sys, zlib
def load(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8]); body = data[pos + 8:pos + 8 + n]; pos += 12 + n
        if kind == b"IHDR": w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT": idat += body
    assert depth == 8 and ctype == 2, "8-bit RGB expected"
    raw, bpp, stride, out, prev = zlib.decompress(idat), 3, w * 3, bytearray(), bytearray(w * 3)
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
    return (w, h), out
got = sorted(f for f in os.listdir(sys.argv[1]) if f.endswith(".png"))
want = sorted(f for f in os.listdir(sys.argv[2]) if f.endswith(".png"))
if got != want: print(len(got), 0, 999, 999); sys.exit()
diff = m = badv = 0
for f in want:
    (sg, a), (sw, b) = load(os.path.join(sys.argv[1], f)), load(os.path.join(sys.argv[2], f))
    if sg != sw: print(len(got), 0, 999, 999); sys.exit()
    for x, y in zip(a, b):
        d = abs(x - y); diff += d > 0; badv += d > 1; m = max(m, d)
print(len(got), diff, m, badv)
PY
}

# ---- PNG frames against diffusers'
expect_rc 0 "$MMC" generate-video "${ARGS[@]}" --prompt "a red cat walks on the beach" --guidance 1 --steps 2 \
  --latents $P/cli_latents.safetensors --fps 8 --out "$T/frames/"
set -- $(png_cmp "$T/frames" $P/cli_expected)
[ "$1" = 9 ] && [ "$4" = 0 ] && ok || bad "frames differ from diffusers': $1 frames, $4 values off by > 1 (max $3)"
echo "generate-video vs diffusers: $1 frames, $2 channel values differ (max $3/255)"
grep -q '"frames": 9' "$T/frames/settings.json" && grep -q '"fps": 8' "$T/frames/settings.json" \
  && grep -q 'prompt: a red cat walks on the beach' "$T/frames/settings.json" && ok \
  || bad "settings.json: $(cat "$T/frames/settings.json")"

# ---- --lora (a diffusers adapter written by WanPipeline.save_lora_weights) changes the frames
expect_rc 0 "$MMC" generate-video "${ARGS[@]}" --prompt "a red cat walks on the beach" --guidance 1 --steps 2 \
  --latents $P/cli_latents.safetensors --lora tests/fixtures/wan/lora:0.8 --out "$T/lora/"
set -- $(png_cmp "$T/lora" $P/cli_expected)
[ "$1" = 9 ] && [ "$2" -gt 100 ] && ok || bad "--lora did not change the frames ($2 values differ)"
grep -q 'lora: tests/fixtures/wan/lora:0.8' "$T/lora/settings.json" && ok || bad "settings.json lacks the LoRA"
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --lora "$T/nothing-here" --out "$T/e.mp4"

# ---- MP4 / GIF / MKV by extension; CFG with a negative prompt; --json
expect_rc 0 "$MMC" generate-video "${ARGS[@]}" --prompt "a dog runs" --negative-prompt "grass" --guidance 4 --steps 2 \
  --seed 5 --out "$T/v.mp4" --json
grep -q '"s_per_step"' "$T/out" && grep -q '"vae_decode_s"' "$T/out" && grep -q '"peak_rss_mib"' "$T/out" && ok \
  || bad "--json lacks timings: $(cat "$T/out")"
[ "$(head -c 8 "$T/v.mp4" | tail -c 4)" = ftyp ] && ok || bad "v.mp4 is not an MP4"
expect_rc 0 "$MMC" generate-video "${ARGS[@]}" --prompt "a dog runs" --steps 1 --output "$T/v.gif"
[ "$(head -c 6 "$T/v.gif")" = GIF89a ] && ok || bad "v.gif is not a GIF"
grep -q "VAE decode" "$T/err" && grep -q "denoising" "$T/err" && ok || bad "no progress lines: $(cat "$T/err")"
expect_rc 0 "$MMC" generate-video "${ARGS[@]}" --prompt "a dog runs" --steps 1 --out "$T/v.mkv"
[ -s "$T/v.mkv" ] && ok || bad "no v.mkv"

# ---- image to video (tests/fixtures/wan_i2v/pipe, a WanImageToVideoPipeline, tools/ref/gen_wan_i2v.py): from
# diffusers' noise, 2 steps without guidance, the first frame from input.png; frames as diffusers hands them
# to export_to_video, within 1/255
I=tests/fixtures/wan_i2v/pipe
IARGS=(--model $I --width 48 --height 32 --frames 9 --prompt "a red cat walks on the beach")
expect_rc 0 "$MMC" generate-video "${IARGS[@]}" --image $I/input.png --guidance 1 --steps 2 \
  --latents $I/cli_latents.safetensors --out "$T/i2v/"
set -- $(png_cmp "$T/i2v" $I/cli_expected)
[ "$1" = 9 ] && [ "$4" = 0 ] && ok || bad "image-to-video frames differ from diffusers': $1 frames, $4 values off by > 1 (max $3)"
echo "generate-video --image vs diffusers' WanImageToVideoPipeline: $1 frames, $2 channel values differ (max $3/255)"
grep -q 'image: tests/fixtures/wan_i2v/pipe/input.png' "$T/i2v/settings.json" && grep -q 'WanImageToVideoPipeline' \
  "$T/i2v/settings.json" && ok || bad "settings.json lacks the image: $(cat "$T/i2v/settings.json")"
expect_rc 2 "$MMC" generate-video "${IARGS[@]}" --out "$T/e.mp4"
expect_err "image-to-video pipeline: --image F"
expect_rc 2 "$MMC" generate-video "${ARGS[@]}" --prompt x --image $I/input.png --out "$T/e.mp4"
expect_err "takes no --image"
expect_rc 1 "$MMC" generate-video "${IARGS[@]}" --image "$T/no-such.png" --out "$T/e.mp4"
expect_err "no-such.png"

# ---- first-last-frame to video (tests/fixtures/wan_flf2v/pipe: pos_embed_seq_len, tools/ref/gen_wan_flf2v.py):
# --image and --last-image as the pipeline's image / last_image; frames within 1/255 of diffusers'
L=tests/fixtures/wan_flf2v/pipe
LARGS=(--model $L --width 48 --height 32 --frames 9 --prompt "a red cat walks on the beach")
expect_rc 0 "$MMC" generate-video "${LARGS[@]}" --image $L/first.png --last-image $L/last.png --guidance 1 --steps 2 \
  --latents $L/cli_latents.safetensors --out "$T/flf2v/"
set -- $(png_cmp "$T/flf2v" $L/cli_expected)
[ "$1" = 9 ] && [ "$4" = 0 ] && ok || bad "first-last-frame frames differ from diffusers': $1 frames, $4 values off by > 1 (max $3)"
echo "generate-video --image --last-image vs diffusers' WanImageToVideoPipeline(last_image): $1 frames, $2 channel values differ (max $3/255)"
grep -q 'last_image: tests/fixtures/wan_flf2v/pipe/last.png' "$T/flf2v/settings.json" && ok \
  || bad "settings.json lacks the last image: $(cat "$T/flf2v/settings.json")"
expect_rc 2 "$MMC" generate-video "${LARGS[@]}" --image $L/first.png --out "$T/e.mp4"
expect_err "needs the last frame too"
expect_rc 2 "$MMC" generate-video "${IARGS[@]}" --image $I/input.png --last-image $L/last.png --out "$T/e.mp4"
expect_err "needs a first-last-frame (FLF2V) transformer"
expect_rc 2 "$MMC" generate-video "${ARGS[@]}" --prompt x --last-image $L/last.png --out "$T/e.mp4"
expect_err "takes no --last-image"
expect_rc 1 "$MMC" generate-video "${LARGS[@]}" --image $L/first.png --last-image "$T/no-such-last.png" --out "$T/e.mp4"
expect_err "no-such-last.png"

# ---- errors
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --frames 10 --out "$T/e.mp4"
expect_err "nearest valid count is 9"
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --frames 12 --out "$T/e.mp4"
expect_err "nearest valid count is 13"
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --height 40 --out "$T/e.mp4"
expect_err "nearest valid size is 48x48"
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --frames 13 --latents $P/cli_latents.safetensors --out "$T/e.mp4"
expect_err "latents must be \[1, 4, 4, 4, 6\]"
expect_rc 1 "$MMC" generate-video "${ARGS[@]}" --prompt x --steps 1 --out "$T/e.avi"
[ ! -e "$T/e.avi" ] && ok || bad "an unknown extension left a file"
expect_rc 1 "$MMC" generate-video --model tests/fixtures/flux/pipe --prompt x
expect_err "not a WanPipeline"
expect_rc 2 "$MMC" generate-video --model $P
expect_err "--prompt TEXT is required"
expect_rc 2 "$MMC" generate-video --model $P --prompt x --fps 0
expect_rc 2 "$MMC" generate-video --model $P --prompt x --frobnicate 1
expect_err "unknown option '--frobnicate'"
expect_rc 0 "$MMC" generate-video --help
for o in --image --last-image --frames --fps --negative-prompt --guidance --seed --lora --latents --out --steps --width --height --json; do
  grep -q -- "$o" "$T/out" && ok || bad "--help lacks $o"
done
"$MMC" --help 2>&1 | grep -q "generate-video" && ok || bad "mmc --help does not list generate-video"

echo "test_generate_video_cli: $((n - fail)) of $n checks passed"
[ $fail = 0 ]
