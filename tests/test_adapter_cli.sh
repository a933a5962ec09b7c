#!/usr/bin/env bash
# test_adapter_cli.sh — a LoRA training checkpoint (PEFT adapter only) is used directly by
# mmc eval / generate / forward, no `mmc merge` first: its adapter_config.json names the base
# (absolute path), the base is loaded and the adapter applied in the linears. Eval loss and
# answers equal those of the merged model; --adapter DIR does the same on an explicit base;
# a base that moved or a wrong --adapter fail with a message saying what to pass.
set -u
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
MMC=${MMC:-build/mmc}
W=$(mktemp -d /tmp/mmc_test_adapter_cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
BASE=tests/fixtures/eval/model
DATA=tests/fixtures/eval/data/val.jsonl
IMG=tests/fixtures/eval/data/images/s0.png

cat > "$W/lora.yaml" <<YAML
model: {path: $BASE, dtype: f32,
        lora: {r: 4, alpha: 8, dropout: 0.0, targets: [qkv, fc1, q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}}
data: {train: $DATA, seq_len: 256, batch_size: 2, micro_batch_size: 1, num_workers: 1}
optimizer: {type: adamw, lr: 2.0e-2, schedule: constant}
training: {steps: 4, seed: 7, log_every: 1, save_every: 4, output_dir: $W/run}
YAML
"$MMC" train "$W/lora.yaml" 2> "$W/train.log" || { cat "$W/train.log"; bad "LoRA training run"; exit 1; }
C=$W/run/checkpoint-4
[ -f "$C/adapter_config.json" ] && [ ! -f "$C/model.safetensors" ] && ok "checkpoint holds only the adapter" \
  || bad "checkpoint layout: $(ls "$C")"
grep -q "\"base_model_name_or_path\":.*\"$(cd "$BASE" && pwd)\"" "$C/adapter_config.json" \
  && ok "base recorded as an absolute path" || bad "base path: $(grep base_model "$C/adapter_config.json")"

"$MMC" merge --adapter "$C" --out "$W/merged" > /dev/null 2> "$W/merge.log" && ok "merge finds the base itself" \
  || bad "merge without --model: $(cat "$W/merge.log")"
e_ck=$("$MMC" eval --model "$C" --data "$DATA" --json --out "$W/p_ck.jsonl" 2> "$W/e.log") || bad "eval on the checkpoint: $(cat "$W/e.log")"
e_ad=$("$MMC" eval --model "$BASE" --adapter "$C" --data "$DATA" --json 2>&1) || bad "eval --adapter: $e_ad"
e_mg=$("$MMC" eval --model "$W/merged" --data "$DATA" --json --out "$W/p_mg.jsonl" 2>&1) || bad "eval merged: $e_mg"
e_b=$("$MMC" eval --model "$BASE" --data "$DATA" --json 2>&1) || bad "eval base: $e_b"
loss() { printf '%s' "$1" | sed -n 's/.*"loss":\([^,]*\),.*/\1/p'; }
echo "eval loss: checkpoint $(loss "$e_ck"), merged $(loss "$e_mg"), base $(loss "$e_b")"
[ "$e_ck" = "$e_ad" ] && ok "--model CKPT = --model BASE --adapter CKPT" || bad "--adapter differs: $e_ck vs $e_ad"
awk -v a="$(loss "$e_ck")" -v b="$(loss "$e_mg")" 'BEGIN{d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * (a < 0 ? -a : a))}' \
  && ok "eval loss = merged model's (1e-5 rel)" || bad "eval loss $(loss "$e_ck") vs merged $(loss "$e_mg")"
awk -v a="$(loss "$e_ck")" -v b="$(loss "$e_b")" 'BEGIN{d = a - b; if (d < 0) d = -d; exit !(d > 1e-3)}' \
  && ok "the adapter is applied (loss differs from the base's)" || bad "checkpoint loss equals the base's"
cmp -s <(sed 's/"loss": [^,]*,//' "$W/p_ck.jsonl") <(sed 's/"loss": [^,]*,//' "$W/p_mg.jsonl") \
  && ok "eval predictions = merged model's" || bad "predictions differ from the merged model's"

g_ck=$("$MMC" generate --model "$C" --prompt "What colour?" --image "$IMG" --max-new-tokens 6 --json 2>&1) || bad "generate on the checkpoint: $g_ck"
g_mg=$("$MMC" generate --model "$W/merged" --prompt "What colour?" --image "$IMG" --max-new-tokens 6 --json 2>&1)
g_ad=$("$MMC" generate --adapter "$C" --prompt "What colour?" --image "$IMG" --max-new-tokens 6 --json 2>&1)
toks() { printf '%s' "$1" | sed -n 's/.*"tokens": \(\[[^]]*\]\).*/\1/p'; }
[ -n "$(toks "$g_ck")" ] && [ "$(toks "$g_ck")" = "$(toks "$g_mg")" ] && [ "$(toks "$g_ck")" = "$(toks "$g_ad")" ] \
  && ok "generate: checkpoint = merged = --adapter alone ($(toks "$g_ck"))" || bad "generate: $g_ck / $g_mg / $g_ad"
"$MMC" forward --model "$C" --prompt "What colour?" --image "$IMG" --out "$W/f.safetensors" --json > /dev/null 2> "$W/f.log" \
  && [ -s "$W/f.safetensors" ] && ok "forward on the checkpoint" || bad "forward: $(cat "$W/f.log")"

# errors: a base model that moved, an --adapter that is not one, an adapter as --model with --adapter
cp -r "$C" "$W/moved"
sed -i 's#"base_model_name_or_path":[^,]*#"base_model_name_or_path": "/nonexistent/base"#' "$W/moved/adapter_config.json"
err=$("$MMC" eval --model "$W/moved" --data "$DATA" --json 2>&1)
[ $? -ne 0 ] && printf '%s' "$err" | grep -q "/nonexistent/base" && printf '%s' "$err" | grep -q -- "--model BASE --adapter" \
  && ok "moved base: error says what to pass" || bad "moved base: $err"
out=$("$MMC" eval --model "$BASE" --adapter "$W/moved" --data "$DATA" --json 2>&1) && [ "$out" = "$e_ck" ] \
  && ok "moved base: --model BASE --adapter works" || bad "explicit base: $out"
err=$("$MMC" generate --model "$BASE" --adapter "$BASE" --prompt hi 2>&1)
[ $? -ne 0 ] && printf '%s' "$err" | grep -q "not a LoRA adapter directory" && ok "--adapter on a model dir refused" || bad "--adapter BASE: $err"
err=$("$MMC" forward --model "$C" --adapter "$C" --prompt hi --out "$W/x.safetensors" 2>&1)
[ $? -ne 0 ] && printf '%s' "$err" | grep -q "is a LoRA adapter, not a base model" && ok "adapter as --model with --adapter refused" || bad "$err"
exit $fail
