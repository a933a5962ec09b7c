#!/usr/bin/env bash
# test_llava_cli.sh — `mmc generate`, `mmc forward` and `mmc info` on tiny LLaVA-1.5 checkpoints
# (tools/ref/gen_llava.py -> tests/fixtures/llava/): v5 (transformers 5's save_pretrained output,
# untouched: processor_config.json, chat_template.jinja), v452 (4.52-4.57's weight names), hub
# (the Hub's 4.4x layout: bf16 matrices, preprocessor_config.json, chat_template.json) and v5_full
# (list vision_feature_layer, "full" strategy, biases, tied head), hub_llama (the Hub layout with
# Llama's SentencePiece BPE tokenizer: <s> from the processor, byte fallback; the greedy text too), each with the non-square
# fixture image through the chat template (executed by mmc's Jinja engine, LLaVA-1.5's
# selectattr template) and CLIPImageProcessor. Against transformers on the same directories:
#   generate: prompt token count and the 8 greedy new tokens are equal
#   forward:  the last position's logits within 1e-4 absolute, and the same argmax
# plus v5 with --image-backend torchvision (transformers 5's default image processor), and the
# LLaVA-OneVision / LLaVA-NeXT fixtures (tools/ref/gen_llava_next.py) with a landscape, a portrait
# and (OneVision) both images in one prompt and a 3-frame video (--video FOLDER): the same checks, and
# mmc info's family / tower / LM.
set -u
MMC=${MMC:-build/mmc}
E=tests/fixtures/llava
IMG=tests/fixtures/e2e/shapes_160x120.png
W=$(mktemp -d /tmp/mmc_test_llava.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_llava_cli: skipped: no mmc binary at $MMC"; exit 77; }

# a tensor of an mmc forward .safetensors as text, one float per line (the header's
# data_offsets, then od), as test_e2e_cli.sh reads it
st_floats() {   # st_floats FILE NAME
  local f=$1 name=$2 hlen hdr off
  hlen=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  hdr=$(dd if="$f" bs=1 skip=8 count="$hlen" 2>/dev/null)
  off=$(printf '%s' "$hdr" | sed -E "s/.*\"$name\": *\{[^}]*\"data_offsets\": *\[ *([0-9]+), *([0-9]+) *\].*/\1 \2/")
  case "$off" in ""|*[!0-9\ ]*) echo "no $name in $f" >&2; return 1 ;; esac
  set -- $off
  od -An -v -tf4 -w4 -j $((8 + hlen + $1)) -N $(($2 - $1)) "$f" | tr -d ' '
}

PROMPT="What is in the image?"
checked=0
while IFS=$'\t' read -r dir case np ids argmax; do
  case "$dir" in ''|'#'*) continue ;; esac
  media=(--image "$IMG")
  [ "$case" = image_torchvision ] && media+=(--image-backend torchvision)
  d=$E/$dir
  "$MMC" generate --model "$d" "${media[@]}" --prompt "$PROMPT" --max-new-tokens 8 --json >"$W/gen" 2>"$W/err"
  rc=$?
  [ $rc = 0 ] && ok || { bad "$dir $case: generate exited $rc: $(cat "$W/err")"; continue; }
  got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ' ')
  [ "$got" = "$ids" ] && ok || bad "$dir $case: generate tokens [$got] != transformers [$ids]"
  if [ -f "$E/$dir.greedy_text.txt" ]; then   # the decoded text (SentencePiece byte fallback, stripped space)
    gott=$(sed -E 's/^\{"text": "(.*)", "tokens".*/\1/' "$W/gen")
    [ "$gott" = "$(cat "$E/$dir.greedy_text.txt")" ] && ok || bad "$dir $case: text \"$gott\" != transformers \"$(cat "$E/$dir.greedy_text.txt")\""
  fi
  gotn=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/gen")
  [ "$gotn" = "$np" ] && ok || bad "$dir $case: prompt_tokens $gotn != transformers $np"
  "$MMC" forward --model "$d" "${media[@]}" --prompt "$PROMPT" --out "$W/fw.safetensors" --json >"$W/fw" 2>"$W/err" \
    && ok || { bad "$dir $case: forward failed: $(cat "$W/err")"; continue; }
  grep -q "\"tokens\": $np," "$W/fw" && ok || bad "$dir $case: forward tokens: $(cat "$W/fw") (transformers $np)"
  grep -q "\"argmax_last\": $argmax," "$W/fw" && ok || bad "$dir $case: forward argmax: $(cat "$W/fw") (transformers $argmax)"
  st_floats "$W/fw.safetensors" last_logits >"$W/got.txt"
  res=$(paste "$W/got.txt" "$E/$dir.$case.logits.txt" | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; if (d > 1e-4) bad++ }
    END { printf "%d %d %.3g", n, bad + 0, m }')
  set -- $res
  want=$(wc -l < "$E/$dir.$case.logits.txt")
  [ "$1" = "$want" ] && [ "$2" = 0 ] && ok || bad "$dir $case: last_logits: $2 of $1 (want $want) outside 1e-4, max |diff| $3"
  echo "llava $dir $case: tokens equal, last_logits max |diff| $3"
  checked=$((checked + 1))
done < $E/expected.tsv
[ $checked = 6 ] && ok || bad "$checked of 6 cases ran"
# LLaVA-OneVision (SigLIP + Qwen2) and LLaVA-NeXT (CLIP + Mistral), tools/ref/gen_llava_next.py: the
# anyres tiles, the processors' placeholder counts, the un-padded / downsampled features and the
# newlines, through the same commands; the same checks as above against transformers
TALL=tests/fixtures/llava_next/tall_97x151.png
nchecked=0
for F in tests/fixtures/llava_onevision tests/fixtures/llava_next; do
  while IFS=$'\t' read -r dir case np ids argmax; do
    case "$dir" in ''|'#'*) continue ;; esac
    q=$PROMPT
    case "$case" in
      video) media=(--video tests/fixtures/llava_onevision/video); q="What happens?" ;;
      image_wide) media=(--image "$IMG") ;;
      image_tall) media=(--image "$TALL") ;;
      two_images) media=(--image "$IMG" --image "$TALL") ;;
    esac
    d=$F/$dir
    "$MMC" generate --model "$d" "${media[@]}" --prompt "$q" --max-new-tokens 8 --json >"$W/gen" 2>"$W/err"
    rc=$?
    [ $rc = 0 ] && ok || { bad "$dir $case: generate exited $rc: $(cat "$W/err")"; continue; }
    got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ' ')
    [ "$got" = "$ids" ] && ok || bad "$dir $case: generate tokens [$got] != transformers [$ids]"
    gotn=$(sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p' "$W/gen")
    [ "$gotn" = "$np" ] && ok || bad "$dir $case: prompt_tokens $gotn != transformers $np"
    "$MMC" forward --model "$d" "${media[@]}" --prompt "$q" --out "$W/fw.safetensors" --json >"$W/fw" 2>"$W/err" \
      && ok || { bad "$dir $case: forward failed: $(cat "$W/err")"; continue; }
    grep -q "\"argmax_last\": $argmax," "$W/fw" && ok || bad "$dir $case: forward argmax: $(cat "$W/fw") (transformers $argmax)"
    st_floats "$W/fw.safetensors" last_logits >"$W/got.txt"
    res=$(paste "$W/got.txt" "$F/$dir.$case.logits.txt" | awk '
      { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; if (d > 1e-4) bad++ }
      END { printf "%d %d %.3g", n, bad + 0, m }')
    set -- $res
    want=$(wc -l < "$F/$dir.$case.logits.txt")
    [ "$1" = "$want" ] && [ "$2" = 0 ] && ok || bad "$dir $case: last_logits: $2 of $1 (want $want) outside 1e-4, max |diff| $3"
    echo "llava $dir $case: tokens equal, last_logits max |diff| $3"
    nchecked=$((nchecked + 1))
  done < $F/expected.tsv
done
[ $nchecked = 6 ] && ok || bad "$nchecked of 6 NeXT / OneVision cases ran"
"$MMC" info tests/fixtures/llava_onevision/ov >"$W/info" 2>"$W/err" && grep -q "^family: *LLaVA-OneVision" "$W/info" \
  && grep -q "^vision tower: *SigLIP ViT" "$W/info" && grep -q "anyres_max_4" "$W/info" \
  && grep -q "^language model: *Qwen2" "$W/info" && ok || bad "info ov: $(cat "$W/info" "$W/err")"
"$MMC" info tests/fixtures/llava_next/next >"$W/info" 2>"$W/err" && grep -q "^family: *LLaVA-NeXT" "$W/info" \
  && grep -q "^vision tower: *CLIP ViT" "$W/info" && grep -q "^language model: *Mistral" "$W/info" \
  && ok || bad "info next: $(cat "$W/info" "$W/err")"
"$MMC" generate --model tests/fixtures/llava_next/next --image "$IMG" --image-backend torchvision --prompt x \
  >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "only the PIL backend" "$W/err" && ok || bad "next --image-backend torchvision: exit $rc, $(cat "$W/err")"
# mmc info names the family, the tower and the projector
"$MMC" info $E/hub >"$W/info" 2>"$W/err" && ok || bad "info: $(cat "$W/err")"
grep -q "^family: *LLaVA-1.5" "$W/info" && grep -q "^vision tower: *CLIP ViT" "$W/info" \
  && grep -q "^projector: *multi_modal_projector: linear_1 -> gelu -> linear_2" "$W/info" \
  && grep -q "^language model: *Llama" "$W/info" && ok || bad "info: $(cat "$W/info")"
# the image and the <image> placeholders must agree: a prompt without an image is text only,
# two images need two placeholders (the template writes one per image)
"$MMC" generate --model $E/v5 --prompt "$PROMPT" --max-new-tokens 2 --json >/dev/null 2>"$W/err" \
  && ok || bad "text-only prompt: $(cat "$W/err")"
"$MMC" generate --model $E/v5 --image "$IMG" --image "$IMG" --prompt "$PROMPT" --max-new-tokens 2 --json >/dev/null 2>"$W/err" \
  && ok || bad "two images: $(cat "$W/err")"
"$MMC" generate --model $E/v5 --raw --prompt "<image> hi" --max-new-tokens 2 >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "1 image placeholder but 0 images" "$W/err" && ok \
  || bad "an <image> without an image: exit $rc, $(cat "$W/err")"
"$MMC" generate --model $E/v5 --image "$IMG" --video "$IMG" --prompt x >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "llava takes images, not videos" "$W/err" && ok || bad "--video: exit $rc, $(cat "$W/err")"
# mmc chat: /image then the question answers as generate does
g=$("$MMC" generate --model $E/v5 --image "$IMG" --prompt "$PROMPT" --greedy --max-new-tokens 8 2>/dev/null)
c=$(printf '/image %s\n%s\n' "$IMG" "$PROMPT" | "$MMC" chat --model $E/v5 --greedy --max-new-tokens 8 2>/dev/null)
[ -n "$g" ] && [ "$g" = "$c" ] && ok || bad "chat: reply '$c' is not generate's '$g'"
echo "$((n - fail)) passed, $fail failed ($checked cases)"
[ $fail -eq 0 ]
