#!/usr/bin/env bash
# test_video_cli.sh — `mmc generate/forward --video FILE` end to end: an H.264 clip sampled at
# 2 fps through FFmpeg gives transformers' prompt length and greedy tokens on the tiny Qwen2-VL
# chat fixture (tools/ref/gen_video.py -> tests/fixtures/video/chat_expected.json); a folder of
# frames still works; bad files and options fail with a message naming them.
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }
VLDIR=tests/fixtures/qwen2_vl_chat
V=tests/fixtures/video
want=$(sed -E 's/.*"new_ids": (\[[^]]*\]).*/\1/' $V/chat_expected.json)
np=$(sed -E 's/.*"prompt_tokens": ([0-9]+).*/\1/' $V/chat_expected.json)
expect_rc 0 "$MMC" generate --model $VLDIR --video $V/moving.mp4 --prompt "What moves?" --max-new-tokens 8 --json
got=$(sed -E 's/.*"tokens": (\[[^]]*\]).*/\1/' "$T/out")
if [ "$got" = "$want" ]; then ok; else bad "video generate tokens $got != transformers $want"; fi
grep -q "\"prompt_tokens\": $np," "$T/out" && ok || bad "prompt_tokens: $(cat "$T/out") (transformers $np)"
# forward runs on the same inputs
expect_rc 0 "$MMC" forward --model $VLDIR --video $V/moving.mp4 --prompt "What moves?" --out "$T/fw.safetensors"
# sampling overrides change the token count: 2 frames instead of 4 halve the video tokens
expect_rc 0 "$MMC" generate --model $VLDIR --video $V/moving.mp4 --video-frames 2 --prompt "What moves?" --max-new-tokens 1 --json
n2=$(sed -E 's/.*"prompt_tokens": ([0-9]+).*/\1/' "$T/out")
[ "$n2" -lt "$np" ] 2>/dev/null && ok || bad "--video-frames 2 gave $n2 prompt tokens (4 frames: $np)"
# chat: the video goes with the first message
printf 'What moves?\n' | "$MMC" chat --model $VLDIR --video $V/moving.mp4 --max-new-tokens 2 >"$T/out" 2>"$T/err" && ok || bad "chat --video: $(cat "$T/err")"
# chat: /video attaches one to the next message (one per conversation)
printf 'Hello\n/video %s\nWhat moves?\n/video %s\n' $V/moving.mp4 $V/moving.mp4 | "$MMC" chat --model $VLDIR --max-new-tokens 2 >"$T/out" 2>"$T/err" \
  && grep -q "video attached" "$T/err" && grep -q "one video per conversation" "$T/err" && ok || bad "chat /video: $(cat "$T/err")"
# a folder of frames still works
mkdir -p "$T/frames"
cp tests/fixtures/image/rgb_500x333.jpg "$T/frames/0001.jpg"; cp tests/fixtures/image/rgb_500x333.jpg "$T/frames/0002.jpg"
expect_rc 0 "$MMC" generate --model $VLDIR --video "$T/frames" --prompt "What moves?" --max-new-tokens 1
# errors: missing, not a video, truncated, bad option value
expect_rc 1 "$MMC" generate --model $VLDIR --video "$T/none.mp4" --prompt x; expect_err "none.mp4"
expect_rc 1 "$MMC" generate --model $VLDIR --video $V/expected.json --prompt x; expect_err "not a video"
head -c 3000 $V/moving.mp4 > "$T/cut.mp4"
expect_rc 1 "$MMC" generate --model $VLDIR --video "$T/cut.mp4" --prompt x; expect_err "cut.mp4"
expect_rc 2 "$MMC" generate --model $VLDIR --video $V/moving.mp4 --video-fps zero --prompt x; expect_err "video-fps"
echo "$((n - fail)) passed, $fail failed"
[ $fail -eq 0 ]
