#!/usr/bin/env bash
# test_eval_cli.sh — `mmc synth` and `mmc eval` from the command line: synth is
# deterministic for a seed, eval --json prints one JSON object with the documented keys
# (by_type when samples carry a type), --out writes one prediction per sample, bad input
# fails with a message and a non-zero exit code.
set -u
MMC=${MMC:-build/mmc}
tmp=$(mktemp -d /tmp/mmc_test_eval_cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then :; else echo "FAIL: $1"; fail=1; fi; }

"$MMC" synth --out "$tmp/a" --train 16 --val 8 --seed 4 >/dev/null || { echo "FAIL: synth"; exit 1; }
"$MMC" synth --out "$tmp/b" --train 16 --val 8 --seed 4 >/dev/null
check "synth deterministic (jsonl)" "cmp -s $tmp/a/train.jsonl $tmp/b/train.jsonl"
check "synth deterministic (png)" "cmp -s $tmp/a/images/val_000005.png $tmp/b/images/val_000005.png"
"$MMC" synth --out "$tmp/c" --train 16 --val 8 --seed 5 >/dev/null
check "synth seed matters" "! cmp -s $tmp/a/images/val_000005.png $tmp/c/images/val_000005.png"
check "synth bad size" "! \"$MMC\" synth --out $tmp/d --size 7 2>/dev/null"
check "synth needs --out" "! \"$MMC\" synth 2>/dev/null"

out=$("$MMC" eval --model tests/fixtures/eval/model --data "$tmp/a/val.jsonl" --json --out "$tmp/pred.jsonl" --max-new-tokens 3)
check "eval exit code" "[ $? -eq 0 ]"
check "eval one line" "[ $(printf '%s\n' "$out" | wc -l) -eq 1 ]"
for k in loss perplexity exact_match normalized_match samples by_type; do
  check "eval --json has $k" "printf '%s' '$out' | grep -q '\"$k\":'"
done
for t in colour shape count leftright; do
  check "by_type has $t" "printf '%s' '$out' | grep -q '\"$t\":'"
done
check "eval samples" "printf '%s' '$out' | grep -q '\"samples\":8'"
check "predictions written" "[ $(wc -l < $tmp/pred.jsonl) -eq 8 ]"
check "prediction fields" "head -1 $tmp/pred.jsonl | grep -q '\"prediction\":'"
"$MMC" eval --model tests/fixtures/eval/model --data "$tmp/a/val.jsonl" --blank-images --limit 2 >"$tmp/human.txt" 2>&1
check "eval human output" "grep -q 'normalised match' $tmp/human.txt && grep -q 'samples  *2' $tmp/human.txt"
err=$("$MMC" eval --model tests/fixtures/eval/model --data "$tmp/missing.jsonl" 2>&1)
check "missing data fails" "[ $? -ne 0 ] && printf '%s' '$err' | grep -q missing.jsonl"
check "eval needs --model" "! \"$MMC\" eval --data x 2>/dev/null"
check "eval bad option" "! \"$MMC\" eval --model x --data y --bogus 2>/dev/null"
[ $fail -eq 0 ] && echo "test_eval_cli: ok"
exit $fail
