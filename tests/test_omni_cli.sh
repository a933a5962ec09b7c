#!/usr/bin/env bash
# test_omni_cli.sh — `mmc generate --audio` and `mmc info` on the tiny Qwen2.5-Omni checkpoints of
# tools/ref/gen_omni.py (tests/fixtures/omni): the thinker and the full
# Qwen2_5OmniForConditionalGeneration (thinker.* weights), each with the fixture WAV (audio case) and
# the WAV plus the fixture image (image_audio case), and tests/fixtures/audio/video.mp4 with
# --audio-in-video (cli_video: every frame, its AAC track, interleaved TMRoPE), through the
# directory's chat template.
# Against transformers 5.23 on the same directories: the prompt token count and the 8 greedy new
# tokens are equal; `mmc forward` gives the same prompt length and last-position argmax. Also: --audio on a model that is not Qwen2.5-Omni is refused with a message, and
# `mmc info` on the full checkpoint says the talker / token2wav (speech output) are not supported.
set -u
MMC=${MMC:-build/mmc}
E=tests/fixtures/omni
W=$(mktemp -d /tmp/mmc_test_omni.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_omni_cli: skipped: no mmc binary at $MMC"; exit 77; }

np_of() { sed -n "/\"$1\"/,/}/p" "$E/expected.json" | sed -n 's/.*"n_prompt": \([0-9]*\).*/\1/p' | head -1; }
for dir in thinker full; do
  while IFS=$'\t' read -r case ids; do
    [ -n "$case" ] || continue
    if [ "$case" = image_audio ]; then media=(--image "$E/image.png" --audio "$E/audio.wav"); prompt="Describe both."
    elif [ "$case" = cli_video ]; then media=(--video tests/fixtures/audio/video.mp4 --audio-in-video); prompt="What happens?"
    else media=(--audio "$E/audio.wav"); prompt="What did you hear?"; fi
    "$MMC" generate --model "$E/$dir" "${media[@]}" --prompt "$prompt" --max-new-tokens 8 --json >"$W/gen" 2>"$W/err"
    rc=$?
    [ $rc = 0 ] && ok || { bad "$dir $case: generate exited $rc: $(cat "$W/err")"; continue; }
    got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ',')
    [ "$got" = "$ids" ] && ok || bad "$dir $case: generate tokens [$got] != transformers [$ids]"
    gotn=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/gen")
    want=$(np_of "$case")
    [ "$gotn" = "$want" ] && ok || bad "$dir $case: prompt_tokens $gotn != transformers $want"
    # forward: the prompt's length and the last position's argmax (the first greedy token)
    "$MMC" forward --model "$E/$dir" "${media[@]}" --prompt "$prompt" --out "$W/fw.safetensors" --json >"$W/fw" 2>"$W/err" \
      && grep -q "\"tokens\": $want," "$W/fw" && grep -q "\"argmax_last\": ${ids%% *}," "$W/fw" && ok \
      || bad "$dir $case: forward: $(cat "$W/fw" "$W/err")"
  done <"$E/expected.tsv"
done

# audio needs an omni model
"$MMC" generate --model tests/fixtures/llava/v5 --audio "$E/audio.wav" --prompt x >"$W/out" 2>"$W/err"
rc=$?
[ $rc != 0 ] && grep -q "audio input needs a Qwen2.5-Omni model" "$W/err" && ok \
  || bad "--audio on llava: rc $rc, $(cat "$W/err")"
# --audio-in-video needs a video file, and an omni model
"$MMC" generate --model "$E/thinker" --audio-in-video --prompt x >"$W/out" 2>"$W/err"
rc=$?
[ $rc != 0 ] && grep -q -- "--audio-in-video needs a video file" "$W/err" && ok || bad "--audio-in-video alone: rc $rc, $(cat "$W/err")"
"$MMC" generate --model tests/fixtures/llava/v5 --video tests/fixtures/audio/video.mp4 --audio-in-video --prompt x >"$W/out" 2>"$W/err"
rc=$?
[ $rc != 0 ] && grep -q -- "--audio-in-video needs a Qwen2.5-Omni model" "$W/err" && ok || bad "--audio-in-video on llava: rc $rc, $(cat "$W/err")"
# a missing audio file names it
"$MMC" generate --model "$E/thinker" --audio "$W/none.wav" --prompt x >"$W/out" 2>"$W/err"
rc=$?
[ $rc != 0 ] && grep -q "none.wav" "$W/err" && ok || bad "missing audio file: rc $rc, $(cat "$W/err")"

# mmc info: the full checkpoint's speech output is not supported, the thinker is
"$MMC" info "$E/full" >"$W/info" 2>&1 && ok || bad "info full failed: $(cat "$W/info")"
grep -q "speech output:  not supported: the talker and token2wav" "$W/info" && ok || bad "info full: $(cat "$W/info")"
grep -q "the thinker (text output) is" "$W/info" && ok || bad "info full: no thinker line"
"$MMC" info "$E/full" --json >"$W/info" 2>&1 && grep -q '"supported": true' "$W/info" && grep -q '"speech_output"' "$W/info" \
  && ok || bad "info --json full: $(cat "$W/info")"
"$MMC" info "$E/thinker" >"$W/info" 2>&1 && ! grep -q "speech output" "$W/info" && grep -q "Qwen2.5-Omni thinker" "$W/info" \
  && ok || bad "info thinker: $(cat "$W/info")"

echo "test_omni_cli: $((n - fail))/$n checks passed"
[ $fail = 0 ]
