#!/usr/bin/env bash
# test_internvl_train.sh — `mmc train` on InternVL (the tiny tests/fixtures/internvl/v5, HF-native
# layout) against transformers 5.23 + PEFT 0.21 (tools/ref/gen_internvl_train.py ->
# tests/fixtures/internvl_train/; data: a wide image of 4 tiles, a tall one of 3, a text-only turn):
#   LoRA: 20 steps (r 4, alpha 8 on the LM's q/k/v/o/gate/up/down and the projector's
#         linear_1/linear_2, started from the reference's initial adapter via model.lora.init),
#         every step's loss within 1e-3 of PEFT's (measured: 2e-5)
#   full: 6 steps (vision_tower frozen), every loss within 1e-3 (measured: 3e-6); the checkpoint
#         holds save_pretrained's names and `mmc forward` loads it
#   QLoRA (NF4 LM): the first loss within 5e-2 of the LoRA reference (quantisation error)
#   the tower unfrozen: 6 steps with the InternViT tower trained (losses and tower weights, below)
#   resume: a LoRA run stopped at step 10 and resumed gives the same losses for steps 11-20
#   DP: 2 ranks (LoRA, ZeRO-2) give the single-process losses (with MPI)
#   LoRA on the tower's linears too: 10 steps' losses and adapters against PEFT's, merged (below)
#   mmc merge of PEFT's trained adapter / of mmc's 20-step LoRA run: 16 linears folded, the tower
#   copied unchanged
#   malformed: a video sample on v5 (384-pixel video frames, 56-pixel tiles) refused with a message (videos train:
#   test_internvl_video_train; OpenGVLab's internvl_chat layout trains: see
#   test_internvl_chat_train for it with InternLM2, test_internvl_chat_train_qwen2 with Qwen2)
# With the reference venv (.venv-ref or MMC_REF_PYTHON), tools/ref/check_internvl_train.py:
# transformers loads the full checkpoint (logits = mmc forward's within 1e-4 at the text
# positions), PEFT loads mmc's 20-step adapter (its tensors within 2e-3 of PEFT's own 20-step
# adapter, measured 8e-4; the adapted logits within 2e-3, measured 1.1e-3), and the merged model
# through `mmc forward` gives PEFT's logits within 1e-4 at the text positions.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"   # (fontconfig, via the loss plot)
F=tests/fixtures/internvl_train
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
[ -x "$MMC" ] || { echo "test_internvl_train: skipped: no mmc binary at $MMC"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_internvl_train.XXXXXX); trap 'rm -rf "$W"' EXIT
. tests/train_check.sh   # ok / bad, st_floats, maxdiff, within, losses

common="data: {train: $F/data.jsonl, batch_size: 1, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}"
cat > "$W/lora.yaml" <<YAML
model: {path: tests/fixtures/internvl/v5, dtype: f32, lora: {r: 4, alpha: 8, init: $F/lora_init}}
$common
optimizer: {lr: 5.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 20, log_every: 1, save_every: 10, output_dir: $W/lora, seed: 0}
YAML
cat > "$W/full.yaml" <<YAML
model: {path: tests/fixtures/internvl/v5, dtype: f32, freeze: [vision_tower]}
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

if "$MMC" train "$W/full.yaml" 2> "$W/full.log"; then
  losses "$W/full.log" > "$W/full.txt"
  d=$(maxdiff "$W/full.txt" $F/full_losses.txt)
  echo "full 6 steps: max |loss - transformers'| = $d"
  within "$d" 1e-3 && ok || bad "full fine-tuning losses differ from transformers' by $d"
  hdr=$(head -c 20000 "$W/full/checkpoint-6/model.safetensors" | tr -d '\0')
  for k in language_model.model.embed_tokens.weight language_model.lm_head.weight \
           multi_modal_projector.layer_norm.weight vision_tower.embeddings.cls_token; do
    case "$hdr" in *"\"$k\""*) ok ;; *) bad "full checkpoint lacks $k" ;; esac
  done
  if "$MMC" forward --model "$W/full/checkpoint-6" --image $F/wide.png --prompt "What is in the picture?" \
       --out "$W/full.safetensors" 2> "$W/f.log"; then ok
  else cat "$W/f.log"; bad "forward --model on the full checkpoint failed"; fi
else cat "$W/full.log"; bad "full training failed"; fi

# the InternViT tower trained too (model.freeze given without vision_tower): every loss within
# 1e-3 of transformers' (measured: 6e-6), and the tower's weights after the 6 steps near
# transformers' (TOWER_KEYS of gen_internvl_train.py): |mmc - ref| / |ref - base| (2-norms over
# each tensor's update) within 2.5e-2. Measured: 1.3e-2 for the patch embedding (AdamW's first
# steps take lr * g / (|g| + eps) ~ lr * sign(g), so the few weights whose gradient is ~1e-7 of
# the largest flip with rounding), at most 2.1e-3 for the others; a tower without gradients gives 1.
if "$MMC" train "$W/full.yaml" --set "model.freeze=[]" --set training.output_dir="$W/ft" 2> "$W/ft.log"; then
  losses "$W/ft.log" > "$W/ft.txt"
  d=$(maxdiff "$W/ft.txt" $F/full_tower_losses.txt)
  echo "full 6 steps, InternViT trained: max |loss - transformers'| = $d"
  within "$d" 1e-3 && ok || bad "tower-trained losses differ from transformers' by $d"
  worst=0
  for k in vision_tower.embeddings.cls_token vision_tower.embeddings.position_embeddings \
           vision_tower.embeddings.patch_embeddings.projection.weight vision_tower.encoder.layer.0.attention.q_proj.weight \
           vision_tower.encoder.layer.0.lambda_1 vision_tower.encoder.layer.1.mlp.fc2.weight \
           vision_tower.encoder.layer.1.layernorm_after.bias; do
    st_floats "$W/ft/checkpoint-6/model.safetensors" $k > "$W/a.txt"; st_floats $F/full_tower_weights.safetensors $k > "$W/b.txt"
    st_floats tests/fixtures/internvl/v5/model.safetensors $k > "$W/c.txt"
    r=$(relupdate "$W/a.txt" "$W/b.txt" "$W/c.txt")
    within "$r" 2.5e-2 && ok || bad "InternViT weight $k after 6 steps: relative update error $r"
    worst=$(maxof "$worst" "$r")
  done
  echo "InternViT weights after 6 steps: max relative update error = $worst"
else cat "$W/ft.log"; bad "training with the tower unfrozen failed"; fi

# tiles of another size than the tower's image_size (84 on a 56-pixel tower: the position table
# interpolated) train with the tower frozen; training the tower on them is refused with a message
mkdir -p "$W/p84" && cp tests/fixtures/internvl/v5/* "$W/p84/"
sed -i 's/"height": 56/"height": 84/; s/"width": 56/"width": 84/; s/"image_seq_length": 4/"image_seq_length": 9/' "$W/p84/processor_config.json"
if "$MMC" train "$W/full.yaml" --set model.path="$W/p84" --set training.steps=1 --set training.save_every=0 \
     --set training.output_dir="$W/p84f" > "$W/p84f.log" 2>&1; then ok
else cat "$W/p84f.log"; bad "84-pixel tiles with the tower frozen failed"; fi
if "$MMC" train "$W/full.yaml" --set model.path="$W/p84" --set "model.freeze=[]" --set training.steps=1 \
     --set training.save_every=0 --set training.output_dir="$W/p84t" > "$W/p84t.log" 2>&1; then
  bad "training the tower on 84-pixel tiles was accepted"
else grep -q "training the tower on 84 x 84 tiles" "$W/p84t.log" && ok || { cat "$W/p84t.log"; bad "84-pixel tiles, tower trained: no clear error"; }; fi

# LoRA on the InternViT tower's linears too (PEFT's names model.vision_tower.encoder.layer.N.
# attention.{q,k,v}_proj / projection_layer / mlp.fc1 / fc2; 34 modules): 10 steps within 1e-3 of
# PEFT's losses (measured: 2e-5), the tower's adapters after them within 2.5e-2 relative update
# error (measured: at most 4.5e-3); mmc merge folds all 34 (the tower's weights change, its
# position embeddings stay bit for bit)
cat > "$W/tl.yaml" <<YAML
model: {path: tests/fixtures/internvl/v5, dtype: f32, lora: {r: 4, alpha: 8, init: $F/tower_lora_init}}
$common
optimizer: {lr: 5.0e-3, weight_decay: 0.0, schedule: constant, grad_clip: 0}
training: {steps: 10, log_every: 1, save_every: 10, output_dir: $W/tl, seed: 0}
YAML
if "$MMC" train "$W/tl.yaml" 2> "$W/tl.log"; then
  grep -q "LoRA r=4 alpha=8 on 34 modules" "$W/tl.log" && ok || bad "tower LoRA did not adapt 34 modules"
  losses "$W/tl.log" > "$W/tl.txt"
  d=$(maxdiff "$W/tl.txt" $F/tower_lora_losses.txt)
  echo "LoRA with the tower's linears, 10 steps: max |loss - PEFT's| = $d"
  within "$d" 1e-3 && ok || bad "tower LoRA losses differ from PEFT's by $d"
  worst=0
  for m in layer.0.attention.q_proj layer.1.attention.projection_layer layer.1.mlp.fc1 layer.0.mlp.fc2; do
    for ab in A B; do
      k=base_model.model.model.vision_tower.encoder.$m.lora_$ab.weight
      st_floats "$W/tl/checkpoint-10/adapter_model.safetensors" $k > "$W/a.txt"
      st_floats $F/tower_lora_ref/adapter_model.safetensors $k > "$W/b.txt"; st_floats $F/tower_lora_init/adapter_model.safetensors $k > "$W/c.txt"
      r=$(relupdate "$W/a.txt" "$W/b.txt" "$W/c.txt")
      within "$r" 2.5e-2 && ok || bad "tower adapter $m lora_$ab after 10 steps: relative update error $r"
      worst=$(maxof "$worst" "$r")
    done
  done
  echo "InternViT LoRA adapters after 10 steps: max relative update error = $worst"
  if "$MMC" merge --model tests/fixtures/internvl/v5 --adapter "$W/tl/checkpoint-10" --out "$W/tlm" > "$W/tlm.log" 2>&1; then
    grep -q "merged 34 adapted weights" "$W/tlm.log" && ok || { cat "$W/tlm.log"; bad "merge did not fold the 34 adapted linears"; }
    for k in vision_tower.encoder.layer.0.attention.q_proj.weight vision_tower.embeddings.position_embeddings; do
      st_floats "$W/tlm/model.safetensors" $k > "$W/a.txt"; st_floats tests/fixtures/internvl/v5/model.safetensors $k > "$W/b.txt"
      case $k in *q_proj*) [ -s "$W/b.txt" ] && ! cmp -s "$W/a.txt" "$W/b.txt" && ok || bad "merge left the adapted $k as it was" ;;
                 *) [ -s "$W/b.txt" ] && cmp -s "$W/a.txt" "$W/b.txt" && ok || bad "merge changed $k" ;; esac
    done
  else cat "$W/tlm.log"; bad "merge of the tower LoRA run failed"; fi
else cat "$W/tl.log"; bad "LoRA with the tower's linears failed"; fi

# QLoRA (the LM's projections in NF4, the shared Qwen2 path): runs, and its first loss is the
# LoRA one up to the quantisation error (measured 2.7e-3; bound 5e-2)
if "$MMC" train "$W/lora.yaml" --set model.quantization.method=nf4 --set training.steps=2 --set training.save_every=0 \
     --set training.output_dir="$W/q" 2> "$W/q.log"; then
  d=$(losses "$W/q.log" | head -1 | awk -v r="$(head -1 $F/lora_losses.txt)" '{d = $1 - r; print d < 0 ? -d : d}')
  echo "QLoRA NF4: |first loss - PEFT's LoRA| = $d"
  within "$d" 5e-2 && ok || bad "QLoRA first loss off by $d"
else cat "$W/q.log"; bad "QLoRA training failed"; fi

# resume: stop after step 10 (its checkpoint), go on to 20
if "$MMC" train "$W/lora.yaml" --set training.steps=10 --set training.output_dir="$W/res" 2> "$W/r1.log" &&
   "$MMC" train "$W/lora.yaml" --set training.output_dir="$W/res" --resume 2> "$W/r2.log"; then
  losses "$W/r2.log" > "$W/r2.txt"
  sed -n '11,20p' "$W/lora.txt" > "$W/l2.txt"
  d=$(maxdiff "$W/r2.txt" "$W/l2.txt")
  [ "$(wc -l < "$W/r2.txt")" = 10 ] && within "$d" 0 && ok || bad "resumed losses differ ($d)"
else cat "$W/r1.log" "$W/r2.log" 2>/dev/null; bad "resume failed"; fi

# data parallelism (2 ranks, ZeRO-2): the losses of the single-process run with the same global batch
dp2_check "$W/lora.yaml" 3 "DP 2 ranks"

# mmc merge: the PEFT-trained adapter folded in (LM + projector linears); the InternViT tower's
# weights copied unchanged; `mmc forward` runs the merged model (its logits against PEFT's below)
if "$MMC" merge --adapter $F/lora_ref --out "$W/merged" > "$W/mg.log" 2>&1 &&
   "$MMC" forward --model "$W/merged" --image $F/wide.png --prompt "What is in the picture?" \
     --out "$W/mg.safetensors" 2>> "$W/mg.log"; then
  grep -q "merged 16 adapted weights" "$W/mg.log" && ok || { cat "$W/mg.log"; bad "merge did not fold the 16 adapted linears"; }
  k=vision_tower.encoder.layer.1.attention.q_proj.weight
  st_floats "$W/merged/model.safetensors" $k > "$W/t1.txt"; st_floats tests/fixtures/internvl/v5/model.safetensors $k > "$W/t0.txt"
  [ -s "$W/t0.txt" ] && cmp -s "$W/t0.txt" "$W/t1.txt" && ok || bad "merge changed the vision tower ($k)"
else cat "$W/mg.log"; bad "merge failed"; fi

# mmc's own 20-step LoRA run (LM + projector) merged: the tower copied bit for bit
if "$MMC" merge --model tests/fixtures/internvl/v5 --adapter "$W/lora/checkpoint-20" --out "$W/m2" > "$W/m2.log" 2>&1; then
  k=vision_tower.encoder.layer.1.attention.q_proj.weight
  st_floats "$W/m2/model.safetensors" $k > "$W/t1.txt"; st_floats tests/fixtures/internvl/v5/model.safetensors $k > "$W/t0.txt"
  [ -s "$W/t0.txt" ] && cmp -s "$W/t0.txt" "$W/t1.txt" && ok || bad "merging mmc's LoRA run changed the vision tower ($k)"
else cat "$W/m2.log"; bad "merge of mmc's LoRA checkpoint failed"; fi

# malformed: a video sample on v5, whose saved video processor (transformers' class defaults: 384-pixel frames)
# does not fit its 56-pixel tiles, is refused with a message saying so (videos train: test_internvl_video_train)
printf '%s\n' '{"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "x"}], "videos": ["v.mp4"]}' > "$W/video.jsonl"
if "$MMC" train "$W/full.yaml" --set data.train="$W/video.jsonl" --set data.strict=true --set training.steps=1 \
     --set training.output_dir="$W/vd" > "$W/vd.log" 2>&1; then bad "a video sample was accepted"
else grep -q "the video processor's frames are 384 x 384 but the image tiles 56 x 56" "$W/vd.log" && ok \
  || { cat "$W/vd.log"; bad "video sample: no clear error"; }; fi

if "$PY" -c "import transformers, peft" 2>/dev/null; then
  "$PY" tools/ref/check_internvl_train.py "$W/lora/checkpoint-20" $F/lora_ref "$W/full/checkpoint-6" \
      "$W/full.safetensors" $F/wide.png "$W/mg.safetensors" 2> "$W/py.log" && ok || { cat "$W/py.log"; bad "reference check of the checkpoints"; }
else
  echo "test_internvl_train: skipped: the PEFT / transformers loading checks (no $PY)"
fi
echo "test_internvl_train: $((n - fail))/$n passed"
[ "$fail" = 0 ]
