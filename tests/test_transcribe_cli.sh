#!/usr/bin/env bash
# test_transcribe_cli.sh — `mmc transcribe` on the tiny random Whisper checkpoint of
# tests/fixtures/whisper (tools/ref/gen_whisper.py) with two FLAC files (8 s; 40 s, long-form) and
# the fixture's log-mel features:
#   audio: the ids equal transformers' generate() on WhisperProcessor's features of the same samples;
#   --json: the generated ids equal transformers' generate() (language en, no timestamps;
#           language en with timestamps), the detected language equal; --srt cues well formed;
#   usage and runtime errors: exit 2 for a bad command line, 1 for an unknown language or
#   features of the wrong shape, each with a message.
set -u
MMC=${MMC:-build/mmc}
F=tests/fixtures/whisper
W=$(mktemp -d /tmp/mmc_test_transcribe.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_transcribe_cli: skipped: no mmc binary at $MMC"; exit 77; }
run() { "$MMC" transcribe --model $F/model --features $F/expected.safetensors "$@"; }

# transformers: generate(input_features, language="en", task="transcribe", max_new_tokens=24)
want_en='"tokens": [1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 1838, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232]'
# generate(..., language="en", return_timestamps=True, max_new_tokens=40)
want_ts='"tokens": [482, 232, 1838, 1838, 232, 1891, 1891, 232, 1898, 1898, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 232, 1937, 1937, 446, 232, 1373, 1373, 232, 1838, 1838, 232, 1898, 1898]'

if run --language English --task transcribe --max-new-tokens 24 --json > "$W/en.json" 2> "$W/en.err"; then
  if grep -qF "$want_en" "$W/en.json" && grep -q '"language": "<|en|>"' "$W/en.json" &&
     grep -q '"prompt": \[421, 422, 435, 439\]' "$W/en.json"; then ok; else bad "en tokens: $(cat "$W/en.json")"; fi
else bad "transcribe --language en: $(cat "$W/en.err")"; fi

if run --language en --timestamps --max-new-tokens 40 --json > "$W/ts.json" 2> "$W/ts.err"; then
  grep -qF "$want_ts" "$W/ts.json" && grep -q '"start": 0.84, "end": 27.96' "$W/ts.json" && ok ||
    bad "timestamps: $(cat "$W/ts.json")"
else bad "transcribe --timestamps: $(cat "$W/ts.err")"; fi

# language detection: transformers' detect_language picked <|pl|> on these features
if run --max-new-tokens 4 --json > "$W/det.json" 2> "$W/det.err"; then
  grep -q '"language": "<|pl|>"' "$W/det.json" && ok || bad "detected language: $(cat "$W/det.json")"
else bad "transcribe (detect): $(cat "$W/det.err")"; fi

if run --language en --timestamps --max-new-tokens 40 --srt > "$W/out.srt" 2> "$W/srt.err"; then
  [ "$(sed -n 1p "$W/out.srt")" = 1 ] && sed -n 2p "$W/out.srt" | grep -qE '^00:00:00,840 --> 00:00:27,960$' && ok ||
    bad "srt: $(cat "$W/out.srt")"
else bad "transcribe --srt: $(cat "$W/srt.err")"; fi

# plain text with timestamps: one "[start --> end] text" line per segment
run --language en --timestamps --max-new-tokens 40 > "$W/plain.txt" 2>/dev/null &&
  grep -qE '^\[00:00:00\.840 --> 00:00:27\.960\] ' "$W/plain.txt" && ok || bad "plain timestamps: $(cat "$W/plain.txt")"

# audio files (mmc_audio_load + WhisperFeatureExtractor's features + generate): the 8 s clip padded
# to 30 s, the 40 s one long-form over its 4000 frames; ids equal transformers' on the same samples
for clip in tones_8s tones_40s; do
  want=$(grep -o "\"$clip\": {[^}]*}" $F/audio_expected.json | grep -o '"tokens": \[[0-9, ]*\]')
  frames=$(grep -o "\"$clip\": {[^}]*}" $F/audio_expected.json | grep -o '"frames": [0-9]*' | grep -o '[0-9]*$')
  if "$MMC" transcribe $F/$clip.flac --model $F/model --language en --timestamps --max-new-tokens 40 --json \
       > "$W/$clip.json" 2> "$W/$clip.err"; then
    [ -n "$want" ] && grep -qF "$want" "$W/$clip.json" && grep -q "\"frames\": $frames," "$W/$clip.json" && ok ||
      bad "$clip: want $want ($frames frames), got $(cat "$W/$clip.json")"
  else bad "transcribe $clip.flac: $(cat "$W/$clip.err")"; fi
done
"$MMC" transcribe $F/tones_40s.flac --model $F/model --language en --max-new-tokens 4 --srt > "$W/long.srt" 2>/dev/null &&
  grep -qE '^[0-9]{2}:[0-9]{2}:[0-9]{2},[0-9]{3} --> ' "$W/long.srt" && ok || bad "long srt: $(cat "$W/long.srt")"

# errors
"$MMC" transcribe --help | grep -q -- "--features FILE" && ok || bad "help"
"$MMC" transcribe --features $F/expected.safetensors > /dev/null 2> "$W/e1"; rc=$?
[ $rc = 2 ] && grep -q -- "--model" "$W/e1" && ok || bad "no --model: rc $rc $(cat "$W/e1")"
run --task summarize > /dev/null 2> "$W/e2"; rc=$?
[ $rc = 2 ] && grep -q "transcribe or translate" "$W/e2" && ok || bad "bad task: rc $rc $(cat "$W/e2")"
run --json --srt > /dev/null 2> "$W/e3"; rc=$?
[ $rc = 2 ] && ok || bad "--json --srt: rc $rc"
"$MMC" transcribe $F/tones_8s.flac --features $F/expected.safetensors --model $F/model > /dev/null 2> "$W/e3"; rc=$?
[ $rc = 2 ] && ok || bad "--json --srt: rc $rc"
run --language xx > /dev/null 2> "$W/e4"; rc=$?
[ $rc = 1 ] && grep -q "lang_to_id" "$W/e4" && ok || bad "unknown language: rc $rc $(cat "$W/e4")"
"$MMC" transcribe --model $F/model --features $F/model/model.safetensors > /dev/null 2> "$W/e5"; rc=$?
[ $rc = 1 ] && grep -q "input_features" "$W/e5" && ok || bad "not features: rc $rc $(cat "$W/e5")"
"$MMC" transcribe --model $F/nope --features $F/expected.safetensors > /dev/null 2> "$W/e6"; rc=$?
[ $rc = 1 ] && grep -q "config.json" "$W/e6" && ok || bad "missing model: rc $rc $(cat "$W/e6")"
"$MMC" transcribe $F/nope.wav --model $F/model > /dev/null 2> "$W/e7"; rc=$?
[ $rc = 1 ] && grep -q "nope.wav" "$W/e7" && ok || bad "missing audio: rc $rc $(cat "$W/e7")"
"$MMC" transcribe $F/cases.json --model $F/model > /dev/null 2> "$W/e8"; rc=$?
[ $rc = 1 ] && grep -q "cases.json" "$W/e8" && ok || bad "not audio: rc $rc $(cat "$W/e8")"
"$MMC" transcribe --model $F/model > /dev/null 2> "$W/e9"; rc=$?
[ $rc = 2 ] && ok || bad "no input: rc $rc"

if [ $fail -ne 0 ]; then echo "test_transcribe_cli: $fail of $n checks FAILED"; exit 1; fi
echo "test_transcribe_cli: all $n checks passed"
