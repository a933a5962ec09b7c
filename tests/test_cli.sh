#!/usr/bin/env bash
# test_cli.sh — the mmc command end to end: help texts, info, generate (greedy output equal
# to transformers' generate on the same tiny checkpoint), and clear errors on bad input.
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
expect_rc() { local want=$1; shift; "$@" >/tmp/mmc_cli_out.$$ 2>/tmp/mmc_cli_err.$$; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat /tmp/mmc_cli_err.$$)"; fi; }
expect_err() { local pat=$1; if grep -q -- "$pat" /tmp/mmc_cli_err.$$; then ok; else bad "stderr lacks '$pat': $(cat /tmp/mmc_cli_err.$$)"; fi; }
expect_out() { local pat=$1; if grep -q -- "$pat" /tmp/mmc_cli_out.$$; then ok; else bad "stdout lacks '$pat': $(head -c 400 /tmp/mmc_cli_out.$$)"; fi; }

# help: top level and every subcommand
expect_rc 0 "$MMC" --help; expect_out "usage: mmc <command>"
for c in $("$MMC" --help | awk '/^commands:/{f=1;next} f&&!NF{exit} f{print $1}'); do
  expect_rc 0 "$MMC" "$c" --help; expect_out "usage: mmc $c"
done
expect_rc 2 "$MMC" frobnicate; expect_err "unknown command 'frobnicate'"

# info
expect_rc 0 "$MMC" info tests/fixtures/qwen2/tiny --json
expect_out '"model_type": "qwen2"'
expect_rc 1 "$MMC" info /nonexistent/dir; expect_err "config.json"

# generate: token-identical to transformers (tools/ref/gen_qwen2.py -> chat_expected.json)
want=$(python3 -c 'import json;print(json.load(open("tests/fixtures/qwen2/chat_expected.json"))["new_ids"])' 2>/dev/null \
       || sed -E 's/.*"new_ids": (\[[^]]*\]).*/\1/' tests/fixtures/qwen2/chat_expected.json)
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 16 --json
got=$(sed -E 's/.*"tokens": (\[[^]]*\]).*/\1/' /tmp/mmc_cli_out.$$)
if [ "$got" = "$want" ]; then ok; else bad "generate tokens $got != transformers $want"; fi
# streamed text equals the JSON text
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 16
# sampling is reproducible for a seed
"$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 12 --json >/tmp/mmc_s1.$$ 2>/dev/null
"$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 12 --json >/tmp/mmc_s2.$$ 2>/dev/null
if cmp -s <(sed -E 's/"load_seconds.*//' /tmp/mmc_s1.$$) <(sed -E 's/"load_seconds.*//' /tmp/mmc_s2.$$); then ok; else bad "seeded sampling differs between runs"; fi

# vision-language generate: one image, token-identical to transformers (tools/ref/gen_vl_chat.py)
VLDIR=tests/fixtures/qwen2_vl_chat
want=$(sed -E 's/.*"new_ids": (\[[^]]*\]).*/\1/' $VLDIR/expected.json)
expect_rc 0 "$MMC" generate --model $VLDIR --image tests/fixtures/image/rgb_500x333.jpg --prompt "What colour is the circle?" --max-new-tokens 16 --json
got=$(sed -E 's/.*"tokens": (\[[^]]*\]).*/\1/' /tmp/mmc_cli_out.$$)
if [ "$got" = "$want" ]; then ok; else bad "VL generate tokens $got != transformers $want"; fi
expect_out '"prompt_tokens": 101'
# forward writes the logits; its last-position argmax is transformers' first greedy token
first=$(echo "$want" | sed -E 's/^\[([0-9]+).*/\1/')
expect_rc 0 "$MMC" forward --model $VLDIR --image tests/fixtures/image/rgb_500x333.jpg --prompt "What colour is the circle?" --out /tmp/mmc_fw.$$.safetensors --json
expect_out "\"argmax_last\": $first,"
[ -s /tmp/mmc_fw.$$.safetensors ] && ok || bad "forward wrote no file"
rm -f /tmp/mmc_fw.$$.safetensors
# chat: two turns with an image, replies streamed
printf '/image tests/fixtures/image/rgb_500x333.jpg\nWhat colour is the circle?\nAnd the square?\n/quit\n' | "$MMC" chat --model $VLDIR --max-new-tokens 4 >/tmp/mmc_cli_out.$$ 2>/tmp/mmc_cli_err.$$
[ "$(wc -l < /tmp/mmc_cli_out.$$)" -ge 2 ] && ok || bad "chat printed fewer than 2 replies"
expect_err "image attached"
expect_rc 1 "$MMC" generate --model $VLDIR --image /nonexistent.png --prompt x; expect_err "nonexistent.png"
expect_rc 1 "$MMC" generate --model $VLDIR --image tests/fixtures/image/rgb_37x53.png --raw --prompt x; expect_err "raw"

# errors
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat; expect_err "prompt TEXT is required"
expect_rc 2 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt x --max-new-tokens 0; expect_err "max-new-tokens"
expect_rc 2 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt x --top-p 2; expect_err "top-p"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt x --bogus; expect_err "unknown option '--bogus'"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/tiny --prompt x; expect_err "tokenizer"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt x --image a.png; expect_err "text-only"

rm -f /tmp/mmc_cli_out.$$ /tmp/mmc_cli_err.$$ /tmp/mmc_s1.$$ /tmp/mmc_s2.$$
echo "test_cli: $((n-fail)) passed, $fail failed"
[ "$fail" = 0 ]
