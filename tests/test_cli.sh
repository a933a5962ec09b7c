#!/usr/bin/env bash
# test_cli.sh — the mmc command end to end: help texts (complete: every option a subcommand
# parses is listed), info, generate (greedy output equal to transformers' generate on the same
# tiny checkpoint), and the exit-code contract of tools/cli.h for every subcommand: 2 for a
# usage error (unknown option, missing required option, bad option value), 1 for a runtime
# error (missing file, bad model), each with a message.
set -u
MMC=${MMC:-build/mmc}
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
expect_rc() { local want=$1; shift; "$@" >/tmp/mmc_cli_out.$$ 2>/tmp/mmc_cli_err.$$; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat /tmp/mmc_cli_err.$$)"; fi; }
expect_err() { local pat=$1; if grep -q -- "$pat" /tmp/mmc_cli_err.$$; then ok; else bad "stderr lacks '$pat': $(cat /tmp/mmc_cli_err.$$)"; fi; }
expect_out() { local pat=$1; if grep -q -- "$pat" /tmp/mmc_cli_out.$$; then ok; else bad "stdout lacks '$pat': $(head -c 400 /tmp/mmc_cli_out.$$)"; fi; }

# help: top level and every subcommand; each help lists every option its source parses
# (the "--name" literals of tools/cmd_<c>.c, plus runner.c's prompt options for generate and forward
# and sampling.c's sampling options for generate and chat)
expect_rc 0 "$MMC" --help; expect_out "usage: mmc <command>"
cmds=$("$MMC" --help | awk '/^commands:/{f=1;next} f&&!NF{exit} f{print $1}')
for c in info generate chat forward train launch eval merge export synth; do
  echo "$cmds" | grep -qx "$c" && ok || bad "mmc --help does not list $c"
done
for c in $cmds; do
  expect_rc 0 "$MMC" "$c" --help; expect_out "usage: mmc $c"
  expect_rc 0 "$MMC" "$c" -h; expect_out "usage: mmc $c"
  src="tools/cmd_$c.c"; case $c in generate|forward) src="$src tools/runner.c" ;; esac
  case $c in generate|chat) src="$src tools/sampling.c" ;; esac
  for o in $(grep -oh '"--[a-z][a-z-]*' $src | tr -d '"' | sort -u); do
    grep -q -- "$o" /tmp/mmc_cli_out.$$ && ok || bad "mmc $c --help does not list $o"
  done
done
expect_rc 2 "$MMC"; expect_err "usage: mmc <command>"
expect_rc 2 "$MMC" frobnicate; expect_err "unknown command 'frobnicate'"
expect_rc 2 "$MMC" --frobnicate; expect_err "unknown command '--frobnicate'"

# usage errors exit 2 and name the problem, in every subcommand
M=tests/fixtures/qwen2/chat
for c in info generate chat forward train launch eval merge export synth; do
  expect_rc 2 "$MMC" $c --bogus; expect_err "mmc $c: unknown \(option\|argument\) '--bogus'"; expect_err "see mmc $c --help"
done
expect_rc 2 "$MMC" info; expect_err "no model directory"
expect_rc 2 "$MMC" info $M $M; expect_err "more than one directory"
expect_rc 2 "$MMC" generate --prompt x; expect_err "model DIR is required"
expect_rc 2 "$MMC" generate --model $M; expect_err "prompt TEXT is required"
expect_rc 2 "$MMC" generate --model $M --prompt x --max-new-tokens 0; expect_err "max-new-tokens"
expect_rc 2 "$MMC" generate --model $M --prompt x --top-p 2; expect_err "top-p"
expect_rc 2 "$MMC" generate --model $M --prompt x --temperature; expect_err "needs a value"
expect_rc 2 "$MMC" generate --model $M --prompt x --image; expect_err "needs a value"
expect_rc 2 "$MMC" generate --model $M --prompt x --raw --image a.png; expect_err "raw"
expect_rc 2 "$MMC" chat; expect_err "model DIR is required"
expect_rc 2 "$MMC" chat --model $M --seed -1; expect_err "seed"
expect_rc 2 "$MMC" forward --model $M --prompt x; expect_err "out FILE is required"
expect_rc 2 "$MMC" forward --model $M --out f; expect_err "prompt TEXT is required"
expect_rc 2 "$MMC" forward --model $M --prompt x --out f --raw --image a.png; expect_err "raw"
expect_rc 2 "$MMC" train; expect_err "missing RUN.yaml"
expect_rc 2 "$MMC" train a.yaml b.yaml; expect_err "one run config expected"
expect_rc 2 "$MMC" train a.yaml --set optimizer.lr; expect_err "key.path=value"
expect_rc 2 "$MMC" train a.yaml --set; expect_err "needs a value"
expect_rc 2 "$MMC" launch a.yaml; expect_err "missing -n N"
expect_rc 2 "$MMC" launch -n 2; expect_err "missing RUN.yaml"
expect_rc 2 "$MMC" launch -n 0 a.yaml; expect_err "expects an integer"
expect_rc 2 "$MMC" launch -n 2 a.yaml --set=x; expect_err "key.path=value"
expect_rc 2 "$MMC" eval --data x; expect_err "are required"
expect_rc 2 "$MMC" eval --model $M --data x --limit 0; expect_err "limit"
expect_rc 2 "$MMC" merge --adapter a; expect_err "are required"
expect_rc 2 "$MMC" merge --model $M --adapter a --out $M; expect_err "must differ"
expect_rc 2 "$MMC" export ckpt; expect_err "missing --out DIR"
expect_rc 2 "$MMC" export --out d; expect_err "missing CKPT"
expect_rc 2 "$MMC" export a b --out d; expect_err "one checkpoint expected"
expect_rc 2 "$MMC" synth; expect_err "out DIR is required"
expect_rc 2 "$MMC" synth --out /tmp/x --size 7; expect_err "size"

# launch forwards exactly its listed MMC_* variables (those set), as its help says
printf 'model: {path: tests/fixtures/qwen2/tiny}\ndata: {train: synthetic, seq_len: 32, batch_size: 2, micro_batch_size: 1}\ntraining: {steps: 2, output_dir: /tmp/mmc_cli_l.%s}\n' $$ > /tmp/mmc_cli_l.$$.yaml
MMC_MPIRUN=/bin/true MMC_GEMM_KERNEL=avx2 MMC_DIST_TIMEOUT=9 MMC_CLI_TEST_UNLISTED=1 expect_rc 0 "$MMC" launch -n 2 /tmp/mmc_cli_l.$$.yaml --print
expect_err "-x MMC_GEMM_KERNEL"; expect_err "-x MMC_DIST_TIMEOUT"
grep -q "MMC_CLI_TEST_UNLISTED\|MMC_DP_BUCKET_BYTES" /tmp/mmc_cli_err.$$ && bad "launch forwards a variable it does not list or that is unset" || ok

# runtime errors exit 1 and name the file, in every subcommand
N=/nonexistent/mmc_cli
expect_rc 1 "$MMC" info $N; expect_err "$N/config.json"
expect_rc 1 "$MMC" generate --model $N --prompt x; expect_err "$N"
expect_rc 1 "$MMC" chat --model $N </dev/null; expect_err "$N"
expect_rc 1 "$MMC" forward --model $N --prompt x --out /tmp/mmc_cli_fw.$$; expect_err "$N"
expect_rc 1 "$MMC" train $N.yaml; expect_err "$N.yaml"
expect_rc 1 "$MMC" launch -n 2 $N.yaml --print; expect_err "$N.yaml"
expect_rc 1 "$MMC" eval --model $M --data $N.jsonl; expect_err "$N.jsonl"
expect_rc 1 "$MMC" merge --model $M --adapter $N --out /tmp/mmc_cli_m.$$; expect_err "$N"
expect_rc 1 "$MMC" export $N --out /tmp/mmc_cli_x.$$; expect_err "$N"
expect_rc 1 "$MMC" synth --out /dev/null/d; expect_err "/dev/null/d"

# info
expect_rc 0 "$MMC" info tests/fixtures/qwen2/tiny --json
expect_out '"model_type": "qwen2"'
expect_rc 1 "$MMC" info /nonexistent/dir; expect_err "config.json"
# info --system: the machine; the JSON parses and holds what bench/run.sh copies
expect_rc 0 "$MMC" info --system; expect_out "^gemm f32: "; expect_out "^caches: "
expect_rc 0 "$MMC" info --system --json; expect_out '"gemm": {"f32": {"kernel": '
if ! command -v python3 >/dev/null; then ok   # (the JSON parse needs python3; bench/run.sh does too)
elif python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["gemm"]["f32"]["kc"] > 0 and "isa" in d' \
     /tmp/mmc_cli_out.$$ 2>/dev/null; then ok; else bad "mmc info --system --json: not the expected JSON"; fi
MMC_GEMM_BLOCKING=28,256,512 expect_rc 0 env -u MMC_GEMM_MC -u MMC_GEMM_KC -u MMC_GEMM_NC "$MMC" info --system
expect_out "MC=28 KC=256 NC=512 (MMC_GEMM_BLOCKING)"
MMC_GEMM_BLOCKING=1,2 expect_rc 0 "$MMC" info --system; expect_err "ignoring MMC_GEMM_BLOCKING='1,2'"
expect_rc 2 "$MMC" info --system $M; expect_err "give no directory"
# the OpenMP wait policy: passive unless the user sets one (tools/mmc.c re-executes itself once)
expect_rc 0 env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u KMP_BLOCKTIME "$MMC" info --system
expect_out "wait policy passive"
OMP_WAIT_POLICY=active expect_rc 0 "$MMC" info --system; expect_out "wait policy active"

# generate: token-identical to transformers (tools/ref/gen_qwen2.py -> chat_expected.json)
want=$(sed -E 's/.*"new_ids": (\[[^]]*\]).*/\1/' tests/fixtures/qwen2/chat_expected.json)
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 16 --json
got=$(sed -E 's/.*"tokens": (\[[^]]*\]).*/\1/' /tmp/mmc_cli_out.$$)
if [ "$got" = "$want" ]; then ok; else bad "generate tokens $got != transformers $want"; fi
# streamed text equals the JSON text
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 16
# sampling is reproducible for a seed
"$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 12 --json >/tmp/mmc_s1.$$ 2>/dev/null
"$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --temperature 0.8 --top-p 0.9 --seed 7 --max-new-tokens 12 --json >/tmp/mmc_s2.$$ 2>/dev/null
if cmp -s <(sed -E 's/"load_seconds.*//' /tmp/mmc_s1.$$) <(sed -E 's/"load_seconds.*//' /tmp/mmc_s2.$$); then ok; else bad "seeded sampling differs between runs"; fi

# generation_config.json drives generate as it drives transformers' generate() (tools/ref/gen_gencfg.py:
# do_sample + top_k 1, repetition_penalty 0.2, eos [5, 1379], max_new_tokens 16): the same tokens,
# and the command line over it
GD=/tmp/mmc_cli_gen.$$; mkdir -p $GD
for f in tests/fixtures/qwen2/chat/*; do ln -s "$PWD/$f" $GD/; done
cp tests/fixtures/gencfg/generate_model/generation_config.json $GD/
gen_ids() { sed -E 's/.*"tokens": (\[[^]]*\]).*/\1/' /tmp/mmc_cli_out.$$; }
want=$(sed -E 's/.*"new_ids": (\[[^]]*\]).*/\1/' tests/fixtures/gencfg/generate_expected.json)
expect_rc 0 "$MMC" generate --model $GD --prompt "What colour is the circle?" --json
[ "$(gen_ids)" = "$want" ] && ok || bad "generate under generation_config.json: $(gen_ids) != transformers $want"
want=$(sed -E 's/.*"plain_greedy_ids": (\[[^]]*\]).*/\1/' tests/fixtures/gencfg/generate_expected.json)
expect_rc 0 "$MMC" generate --model $GD --prompt "What colour is the circle?" --greedy --repetition-penalty 1 --json
[ "$(gen_ids)" = "$want" ] && ok || bad "--greedy --repetition-penalty 1 over the file: $(gen_ids) != $want"
expect_rc 0 "$MMC" generate --model $GD --prompt "What colour is the circle?" --max-new-tokens 3 --json
[ "$(gen_ids)" = "[316, 78, 698]" ] && ok || bad "--max-new-tokens 3 over the file: $(gen_ids)"
# the file's eos list stops generation (the eos itself is not emitted)
sed -i 's/"eos_token_id": \[/"eos_token_id": [698, /' $GD/generation_config.json
expect_rc 0 "$MMC" generate --model $GD --prompt "What colour is the circle?" --json
[ "$(gen_ids)" = "[316, 78]" ] && ok || bad "eos from generation_config.json: $(gen_ids) != [316, 78]"
expect_rc 0 "$MMC" chat --model $GD < /dev/null
expect_rc 0 "$MMC" info $GD; expect_out "generation:     generation_config.json, sampling: temperature 1, top_k 1, top_p 1, min_p 0, repetition_penalty 0.2, max_new_tokens 16, eos 698, 5, 1379"
expect_rc 0 "$MMC" info $GD --json; expect_out '"generation": {"file": true, "do_sample": true, .*"eos_token_id": \[698, 5, 1379\]}'
echo '{"top_p": 7}' > $GD/generation_config.json
expect_rc 0 "$MMC" info tests/fixtures/diffusion/pipe_flux; expect_out "FluxPipeline"; expect_out "diffusers.AutoencoderKL .* yes"
expect_rc 1 "$MMC" generate --model $GD --prompt hi; expect_err "generation_config.json: top_p"
rm -rf $GD

# --chat-template FILE replaces the model's template: one that prints the message alone gives
# the --raw prompt; an unknown --chat-template-name is an error naming what there is
printf '{%% set c = messages[0].content %%}{%% if c is string %%}{{ c }}{%% else %%}{{ c[0].text }}{%% endif %%}' > /tmp/mmc_cli_tpl.$$
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 4 --json --raw
raw=$(sed -E 's/"load_seconds.*//' /tmp/mmc_cli_out.$$)
expect_rc 0 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt "What colour is the circle?" --max-new-tokens 4 --json --chat-template /tmp/mmc_cli_tpl.$$
[ "$(sed -E 's/"load_seconds.*//' /tmp/mmc_cli_out.$$)" = "$raw" ] && ok || bad "--chat-template: $(cat /tmp/mmc_cli_out.$$) != --raw $raw"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --chat-template-name nosuch; expect_err "nosuch"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --chat-template /nonexistent.jinja; expect_err "nonexistent.jinja"
printf '{{ raise_exception("no system role here") }}' > /tmp/mmc_cli_tpl.$$
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt hi --chat-template /tmp/mmc_cli_tpl.$$; expect_err "no system role here"
rm -f /tmp/mmc_cli_tpl.$$

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

# more runtime errors
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/tiny --prompt x; expect_err "tokenizer"
expect_rc 1 "$MMC" generate --model tests/fixtures/qwen2/chat --prompt x --image a.png; expect_err "text-only"

rm -rf /tmp/mmc_cli_out.$$ /tmp/mmc_cli_err.$$ /tmp/mmc_s1.$$ /tmp/mmc_s2.$$ /tmp/mmc_cli_fw.$$ /tmp/mmc_cli_m.$$ /tmp/mmc_cli_x.$$ /tmp/mmc_cli_l.$$ /tmp/mmc_cli_l.$$.yaml
echo "test_cli: $((n-fail)) passed, $fail failed"
[ "$fail" = 0 ]
