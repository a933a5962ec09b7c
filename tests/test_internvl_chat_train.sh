#!/usr/bin/env bash
# test_internvl_chat_train.sh — `mmc train` on OpenGVLab's remote-code InternVL layout (InternVLChatModel, model_type
# internvl_chat: vision_model.*, mlp1.*, language_model.* with an InternLM2 language model, its wqkv packed in groups
# [q0 q1 q2 k v] x 2, biased) against OpenGVLab's own modeling_internvl_chat.py / modeling_intern_vit.py /
# modeling_internlm2.py on transformers 4.44.2 + PEFT 0.14.0 (tools/ref/gen_internvl_chat_train.py ->
# tests/fixtures/internvl_chat_train/; the reference in float64). Data: a wide image of 4 tiles + thumbnail, a tall
# one, a text-only turn, rendered as chat() renders them (the tokenizer's template over string content:
# "<image>\n" + text, "<image>" -> <img> <IMG_CONTEXT> x N </img>); the same YAML as the other VLMs:
#   full:  20 steps (the tower frozen by default, weight decay 0.1): every loss within 5e-5 of the reference's
#          (measured 7.5e-6), the saved weights (mlp1, wqkv / wo / w1-3, norms, tok_embeddings, output) within 1e-5
#          (measured 2.9e-6), wqkv's bias within 2.5e-4 (its key rows: see below)
#   tower: model.freeze [language_model, embeddings] (InternViT + mlp1 trained), 10 steps: losses within 5e-5
#          (measured 6e-7), the tower's and projector's weights within 1e-4 (measured 1.7e-5)
#   LoRA:  r 4, alpha 8 from PEFT's initial adapter (model.lora.init) on the InternLM2's wqkv / wo / w1 / w2 / w3 and
#          mlp1.1 / mlp1.3 under InternVLChatModel's PEFT module names: losses within 5e-5 (measured 3.3e-6), the
#          adapters after 20 steps within 1e-4 of PEFT's
#   QLoRA: the InternLM2 linears in NF4 (block 64), the same LoRA: losses within 5e-5 of PEFT's on bitsandbytes' NF4
#          round trip of the base (measured 2.7e-6)
#   --adapter at inference: `mmc forward --adapter` with PEFT's trained adapter (lora_ref) gives PeftModel's logits
#          within 1e-4 (measured 4.8e-7) on the same input_ids; without it they differ
#   mmc merge of PEFT's adapter folds the 12 linears and keeps the tower bit for bit; the merged folder's logits
#          are PeftModel's within 1e-4 (measured 4.8e-7)
#   DP: 2 ranks (ZeRO-2) give the single-process losses of a global batch of 2 (with MPI)
#   resume: the full run resumed from checkpoint-10 prints the same loss lines for steps 11-20
#   mmc generate loads the full checkpoint, and the base with mmc's LoRA checkpoint as --adapter
#   mmc info names the family, the InternViT tower, the pixel shuffle + mlp1 projector and the language model
#   malformed: an unknown llm_config.model_type, no llm_config, a truncated model.safetensors refused by name;
#   LoRA targets of the other language model (q_proj on InternLM2, wqkv on Qwen2) are refused with a
#   message naming this model's modules
# MMC_INTERNVL_CHAT_LLM=qwen2 (tests/test_internvl_chat_train_qwen2.sh) runs the same checks on the Qwen2 twin
# (gen_internvl_chat_train.py --llm qwen2 -> tests/fixtures/internvl_chat_train_qwen2/: InternVL2-1B / 2.5-1B / 3's
# layout, Qwen2ForCausalLM with 6 query heads over 2 key/value heads, biased q / k / v, language_model.lm_head):
# full losses (measured 7.8e-6) and weights (6.8e-6; k_proj's bias 2.4e-5), tower (4.7e-7), LoRA on
# self_attn.{q,k,v,o}_proj / mlp.{gate,up,down}_proj + mlp1 (16 modules; 2.5e-6, adapters 1.7e-5), QLoRA (2.4e-6),
# --adapter and mmc merge (16 linears folded; logits 5.4e-7), DP, resume, the reference loaders (logits 7.2e-7).
# With the reference venv (.venv-internlm2 or MMC_INTERNLM2_PYTHON) and OpenGVLab's internvl_chat/ code (.internvl-code
# or MMC_INTERNVL_CODE; tools/ref/gen_internvl_chat_train.py says how to get both), tools/ref/check_internvl_chat_train.py:
# InternVLChatModel loads mmc's full checkpoint (no missing / unexpected keys, every tensor as saved) and its logits
# equal `mmc forward`'s on it within 1e-4; PEFT loads mmc's LoRA checkpoint. Without them those checks are skipped.
set -u
MMC=${MMC:-build/mmc}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
LLM=${MMC_INTERNVL_CHAT_LLM:-internlm2}
T=test_internvl_chat_train; [ "$LLM" = internlm2 ] || T=${T}_$LLM
# per language model: the fixture; the weights held to 1e-5 after the full run and the one held to 2.5e-4 (see there);
# the number of LoRA modules and those whose adapters are compared
case $LLM in
  internlm2)
    F=tests/fixtures/internvl_chat_train
    FULL_W=(language_model.model.tok_embeddings.weight language_model.model.layers.0.attention.wqkv.weight
            language_model.model.layers.0.attention.wo.bias language_model.model.layers.1.feed_forward.w2.weight
            language_model.model.layers.0.feed_forward.w3.weight language_model.model.layers.1.ffn_norm.weight
            language_model.model.norm.weight language_model.output.weight)
    KEY_BIAS=language_model.model.layers.1.attention.wqkv.bias
    N_LORA=12 LM_INFO="InternLM2" OTHER_TARGET=q_proj
    LORA_K=(language_model.model.layers.0.attention.wqkv language_model.model.layers.1.feed_forward.w2) ;;
  qwen2)
    F=tests/fixtures/internvl_chat_train_qwen2
    FULL_W=(language_model.model.embed_tokens.weight language_model.model.layers.0.self_attn.q_proj.weight
            language_model.model.layers.0.self_attn.q_proj.bias language_model.model.layers.1.self_attn.v_proj.bias
            language_model.model.layers.0.self_attn.k_proj.weight language_model.model.layers.1.self_attn.o_proj.weight
            language_model.model.layers.1.mlp.down_proj.weight language_model.model.layers.0.mlp.gate_proj.weight
            language_model.model.layers.0.mlp.up_proj.weight language_model.model.layers.1.post_attention_layernorm.weight
            language_model.model.norm.weight language_model.lm_head.weight)
    KEY_BIAS=language_model.model.layers.1.self_attn.k_proj.bias
    N_LORA=16 LM_INFO="Qwen2" OTHER_TARGET=wqkv
    LORA_K=(language_model.model.layers.0.self_attn.q_proj language_model.model.layers.1.self_attn.k_proj
            language_model.model.layers.1.mlp.down_proj language_model.model.layers.0.mlp.up_proj) ;;
  *) echo "$T: MMC_INTERNVL_CHAT_LLM must be internlm2 or qwen2, not '$LLM'"; exit 1 ;;
esac
PY=${MMC_INTERNLM2_PYTHON:-.venv-internlm2/bin/python}
CODE=${MMC_INTERNVL_CODE:-.internvl-code}
IMG=tests/fixtures/internvl_train/wide.png
[ -x "$MMC" ] || { echo "$T: skipped: no mmc binary at $MMC"; exit 77; }
W=$(mktemp -d /tmp/mmc_$T.XXXXXX); trap 'rm -rf "$W"' EXIT
. tests/train_check.sh   # ok / bad, st_floats, maxdiff, within, losses

cat > "$W/full.yaml" <<YAML
model: {path: $F/tiny, dtype: f32}
data: {train: $F/data.jsonl, batch_size: 1, micro_batch_size: 1, shuffle: false, num_workers: 0, seq_len: 512}
optimizer: {lr: 1.0e-3, weight_decay: 0.1, betas: [0.9, 0.999], eps: 1.0e-8, schedule: constant, grad_clip: 0}
training: {steps: 20, log_every: 1, save_every: 10, output_dir: $W/full, seed: 0}
YAML

# weights of checkpoint $2 against parity.safetensors "$3.<name>" within $1, for the names after them
weights() {
  local tol=$1 ck=$2 pre=$3 worst=0 k d; shift 3
  for k in "$@"; do
    if st_floats "$ck/model.safetensors" "$k" > "$W/a.txt" && st_floats $F/parity.safetensors "$pre.$k" > "$W/b.txt" &&
       [ -s "$W/b.txt" ]; then
      d=$(maxdiff "$W/a.txt" "$W/b.txt")
      within "$d" "$tol" && ok || bad "$pre: $k differs from the reference's by $d"
      worst=$(maxof "$worst" "$d")
    else bad "$pre: $ck or the fixture lacks $k"; fi
  done
  echo "$pre: max |w - reference| over $# tensors = $worst"
}

# mmc info: family, tower, projector, language model, context length
if "$MMC" info $F/tiny > "$W/info.log" 2>&1; then
  for want in "family: *InternVL (OpenGVLab InternVLChatModel layout)" "vision tower: *InternViT: 3 layers, hidden 36" \
              "projector: *pixel shuffle x0.5 (ps_version v2) -> mlp1" "language model: *$LM_INFO" "context length: *[1-9]"; do
    grep -q "^$want" "$W/info.log" && ok || { cat "$W/info.log"; bad "mmc info lacks '$want'"; }
  done
else cat "$W/info.log"; bad "mmc info failed"; fi

if "$MMC" train "$W/full.yaml" 2> "$W/full.log"; then
  losses "$W/full.log" > "$W/full.txt"
  d=$(maxdiff "$W/full.txt" $F/full_losses.txt)
  echo "full 20 steps: max |loss - reference| = $d"
  [ "$(wc -l < "$W/full.txt")" = 20 ] && within "$d" 5e-5 && ok || bad "full losses differ from the reference's by $d"
  weights 1e-5 "$W/full/checkpoint-20" final mlp1.0.weight mlp1.1.weight mlp1.3.bias "${FULL_W[@]}"
  # the key bias (wqkv's key rows, Qwen2's k_proj.bias) gets no gradient in exact arithmetic (q . b_k is the same for
  # every key of a query, so the softmax cancels it): AdamW turns float32's rounding noise there into steps of up to
  # ~lr/10 that the float64 reference does not take (measured 7.8e-5; the query / value rows agree within 1e-6)
  weights 2.5e-4 "$W/full/checkpoint-20" final "$KEY_BIAS"
  grep -q '"model_type": *"internvl_chat"' "$W/full/checkpoint-20/config.json" && ok || bad "checkpoint config.json is not internvl_chat's"
  if "$MMC" generate --model "$W/full/checkpoint-20" --image $IMG --prompt "What is in the picture?" --max-new-tokens 3 \
       > "$W/gen.log" 2>&1; then ok; else cat "$W/gen.log"; bad "mmc generate on the full checkpoint failed"; fi
  "$MMC" forward --model "$W/full/checkpoint-20" --image $IMG --prompt "What is in the picture?" \
    --out "$W/full_fwd.safetensors" > "$W/ff.log" 2>&1 || { cat "$W/ff.log"; bad "mmc forward on the full checkpoint failed"; }
  # resumed from checkpoint-10 (the packed checkpoint read back): steps 11-20 print the same lines
  resume_check "$W/full.yaml" full
else cat "$W/full.log"; bad "full training failed"; fi

if "$MMC" train "$W/full.yaml" --set "model.freeze=[language_model, embeddings]" --set optimizer.weight_decay=0.0 \
     --set training.steps=10 --set training.save_every=10 --set training.output_dir="$W/tower" 2> "$W/tower.log"; then
  losses "$W/tower.log" > "$W/tower.txt"
  d=$(maxdiff "$W/tower.txt" $F/tower_losses.txt)
  echo "tower + projector 10 steps: max |loss - reference| = $d"
  [ "$(wc -l < "$W/tower.txt")" = 10 ] && within "$d" 5e-5 && ok || bad "tower losses differ from the reference's by $d"
  weights 1e-4 "$W/tower/checkpoint-10" tower vision_model.embeddings.class_embedding vision_model.embeddings.patch_embedding.weight \
    vision_model.embeddings.position_embedding vision_model.encoder.layers.0.attn.qkv.weight \
    vision_model.encoder.layers.1.attn.qkv.bias vision_model.encoder.layers.2.ls1 vision_model.encoder.layers.2.mlp.fc2.weight \
    vision_model.encoder.layers.1.norm2.bias mlp1.1.weight mlp1.3.weight
else cat "$W/tower.log"; bad "training the tower failed"; fi

if "$MMC" train "$W/full.yaml" --set "model.lora={r: 4, alpha: 8, init: $F/lora_init}" --set optimizer.lr=5.0e-3 \
     --set optimizer.weight_decay=0.0 --set training.output_dir="$W/lora" 2> "$W/lora.log"; then
  grep -q "LoRA r=4 alpha=8 on $N_LORA modules" "$W/lora.log" && ok || bad "LoRA did not adapt the $N_LORA modules"
  losses "$W/lora.log" > "$W/lora.txt"
  d=$(maxdiff "$W/lora.txt" $F/lora_losses.txt)
  echo "LoRA 20 steps: max |loss - PEFT's| = $d"
  [ "$(wc -l < "$W/lora.txt")" = 20 ] && within "$d" 5e-5 && ok || bad "LoRA losses differ from PEFT's by $d"
  worst=0
  for k in "${LORA_K[@]}" mlp1.1 mlp1.3; do
    for ab in A B; do
      key=base_model.model.$k.lora_$ab.weight
      if st_floats "$W/lora/checkpoint-20/adapter_model.safetensors" $key > "$W/a.txt" &&
         st_floats $F/lora_ref/adapter_model.safetensors $key > "$W/b.txt" && [ -s "$W/b.txt" ]; then
        d=$(maxdiff "$W/a.txt" "$W/b.txt")
        within "$d" 1e-4 && ok || bad "LoRA $key differs from PEFT's by $d"
        worst=$(maxof "$worst" "$d")
      else bad "LoRA checkpoint or fixture lacks $key"; fi
    done
  done
  echo "LoRA adapters after 20 steps: max |w - PEFT's| = $worst"
  if "$MMC" generate --model $F/tiny --adapter "$W/lora/checkpoint-20" --image $IMG --prompt "Hi" --max-new-tokens 3 \
       > "$W/lgen.log" 2>&1; then ok; else cat "$W/lgen.log"; bad "mmc generate --adapter (mmc's LoRA checkpoint) failed"; fi
else cat "$W/lora.log"; bad "LoRA training failed"; fi

# QLoRA: the InternLM2 linears in NF4 (block 64, no double quantisation), the same LoRA
if "$MMC" train "$W/full.yaml" --set "model.lora={r: 4, alpha: 8, init: $F/lora_init}" --set optimizer.lr=5.0e-3 \
     --set optimizer.weight_decay=0.0 --set "model.quantization={method: nf4, double_quant: false, block_size: 64}" \
     --set training.save_every=0 --set training.output_dir="$W/qlora" 2> "$W/qlora.log"; then
  losses "$W/qlora.log" > "$W/qlora.txt"
  d=$(maxdiff "$W/qlora.txt" $F/qlora_losses.txt)
  echo "QLoRA 20 steps: max |loss - PEFT's on the NF4 base| = $d"
  [ "$(wc -l < "$W/qlora.txt")" = 20 ] && within "$d" 5e-5 && ok || bad "QLoRA losses differ from the reference's by $d"
else cat "$W/qlora.log"; bad "QLoRA training failed"; fi

# data parallelism (2 ranks, ZeRO-2): the losses of the single-process run with the same global batch of 2
dp2_check "$W/full.yaml" 3 "DP 2 ranks ZeRO-2"

# --adapter at inference: PEFT's trained adapter, against PeftModel's logits
logit_diff() {   # $1 $2: safetensors with input_ids and logits -> max |diff|, or "ids" when the prompts differ
  python3 - "$1" "$2" <<'PYEOF'
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k in ("input_ids", "logits"):
        s, e = h[k]["data_offsets"]; dt = h[k]["dtype"]
        fmt = {"F32": "f", "I64": "q", "I32": "i"}[dt]; sz = struct.calcsize(fmt)
        out[k] = struct.unpack("<%d%s" % ((e - s) // sz, fmt), b[8 + n + s:8 + n + e])
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
print("ids" if list(a["input_ids"]) != list(b["input_ids"]) else max(abs(x - y) for x, y in zip(a["logits"], b["logits"])))
PYEOF
}
if "$MMC" forward --model $F/tiny --adapter $F/lora_ref --image $IMG --prompt "What is in the picture?" \
     --out "$W/ad.safetensors" > "$W/ad.log" 2>&1 &&
   "$MMC" forward --model $F/tiny --image $IMG --prompt "What is in the picture?" --out "$W/base.safetensors" >> "$W/ad.log" 2>&1; then
  d=$(logit_diff "$W/ad.safetensors" $F/lora_fwd.safetensors)
  echo "mmc forward --adapter lora_ref: max |logits - PeftModel's| = $d"
  within "$d" 1e-4 && ok || bad "adapter logits differ from PEFT's by $d"
  d=$(logit_diff "$W/base.safetensors" $F/lora_fwd.safetensors)
  awk -v d="$d" 'BEGIN {exit !(d != "ids" && d + 0 > 1e-2)}' && ok || bad "without the adapter the logits should differ from PEFT's ($d)"
else cat "$W/ad.log"; bad "mmc forward with / without --adapter failed"; fi

# mmc merge of PEFT's adapter: all its linears folded (InternLM2: wqkv / wo / w1-3 x 2 layers, Qwen2: q / k / v / o /
# gate / up / down_proj x 2, and mlp1.1 / mlp1.3), the tower copied bit for bit; `mmc forward` on the merged folder gives PeftModel's logits within 1e-4
if "$MMC" merge --model $F/tiny --adapter $F/lora_ref --out "$W/merged" > "$W/mg.log" 2>&1 &&
   "$MMC" forward --model "$W/merged" --image $IMG --prompt "What is in the picture?" --out "$W/mg.safetensors" >> "$W/mg.log" 2>&1; then
  grep -q "merged $N_LORA adapted weights" "$W/mg.log" && ok || { cat "$W/mg.log"; bad "merge did not fold the $N_LORA adapted linears"; }
  d=$(logit_diff "$W/mg.safetensors" $F/lora_fwd.safetensors)
  echo "mmc merge of lora_ref, mmc forward: max |logits - PeftModel's| = $d"
  within "$d" 1e-4 && ok || bad "merged logits differ from PEFT's by $d"
  for k in vision_model.encoder.layers.1.attn.qkv.weight vision_model.embeddings.position_embedding; do
    st_floats "$W/merged/model.safetensors" $k > "$W/a.txt"; st_floats $F/tiny/model.safetensors $k > "$W/b.txt"
    [ -s "$W/b.txt" ] && cmp -s "$W/a.txt" "$W/b.txt" && ok || bad "merge changed the tower's $k"
  done
else cat "$W/mg.log"; bad "mmc merge / forward of the merged folder failed"; fi

# malformed: LoRA targets that name the other language model's linears only
if "$MMC" train "$W/full.yaml" --set "model.lora={r: 4, alpha: 8, targets: [$OTHER_TARGET]}" --set training.steps=1 \
     --set training.output_dir="$W/badt" > "$W/badt.log" 2>&1; then bad "LoRA targets [$OTHER_TARGET] were accepted"
else grep -q "no module matches the targets ($OTHER_TARGET.*modules look like 'language_model.model.layers.0" "$W/badt.log" &&
  ok || { cat "$W/badt.log"; bad "LoRA targets [$OTHER_TARGET]: no clear error"; }; fi

# malformed checkpoints (the saved folder edited): an unknown llm_config.model_type, no llm_config, a truncated
# model.safetensors: `mmc train` stops with a message naming what is wrong (an exit status, never a signal)
for bad_kind in type nollm trunc; do
  rm -rf "$W/mal" && cp -r "$F/tiny" "$W/mal"
  case $bad_kind in
    type) python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['llm_config']['model_type']='mixtral'; json.dump(c, open(p,'w'))" "$W/mal/config.json"; want="llm_config.model_type 'mixtral' is not supported" ;;
    nollm) python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); del c['llm_config']; json.dump(c, open(p,'w'))" "$W/mal/config.json"; want="'llm_config' is missing" ;;
    trunc) truncate -s 4000 "$W/mal/model.safetensors"; want="model.safetensors" ;;
  esac
  "$MMC" train "$W/full.yaml" --set model.path="$W/mal" --set training.steps=1 --set training.output_dir="$W/malo" \
    > "$W/mal.log" 2>&1; rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "$want" "$W/mal.log"; then ok
  else cat "$W/mal.log"; bad "malformed checkpoint ($bad_kind): exit $rc, no message with \"$want\""; fi
done

# the reference loaders
if [ -d "$W/full/checkpoint-20" ] && [ -d "$W/lora/checkpoint-20" ] && [ -f "$W/full_fwd.safetensors" ] &&
   [ -d "$CODE/internvl/model/internvl_chat" ] && "$PY" -c "import transformers, peft" 2>/dev/null; then
  MMC_INTERNVL_CODE="$CODE" "$PY" tools/ref/check_internvl_chat_train.py "$W/full/checkpoint-20" "$W/lora/checkpoint-20" \
    "$W/full_fwd.safetensors" "$LLM" > "$W/ref.log" 2>&1 && ok || { cat "$W/ref.log"; bad "the reference could not load mmc's checkpoints"; }
  grep -E "max \|logit|loaded" "$W/ref.log"
else
  echo "$T: skipped: the remote-code / PEFT load checks (no InternLM2 reference Python at $PY or no OpenGVLab code at $CODE)"
fi

echo "$T: $((n - fail)) of $n checks passed"
[ $fail = 0 ]
