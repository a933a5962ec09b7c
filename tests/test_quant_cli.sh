#!/usr/bin/env bash
# test_quant_cli.sh — `--quantize int8|nf4` at load in mmc generate / forward (chat and serve parse it the
# same way, through runner.c): the load log names the format and the bytes, greedy generation runs on
# the tiny Qwen2-VL fixture with an image, and a bad value is a usage error (exit 2) naming the option. Drift itself: test_quant model;
# LoRA on top of a quantised base: test_quant format.
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
M=tests/fixtures/qwen2_vl_chat
T=$(mktemp -d /tmp/mmc_quant_cli.XXXXXX); trap 'rm -rf "$T"' EXIT
for q in int8 nf4; do
  "$MMC" generate --model $M --prompt "What colour is the circle?" --image tests/fixtures/image/rgb_500x333.jpg \
    --greedy --max-new-tokens 4 --quantize $q --json >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc = 0 ] && ok || bad "generate --quantize $q exited $rc: $(cat "$T/err")"
  grep -q "quantised 14 decoder linears to $q" "$T/err" && grep -q "MiB saved" "$T/err" && ok || bad "load log for $q: $(cat "$T/err")"
  grep -q '"new_tokens": 4' "$T/out" && ok || bad "generate --quantize $q output: $(cat "$T/out")"
done
"$MMC" forward --model $M --prompt hi --out "$T/f.safetensors" --quantize nf4 --json >"$T/out" 2>"$T/err" && [ -s "$T/f.safetensors" ] && ok \
  || bad "forward --quantize nf4: $(cat "$T/err")"
"$MMC" generate --model $M --prompt hi --quantize int4 >"$T/out" 2>"$T/err"
rc=$?
[ $rc = 2 ] && grep -q -- "--quantize must be int8, nf4 or none" "$T/err" && ok || bad "--quantize int4 exited $rc: $(cat "$T/err")"
for c in generate chat serve forward; do
  "$MMC" $c --help 2>/dev/null | grep -q -- "--quantize int8|nf4" && ok || bad "mmc $c --help lacks --quantize"
done
echo "test_quant_cli: $((n - fail)) passed, $fail failed"
[ $fail = 0 ]
