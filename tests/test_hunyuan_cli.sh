#!/usr/bin/env bash
# test_hunyuan_cli.sh — `mmc generate-image` on the tiny HunyuanDiTPipeline folder written by diffusers
# (tests/fixtures/hunyuan/pipe, tools/ref/gen_hunyuan.py): model_index.json's _class_name takes the HunyuanDiT
# path; from diffusers' initial noise (--latents) with a negative prompt, CFG 5 and one DDPM step (whose variance
# noise is scaled by 1e-10, so mmc's draws do not matter) the PNG equals diffusers' within 1/255 per channel (the
# multi-step numerics with torch's draws: test_hunyuan); the tEXt chunks name the pipeline; seeded runs repeat;
# --guidance-rescale changes it; resolution binning maps 64 x 48 to 1024 x 768 (checked on the latents' shape
# error); options not wired are usage errors.
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
  if python3 - "$T/c.png" $P/cli_expected.png >"$T/cmp" 2>&1 <<'PY'
import struct, sys, zlib
def pixels(path):
    data = open(path, "rb").read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype == 2, "8-bit RGB expected"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, out, stride, prev = zlib.decompress(idat), [], w * 3, bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], prev[i - 3] if i >= 3 else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, out
wa, ha, a = pixels(sys.argv[1])
wb, hb, b = pixels(sys.argv[2])
worst = max(abs(x - y) for x, y in zip(a, b)) if (wa, ha) == (wb, hb) else 999
print("size", wa, ha, "vs", wb, hb, "max pixel difference", worst)
sys.exit(0 if worst <= 1 else 1)
PY
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
echo "test_hunyuan_cli: $((n - fail)) of $n checks passed"
[ "$fail" = 0 ]
