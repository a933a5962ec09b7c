#!/usr/bin/env bash
# test_template_cli.sh — `mmc template` end to end: a model directory as transformers 5
# saves it (chat_template.jinja, tokenizer_config.json with an AddedToken-dict bos_token),
# tools and --set variables, --no-generation-prompt, --template files; output byte-equal
# to transformers' apply_chat_template (tests/fixtures/template/cli, written by
# tools/ref/gen_template.py), raise_exception messages on stderr with exit 1, usage errors
# with exit 2.
set -u
MMC=${MMC:-build/mmc}
F=tests/fixtures/template/cli
tmp=$(mktemp -d /tmp/mmc_test_template_cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if eval "$2"; then :; else echo "FAIL: $1"; fail=1; fi; }

"$MMC" template --model $F/model --messages $F/tools_messages.json --tools $F/tools.json \
  --set enable_thinking=false >"$tmp/a.txt"
check "tools + enable_thinking=false: exit 0" "[ $? -eq 0 ]"
check "tools + enable_thinking=false: byte-equal" "cmp -s $tmp/a.txt $F/expected_tools_nothink.txt"

"$MMC" template --model $F/model --messages $F/reasoning_messages.json --no-generation-prompt >"$tmp/b.txt"
check "reasoning, no generation prompt: byte-equal" "cmp -s $tmp/b.txt $F/expected_reasoning_nogen.txt"

"$MMC" template --model $F/model --chat-template $F/qwen2_vl.jinja --messages $F/vision_messages.json \
  --set add_vision_id=true >"$tmp/c.txt"
check "--chat-template overrides, add_vision_id: byte-equal" "cmp -s $tmp/c.txt $F/expected_vision_ids.txt"
"$MMC" template --template $F/qwen2_vl.jinja --messages - --set add_vision_id=true <$F/vision_messages.json >"$tmp/d.txt"
check "--template FILE, messages on stdin: byte-equal" "cmp -s $tmp/d.txt $F/expected_vision_ids.txt"

# bos/eos: the model's by default, overridable
echo '[{"role": "user", "content": "x"}]' >"$tmp/m.json"
printf '{{ bos_token }}|{{ eos_token }}|{{ x }}' >"$tmp/t.jinja"
mkdir -p "$tmp/model" && cp $F/model/tokenizer_config.json "$tmp/model/" && cp "$tmp/t.jinja" "$tmp/model/chat_template.jinja"
check "bos/eos from tokenizer_config.json" "[ \"\$(\"$MMC\" template --model $tmp/model --messages $tmp/m.json)\" = '<|bos|>|<|im_end|>|' ]"
check "--bos-token/--set override" "[ \"\$(\"$MMC\" template --model $tmp/model --messages $tmp/m.json --bos-token B --set x='[1,\"a\"]')\" = \"B|<|im_end|>|[1, 'a']\" ]"

# the template's own error: exit 1, raise_exception's message verbatim on stderr
"$MMC" template --template $F/mistral.jinja --messages $F/bad_messages.json >"$tmp/e.out" 2>"$tmp/e.err"
check "raise_exception: exit 1" "[ $? -eq 1 ]"
check "raise_exception: nothing on stdout" "[ ! -s $tmp/e.out ]"
check "raise_exception: message on stderr" "grep -q 'conversation roles must alternate user/assistant' $tmp/e.err"
printf '{{ 1 +\n}}' >"$tmp/bad.jinja"
"$MMC" template --template "$tmp/bad.jinja" --messages "$tmp/m.json" 2>"$tmp/s.err" >/dev/null
check "syntax error: exit 1" "[ $? -eq 1 ]"
check "syntax error names line and column" "grep -q 'line 2, column 1' $tmp/s.err"
mkdir -p "$tmp/empty"
"$MMC" template --model "$tmp/empty" --messages "$tmp/m.json" 2>"$tmp/n.err" >/dev/null
check "no template: exit 1" "[ $? -eq 1 ]"
check "no template: says where it looked" "grep -q 'chat_template.jinja' $tmp/n.err"

# usage errors: exit 2
"$MMC" template --messages "$tmp/m.json" 2>/dev/null; check "no template source: exit 2" "[ $? -eq 2 ]"
"$MMC" template --model $F/model --template $F/mistral.jinja --messages "$tmp/m.json" 2>/dev/null; check "both sources: exit 2" "[ $? -eq 2 ]"
"$MMC" template --model $F/model 2>/dev/null; check "no messages: exit 2" "[ $? -eq 2 ]"
"$MMC" template --model $F/model --messages "$tmp/m.json" --bogus 2>/dev/null; check "unknown option: exit 2" "[ $? -eq 2 ]"
"$MMC" template --model $F/model --messages "$tmp/m.json" --set novalue 2>/dev/null; check "--set without =: exit 2" "[ $? -eq 2 ]"
"$MMC" template --help | grep -q -- '--chat-template-name'; check "--help documents the options" "[ $? -eq 0 ]"
exit $fail
