#!/usr/bin/env bash
# test_spoken_cli.sh — `mmc transcribe` and `mmc generate --image --audio` on the espeak-ng questions of
# tests/fixtures/spoken (tools/ref/gen_spoken.py: 22050 Hz WAVs, resampled to 16 kHz on reading), with the
# tiny random Whisper (tests/fixtures/whisper/model) and Qwen2.5-Omni thinker (tests/fixtures/omni/thinker).
# Against transformers 5.23 on the same files: Whisper's generated ids (language en, max_new_tokens 24 per
# window) equal; the omni prompt length (Qwen2_5OmniProcessor's audio token count) and 8 greedy new tokens
# equal. Tolerance: none (integer ids). The features are checked numerically in test_spoken.c.
set -u
MMC=${MMC:-build/mmc}
S=tests/fixtures/spoken
W=$(mktemp -d /tmp/mmc_test_spoken.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_spoken_cli: skipped: no mmc binary at $MMC"; exit 77; }
clip_json() { grep -o "\"$1\": {\"text\"[^}]*}[^}]*}[^}]*}" $S/expected.json; }
for clip in colour count; do
  e=$(clip_json $clip)
  want=$(grep -o '"whisper": {"tokens": \[[0-9, ]*\]' <<<"$e" | sed 's/"whisper": {//')
  if "$MMC" transcribe $S/$clip.wav --model tests/fixtures/whisper/model --language en --max-new-tokens 24 --json \
       >"$W/t.json" 2>"$W/t.err"; then
    [ -n "$want" ] && grep -qF "$want, \"prompt\"" "$W/t.json" && ok || bad "$clip: transcribe ids differ: want $want, got $(head -c 600 "$W/t.json")"
  else bad "$clip: transcribe failed: $(cat "$W/t.err")"; fi
  np=$(grep -o '"n_prompt": [0-9]*' <<<"$e" | grep -o '[0-9]*$')
  gi=$(grep -o '"greedy_ids": \[[0-9, ]*\]' <<<"$e" | sed 's/.*\[//; s/\]//; s/,//g')
  if "$MMC" generate --model tests/fixtures/omni/thinker --image tests/fixtures/omni/image.png --audio $S/$clip.wav \
       --prompt "Answer the spoken question." --max-new-tokens 8 --json >"$W/g.json" 2>"$W/g.err"; then
    got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/g.json" | tr -d ',')
    gotn=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/g.json")
    [ -n "$np" ] && [ "$gotn" = "$np" ] && ok || bad "$clip: prompt tokens $gotn != transformers $np"
    [ -n "$gi" ] && [ "$got" = "$gi" ] && ok || bad "$clip: greedy [$got] != transformers [$gi]"
  else bad "$clip: generate failed: $(cat "$W/g.err")"; fi
done
echo "test_spoken_cli: $((n - fail))/$n checks passed"
[ $fail = 0 ]
