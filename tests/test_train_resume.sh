#!/usr/bin/env bash
# test_train_resume.sh — `mmc train --resume` continues bit-identically after a SIGKILL:
# run A trains N steps uninterrupted; run B is killed with SIGKILL after a checkpoint, then
# resumed; every step's loss/lr/grad_norm line and the final weights and optimizer state
# must be byte-identical. Also: bad configs, NaN stop with the last checkpoint intact, an
# unwritable output_dir, keep_last pruning, bf16 resume.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

cat > "$W/run.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32, recompute: full}
data: {train: synthetic, seq_len: 32, batch_size: 4, micro_batch_size: 2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 3, grad_clip: 1.0}
training: {steps: 24, seed: 7, log_every: 1, save_every: 4, keep_last: 2, output_dir: $W/a}
YAML
# loss lines without the timing fields
losses() { grep '^step ' "$1" | sed 's/ tok\/s.*//'; }

"$MMC" train "$W/run.yaml" 2> "$W/a.log" || { cat "$W/a.log"; bad "uninterrupted run"; }
[ "$(ls -d "$W"/a/checkpoint-* | wc -l)" = 2 ] && ok "keep_last 2 pruning" || bad "keep_last: $(ls "$W/a")"

# run B: slowed down so that it can be killed between checkpoints
MMC_TRAIN_TEST_SLEEP_MS=150 "$MMC" train "$W/run.yaml" --set training.output_dir="$W/b" 2> "$W/b1.log" &
pid=$!
for i in $(seq 1 400); do
  [ -d "$W/b/checkpoint-8" ] && break
  sleep 0.05
done
sleep 0.3
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ -d "$W/b/checkpoint-8" ] && [ ! -d "$W/b/checkpoint-24" ] && ok "killed mid-run after checkpoint-8" \
  || bad "kill timing: $(ls "$W/b" 2>&1)"
"$MMC" train "$W/run.yaml" --set training.output_dir="$W/b" --resume 2> "$W/b2.log" || { cat "$W/b2.log"; bad "resume"; }
grep -q "resumed at step" "$W/b2.log" && ok "resumed" || bad "no resume message"
# B's lines: the killed run's lines up to the resume step, then the resumed run's
rs=$(sed -n 's/.*resumed at step \([0-9]*\).*/\1/p' "$W/b2.log")
{ losses "$W/b1.log" | awk -v r="$rs" '{split($2, a, "/"); if (a[1] + 0 <= r) print}'; losses "$W/b2.log"; } > "$W/b.lines"
losses "$W/a.log" > "$W/a.lines"
if cmp -s "$W/a.lines" "$W/b.lines" && [ "$(wc -l < "$W/a.lines")" = 24 ]; then ok "24 loss lines identical"
else bad "loss lines differ"; diff "$W/a.lines" "$W/b.lines" | head; fi
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$W/a/checkpoint-24/$f" "$W/b/checkpoint-24/$f" && ok "final $f byte-identical" || bad "$f differs"
done
cmp -s <(grep -o '"step": [0-9]*, "loss": [^,]*' "$W/a/metrics.jsonl") \
       <(grep -o '"step": [0-9]*, "loss": [^,]*' "$W/b/metrics.jsonl") && ok "metrics.jsonl trimmed + identical" \
  || bad "metrics.jsonl differs"

# bf16 weights with fp32 masters: resume is bit-identical too
"$MMC" train "$W/run.yaml" --set model.dtype=bf16 --set optimizer.schedule=constant --set training.steps=8 --set training.output_dir="$W/c" 2> "$W/c.log" \
  || { cat "$W/c.log"; bad "bf16 run"; }
"$MMC" train "$W/run.yaml" --set model.dtype=bf16 --set optimizer.schedule=constant --set training.steps=4 --set training.output_dir="$W/d" 2>/dev/null
"$MMC" train "$W/run.yaml" --set model.dtype=bf16 --set optimizer.schedule=constant --set training.steps=8 --set training.output_dir="$W/d" --resume 2>/dev/null
cmp -s "$W/c/checkpoint-8/optimizer.safetensors" "$W/d/checkpoint-8/optimizer.safetensors" \
  && cmp -s "$W/c/checkpoint-8/model.safetensors" "$W/d/checkpoint-8/model.safetensors" && ok "bf16 resume identical" \
  || bad "bf16 resume differs"

# NaN: a huge lr blows the weights up; the run stops with a message, checkpoints stay
# (MMC_TRAIN_TEST_NAN_STEP makes step 6's loss NaN: a deterministic stand-in for a diverging run)
MMC_TRAIN_TEST_NAN_STEP=6 "$MMC" train "$W/run.yaml" --set training.output_dir="$W/n" 2> "$W/n.log"
rc=$?
[ $rc = 1 ] && grep -qiE "NaN|infinite" "$W/n.log" && ok "NaN/Inf stops the run" || { cat "$W/n.log"; bad "NaN stop rc=$rc"; }
last=$(ls -d "$W"/n/checkpoint-* 2>/dev/null | tail -1)
[ "$last" = "$W/n/checkpoint-4" ] && [ -f "$last/model.safetensors" ] && [ -f "$last/trainer_state.json" ] && ok "last good checkpoint intact" \
  || bad "no intact checkpoint after NaN"

# unwritable output dir
mkdir -p "$W/ro" && chmod 555 "$W/ro"
if [ "$(id -u)" != 0 ]; then
  "$MMC" train "$W/run.yaml" --set training.output_dir="$W/ro/x" 2> "$W/ro.log"; rc=$?
  [ $rc = 1 ] && grep -q "cannot create\|not writable" "$W/ro.log" && ok "unwritable output_dir" || bad "unwritable: $(cat "$W/ro.log")"
fi
# output_dir below a regular file
touch "$W/file"
"$MMC" train "$W/run.yaml" --set training.output_dir="$W/file/out" 2> "$W/f.log"; rc=$?
[ $rc = 1 ] && grep -q "cannot create directory" "$W/f.log" && ok "output_dir under a file" || bad "file: $(cat "$W/f.log")"

# full disk during a save: RLIMIT_FSIZE (ulimit -f, KiB) below the size of model.safetensors
# makes the write of checkpoint-8 fail with EFBIG, as ENOSPC would; the run stops with a
# message, checkpoint-4 stays byte-identical, and no partial checkpoint is left behind
"$MMC" train "$W/run.yaml" --set training.steps=4 --set training.output_dir="$W/full" 2> /dev/null
cp -r "$W/full/checkpoint-4" "$W/full_ckpt4.copy"
( ulimit -f 256; trap '' XFSZ; exec "$MMC" train "$W/run.yaml" --set training.steps=8 --set training.output_dir="$W/full" --resume ) 2> "$W/full.log"; rc=$?
[ $rc = 1 ] && grep -qiE "cannot write|disk full|too large" "$W/full.log" && ok "full disk: the save fails with a message" \
  || bad "full disk rc=$rc: $(tail -3 "$W/full.log")"
diff -r "$W/full/checkpoint-4" "$W/full_ckpt4.copy" >/dev/null && ok "full disk: previous checkpoint intact" || bad "full disk: checkpoint-4 changed"
[ "$(ls -A "$W/full" | grep -v -e '^checkpoint-4$' -e '^metrics.jsonl$' -e '^tb$' -e '^loss.png$' -e '^config.yaml$' | tr '\n' ' ')" = "" ] \
  && ok "full disk: no partial checkpoint left" || bad "full disk: left behind: $(ls -A "$W/full")"
"$MMC" train "$W/run.yaml" --set training.steps=8 --set training.output_dir="$W/full" --resume 2> "$W/full2.log" \
  && grep -q "resumed at step 4" "$W/full2.log" && [ -f "$W/full/checkpoint-8/model.safetensors" ] && ok "full disk: resumes from checkpoint-4 once there is room" \
  || bad "full disk resume: $(tail -3 "$W/full2.log")"

# config errors name file:line, the key and a suggestion
printf 'model: {path: tests/fixtures/qwen2/tiny}\ndata: {train: synthetic}\noptimizer:\n  lr: 1e-3\n  warmup_step: 3\ntraining: {output_dir: %s/e}\n' "$W" > "$W/e.yaml"
"$MMC" train "$W/e.yaml" 2> "$W/e.log"; rc=$?
[ $rc = 1 ] && grep -q "e.yaml:5: unknown key 'optimizer.warmup_step' (did you mean 'optimizer.warmup_steps'?)" "$W/e.log" \
  && ok "unknown key" || bad "unknown key: $(cat "$W/e.log")"
"$MMC" train "$W/run.yaml" --set optimizer.lr=fast 2> "$W/e2.log"; rc=$?
[ $rc = 1 ] && grep -q "optimizer.lr: expected a number" "$W/e2.log" && ok "--set wrong type" || bad "wrong type: $(cat "$W/e2.log")"
"$MMC" train "$W/run.yaml" --set parallel.pipeline_parallel=2 2> "$W/e3.log"; rc=$?
[ $rc = 1 ] && grep -q "pipeline_parallel 2 is larger than the job's 1 process" "$W/e3.log" && ok "parallel validated" \
  || bad "parallel: $(cat "$W/e3.log")"
"$MMC" train "$W/run.yaml" --set parallel.tensor_parallel=2 2> "$W/e3.log"; rc=$?
[ $rc = 1 ] && grep -q "tensor_parallel 2 is larger than the job's 1 process" "$W/e3.log" && ok "tensor_parallel validated" \
  || bad "tensor_parallel: $(cat "$W/e3.log")"
"$MMC" train "$W/run.yaml" --resume --set training.output_dir="$W/none" 2> "$W/e4.log"; rc=$?
[ $rc = 1 ] && grep -q "no complete checkpoint" "$W/e4.log" && ok "--resume without checkpoint" || bad "resume none: $(cat "$W/e4.log")"
"$MMC" train --help | grep -q -- "--resume" && ok "help" || bad "help"
# the shipped examples are valid configs (they fail later, at the missing model directory)
for e in examples/qwen2_vl_2b_*.yaml; do
  "$MMC" train "$e" 2> "$W/ex.log"; grep -q "Qwen2-VL-2B-Instruct/config.json" "$W/ex.log" && ok "$e parses" \
    || bad "$e: $(cat "$W/ex.log")"
done

# Qwen2-VL from random init on a JSONL dataset (images + a video) through the data pipeline:
# the loss falls, a SIGKILLed run resumes bit-identically (loader state mid-epoch), packed rows
# give the padded rows' losses, and `mmc eval` loads the checkpoint (HF dir + processor config)
cat > "$W/vl.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32, recompute: full}
data: {train: tests/fixtures/data/sharegpt.jsonl, max_pixels: 3136, min_pixels: 3136, seq_len: 256, batch_size: 3, micro_batch_size: 1, num_workers: 2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}
training: {steps: 12, seed: 7, log_every: 1, save_every: 4, keep_last: 2, output_dir: $W/va}
YAML
"$MMC" train "$W/vl.yaml" 2> "$W/va.log" || { cat "$W/va.log"; bad "VL run"; }
l1=$(losses "$W/va.log" | sed -n '1s/.* loss \([0-9.]*\).*/\1/p'); l12=$(losses "$W/va.log" | sed -n '12s/.* loss \([0-9.]*\).*/\1/p')
awk -v a="$l1" -v b="$l12" 'BEGIN{exit !(b + 0 < a - 1.0)}' && ok "VL loss falls ($l1 -> $l12)" || bad "VL loss: $l1 -> $l12"
MMC_TRAIN_TEST_SLEEP_MS=150 "$MMC" train "$W/vl.yaml" --set training.output_dir="$W/vb" 2> "$W/vb1.log" &
pid=$!
for i in $(seq 1 400); do [ -d "$W/vb/checkpoint-4" ] && break; sleep 0.05; done
sleep 0.2
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
"$MMC" train "$W/vl.yaml" --set training.output_dir="$W/vb" --resume 2> "$W/vb2.log" || { cat "$W/vb2.log"; bad "VL resume"; }
rs=$(sed -n 's/.*resumed at step \([0-9]*\).*/\1/p' "$W/vb2.log")
{ losses "$W/vb1.log" | awk -v r="$rs" '{split($2, a, "/"); if (a[1] + 0 <= r) print}'; losses "$W/vb2.log"; } > "$W/vb.lines"
losses "$W/va.log" > "$W/va.lines"
cmp -s "$W/va.lines" "$W/vb.lines" && [ "$(wc -l < "$W/va.lines")" = 12 ] && ok "VL resume: 12 loss lines identical" \
  || { bad "VL resume loss lines differ (resumed at '$rs')"; diff "$W/va.lines" "$W/vb.lines" | head; }
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$W/va/checkpoint-12/$f" "$W/vb/checkpoint-12/$f" && ok "VL final $f byte-identical" || bad "VL $f differs"
done
"$MMC" train "$W/vl.yaml" --set data.batch_size=4 --set data.micro_batch_size=2 --set training.steps=3 --set training.output_dir="$W/vp1" 2> "$W/vp1.log"
"$MMC" train "$W/vl.yaml" --set data.batch_size=2 --set data.packing=true --set training.steps=3 --set training.output_dir="$W/vp2" 2> "$W/vp2.log"
# same tokens scored, another summation order: equal within 1e-5 relative
paste <(losses "$W/vp1.log" | cut -d' ' -f4) <(losses "$W/vp2.log" | cut -d' ' -f4) \
  | awk 'NF != 2 || ($1 - $2) > 1e-5 * $1 || ($2 - $1) > 1e-5 * $1 {bad = 1} END {exit bad || NR != 3}' \
  && ok "VL packed rows = padded rows (loss)" || { bad "VL packed vs padded"; losses "$W/vp1.log"; losses "$W/vp2.log"; }
"$MMC" eval --model "$W/va/checkpoint-12" --data tests/fixtures/data/llava.jsonl --json > "$W/ve.json" 2> "$W/ve.log" \
  && grep -q '"loss"' "$W/ve.json" && [ -f "$W/va/checkpoint-12/preprocessor_config.json" ] && ok "mmc eval loads the VL checkpoint" \
  || bad "VL eval: $(cat "$W/ve.log")"

# LoRA (dropout seeded per step/micro-batch) and QLoRA (NF4 base): PEFT files in every
# checkpoint, the loss falls, and a resume is bit-identical
for q in none nf4; do
  cat > "$W/lora_$q.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32, recompute: full,
        lora: {r: 4, alpha: 8, dropout: 0.1, targets: [q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]},
        quantization: {method: $q, double_quant: true}}
data: {train: tests/fixtures/data/sharegpt.jsonl, max_pixels: 3136, min_pixels: 3136, seq_len: 256, batch_size: 3, micro_batch_size: 1, num_workers: 1}
optimizer: {type: adamw, lr: 1.0e-2, schedule: constant, grad_clip: 1.0}
training: {steps: 8, seed: 7, log_every: 1, save_every: 4, output_dir: $W/l${q}a}
YAML
  "$MMC" train "$W/lora_$q.yaml" 2> "$W/l${q}a.log" || { cat "$W/l${q}a.log"; bad "LoRA ($q) run"; }
  "$MMC" train "$W/lora_$q.yaml" --set training.steps=4 --set training.output_dir="$W/l${q}b" 2>/dev/null
  "$MMC" train "$W/lora_$q.yaml" --set training.output_dir="$W/l${q}b" --resume 2> "$W/l${q}b.log" || bad "LoRA ($q) resume"
  grep -q "LoRA r=4 alpha=8 on 12 modules: [0-9]* trainable parameters ([0-9.]*% of [0-9]* total)" "$W/l${q}a.log" \
    && ok "LoRA ($q): start-up summary" || bad "LoRA ($q): no LoRA summary line"
  if [ $q = nf4 ]; then
    grep -q "QLoRA NF4 (double quant): quantised weights [0-9.]* MiB (f32) -> [0-9.]* MiB (NF4 codes + scales); base weights .* saving [0-9.]* MiB" "$W/l${q}a.log" \
      && ok "QLoRA: memory saving reported" || bad "QLoRA: no memory report"
  else
    grep -q "QLoRA" "$W/l${q}a.log" && bad "LoRA: QLoRA line without quantisation" || ok "LoRA: no QLoRA line"
  fi
  [ -f "$W/l${q}a/checkpoint-8/adapter_config.json" ] && [ -f "$W/l${q}a/checkpoint-8/adapter_model.safetensors" ] \
    && ok "LoRA ($q): PEFT adapter in the checkpoint" || bad "LoRA ($q): no adapter files"
  l1=$(losses "$W/l${q}a.log" | sed -n '1s/.* loss \([0-9.]*\).*/\1/p'); l8=$(losses "$W/l${q}a.log" | sed -n '8s/.* loss \([0-9.]*\).*/\1/p')
  awk -v a="$l1" -v b="$l8" 'BEGIN{exit !(b + 0 < a - 0.05)}' && ok "LoRA ($q) loss falls ($l1 -> $l8)" || bad "LoRA ($q) loss: $l1 -> $l8"
  cmp -s "$W/l${q}a/checkpoint-8/adapter_model.safetensors" "$W/l${q}b/checkpoint-8/adapter_model.safetensors" \
    && cmp -s "$W/l${q}a/checkpoint-8/optimizer.safetensors" "$W/l${q}b/checkpoint-8/optimizer.safetensors" \
    && ok "LoRA ($q) resume bit-identical" || bad "LoRA ($q) resume differs"
done

# eval_every: the eval split's teacher-forced loss goes to the log, metrics.jsonl and TensorBoard
"$MMC" train "$W/vl.yaml" --set data.eval=tests/fixtures/data/llava.jsonl --set training.eval_every=4 --set training.steps=8 \
  --set training.output_dir="$W/ve" 2> "$W/ve2.log" || { cat "$W/ve2.log"; bad "eval_every run"; }
[ "$(grep -c '"eval_loss"' "$W/ve/metrics.jsonl")" = 2 ] && grep -q "eval step 8: loss" "$W/ve2.log" \
  && ok "eval_every logs eval_loss" || bad "eval_every: $(cat "$W/ve/metrics.jsonl")"

exit $fail
