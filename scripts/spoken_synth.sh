#!/usr/bin/env bash
# spoken_synth.sh DIR [--silent] — speak the questions of a `mmc synth` dataset with espeak-ng (issue 15's
# spoken-question data): for each line of DIR/train.jsonl and DIR/val.jsonl, its question ("What colour is
# the square?") is spoken to DIR/audio/<split>_<n>.wav (espeak-ng's 22050 Hz mono 16-bit WAV; mmc resamples
# it to 16 kHz on reading), and DIR/<split>_spoken.jsonl gets the line with the question moved to the audio:
#   {"messages": [{"role": "user", "content": "<image><audio>"}, {"role": "assistant", "content": ANSWER}],
#    "images": [IMAGE], "audios": ["audio/<split>_<n>.wav"], "type": TYPE, "question": TEXT, "voice": V, "speed": S}
# Voices and speeds (words per minute) cycle over the lines; the validation split uses voices and speeds
# the training split never does (held-out speakers): train en-us, en-gb, en-gb-scotland, en-029 at 130, 155,
# 180; val en-gb-x-rp, en-us+f3 (a female variant), en-gb-x-gbclan at 145, 170, 195.
# --silent also writes DIR/<split>_silent.jsonl whose audios are silence of the same lengths
# (DIR/audio/<split>_<n>_silent.wav): the control where the question cannot be heard.
# Deterministic for a given espeak-ng version (1.51 in Debian 12). Needs espeak-ng (scripts/bootstrap.sh
# installs it). Runs nproc espeak-ng processes at once.
# mmc trains on these files (Qwen2.5-Omni thinker, `make run-omni` = scripts/demo_omni.sh).
set -euo pipefail
DIR=${1:?usage: spoken_synth.sh DIR [--silent]}
SILENT=${2:-}
command -v espeak-ng >/dev/null || { echo "spoken_synth: espeak-ng is not installed (apt-get install espeak-ng)" >&2; exit 2; }
mkdir -p "$DIR/audio"
TRAIN_VOICES=(en-us en-gb en-gb-scotland en-029); TRAIN_SPEEDS=(130 155 180)
VAL_VOICES=(en-gb-x-rp en-us+f3 en-gb-x-gbclan);  VAL_SPEEDS=(145 170 195)

# silence.wav N OUT: a 22050 Hz mono 16-bit WAV of N zero samples
silence() {
  local n=$1 out=$2 bytes=$(($1 * 2))
  le32() { printf "\\x$(printf %02x $(($1 & 255)))\\x$(printf %02x $((($1 >> 8) & 255)))\\x$(printf %02x $((($1 >> 16) & 255)))\\x$(printf %02x $((($1 >> 24) & 255)))"; }
  { printf 'RIFF'; le32 $((36 + bytes)); printf 'WAVEfmt '; le32 16; printf '\x01\x00\x01\x00'; le32 22050; le32 44100
    printf '\x02\x00\x10\x00data'; le32 $bytes; head -c "$bytes" /dev/zero; } >"$out"
}
# the sample count of a canonical 44-byte-header WAV (espeak-ng's)
wav_samples() { echo $((($(stat -c %s "$1") - 44) / 2)); }

esc() { sed 's/\\/\\\\/g; s/"/\\"/g' <<<"$1"; }
for split in train val; do
  src="$DIR/$split.jsonl"
  [ -f "$src" ] || { echo "spoken_synth: no $src (write the dataset with mmc synth --out $DIR first)" >&2; exit 2; }
  if [ $split = train ]; then voices=("${TRAIN_VOICES[@]}"); speeds=("${TRAIN_SPEEDS[@]}")
  else voices=("${VAL_VOICES[@]}"); speeds=("${VAL_SPEEDS[@]}"); fi
  # one TSV line per sample: question, answer, image, type (the fixed layout mmc synth writes)
  sed -E 's/^\{"messages": \[\{"role": "user", "content": "<image>([^"]*)"\}, \{"role": "assistant", "content": "([^"]*)"\}\], "images": \["([^"]*)"\], "type": "([a-z]*)"\}$/\1\t\2\t\3\t\4/' \
    "$src" >"$DIR/.$split.tsv"
  if grep -qv $'\t' "$DIR/.$split.tsv"; then
    echo "spoken_synth: $src: a line not in mmc synth's layout: $(grep -v $'\t' "$DIR/.$split.tsv" | head -1 | cut -c1-120)" >&2; exit 2
  fi
  : >"$DIR/.$split.jobs"
  : >"$DIR/${split}_spoken.jsonl"
  i=0
  while IFS=$'\t' read -r q a img type; do
    v=${voices[$((i % ${#voices[@]}))]}; s=${speeds[$(((i / ${#voices[@]}) % ${#speeds[@]}))]}
    wav=$(printf 'audio/%s_%06d.wav' $split $i)
    printf '%s\0%s\0%s\0%s\0' "$v" "$s" "$DIR/$wav" "$q" >>"$DIR/.$split.jobs"
    printf '{"messages": [{"role": "user", "content": "<image><audio>"}, {"role": "assistant", "content": "%s"}], "images": ["%s"], "audios": ["%s"], "type": "%s", "question": "%s", "voice": "%s", "speed": %s}\n' \
      "$(esc "$a")" "$img" "$wav" "$type" "$(esc "$q")" "$v" "$s" >>"$DIR/${split}_spoken.jsonl"
    i=$((i + 1))
  done <"$DIR/.$split.tsv"
  xargs -0 -n 4 -P "$(nproc)" sh -c 'espeak-ng -v "$0" -s "$1" -w "$2" "$3"' <"$DIR/.$split.jobs"
  if [ "$SILENT" = --silent ]; then
    sed -E 's/"audios": \["audio\/([a-z]*_[0-9]*)\.wav"\]/"audios": ["audio\/\1_silent.wav"]/' \
      "$DIR/${split}_spoken.jsonl" >"$DIR/${split}_silent.jsonl"
    for ((k = 0; k < i; k++)); do
      w=$(printf '%s/audio/%s_%06d' "$DIR" $split $k)
      silence "$(wav_samples "$w.wav")" "${w}_silent.wav"
    done
  fi
  rm -f "$DIR/.$split.tsv" "$DIR/.$split.jobs"
  echo "spoken_synth: $i $split questions spoken -> $DIR/${split}_spoken.jsonl"
done
