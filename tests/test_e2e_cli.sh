#!/usr/bin/env bash
# test_e2e_cli.sh — `mmc generate` and `mmc forward` on checkpoints exactly as transformers 5.x's
# save_pretrained writes them (model + processor, untouched: processor_config.json with nested
# image/video processors, chat_template.jinja, f32 weights under model.language_model.*) and as
# the Hub's 4.4x layout has them (preprocessor_config.json, video_preprocessor_config.json,
# chat_template.json, bf16 weights under model.* / visual.*), for Qwen2-VL and Qwen2.5-VL, each
# with an image and a video (tools/ref/gen_e2e.py -> tests/fixtures/e2e/). Against transformers
# loading the same directory:
#   generate: prompt token count and the 8 greedy new tokens are equal
#   forward:  the last position's logits agree within 2e-4 absolute + 1e-4 relative (measured:
#             at most 2e-5; the two image backends differ by 0.03-0.14 here)
#             (float32 both sides, different summation orders), and its argmax is equal
# Image backends: transformers 5.x's AutoProcessor loads the torchvision image processor by
# default (torch's uint8 antialiased resize); backend="pil" gives the Pillow-exact one. mmc's
# default is the PIL one (as every other image fixture); --image-backend torchvision gives the
# other. expected.tsv has both: "image" (transformers backend="pil", mmc default) and
# "image_torchvision" (transformers' default load, mmc --image-backend torchvision). Videos:
# transformers has only the torchvision video processor, and mmc mirrors it.
set -u
MMC=${MMC:-build/mmc}
E=tests/fixtures/e2e
W=$(mktemp -d /tmp/mmc_test_e2e.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_e2e_cli: skipped: no mmc binary at $MMC"; exit 77; }

# last_logits of an mmc forward .safetensors as text, one float per line (no Python: the
# header's data_offsets, then od)
st_floats() {   # st_floats FILE NAME
  local f=$1 name=$2 hlen hdr off
  hlen=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  hdr=$(dd if="$f" bs=1 skip=8 count="$hlen" 2>/dev/null)
  off=$(printf '%s' "$hdr" | sed -E "s/.*\"$name\": *\{[^}]*\"data_offsets\": *\[ *([0-9]+), *([0-9]+) *\].*/\1 \2/")
  case "$off" in ""|*[!0-9\ ]*) echo "no $name in $f" >&2; return 1 ;; esac
  set -- $off
  od -An -v -tf4 -w4 -j $((8 + hlen + $1)) -N $(($2 - $1)) "$f" | tr -d ' '
}

PROMPT_IMG="What colour is the square?"; PROMPT_VID="What moves?"
IMG=$(sed -n 's/.*"image": "\([^"]*\)".*/\1/p' $E/expected.json | head -1)
VID=$(sed -n 's/.*"video": "\([^"]*\)".*/\1/p' $E/expected.json | head -1)
checked=0
while IFS=$'\t' read -r dir case np grid ids argmax; do
  case "$dir" in ''|'#'*) continue ;; esac
  if [ "$case" = video ]; then
    media=(--video "$VID"); prompt=$PROMPT_VID
  else
    media=(--image "$IMG"); prompt=$PROMPT_IMG
    [ "$case" = image_torchvision ] && media+=(--image-backend torchvision)
  fi
  d=$E/$dir
  "$MMC" generate --model "$d" "${media[@]}" --prompt "$prompt" --max-new-tokens 8 --json >"$W/gen" 2>"$W/err"
  rc=$?
  [ $rc = 0 ] && ok || { bad "$dir $case: generate exited $rc: $(cat "$W/err")"; continue; }
  got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ' ')
  [ "$got" = "$ids" ] && ok || bad "$dir $case: generate tokens [$got] != transformers [$ids]"
  gotn=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/gen")
  [ "$gotn" = "$np" ] && ok || bad "$dir $case: prompt_tokens $gotn != transformers $np"
  "$MMC" forward --model "$d" "${media[@]}" --prompt "$prompt" --out "$W/fw.safetensors" --json >"$W/fw" 2>"$W/err" \
    && ok || { bad "$dir $case: forward failed: $(cat "$W/err")"; continue; }
  grep -q "\"tokens\": $np," "$W/fw" && ok || bad "$dir $case: forward tokens: $(cat "$W/fw") (transformers $np)"
  grep -q "\"argmax_last\": $argmax," "$W/fw" && ok || bad "$dir $case: forward argmax: $(cat "$W/fw") (transformers $argmax)"
  st_floats "$W/fw.safetensors" last_logits >"$W/got.txt"
  res=$(paste "$W/got.txt" "$E/$dir.$case.logits.txt" | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = $2 < 0 ? -$2 : $2; if (d > m) m = d
      if (d > 2e-4 + 1e-4 * r) bad++ }
    END { printf "%d %d %.3g", n, bad + 0, m }')
  set -- $res
  want=$(wc -l < "$E/$dir.$case.logits.txt")
  [ "$1" = "$want" ] && [ "$2" = 0 ] && ok || bad "$dir $case: last_logits: $2 of $1 (want $want) outside tolerance, max |diff| $3"
  checked=$((checked + 1))
done < $E/expected.tsv
[ $checked -gt 0 ] || bad "no case ran"
# a bad backend name is a usage error naming the option
"$MMC" generate --model $E/q2_v5 --image "$IMG" --prompt x --image-backend fast >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && grep -q "image-backend" "$W/err" && ok || bad "--image-backend fast: exit $rc, $(cat "$W/err")"
# mmc chat takes the same option: its reply to the image equals generate's on the same
# directory, image, prompt and backend (greedy, 8 tokens). On this fixture both backends give
# the same 8 tokens (their logits differ, not the argmax), so this checks that chat accepts the
# option and answers as generate does, not which resize ran (test_image checks the resize).
for be in pil torchvision; do
  g=$("$MMC" generate --model $E/q2_v5 --image "$IMG" --prompt "Describe it." --image-backend $be --greedy --max-new-tokens 8 2>/dev/null)
  c=$(printf '/image %s\nDescribe it.\n' "$IMG" | "$MMC" chat --model $E/q2_v5 --image-backend $be --greedy --max-new-tokens 8 2>/dev/null)
  [ -n "$g" ] && [ "$g" = "$c" ] && ok || bad "chat --image-backend $be: reply '$c' is not generate's '$g'"
done
"$MMC" chat --model $E/q2_v5 --image-backend fast </dev/null >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && grep -q "image-backend" "$W/err" && ok || bad "chat --image-backend fast: exit $rc, $(cat "$W/err")"
# mmc eval takes it too: the teacher-forced loss of one image sample moves with the resize
# (transformers' two processors give slightly different pixels), and a bad name is a usage error
printf '{"messages": [{"role": "user", "content": "<image>Describe it."}, {"role": "assistant", "content": "A picture."}], "images": ["%s"]}\n' "$(realpath "$IMG")" >"$W/eval.jsonl"
lp=$("$MMC" eval --model $E/q2_v5 --data "$W/eval.jsonl" --max-new-tokens 1 --json 2>"$W/err" | sed -E 's/.*"loss": ([^,]*).*/\1/')
lt=$("$MMC" eval --model $E/q2_v5 --data "$W/eval.jsonl" --max-new-tokens 1 --image-backend torchvision --json 2>>"$W/err" | sed -E 's/.*"loss": ([^,]*).*/\1/')
[ -n "$lp" ] && [ -n "$lt" ] && [ "$lp" != "$lt" ] && ok || bad "eval --image-backend: losses pil '$lp' torchvision '$lt': $(cat "$W/err")"
"$MMC" eval --model $E/q2_v5 --data "$W/eval.jsonl" --image-backend fast >/dev/null 2>"$W/err"; rc=$?
[ $rc = 2 ] && grep -q "image-backend" "$W/err" && ok || bad "eval --image-backend fast: exit $rc, $(cat "$W/err")"
echo "$((n - fail)) passed, $fail failed ($checked cases)"
[ $fail -eq 0 ]
