#!/usr/bin/env bash
# test_spoken_synth.sh — scripts/spoken_synth.sh (issue 15's spoken-question data) end to end: `mmc synth`
# writes a small shapes dataset, espeak-ng speaks its questions (train and held-out validation voices) and
# writes silent controls of the same lengths; then every spoken and silent clip goes through mmc's audio
# path (`mmc generate --audio` with the Qwen2.5-Omni thinker fixture reads each one, `mmc transcribe` with
# the Whisper fixture one), and `mmc generate --image --audio` answers one spoken and one silent validation
# question, whose prompts have the same length (same clip length -> same audio token count). Also: espeak-ng 1.51 speaks the committed
# fixture sentence (tests/fixtures/spoken/colour.wav) to the same bytes (when the installed version
# is another, that check is reported and skipped). Skips (77) without espeak-ng.
set -u
MMC=${MMC:-build/mmc}
[ -x "$MMC" ] || { echo "test_spoken_synth: skipped: no mmc binary at $MMC"; exit 77; }
command -v espeak-ng >/dev/null || { echo "test_spoken_synth: skipped: espeak-ng is not installed (apt-get install espeak-ng; make deps installs it)"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_spoken_synth.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }

"$MMC" synth --out "$W/d" --train 6 --val 4 >/dev/null 2>"$W/err" && ok || { bad "mmc synth: $(cat "$W/err")"; exit 1; }
bash scripts/spoken_synth.sh "$W/d" --silent >"$W/out" 2>"$W/err" && ok || { bad "spoken_synth.sh: $(cat "$W/err")"; exit 1; }
for split in train val; do
  lines=$(wc -l <"$W/d/$split.jsonl")
  [ "$(wc -l <"$W/d/${split}_spoken.jsonl")" = "$lines" ] && [ "$(wc -l <"$W/d/${split}_silent.jsonl")" = "$lines" ] && ok \
    || bad "$split: line counts differ"
  # each spoken line: the question moved to an audio part, the answer and image kept
  paste -d'\n' "$W/d/$split.jsonl" "$W/d/${split}_spoken.jsonl" | while read -r orig && read -r sp; do
    q=$(sed -E 's/.*"content": "<image>([^"]*)".*/\1/' <<<"$orig")
    a=$(sed -E 's/.*"assistant", "content": "([^"]*)".*/\1/' <<<"$orig")
    grep -qF "\"content\": \"<image><audio>\"}, {\"role\": \"assistant\", \"content\": \"$a\"}" <<<"$sp" &&
      grep -qF "\"question\": \"$q\"" <<<"$sp" || echo "$sp"
  done >"$W/badlines"
  [ ! -s "$W/badlines" ] && ok || bad "$split: spoken lines do not match their sources: $(head -2 "$W/badlines")"
done
# held-out voices: no validation voice is a training voice
tv=$(grep -o '"voice": "[^"]*"' "$W/d/train_spoken.jsonl" | sort -u)
vv=$(grep -o '"voice": "[^"]*"' "$W/d/val_spoken.jsonl" | sort -u)
[ -n "$vv" ] && [ -z "$(comm -12 <(echo "$tv") <(echo "$vv"))" ] && ok || bad "validation voices overlap training's: $vv / $tv"

# every clip through mmc's audio path (16 kHz resampling, 128-bin features, the omni audio tower): generate
# --audio with the tiny thinker reads each one; transcribe (the tiny Whisper) one spoken question
nclips=0
for f in "$W"/d/audio/*.wav; do
  nclips=$((nclips + 1))
  "$MMC" generate --model tests/fixtures/omni/thinker --audio "$f" --prompt "?" --max-new-tokens 1 --json >"$W/a.json" 2>"$W/a.err" \
    && grep -q '"new_tokens": 1' "$W/a.json" || { bad "generate --audio $(basename "$f"): $(cat "$W/a.err")"; break; }
done
[ $nclips = 20 ] && ok || bad "expected 20 clips (10 spoken, 10 silent), found $nclips"
"$MMC" transcribe "$W/d/audio/val_000001.wav" --model tests/fixtures/whisper/model --language en --max-new-tokens 2 --json \
  >"$W/t.json" 2>"$W/t.err" && grep -q '"frames": 3000' "$W/t.json" && ok || bad "transcribe: $(cat "$W/t.err")"
# spoken vs silent: same length, so the same prompt length; the silent clip holds only zeros
sz1=$(stat -c %s "$W/d/audio/val_000000.wav"); sz2=$(stat -c %s "$W/d/audio/val_000000_silent.wav")
[ "$sz1" = "$sz2" ] && ok || bad "silent control length $sz2 != spoken $sz1"
[ -z "$(tail -c +45 "$W/d/audio/val_000000_silent.wav" | tr -d '\0' | head -c 1)" ] && ok || bad "the silent clip is not silent"
img=$(sed -E 's/.*"images": \["([^"]*)"\].*/\1/' <(head -1 "$W/d/val_spoken.jsonl"))
for kind in "" _silent; do
  "$MMC" generate --model tests/fixtures/omni/thinker --image "$W/d/$img" --audio "$W/d/audio/val_000000$kind.wav" \
    --prompt "Answer the spoken question." --max-new-tokens 4 --json >"$W/g$kind.json" 2>"$W/g.err" && ok \
    || bad "generate with val_000000$kind.wav: $(cat "$W/g.err")"
done
p1=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/g.json"); p2=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/g_silent.json")
[ -n "$p1" ] && [ "$p1" = "$p2" ] && ok || bad "spoken and silent prompts differ in length: $p1 / $p2"

# determinism: the fixture sentence spoken again
if espeak-ng --version | grep -q ' 1\.51 '; then
  espeak-ng -v en-us -s 160 -w "$W/colour.wav" "What colour is the square?"
  cmp -s "$W/colour.wav" tests/fixtures/spoken/colour.wav && ok || bad "espeak-ng 1.51 no longer gives tests/fixtures/spoken/colour.wav"
else
  echo "test_spoken_synth: note: espeak-ng is $(espeak-ng --version | cut -c1-40), not 1.51: the byte-identical check is skipped"
fi
echo "test_spoken_synth: $((n - fail))/$n checks passed"
[ $fail = 0 ]
