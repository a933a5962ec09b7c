#!/usr/bin/env bash
# spoken_synth.sh DIR [--silent] — speak the questions of a `mmc synth` dataset with espeak-ng (issue 15's
# spoken-question data): for each line of DIR/train.jsonl and DIR/val.jsonl, its question ("What colour is
# the square?") is spoken to DIR/audio/<split>_<n>.wav (espeak-ng's 22050 Hz mono 16-bit WAV; mmc resamples
# it to 16 kHz on reading), and DIR/<split>_spoken.jsonl gets the line with the question moved to the audio:
#   {"messages": [{"role": "user", "content": "<image><audio>"}, {"role": "assistant", "content": ANSWER}],
#    "images": [IMAGE], "audios": ["audio/<split>_<n>.wav"], "type": TYPE, "question": TEXT, "voice": V, "speed": S}
# Voices, speeds (words per minute) and pitches are drawn per line from a hash of its index (a
# deterministic shuffle: cycling them in step with mmc synth's cycle of question types would tie each
# voice to one type, a cue a model picks up instead of the words). The validation split uses voices
# and speeds the training split never does (held-out speakers): val en-gb-x-rp, en-us+f3,
# en-gb-x-gbclan at 145, 170, 195 wpm, espeak-ng's default pitch (50); train the accents en-us, en-gb,
# en-gb-scotland, en-029, en-gb-x-gbcwmd, en-us-nyc, each plain or with one of 18 voice variants (male
# m1-m7, female f1, f2, f4, f5 (never f3), klatt, klatt2, and others), at 130, 155, 180, 205 wpm and
# pitch 30, 50, 70: that variety is what lets a tiny model trained on them hear voices it never heard
# (scripts/demo_omni.sh).
# SPOKEN_POOL=P (training split only): each question text is spoken in P clips (clip k of a text: its
# voice, speed and pitch drawn from a hash of (text, k)) and line i takes clip hash(i) mod P, so a
# dataset of many images and few question texts needs at most P clips per text (audio/train_qNN_KKKKK.wav).
# --silent also writes DIR/<split>_silent.jsonl whose audios are silence of the same lengths
# (DIR/audio/<clip>_silent.wav): the control where the question cannot be heard.
# Deterministic for a given espeak-ng version (1.51 in Debian 12). Needs espeak-ng (scripts/bootstrap.sh
# installs it). Runs nproc espeak-ng processes at once.
# mmc trains on these files (Qwen2.5-Omni thinker, `make run-omni` = scripts/demo_omni.sh).
set -euo pipefail
DIR=${1:?usage: spoken_synth.sh DIR [--silent]}
SILENT=${2:-}
POOL=${SPOKEN_POOL:-0}
command -v espeak-ng >/dev/null || { echo "spoken_synth: espeak-ng is not installed (apt-get install espeak-ng)" >&2; exit 2; }
mkdir -p "$DIR/audio"
TRAIN_VOICES=()
for accent in en-us en-gb en-gb-scotland en-029 en-gb-x-gbcwmd en-us-nyc; do
  for variant in "" +m1 +m2 +m3 +m4 +m5 +m6 +m7 +f1 +f2 +f4 +f5 +klatt +klatt2 +Andy +Annie +belinda +edward +john; do
    TRAIN_VOICES+=("$accent$variant")
  done
done
TRAIN_SPEEDS=(130 155 180 205); TRAIN_PITCHES=(30 50 70)
VAL_VOICES=(en-gb-x-rp en-us+f3 en-gb-x-gbclan); VAL_SPEEDS=(145 170 195); VAL_PITCHES=(50)

# silence SPOKEN.wav OUT: the spoken clip's canonical 44-byte header (espeak-ng's: 22050 Hz mono 16-bit,
# its length) followed by as many zero samples
silence() { { head -c 44 "$1"; head -c $(($(stat -c %s "$1") - 44)) /dev/zero; } >"$2"; }

esc() { local x=${1//\\/\\\\}; printf '%s' "${x//\"/\\\"}"; }
for split in train val; do
  src="$DIR/$split.jsonl"
  [ -f "$src" ] || { echo "spoken_synth: no $src (write the dataset with mmc synth --out $DIR first)" >&2; exit 2; }
  if [ $split = train ]; then voices=("${TRAIN_VOICES[@]}"); speeds=("${TRAIN_SPEEDS[@]}"); pitches=("${TRAIN_PITCHES[@]}")
  else voices=("${VAL_VOICES[@]}"); speeds=("${VAL_SPEEDS[@]}"); pitches=("${VAL_PITCHES[@]}"); fi
  nv=${#voices[@]}; ns=${#speeds[@]}; np=${#pitches[@]}
  # one TSV line per sample: question, answer, image, type (the fixed layout mmc synth writes)
  sed -E 's/^\{"messages": \[\{"role": "user", "content": "<image>([^"]*)"\}, \{"role": "assistant", "content": "([^"]*)"\}\], "images": \["([^"]*)"\], "type": "([a-z]*)"\}$/\1\t\2\t\3\t\4/' \
    "$src" >"$DIR/.$split.tsv"
  if grep -qv $'\t' "$DIR/.$split.tsv"; then
    echo "spoken_synth: $src: a line not in mmc synth's layout: $(grep -v $'\t' "$DIR/.$split.tsv" | head -1 | cut -c1-120)" >&2; exit 2
  fi
  : >"$DIR/.$split.jobs"
  : >"$DIR/${split}_spoken.jsonl"
  pool=0; [ $split = train ] && pool=$POOL
  declare -A qid=() spoken=()
  i=0
  while IFS=$'\t' read -r q a img type; do
    h=$(((i * 2654435761 + 12345) % 4294967296 >> 8))   # (Knuth's multiplicative hash; its high bits)
    if [ "$pool" -gt 0 ]; then
      # the question's clip number k of the pool: its voice, speed and pitch drawn from k's hash
      [ -n "${qid[$q]:-}" ] || qid[$q]=${#qid[@]}
      k=$((h % pool)); h=$(((qid[$q] * pool + k) * 2654435761 % 4294967296 >> 8))
      printf -v wav 'audio/%s_q%02d_%05d.wav' $split "${qid[$q]}" $k
    else
      printf -v wav 'audio/%s_%06d.wav' $split $i
    fi
    v=${voices[$((h % nv))]}; s=${speeds[$(((h / nv) % ns))]}; p=${pitches[$(((h / (nv * ns)) % np))]}
    [ -n "${spoken[$wav]:-}" ] || printf '%s\0%s\0%s\0%s\0%s\0' "$v" "$s" "$p" "$DIR/$wav" "$q" >>"$DIR/.$split.jobs"
    spoken[$wav]=1
    printf '{"messages": [{"role": "user", "content": "<image><audio>"}, {"role": "assistant", "content": "%s"}], "images": ["%s"], "audios": ["%s"], "type": "%s", "question": "%s", "voice": "%s", "speed": %s, "pitch": %s}\n' \
      "$(esc "$a")" "$img" "$wav" "$type" "$(esc "$q")" "$v" "$s" "$p" >>"$DIR/${split}_spoken.jsonl"
    i=$((i + 1))
  done <"$DIR/.$split.tsv"
  xargs -0 -n 5 -P "$(nproc)" sh -c 'espeak-ng -v "$0" -s "$1" -p "$2" -w "$3" "$4"' <"$DIR/.$split.jobs"
  if [ "$SILENT" = --silent ]; then
    sed -E 's/"audios": \["audio\/([^"]*)\.wav"\]/"audios": ["audio\/\1_silent.wav"]/' \
      "$DIR/${split}_spoken.jsonl" >"$DIR/${split}_silent.jsonl"
    for wav in "${!spoken[@]}"; do
      silence "$DIR/$wav" "$DIR/${wav%.wav}_silent.wav"
    done
  fi
  rm -f "$DIR/.$split.tsv" "$DIR/.$split.jobs"
  echo "spoken_synth: $i $split questions spoken (${#spoken[@]} clips) -> $DIR/${split}_spoken.jsonl"
done
