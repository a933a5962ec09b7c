#!/usr/bin/env bash
# test_serve_lora.sh — per-request LoRA adapters in `mmc serve` (--lora NAME=DIR): two PEFT adapters
# (tests/fixtures/serve_lora, written by PEFT's save_pretrained: tools/ref/gen_serve_lora.py) on the tiny
# chat Qwen2. First `mmc generate --adapter DIR --greedy` must give exactly the tokens transformers + PEFT
# generated greedily for the fixture prompt (expected.json; and the base model's without an adapter).
# Then tests/serve_lora_check.py (the official openai client, in .venv-client as test_serve_openai.sh
# makes it) checks models.list, the 404 of an unknown model, and greedy chats of base / a / b, one at a
# time and 12 at once (mixed in one continuous batch), each equal to `mmc generate`'s text and token count
# (exact: greedy tokens), with the prefix cache kept apart per adapter; once more with --no-batching.
# Bad --lora arguments fail with a message that names the problem. Skipped (77) without the client venv.
set -u
MMC=${MMC:-build/mmc}
. tests/serve_util.sh
M=tests/fixtures/qwen2/chat
F=tests/fixtures/serve_lora
V=${MMC_CLIENT_VENV:-.venv-client}
[ -x "$MMC" ] || { echo "test_serve_lora: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_lora: skipped: no python3"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_lora.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0

# 1. mmc generate with each adapter == transformers + PEFT (exact token ids), and the expected answers
P1=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt"])' $F/expected.json)
P2="Which shape is red?"
for prompt in "$P1" "$P2"; do
  for model in base a b; do
    ad=(); [ $model = base ] || ad=(--adapter $F/$model)
    "$MMC" generate --model $M "${ad[@]}" --prompt "$prompt" --greedy --max-new-tokens 12 --json >"$W/g.json" 2>"$W/g.err" \
      || { echo "FAIL: mmc generate ${ad[*]}: $(tail -2 "$W/g.err")" >&2; exit 1; }
    python3 - "$W/g.json" "$model" "$prompt" "$F/expected.json" "$P1" >>"$W/cases" <<'PY' || fail=$((fail+1))
import json, sys
g, model, prompt, ref, p1 = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], json.load(open(sys.argv[4])), sys.argv[5]
if prompt == p1 and g["tokens"] != ref["new_ids"][model]:
    sys.exit("FAIL: mmc generate (%s) tokens %s != transformers+PEFT's %s" % (model, g["tokens"], ref["new_ids"][model]))
print(json.dumps({"model": model if model != "base" else "chat", "prompt": prompt, "text": g["text"], "tokens": g["tokens"]}))
PY
  done
done
python3 -c 'import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])]))' "$W/cases" >"$W/cases.json"
echo "test_serve_lora: mmc generate --adapter = transformers+PEFT greedy ids for a and b (12 tokens each)"

# 2. bad --lora arguments
bad() {   # EXPECTED-SUBSTRING ARGS...
  local want=$1; shift
  "$MMC" serve --model $M --port 0 "$@" >"$W/out" 2>"$W/err" & SPID=$!
  for _ in $(seq 100); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
  if kill -0 $SPID 2>/dev/null; then kill -9 $SPID; echo "FAIL: serve $* started" >&2; fail=$((fail+1));
  elif ! grep -q -- "$want" "$W/err"; then echo "FAIL: serve $*: no '$want' in: $(cat "$W/err")" >&2; fail=$((fail+1)); fi
  wait $SPID 2>/dev/null; SPID=
}
bad "takes NAME=DIR" --lora $F/a
bad "takes NAME=DIR" --lora =$F/a
bad "is taken" --lora a=$F/a --lora a=$F/b
bad "is taken" --lora chat=$F/a
bad "do not go together" --adapter $F/a --lora b=$F/b
bad "adapter_config.json" --lora a=$W/nowhere
mkdir -p "$W/trunc" && cp $F/a/adapter_config.json "$W/trunc/" && head -c 300 $F/a/adapter_model.safetensors >"$W/trunc/adapter_model.safetensors"
bad "adapter_model.safetensors" --lora a=$W/trunc

# 3. the server: base, a and b by name
[ -x "$V/bin/python" ] && "$V/bin/python" -c 'import openai' 2>/dev/null \
  || { echo "test_serve_lora: skipped the server part: no openai client in $V (test_serve_openai.sh makes it)"; exit 77; }
serve() {
  if ! serve_start "$W/s" --model $M --lora a=$F/a --lora b=$F/b --max-tokens 64 "$@"; then
    echo "FAIL: the server did not start: $(cat "$W/s.err")" >&2; fail=$((fail+1)); return
  fi
  timeout 120 "$V/bin/python" tests/serve_lora_check.py "$PORT" chat "$W/cases.json" $mode || { fail=$((fail+1)); echo "FAIL: serve $*" >&2; }
  kill -TERM $SPID; wait $SPID; rc=$?; SPID=
  [ $rc -eq 0 ] || { fail=$((fail+1)); echo "FAIL: the server exited $rc: $(tail -3 "$W/s.err")" >&2; }
}
mode=batched; serve --kv-block-size 8
mode=unbatched; serve --no-batching
[ $fail -eq 0 ] && echo "test_serve_lora: all passed" || echo "test_serve_lora: $fail failed"
exit $((fail > 0))
