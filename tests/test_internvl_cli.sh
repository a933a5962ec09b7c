#!/usr/bin/env bash
# test_internvl_cli.sh — `mmc generate`, `mmc forward`, `mmc chat` and `mmc info` on tiny InternVL
# checkpoints (tools/ref/gen_internvl.py -> tests/fixtures/internvl/): v5 and v5_rms, each as
# transformers 5.23's save_pretrained wrote it (processor_config.json, chat_template.jinja), and
# remote / remote_v1, v5 in OpenGVLab's InternVLChatModel layout (tiling settings in config.json,
# a text-only chat template in tokenizer_config.json, the prompt built as chat() does: "<image>\n"
# in the text, expanded in the text; ps_version v2 / v1), and v5 with --image-backend
# torchvision (transformers 5's default image processor), videos (internvl/video: a file sampled to 5
# frames after an image, the same at --video-fps 2, a folder of frames), and remote_internlm2 (remote's tower with an InternLM2
# language model, against the InternLM team's modeling_internlm2.py: tools/ref/gen_internvl_internlm2.py),
# with the non-square fixture image tiled by the GotOcr2 crop_to_patches processor and the prompt
# rendered by mmc's Jinja engine and expanded to <img><IMG_CONTEXT>*N</img>. Against transformers:
#   generate: prompt token count and the 8 greedy new tokens are equal
#   forward:  the last position's logits within 1e-4 absolute, and the same argmax
set -u
MMC=${MMC:-build/mmc}
E=tests/fixtures/internvl
IMG=tests/fixtures/e2e/shapes_160x120.png
W=$(mktemp -d /tmp/mmc_test_internvl.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_internvl_cli: skipped: no mmc binary at $MMC"; exit 77; }

# a tensor of an mmc forward .safetensors as text, one float per line (as test_llava_cli.sh reads it)
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
  d=$E/$dir
  media=(--image "$IMG")
  [ "$case" = image_torchvision ] && media+=(--image-backend torchvision)
  "$MMC" generate --model "$d" "${media[@]}" --prompt "$PROMPT" --max-new-tokens 8 --json >"$W/gen" 2>"$W/err"
  rc=$?
  [ $rc = 0 ] && ok || { bad "$dir $case: generate exited $rc: $(cat "$W/err")"; continue; }
  got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ' ')
  [ "$got" = "$ids" ] && ok || bad "$dir $case: generate tokens [$got] != transformers [$ids]"
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
  echo "internvl $dir $case: tokens equal, last_logits max |diff| $3"
  checked=$((checked + 1))
done < <(cat $E/expected.tsv $E/internlm2_expected.tsv)   # the second: remote_internlm2 (gen_internvl_internlm2.py)
[ $checked = 6 ] && ok || bad "$checked of 6 cases ran"
# mmc info names the family, the tower and the projector
"$MMC" info $E/v5_rms >"$W/info" 2>"$W/err" && ok || bad "info: $(cat "$W/err")"
grep -q "^family: *InternVL" "$W/info" && grep -q "^vision tower: *InternViT: 3 layers, hidden 36, rms_norm, qk-norm" "$W/info" \
  && grep -q "^projector: *pixel shuffle x0.5 -> multi_modal_projector: layer_norm -> linear_1 -> gelu_pytorch_tanh -> linear_2" "$W/info" \
  && grep -q "^language model: *Qwen2" "$W/info" && ok || bad "info: $(cat "$W/info")"
"$MMC" info --json $E/v5 >"$W/info" 2>"$W/err" && grep -q '"supported": true' "$W/info" && grep -q '"family": "InternVL"' "$W/info" \
  && ok || bad "info --json: $(cat "$W/info" "$W/err")"
"$MMC" info $E/remote >"$W/info" 2>"$W/err" && grep -q "^family: *InternVL (OpenGVLab InternVLChatModel layout)" "$W/info" \
  && grep -q "^vision tower: *InternViT: 3 layers, hidden 36, layer_norm, 56x56 px tiles in 14x14 patches; features of layer -2" "$W/info" \
  && grep -q "^projector: *pixel shuffle x0.5 (ps_version v2) -> mlp1: LayerNorm -> Linear -> GELU -> Linear" "$W/info" \
  && grep -q "^language model: *Qwen2" "$W/info" && ok || bad "info remote: $(cat "$W/info" "$W/err")"
"$MMC" info $E/remote_internlm2 >"$W/info" 2>"$W/err" && grep -q "^language model: *InternLM2 (packed wqkv" "$W/info" \
  && ok || bad "info remote_internlm2: $(cat "$W/info" "$W/err")"
# placeholders and images must agree; a prompt without an image is text only
"$MMC" generate --model $E/v5 --prompt "$PROMPT" --max-new-tokens 2 --json >/dev/null 2>"$W/err" \
  && ok || bad "text-only prompt: $(cat "$W/err")"
"$MMC" generate --model $E/v5 --image "$IMG" --image "$IMG" --prompt "$PROMPT" --max-new-tokens 2 --json >"$W/gen" 2>"$W/err" \
  && grep -q "\"prompt_tokens\": 104," "$W/gen" && ok || bad "two images (2 x (<img> + 7 tiles x 4 + </img> + newline) + 42 tokens): $(cat "$W/gen" "$W/err")"
"$MMC" generate --model $E/remote --image "$IMG" --image "$IMG" --prompt "$PROMPT" --max-new-tokens 2 --json >"$W/gen" 2>"$W/err" \
  && grep -q "\"prompt_tokens\": 104," "$W/gen" && ok || bad "remote, two images (chat()'s <image> text expansion): $(cat "$W/gen" "$W/err")"
"$MMC" generate --model $E/v5 --raw --prompt "<IMG_CONTEXT> hi" --max-new-tokens 2 >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "1 image placeholder but 0 images" "$W/err" && ok \
  || bad "an <IMG_CONTEXT> without an image: exit $rc, $(cat "$W/err")"
# videos (tools/ref/gen_internvl_video.py, fixture internvl/video: frames sampled as InternVLVideoProcessor, the
# prompt expanded per frame as InternVLProcessor does): prompt length, greedy tokens and the last argmax equal
while IFS=$'\t' read -r case np ids argmax; do
  case "$case" in ''|'#'*) continue ;; esac
  case "$case" in
    file) media=(--image "$IMG" --video tests/fixtures/video/moving.mkv) ;;
    fps)  media=(--video tests/fixtures/video/moving.mkv --video-fps 2) ;;
    dir)  media=(--video tests/fixtures/llava_onevision/video) ;;
  esac
  "$MMC" generate --model $E/video "${media[@]}" --prompt "What happens in the video?" --max-new-tokens 8 --json \
    >"$W/gen" 2>"$W/err" && ok || { bad "video $case: generate: $(cat "$W/err")"; continue; }
  got=$(sed -E 's/.*"tokens": \[([^]]*)\].*/\1/' "$W/gen" | tr -d ' ')
  [ "$got" = "$ids" ] && grep -q "\"prompt_tokens\": $np," "$W/gen" && ok \
    || bad "video $case: generate $(cat "$W/gen") != transformers [$ids], $np prompt tokens"
  "$MMC" forward --model $E/video "${media[@]}" --prompt "What happens in the video?" --out "$W/fw.safetensors" --json \
    >"$W/fw" 2>"$W/err" && grep -q "\"tokens\": $np, .*\"argmax_last\": $argmax," "$W/fw" && ok \
    || bad "video $case: forward $(cat "$W/fw" "$W/err") (transformers $np tokens, argmax $argmax)"
  echo "internvl video $case: prompt tokens and greedy tokens equal"
done < $E/video_expected.tsv
head -c 700 tests/fixtures/video/moving.mkv >"$W/broken.mkv"
"$MMC" generate --model $E/video --video "$W/broken.mkv" --prompt x >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "broken.mkv" "$W/err" && ok || bad "a truncated video: exit $rc, $(cat "$W/err")"
"$MMC" generate --model $E/video --video "$W/missing.mp4" --prompt x >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "missing.mp4" "$W/err" && ok || bad "a missing video: exit $rc, $(cat "$W/err")"
"$MMC" generate --model $E/v5 --video tests/fixtures/video/moving.mkv --prompt x >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "video frames of 384 x 384 give 169 image tokens each, but the processor's image_seq_length is 4" \
  "$W/err" && ok || bad "v5's 384-pixel video frames on a 56-pixel tower: exit $rc, $(cat "$W/err")"
"$MMC" generate --model $E/remote --video tests/fixtures/video/moving.mkv --prompt x >/dev/null 2>"$W/err"; rc=$?
[ $rc = 1 ] && grep -q "videos are not supported for OpenGVLab's internvl_chat layout yet" "$W/err" && ok \
  || bad "internvl_chat --video: exit $rc, $(cat "$W/err")"
# mmc chat: /image then the question answers as generate does
g=$("$MMC" generate --model $E/v5 --image "$IMG" --prompt "$PROMPT" --greedy --max-new-tokens 8 2>/dev/null)
c=$(printf '/image %s\n%s\n' "$IMG" "$PROMPT" | "$MMC" chat --model $E/v5 --greedy --max-new-tokens 8 2>/dev/null)
[ -n "$g" ] && [ "$g" = "$c" ] && ok || bad "chat: reply '$c' is not generate's '$g'"
echo "$((n - fail)) passed, $fail failed ($checked cases)"
[ $fail -eq 0 ]
