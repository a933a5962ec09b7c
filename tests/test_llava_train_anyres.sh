#!/usr/bin/env bash
# test_llava_train_anyres.sh — `mmc train` on LLaVA-NeXT (tests/fixtures/llava_next/next: CLIP tower,
# Mistral LM) and LLaVA-OneVision (tests/fixtures/llava_onevision/ov: SigLIP tower, Qwen2 LM,
# anyres_max_4) against transformers 5.23 + PEFT 0.21 (tools/ref/gen_llava_train_anyres.py ->
# tests/fixtures/llava_anyres_train/; data: non-square images giving 1x2 / 3x1 / 2x2 grids for
# NeXT and 2x3 / 3x3 grids bilinearly downsampled for OneVision, a text-only turn and a
# two-image turn — OneVision's one padded tile each):
#   LoRA: 20 steps (r 4, alpha 8 on the LM's q/k/v/o/gate/up/down and the projector's
#         linear_1/linear_2, from the reference's initial adapter via model.lora.init), every
#         step's loss within 1e-3 of PEFT's (measured: next 7e-6, ov 8e-6)
#   full: 8 steps with the vision tower frozen (the default; the projector, image_newline and
#         the LM trained), every loss within 1e-3 (measured: next 6e-6, ov 6e-6); the checkpoint
#         holds save_pretrained's names, image_newline trained, `mmc forward` loads it;
#         with nothing frozen (NeXT's CLIP / OneVision's SigLIP tower trained too): 8 steps
#         within 1e-3 (measured: next 6e-6, ov 6e-6)
#   model.freeze [vision_tower, merger]: image_newline stays as it was (frozen with the projector)
#   batches: a padded micro-batch of the 5 records (and OneVision's packed row of them): the first
#         loss is the reference's label-weighted per-sample mean (1e-4); DP: 2 ranks (ZeRO-2)
#         give the single-process losses (with MPI)
#   mmc merge: of PEFT's trained adapter, 16 linears folded, the merged model's logits within
#         1e-4 of PEFT's; of mmc's own 20-step LoRA checkpoint, the vision tower and
#         image_newline copied bit for bit; `mmc forward --adapter` gives PEFT's logits (1e-4)
#   malformed: a video sample, the torchvision image backend and a processor whose
#         image_grid_pinpoints differ from the model's refused with messages
# With the reference venv (.venv-ref or MMC_REF_PYTHON), tools/ref/check_llava_train.py --chat:
# PEFT loads mmc's 20-step LoRA checkpoint and transformers its full one, each giving the logits
# `mmc forward` gives within 1e-4.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
F=tests/fixtures/llava_anyres_train
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
[ -x "$MMC" ] || { echo "test_llava_train_anyres: skipped: no mmc binary at $MMC"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_llava_train_anyres.XXXXXX); trap 'rm -rf "$W"' EXIT
. tests/train_check.sh   # ok / bad, st_floats, maxdiff, within, losses

# one model's checks: $1 next | ov, $2 its base folder, $3 a vision-tower weight name
check_model() {
  local M=$1 BASE=$2 TW=$3 d k
  local common="data: {train: $F/data.jsonl, batch_size: 1, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}"
  cat > "$W/$M.lora.yaml" <<YAML
model: {path: $BASE, dtype: f32, lora: {r: 4, alpha: 8, init: $F/${M}_lora_init}}
$common
optimizer: {lr: 5.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 20, log_every: 1, save_every: 20, output_dir: $W/$M.lora, seed: 0}
YAML
  cat > "$W/$M.full.yaml" <<YAML
model: {path: $BASE, dtype: f32}
$common
optimizer: {lr: 1.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 8, log_every: 1, save_every: 8, output_dir: $W/$M.full, seed: 0}
YAML
  if "$MMC" train "$W/$M.lora.yaml" 2> "$W/$M.lora.log"; then
    losses "$W/$M.lora.log" > "$W/$M.lora.txt"
    d=$(maxdiff "$W/$M.lora.txt" $F/${M}_lora_losses.txt)
    echo "$M LoRA 20 steps: max |loss - PEFT's| = $d"
    within "$d" 1e-3 && ok || bad "$M LoRA losses differ from PEFT's by $d"
    "$MMC" forward --model "$W/$M.lora/checkpoint-20" --image $F/wide.png --prompt "What is in the picture?" \
      --out "$W/$M.lf.safetensors" 2> "$W/f.log" && ok || { cat "$W/f.log"; bad "$M: forward --model on the LoRA checkpoint failed"; }
  else cat "$W/$M.lora.log"; bad "$M LoRA training failed"; fi

  if "$MMC" train "$W/$M.full.yaml" 2> "$W/$M.full.log"; then
    losses "$W/$M.full.log" > "$W/$M.full.txt"
    d=$(maxdiff "$W/$M.full.txt" $F/${M}_full_losses.txt)
    echo "$M full 8 steps (tower frozen): max |loss - transformers'| = $d"
    within "$d" 1e-3 && ok || bad "$M full fine-tuning losses differ from transformers' by $d"
    local ck=$W/$M.full/checkpoint-8
    hdr=$(head -c 30000 "$ck/model.safetensors" | tr -d '\0')
    for k in language_model.model.embed_tokens.weight language_model.lm_head.weight \
             multi_modal_projector.linear_1.weight image_newline "$TW"; do
      case "$hdr" in *"\"$k\""*) ok ;; *) bad "$M full checkpoint lacks $k" ;; esac
    done
    st_floats "$ck/model.safetensors" image_newline > "$W/nl1.txt"; st_floats $BASE/model.safetensors image_newline > "$W/nl0.txt"
    [ -s "$W/nl0.txt" ] && ! cmp -s "$W/nl0.txt" "$W/nl1.txt" && ok || bad "$M: image_newline was not trained"
    st_floats "$ck/model.safetensors" "$TW" > "$W/t1.txt"; st_floats $BASE/model.safetensors "$TW" > "$W/t0.txt"
    [ -s "$W/t0.txt" ] && cmp -s "$W/t0.txt" "$W/t1.txt" && ok || bad "$M: the frozen tower changed ($TW)"
    "$MMC" forward --model "$ck" --image $F/wide.png --prompt "What is in the picture?" --out "$W/$M.ff.safetensors" \
      2> "$W/f.log" && ok || { cat "$W/f.log"; bad "$M: forward --model on the full checkpoint failed"; }
  else cat "$W/$M.full.log"; bad "$M full training failed"; fi

  # image_newline belongs to the projector (merger): frozen with it
  if "$MMC" train "$W/$M.full.yaml" --set "model.freeze=[vision_tower, merger]" --set training.steps=2 \
       --set training.save_every=2 --set training.output_dir="$W/$M.fm" 2> "$W/fm.log"; then
    st_floats "$W/$M.fm/checkpoint-2/model.safetensors" image_newline > "$W/nl2.txt"
    [ -s "$W/nl2.txt" ] && cmp -s "$W/nl0.txt" "$W/nl2.txt" && ok || bad "$M: image_newline trained with the merger frozen"
  else cat "$W/fm.log"; bad "$M: training with the merger frozen failed"; fi

  # the PEFT-trained adapter: at inference and merged (the tower copied as it was)
  tr ' ' '\n' < $F/${M}_lora_ref.logits.txt | sed '/^$/d' > "$W/peft.txt"
  if "$MMC" forward --model $BASE --adapter $F/${M}_lora_ref --image $F/wide.png --prompt "What is in the picture?" \
       --out "$W/ad.safetensors" 2> "$W/ad.log"; then
    st_floats "$W/ad.safetensors" last_logits > "$W/ad.txt"
    d=$(maxdiff "$W/ad.txt" "$W/peft.txt")
    echo "$M PEFT-trained adapter in mmc forward: max |logit - PEFT's| = $d"
    within "$d" 1e-4 && ok || bad "$M adapter logits differ from PEFT's by $d"
  else cat "$W/ad.log"; bad "$M forward --adapter failed"; fi
  if "$MMC" merge --adapter $F/${M}_lora_ref --out "$W/$M.merged" > "$W/mg.log" 2>&1 &&
     "$MMC" forward --model "$W/$M.merged" --image $F/wide.png --prompt "What is in the picture?" \
       --out "$W/mg.safetensors" 2>> "$W/mg.log"; then
    grep -q "merged 16 adapted weights" "$W/mg.log" && ok || { cat "$W/mg.log"; bad "$M merge did not fold 16 linears"; }
    st_floats "$W/mg.safetensors" last_logits > "$W/mg.txt"
    d=$(maxdiff "$W/mg.txt" "$W/peft.txt")
    echo "$M merged adapter: max |logit - PEFT's| = $d"
    within "$d" 1e-4 && ok || bad "$M merged logits differ from PEFT's by $d"
  else cat "$W/mg.log"; bad "$M merge of PEFT's adapter failed"; fi
  # mmc's own LoRA run merged: the tower and image_newline bit for bit the base's
  if "$MMC" merge --model $BASE --adapter "$W/$M.lora/checkpoint-20" --out "$W/$M.m2" > "$W/m2.log" 2>&1; then
    for k in "$TW" image_newline; do
      st_floats "$W/$M.m2/model.safetensors" "$k" > "$W/a.txt"; st_floats $BASE/model.safetensors "$k" > "$W/b.txt"
      [ -s "$W/b.txt" ] && cmp -s "$W/a.txt" "$W/b.txt" && ok || bad "$M: merging mmc's LoRA run changed $k"
    done
    st_floats "$W/$M.m2/model.safetensors" multi_modal_projector.linear_1.weight > "$W/a.txt"
    st_floats $BASE/model.safetensors multi_modal_projector.linear_1.weight > "$W/b.txt"
    ! cmp -s "$W/a.txt" "$W/b.txt" && ok || bad "$M: merging mmc's LoRA run left the projector as it was"
  else cat "$W/m2.log"; bad "$M merge of mmc's LoRA checkpoint failed"; fi

  # PEFT loads mmc's LoRA checkpoint, transformers its full one: the logits `mmc forward` gave (1e-4)
  if "$PY" -c "import transformers, peft" 2>/dev/null; then
    "$PY" tools/ref/check_llava_train.py "$W/$M.lora/checkpoint-20" "$W/$M.lf.safetensors" "$W/$M.full/checkpoint-8" \
        "$W/$M.ff.safetensors" $F/wide.png --chat 2> "$W/py.log" && ok || { cat "$W/py.log"; bad "$M: reference check of the checkpoints"; }
  else
    echo "test_llava_train_anyres: skipped: the PEFT / transformers loading checks for $M (no $PY)"
  fi
}

check_model next tests/fixtures/llava_next/next vision_tower.encoder.layers.1.self_attn.q_proj.weight
check_model ov tests/fixtures/llava_onevision/ov vision_tower.encoder.layers.1.self_attn.q_proj.weight

# several samples in one step: a padded micro-batch of all 5 records, and (OneVision, 478 of 512
# tokens) one packed row of them, the two-image record's padded tiles among single images' anyres
# grids: the first loss is the label-weighted mean of the reference's per-sample losses at the start
# (M_initial_losses.txt), within 1e-4 (measured: equal to the printed digits)
for c in next:micro ov:micro ov:packed; do
  M=${c%%:*}
  want=$(awk '{s += $1 * $2; n += $2} END {printf "%.6f", s / n}' $F/${M}_initial_losses.txt)
  case ${c#*:} in micro) set -- --set data.micro_batch_size=5 --set data.batch_size=5 ;; *) set -- --set data.packing=true ;; esac
  if "$MMC" train "$W/$M.full.yaml" "$@" --set training.steps=1 --set training.save_every=0 \
       --set training.output_dir="$W/$M.b5" 2> "$W/b5.log"; then
    d=$(losses "$W/b5.log" | awk -v w="$want" '{d = $1 - w; print d < 0 ? -d : d}')
    echo "$M ${c#*:} batch of the 5 records: |first loss - weighted reference| = $d"
    within "$d" 1e-4 && ok || bad "$M ${c#*:} batch: first loss off by $d"
  else cat "$W/b5.log"; bad "$M ${c#*:} batch training failed"; fi
done

# data parallelism (2 ranks, ZeRO-2, OneVision full fine-tuning): the single-process losses (1e-5)
dp2_check "$W/ov.full.yaml" 3 "ov DP 2 ranks"

# the tower trained too (model.freeze given without vision_tower): NeXT's CLIP, OneVision's SigLIP
for M in next ov; do
  if "$MMC" train "$W/$M.full.yaml" --set "model.freeze=[]" --set training.save_every=0 \
       --set training.output_dir="$W/$M.tw" 2> "$W/tw.log"; then
    losses "$W/tw.log" > "$W/tw.txt"
    d=$(maxdiff "$W/tw.txt" $F/${M}_full_tower_losses.txt)
    echo "$M full 8 steps, tower trained: max |loss - transformers'| = $d"
    within "$d" 1e-3 && ok || bad "$M tower-trained losses differ from transformers' by $d"
  else cat "$W/tw.log"; bad "$M tower training failed"; fi
done

# malformed: a video sample, the torchvision backend (the anyres processor is PIL only)
printf '%s\n' '{"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "x"}], "videos": ["v.mp4"]}' > "$W/video.jsonl"
if "$MMC" train "$W/ov.full.yaml" --set data.train="$W/video.jsonl" --set data.strict=true --set training.steps=1 \
     --set training.output_dir="$W/vd" > "$W/vd.log" 2>&1; then bad "a video sample was accepted"
else grep -q "LLaVA-NeXT / OneVision takes images, not videos" "$W/vd.log" && ok || { cat "$W/vd.log"; bad "video sample: no clear error"; }; fi
if "$MMC" train "$W/next.full.yaml" --set data.image_backend=torchvision --set data.strict=true --set training.steps=1 \
     --set training.output_dir="$W/tv" > "$W/tv.log" 2>&1; then bad "the torchvision backend was accepted"
else grep -q "only the PIL backend" "$W/tv.log" && ok || { cat "$W/tv.log"; bad "torchvision backend: no clear error"; }; fi

# a processor whose image_grid_pinpoints differ from the model's: the tiles do not fit, refused
mkdir -p "$W/badproc" && cp tests/fixtures/llava_next/next/* "$W/badproc/"
perl -0pi -e 's/"image_grid_pinpoints": *\[.*?\]\s*\]/"image_grid_pinpoints": [[30, 30]]/s' "$W/badproc/processor_config.json"
if "$MMC" train "$W/next.full.yaml" --set model.path="$W/badproc" --set training.steps=1 \
     --set training.output_dir="$W/bp" > "$W/bp.log" 2>&1; then bad "a processor with other pinpoints was accepted"
else grep -q "image_grid_pinpoints call for" "$W/bp.log" && grep -q '\[\[30, 30\]\]' "$W/badproc/processor_config.json" && ok ||
       { cat "$W/bp.log"; bad "mismatched pinpoints: no clear error"; }; fi

echo "test_llava_train_anyres: $((n - fail))/$n passed"
[ "$fail" = 0 ]
