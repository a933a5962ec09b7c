#!/usr/bin/env bash
# test_cli_procconfig.sh — generate, eval and train read the image processor config of a model
# directory the same way (mmc_qwen2vl_proc_load_dir), as transformers does: processor_config.json's
# "image_processor" (what 5.x processor.save_pretrained writes), else preprocessor_config.json
# (the Hub's 4.x layouts). Each layout of tests/fixtures/procconfig (tools/ref/gen_procconfig.py)
# is put next to the weights, tokenizer and chat template of tests/fixtures/qwen2_vl_chat, with
# a non-default image area; per layout, against transformers on the same directory:
#   generate: the prompt's token count (two images: one where max_pixels decides, one where
#             min_pixels does) equals the processor's
#   eval:     the teacher-forced loss of data.jsonl's sample equals transformers' (1e-5 relative)
#   train:    the first step's loss equals it too, and the checkpoint's processor files carry the
#             area (a data.max_pixels override included), which generate then reads back
# The default processor's loss differs (expected.tsv), so a run that ignored the file would fail.
# A malformed or unreadable config is an error naming the file and key, never a silent default.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
FX=tests/fixtures/procconfig
SRC=$PWD/tests/fixtures/qwen2_vl_chat
W=$(mktemp -d /tmp/mmc_test_procconfig.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
IMGS=(--image tests/fixtures/image/rgb_500x333.jpg --image tests/fixtures/image/rgb_37x53.png)
PROMPT="What colour is the circle?"

model_dir() {   # model_dir DIR [config files...]: the tiny model with these processor files
  local d=$1; shift
  mkdir -p "$d"
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja; do
    ln -s "$SRC/$f" "$d/$f"
  done
  [ $# -gt 0 ] && cp "$@" "$d/"
  return 0
}
prompt_tokens() { "$MMC" generate --model "$1" "${IMGS[@]}" --prompt "$PROMPT" --max-new-tokens 1 --json 2>"$W/err" \
                  | sed -n 's/.*"prompt_tokens": \([0-9]*\).*/\1/p'; }
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * (b < 0 ? -b : b)) }'; }

default_loss=$(awk '$1 == "default" {print $5}' $FX/expected.tsv)
while read -r layout min max tokens loss; do
  case "$layout" in ''|'#'*|default) continue ;; esac
  d="$W/$layout"
  model_dir "$d" $FX/$layout/*
  # the fixture is meaningful: this area changes the loss
  awk -v a="$loss" -v b="$default_loss" 'BEGIN { exit !(a - b > 0.01 || b - a > 0.01) }' \
    && ok || bad "$layout: loss $loss is the default processor's ($default_loss); the fixture tests nothing"
  got=$(prompt_tokens "$d")
  [ "$got" = "$tokens" ] && ok || bad "$layout: generate prompt_tokens '$got' != transformers $tokens: $(cat "$W/err")"
  ev=$("$MMC" eval --model "$d" --data $FX/data.jsonl --json --max-new-tokens 1 2>"$W/err")
  got=$(printf '%s' "$ev" | sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p')
  close "$got" "$loss" && ok || bad "$layout: eval loss '$got' != transformers $loss: $(cat "$W/err")"
  cat > "$W/$layout.yaml" <<YAML
model: {path: $d}
data: {train: $FX/data.jsonl, seq_len: 512, batch_size: 1, micro_batch_size: 1, num_workers: 0}
optimizer: {lr: 1.0e-6}
training: {steps: 1, log_every: 1, save_every: 1, output_dir: $W/$layout-run}
YAML
  "$MMC" train "$W/$layout.yaml" 2>"$W/err" >/dev/null || bad "$layout: train failed: $(cat "$W/err")"
  got=$(sed -n '1s/.*"loss": \([-0-9.e]*\).*/\1/p' "$W/$layout-run/metrics.jsonl" 2>/dev/null)
  close "$got" "$loss" && ok || bad "$layout: train step-1 loss '$got' != transformers $loss"
  ck="$W/$layout-run/checkpoint-1"
  grep -q "\"min_pixels\": $min," "$ck/preprocessor_config.json" && grep -q "\"max_pixels\": $max," "$ck/preprocessor_config.json" \
    && ok || bad "$layout: checkpoint preprocessor_config.json lacks [$min, $max]: $(grep pixels "$ck/preprocessor_config.json")"
  got=$(prompt_tokens "$ck")
  [ "$got" = "$tokens" ] && ok || bad "$layout: generate on the checkpoint: prompt_tokens '$got' != $tokens: $(cat "$W/err")"
done < $FX/expected.tsv

# a data.max_pixels override reaches the checkpoint, in both files (processor_config.json's nested
# image_processor is read first): generate on it sees the smaller area (v5 with max 28*28*8)
"$MMC" train "$W/v5.yaml" --set data.max_pixels=6272 --set training.output_dir="$W/ov" 2>"$W/err" >/dev/null \
  || bad "override run: $(cat "$W/err")"
grep -A2 '"size"' "$W/ov/checkpoint-1/processor_config.json" | grep -q '"longest_edge":[[:space:]]*6272' \
  && ok || bad "processor_config.json of the checkpoint keeps the model's area: $(grep -A3 '"size"' "$W/ov/checkpoint-1/processor_config.json" | head -4)"
small=$(prompt_tokens "$W/ov/checkpoint-1")
v5=$(awk '$1 == "v5" {print $4}' $FX/expected.tsv)
[ -n "$small" ] && [ "$small" -lt "$v5" ] && ok || bad "override: prompt_tokens '$small' not below v5's $v5: $(cat "$W/err")"

# malformed or unreadable configs: exit 1 with the file (and key) named, in all three commands
expect_fail() {   # expect_fail NAME PATTERN: generate, eval and train on $W/$NAME all fail naming PATTERN
  local d="$W/$1" pat=$2 rc
  "$MMC" generate --model "$d" "${IMGS[@]}" --prompt x --max-new-tokens 1 >/dev/null 2>"$W/err"; rc=$?
  [ $rc = 1 ] && grep -q -- "$pat" "$W/err" && ok || bad "$1: generate rc $rc, want 1 and '$pat': $(cat "$W/err")"
  "$MMC" eval --model "$d" --data $FX/data.jsonl --max-new-tokens 1 >/dev/null 2>"$W/err"; rc=$?
  [ $rc = 1 ] && grep -q -- "$pat" "$W/err" && ok || bad "$1: eval rc $rc, want 1 and '$pat': $(cat "$W/err")"
  sed "s#$W/v5#$d#; s#v5-run#$1-run#" "$W/v5.yaml" > "$W/$1.yaml"
  "$MMC" train "$W/$1.yaml" >/dev/null 2>"$W/err"; rc=$?
  [ $rc = 1 ] && grep -q -- "$pat" "$W/err" && ok || bad "$1: train rc $rc, want 1 and '$pat': $(cat "$W/err")"
}
model_dir "$W/badjson"; printf '{"image_processor": {"size": ' > "$W/badjson/processor_config.json"
expect_fail badjson "processor_config.json:1:28: invalid JSON"
model_dir "$W/notobj"; printf '[1]' > "$W/notobj/processor_config.json"
expect_fail notobj "processor_config.json: not a JSON object"
model_dir "$W/nestednotobj"; printf '{"image_processor": 3}' > "$W/nestednotobj/processor_config.json"
expect_fail nestednotobj "processor_config.json: image_processor must be an object"
model_dir "$W/badtype"; printf '{"image_processor": {"size": {"shortest_edge": "big", "longest_edge": 9000}}}' > "$W/badtype/processor_config.json"
expect_fail badtype "image_processor.size.shortest_edge must be an integer"
model_dir "$W/oneedge"; printf '{"size": {"longest_edge": 9000}}' > "$W/oneedge/preprocessor_config.json"
expect_fail oneedge "preprocessor_config.json: size needs both shortest_edge and longest_edge"
model_dir "$W/minmax"; printf '{"min_pixels": 9000, "max_pixels": 5000}' > "$W/minmax/preprocessor_config.json"
expect_fail minmax "max_pixels (longest_edge) 5000 is below min_pixels"
model_dir "$W/notafile"; mkdir "$W/notafile/preprocessor_config.json"   # exists, cannot be read
expect_fail notafile "preprocessor_config.json: not a regular file"
model_dir "$W/dangling"; ln -s "$W/nowhere.json" "$W/dangling/processor_config.json"
expect_fail dangling "processor_config.json: cannot open"

rm -f "$W/err"
echo "test_cli_procconfig: $((n-fail)) passed, $fail failed"
[ "$fail" = 0 ]
