#!/usr/bin/env bash
# test_llava_train.sh — `mmc train` on LLaVA-1.5 (the tiny tests/fixtures/llava/v5) against
# transformers 5.23 + PEFT 0.21 (tools/ref/gen_llava_train.py -> tests/fixtures/llava_train/):
#   LoRA: 20 steps (r 4, alpha 8 on the LM's q/k/v/o/gate/up/down and the projector's
#         linear_1/linear_2, started from the reference's initial adapter via model.lora.init),
#         every step's loss within 1e-3 of PEFT's (measured: 4e-5); 8 steps on hub_llama (the
#         Hub's names, Llama's SentencePiece-style tokenizer; 1e-5)
#   full: 6 steps (vision_tower frozen), every loss within 1e-3 (measured: 5e-5); the
#         checkpoint holds save_pretrained's names; 6 steps with the tower trained too (6e-5)
#   packing: the first packed row's loss; DP: 2 ranks (LoRA ZeRO-2, full ZeRO-3 + mmc export)
#         give the single-process losses / weights (with MPI)
#   resume: a LoRA run stopped at step 10 and resumed gives the same losses for steps 11-20
#   inference: the PEFT-trained adapter (lora_ref) through `mmc forward --adapter`: the last
#         logits within 1e-4 of PEFT's (measured: 8e-6); mmc's LoRA checkpoint as --model
# mmc merge: the adapter folded into the base (the tower copied as it was) gives PEFT's logits.
# With the reference venv (.venv-ref or MMC_REF_PYTHON): PEFT loads mmc's LoRA checkpoint and
# transformers its full checkpoint, each giving the logits `mmc forward` gives within 1e-4.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
F=tests/fixtures/llava_train
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
[ -x "$MMC" ] || { echo "test_llava_train: skipped: no mmc binary at $MMC"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_llava_train.XXXXXX); trap 'rm -rf "$W"' EXIT
. tests/train_check.sh   # ok / bad, st_floats, maxdiff, within, losses

common="data: {train: $F/data.jsonl, batch_size: 1, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}"
cat > "$W/lora.yaml" <<YAML
model: {path: tests/fixtures/llava/v5, dtype: f32, lora: {r: 4, alpha: 8, init: $F/lora_init}}
$common
optimizer: {lr: 5.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 20, log_every: 1, save_every: 10, output_dir: $W/lora, seed: 0}
YAML
cat > "$W/full.yaml" <<YAML
model: {path: tests/fixtures/llava/v5, dtype: f32, freeze: [vision_tower]}
$common
optimizer: {lr: 1.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 6, log_every: 1, save_every: 6, output_dir: $W/full, seed: 0}
YAML

if "$MMC" train "$W/lora.yaml" 2> "$W/lora.log"; then
  losses "$W/lora.log" > "$W/lora.txt"
  d=$(maxdiff "$W/lora.txt" $F/lora_losses.txt)
  echo "LoRA 20 steps: max |loss - PEFT's| = $d"
  within "$d" 1e-3 && ok || bad "LoRA losses differ from PEFT's by $d"
  [ -f "$W/lora/checkpoint-20/adapter_model.safetensors" ] && ok || bad "no LoRA checkpoint"
else cat "$W/lora.log"; bad "LoRA training failed"; fi

# the Hub's layout with Llama's SentencePiece-style tokenizer (<s>, "▁"): 8 LoRA steps
if "$MMC" train "$W/lora.yaml" --set model.path=tests/fixtures/llava/hub_llama --set model.lora.init=$F/hub_lora_init \
     --set training.steps=8 --set training.save_every=0 --set training.output_dir="$W/hub" 2> "$W/hub.log"; then
  losses "$W/hub.log" > "$W/hub.txt"
  d=$(maxdiff "$W/hub.txt" $F/hub_lora_losses.txt)
  echo "hub_llama LoRA 8 steps: max |loss - PEFT's| = $d"
  within "$d" 1e-3 && ok || bad "hub_llama LoRA losses differ from PEFT's by $d"
else cat "$W/hub.log"; bad "hub_llama LoRA training failed"; fi

if "$MMC" train "$W/full.yaml" 2> "$W/full.log"; then
  losses "$W/full.log" > "$W/full.txt"
  d=$(maxdiff "$W/full.txt" $F/full_losses.txt)
  echo "full 6 steps: max |loss - transformers'| = $d"
  within "$d" 1e-3 && ok || bad "full fine-tuning losses differ from transformers' by $d"
  hdr=$(head -c 20000 "$W/full/checkpoint-6/model.safetensors" | tr -d '\0')
  for k in language_model.model.embed_tokens.weight language_model.lm_head.weight \
           multi_modal_projector.linear_1.weight vision_tower.embeddings.class_embedding; do
    case "$hdr" in *"\"$k\""*) ok ;; *) bad "full checkpoint lacks $k" ;; esac
  done
else cat "$W/full.log"; bad "full training failed"; fi

# the tower trained too (model.freeze given without vision_tower)
if "$MMC" train "$W/full.yaml" --set "model.freeze=[]" --set training.save_every=0 --set training.output_dir="$W/ft" 2> "$W/ft.log"; then
  losses "$W/ft.log" > "$W/ft.txt"
  d=$(maxdiff "$W/ft.txt" $F/full_tower_losses.txt)
  echo "full 6 steps, tower trained: max |loss - transformers'| = $d"
  within "$d" 1e-3 && ok || bad "tower-trained losses differ from transformers' by $d"
else cat "$W/ft.log"; bad "tower training failed"; fi

# resume: stop after step 10 (its checkpoint), go on to 20
if "$MMC" train "$W/lora.yaml" --set training.steps=10 --set training.output_dir="$W/res" 2> "$W/r1.log" &&
   "$MMC" train "$W/lora.yaml" --set training.output_dir="$W/res" --resume 2> "$W/r2.log"; then
  losses "$W/r2.log" > "$W/r2.txt"
  sed -n '11,20p' "$W/lora.txt" > "$W/l2.txt"
  d=$(maxdiff "$W/r2.txt" "$W/l2.txt")
  [ "$(wc -l < "$W/r2.txt")" = 10 ] && within "$d" 0 && ok || bad "resumed losses differ ($d)"
else cat "$W/r1.log" "$W/r2.log" 2>/dev/null; bad "resume failed"; fi

# packing: the first packed row holds samples 0, 1, 2, 3, 0, 1, 2 (295 + 189 of 512 tokens);
# its loss is the label-weighted mean of the reference's per-sample losses at the start
# (7.546634 x 15, 7.755545 x 19, 8.086265 x 10, 7.600223 x 24 labels -> 7.725358)
if "$MMC" train "$W/lora.yaml" --set training.steps=1 --set data.packing=true --set training.output_dir="$W/pk" 2> "$W/pk.log"; then
  d=$(losses "$W/pk.log" | awk '{d = $1 - 7.725358; print d < 0 ? -d : d}')
  within "$d" 1e-4 && ok || bad "packed loss off by $d"
else cat "$W/pk.log"; bad "packed training failed"; fi

# data parallelism (2 ranks, ZeRO-2): the losses of the single-process run with the same global batch
if dp2_check "$W/lora.yaml" 3 "DP 2 ranks ZeRO-2"; then   # (then ZeRO-3, which needs the same MPI build)
  # full fine-tuning under ZeRO-3 (parameters in the ranks' shards), consolidated by mmc export:
  # the losses and the exported weights of the single-process run
  "$MMC" train "$W/full.yaml" --set training.steps=2 --set training.save_every=2 --set data.batch_size=2 \
    --set training.output_dir="$W/z1" 2> "$W/z1.log"
  timeout -k 10 200 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$MMC" train "$W/full.yaml" \
    --set training.steps=2 --set training.save_every=2 --set data.batch_size=2 --set parallel.data_parallel=2 \
    --set parallel.zero=3 --set training.output_dir="$W/z3" > "$W/z3.log" 2>&1
  losses "$W/z1.log" > "$W/z1.txt"; losses "$W/z3.log" > "$W/z3.txt"
  d=$(maxdiff "$W/z1.txt" "$W/z3.txt")
  [ "$(wc -l < "$W/z3.txt")" = 2 ] && within "$d" 1e-5 && ok || { tail -5 "$W/z3.log"; bad "ZeRO-3 losses differ ($d)"; }
  if "$MMC" export "$W/z3/checkpoint-2" --out "$W/z3e" > /dev/null 2>&1; then
    k=multi_modal_projector.linear_1.weight
    st_floats "$W/z3e/model.safetensors" $k > "$W/e3.txt"; st_floats "$W/z1/checkpoint-2/model.safetensors" $k > "$W/e1.txt"
    d=$(maxdiff "$W/e1.txt" "$W/e3.txt")
    within "$d" 1e-6 && ok || bad "ZeRO-3 exported $k differs by $d"
  else bad "mmc export of the ZeRO-3 checkpoint failed"; fi
fi

# inference with adapters
IMG=$F/img0.png
if "$MMC" forward --model tests/fixtures/llava/v5 --adapter $F/lora_ref --image $IMG --prompt "What is in the picture?" \
     --out "$W/ref.safetensors" 2> "$W/f1.log"; then
  st_floats "$W/ref.safetensors" last_logits > "$W/ref.txt"
  tr ' ' '\n' < $F/lora_ref.logits.txt | sed '/^$/d' > "$W/peft.txt"
  d=$(maxdiff "$W/ref.txt" "$W/peft.txt")
  echo "PEFT-trained adapter in mmc forward: max |logit - PEFT's| = $d"
  within "$d" 1e-4 && ok || bad "adapter logits differ from PEFT's by $d"
else cat "$W/f1.log"; bad "forward --adapter failed"; fi
for ck in lora:checkpoint-20 full:checkpoint-6; do
  if "$MMC" forward --model "$W/${ck%%:*}/${ck#*:}" --image $IMG --prompt "What is in the picture?" \
       --out "$W/${ck%%:*}.safetensors" 2> "$W/f2.log"; then ok
  else cat "$W/f2.log"; bad "forward --model on the ${ck%%:*} checkpoint failed"; fi
done

# mmc merge: the PEFT-trained adapter folded in (LM + projector linears); the CLIP tower's
# weights are copied unchanged; the merged model gives PEFT's logits
if "$MMC" merge --adapter $F/lora_ref --out "$W/merged" > "$W/mg.log" 2>&1 &&
   "$MMC" forward --model "$W/merged" --image $IMG --prompt "What is in the picture?" --out "$W/mg.safetensors" 2>> "$W/mg.log"; then
  grep -q "merged 16 adapted weights" "$W/mg.log" && ok || { cat "$W/mg.log"; bad "merge did not fold the 16 adapted linears"; }
  st_floats "$W/mg.safetensors" last_logits > "$W/mg.txt"
  d=$(maxdiff "$W/mg.txt" "$W/peft.txt")
  echo "merged adapter: max |logit - PEFT's| = $d"
  within "$d" 1e-4 && ok || bad "merged logits differ from PEFT's by $d"
  k=vision_tower.encoder.layers.1.self_attn.q_proj.weight
  st_floats "$W/merged/model.safetensors" $k > "$W/t1.txt"; st_floats tests/fixtures/llava/v5/model.safetensors $k > "$W/t0.txt"
  [ -s "$W/t0.txt" ] && cmp -s "$W/t0.txt" "$W/t1.txt" && ok || bad "merge changed the vision tower ($k)"
else cat "$W/mg.log"; bad "merge failed"; fi

if "$PY" -c "import transformers, peft" 2>/dev/null; then
  "$PY" tools/ref/check_llava_train.py "$W/lora/checkpoint-20" "$W/lora.safetensors" \
      "$W/full/checkpoint-6" "$W/full.safetensors" $IMG && ok || bad "reference check of the checkpoints"
else
  echo "test_llava_train: skipped: the PEFT / transformers loading checks (no $PY)"
fi
echo "test_llava_train: $((n - fail))/$n passed"
[ "$fail" = 0 ]
