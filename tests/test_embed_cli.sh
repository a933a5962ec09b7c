#!/usr/bin/env bash
# test_embed_cli.sh — `mmc embed` and `mmc eval --task retrieval` on the tiny random CLIPModel of
# tests/fixtures/clip_model (tools/ref/gen_clip_model.py):
#   embed: the logits_per_image table (4 images x 5 texts, both tabular and --json) within 1e-4 of
#          transformers' CLIPModel(**CLIPProcessor(...)) (expected.json), embeddings of norm 1;
#   eval --task retrieval: recall@1/5/10 both ways equal to those on transformers' embeddings,
#          --limit, --out ranks;
#   SigLIP (tests/fixtures/siglip_model, tools/ref/gen_siglip_model.py): the logits_per_image table
#          (with logit_bias) within 1e-4 and the sigmoid probabilities within 1e-5 of transformers'
#          SiglipModel(**SiglipProcessor(..., padding="max_length")), --json's family / probs, and the
#          retrieval recalls equal to those on transformers' embeddings;
#   errors: exit 2 for a bad command line, 1 for a folder that is not a CLIPModel, a missing
#          image or a malformed line, each with a message.
set -u
MMC=${MMC:-build/mmc}
F=tests/fixtures/clip_model
W=$(mktemp -d /tmp/mmc_test_embed.XXXXXX); trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
[ -x "$MMC" ] || { echo "test_embed_cli: skipped: no mmc binary at $MMC"; exit 77; }
I=tests/fixtures
imgs=(--image $I/e2e/shapes_160x120.png --image $I/image/rgb_37x53.png --image $I/image/wide_900x100.jpg
      --image $I/image/palette_P.png)
long="a very long caption $(for i in $(seq 12); do printf 'with many repeated words '; done)"
texts=(--text "a red circle on the left" --text "two blue squares" --text "" --text "A photo of a CAT, sitting!"
       --text "$long")
# transformers' logits_per_image, flattened (expected.json, one row per line)
want=$(tr -d ' \n' < $F/expected.json | sed 's/.*"logits_per_image":\[\[//; s/\]\],.*//; s/\],\[/\n/g')

if "$MMC" embed --model $F/model "${imgs[@]}" "${texts[@]}" > "$W/t.txt" 2> "$W/t.err"; then
  got=$(sed -n '/^logits_per_image/,$p' "$W/t.txt" | tail -n +2)
  if paste <(echo "$want" | tr ',' ' ') <(echo "$got") | awk '{h=NF/2; if (h != 5) bad=1;
       for (i = 1; i <= h; i++) { d = $i - $(i+h); if (d < 0) d = -d; if (d > 1e-4) bad=1 } }
       END { exit bad }' && [ "$(echo "$got" | wc -l)" = 4 ]; then ok; else bad "logits table: $got vs $want"; fi
  # every embedding has norm 1
  awk -F'\t' '$1 == "image" || $1 == "text" { s = 0; n = split($3, v, " "); for (i = 1; i <= n; i++) s += v[i]*v[i];
       if (n != 24 || s < 0.99999 || s > 1.00001) bad=1; c++ } END { exit (bad || c != 9) }' "$W/t.txt" && ok ||
    bad "embedding norms / count: $(cut -c1-80 "$W/t.txt")"
else bad "embed: $(cat "$W/t.err")"; fi

if "$MMC" embed --model $F/model "${imgs[@]}" "${texts[@]}" --json > "$W/t.json" 2> "$W/t.err"; then
  got=$(tr -d ' \n' < "$W/t.json" | sed 's/.*"logits_per_image":\[\[//; s/\]\]}.*//; s/\],\[/\n/g')
  if paste -d, <(echo "$want") <(echo "$got") | awk -F, '{ if (NF != 10) bad=1; for (i = 1; i <= 5; i++) {
       d = $i - $(i+5); if (d < 0) d = -d; if (d > 1e-4) bad=1 } } END { exit bad }' &&
     grep -q '"family": "clip", "dim": 24, "logit_scale": 20' "$W/t.json"; then ok; else bad "--json: $(head -c 300 "$W/t.json")"; fi
else bad "embed --json: $(cat "$W/t.err")"; fi

# the torchvision backend runs (its numbers are checked in test_clip_model)
"$MMC" embed --model $F/model --image $I/image/rgb_37x53.png --image-backend torchvision > /dev/null 2> "$W/e" && ok ||
  bad "--image-backend torchvision: $(cat "$W/e")"

# retrieval: recalls equal to transformers' (expected.json)
if "$MMC" eval --task retrieval --model $F/model --data $F/retrieval.jsonl --json --out "$W/ranks.jsonl" > "$W/r.json" 2> "$W/r.err"; then
  ok=1
  for dir in i2t t2i; do
    name=$([ $dir = i2t ] && echo image_to_text || echo text_to_image)
    for k in 1 5 10; do
      w=$(tr -d ' \n' < $F/expected.json | grep -o "\"${dir}_recall@$k\":[0-9.e-]*" | cut -d: -f2)
      g=$(grep -o "\"${name}_recall@$k\": [0-9.]*" "$W/r.json" | cut -d' ' -f2)
      awk -v a="$w" -v b="$g" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d < 1e-6) }' || ok=0
    done
  done
  [ $ok = 1 ] && [ "$(wc -l < "$W/ranks.jsonl")" = 11 ] && ok || bad "retrieval: $(cat "$W/r.json") vs expected.json"
else bad "eval --task retrieval: $(cat "$W/r.err")"; fi
"$MMC" eval --task retrieval --model $F/model --data $F/retrieval.jsonl --limit 2 > "$W/l.txt" 2>/dev/null &&
  grep -q '^images            2, captions 4' "$W/l.txt" && ok || bad "--limit 2: $(cat "$W/l.txt")"

# mmc info names the family, the towers and the projections
"$MMC" info $F/model > "$W/i.txt" 2>&1 && grep -q '^family: *CLIP (dual encoder' "$W/i.txt" &&
  grep -q 'into 24 dims' "$W/i.txt" && ! grep -q 'not supported' "$W/i.txt" && ok || bad "info: $(cat "$W/i.txt")"

# SigLIP: logits (with the bias) and sigmoid probabilities
S=tests/fixtures/siglip_model
table() {   # table KEY FILE: expected.json's KEY matrix, one row per line, comma-separated
  tr -d ' \n' < "$2" | sed "s/.*\"$1\":\[\[//; s/\]\].*//; s/\],\[/\n/g"
}
if "$MMC" embed --model $S/model "${imgs[@]}" "${texts[@]}" > "$W/s.txt" 2> "$W/s.err"; then
  for part in logits_per_image probs; do
    tol=$([ $part = probs ] && echo 1e-5 || echo 1e-4)
    want=$(table $part $S/expected.json)
    if [ $part = probs ]; then got=$(sed -n '/^probs/,$p' "$W/s.txt" | tail -n +2)
    else got=$(sed -n '/^logits_per_image/,/^probs/p' "$W/s.txt" | sed '1d;$d'); fi
    paste <(echo "$want" | tr ',' ' ') <(echo "$got") | awk -v tol=$tol '{h=NF/2; if (h != 5) bad=1;
         for (i = 1; i <= h; i++) { d = $i - $(i+h); if (d < 0) d = -d; if (d > tol) bad=1 } } END { exit bad }' &&
      [ "$(echo "$got" | wc -l)" = 4 ] && ok || bad "siglip $part: $got vs $want"
  done
else bad "embed siglip: $(cat "$W/s.err")"; fi
if "$MMC" embed --model $S/model "${imgs[@]}" "${texts[@]}" --json > "$W/s.json" 2> "$W/s.err"; then
  want=$(table probs $S/expected.json); got=$(table probs "$W/s.json")
  paste -d, <(echo "$want") <(echo "$got") | awk -F, '{ if (NF != 10) bad=1; for (i = 1; i <= 5; i++) {
       d = $i - $(i+5); if (d < 0) d = -d; if (d > 1e-5) bad=1 } } END { exit bad }' &&
    grep -q '"family": "siglip", "dim": 32, "logit_scale": 10\(.0000003\)\?, "logit_bias": -2,' "$W/s.json" && ok ||
    bad "siglip --json: $(head -c 300 "$W/s.json")"
else bad "embed siglip --json: $(cat "$W/s.err")"; fi
if "$MMC" eval --task retrieval --model $S/model --data $S/retrieval.jsonl --json > "$W/sr.json" 2> "$W/sr.err"; then
  ok=1
  for dir in i2t t2i; do
    name=$([ $dir = i2t ] && echo image_to_text || echo text_to_image)
    for k in 1 5 10; do
      w=$(tr -d ' \n' < $S/expected.json | grep -o "\"${dir}_recall@$k\":[0-9.e-]*" | cut -d: -f2)
      g=$(grep -o "\"${name}_recall@$k\": [0-9.]*" "$W/sr.json" | cut -d' ' -f2)
      awk -v a="$w" -v b="$g" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d < 1e-6) }' || ok=0
    done
  done
  [ $ok = 1 ] && ok || bad "siglip retrieval: $(cat "$W/sr.json") vs $S/expected.json"
else bad "eval --task retrieval (siglip): $(cat "$W/sr.err")"; fi

"$MMC" info tests/fixtures/siglip_model/model > "$W/i2.txt" 2>&1 && grep -q '^family: *SigLIP (dual encoder' "$W/i2.txt" &&
  ! grep -q 'not supported' "$W/i2.txt" && ok || bad "info siglip: $(cat "$W/i2.txt")"

# errors
expect() {   # expect RC NEEDLE CMD...
  local rc=$1 needle=$2; shift 2
  "$@" > "$W/o" 2> "$W/e"; local got=$?
  [ $got = $rc ] && grep -qF -- "$needle" "$W/e" && ok || bad "$* -> rc $got: $(cat "$W/e")"
}
expect 2 "at least one --image" "$MMC" embed --model $F/model
expect 2 "unknown option" "$MMC" embed --model $F/model --pooling mean
expect 2 "--image-backend" "$MMC" embed --model $F/model --text x --image-backend magic
expect 1 "CLIPModel folder" "$MMC" embed --model tests/fixtures/llava/v5 --text x
expect 1 "nowhere.png" "$MMC" embed --model $F/model --image $W/nowhere.png
expect 2 "--task must be" "$MMC" eval --task ranking --model $F/model --data $F/retrieval.jsonl
printf '{"image": "%s"}\n' "$PWD/$I/image/rgb_37x53.png" > "$W/bad.jsonl"
expect 1 "bad.jsonl:1: no caption" "$MMC" eval --task retrieval --model $F/model --data "$W/bad.jsonl"

if [ $fail -ne 0 ]; then echo "test_embed_cli: $fail of $n checks FAILED"; exit 1; fi
echo "test_embed_cli: all $n checks passed"
