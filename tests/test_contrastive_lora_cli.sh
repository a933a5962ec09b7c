#!/usr/bin/env bash
# test_contrastive_lora_cli.sh — `mmc train` with model.lora over a CLIPModel folder and `mmc merge` of
# its checkpoint (examples/clip_contrastive_lora.yaml; the parity with PEFT is tests/test_contrastive_lora.c):
#   - a LoRA checkpoint is a PEFT adapter folder (adapter_config.json with task_type null and the base's
#     path, adapter_model.safetensors) plus the optimizer state, and holds no base weights;
#   - --resume after a kill (checkpoint-10 removed) continues from checkpoint-5 to the same end: the losses
#     of steps 6-10 and checkpoint-10's adapter and moments byte-identical to the uninterrupted run's
#     (cosine schedule with warmup; lora.dropout 0.1, whose masks depend on the step);
#   - 2 data-parallel ranks (negatives gathered) give PEFT's single-process losses within 2e-5 relative;
#   - `mmc merge` writes a CLIPModel folder that `mmc embed` loads and whose embeddings differ from the base's;
#     `mmc embed --model CHECKPOINT` (the adapter attached to its base) gives the same embeddings within 1e-5;
#   - with the reference venv: PeftModel.from_pretrained loads the checkpoint and transformers' CLIPModel the
#     merged folder, whose logits_per_image equal PeftModel's merged on the same inputs within 1e-5
#     (skipped with a message without the venv).
set -u
MMC=${MMC:-build/mmc}
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
W=$(mktemp -d /tmp/mmc_test_contrastive_lora_cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
Y=examples/clip_contrastive_lora.yaml
BASE=tests/fixtures/clip_model/model
IMG=tests/fixtures/image/rgb_37x53.png

RA=(--set optimizer.schedule=cosine --set optimizer.warmup_steps=2 --set training.save_every=5 --set model.lora.dropout=0.1)
"$MMC" train $Y "${RA[@]}" --set training.output_dir="$W/full" > "$W/full.log" 2> "$W/full.err" \
  && "$MMC" train $Y "${RA[@]}" --set training.output_dir="$W/cut" > /dev/null 2>&1 \
  && rm -rf "$W/cut/checkpoint-10" \
  && "$MMC" train $Y "${RA[@]}" --set training.output_dir="$W/cut" --resume > "$W/res.log" 2> "$W/res.err" \
  && ok "train with LoRA, kill, resume: runs" || { cat "$W/full.log" "$W/full.err" "$W/res.log" "$W/res.err"; bad "a run failed"; }
C=$W/full/checkpoint-10
[ -f "$C/adapter_config.json" ] && [ -f "$C/adapter_model.safetensors" ] && [ -f "$C/optimizer.safetensors" ] \
  && [ ! -f "$C/model.safetensors" ] && ok "checkpoint: a PEFT adapter folder" || bad "checkpoint layout: $(ls "$C" 2>&1)"
grep -q '"task_type":[[:space:]]*null' "$C/adapter_config.json" && grep -q "\"base_model_name_or_path\":[[:space:]]*\"$BASE\"" "$C/adapter_config.json" \
  && ok "adapter_config.json: task_type null, base_model_name_or_path" || { cat "$C/adapter_config.json"; bad "adapter_config.json"; }
grep -q "resuming from $W/cut/checkpoint-5" "$W/res.err" && ok "resume: from checkpoint-5" || bad "resume: $(cat "$W/res.err")"
grep -E '^step ([6-9]|10) loss' "$W/full.log" > "$W/a.txt"; grep -E '^step [0-9]+ loss' "$W/res.log" > "$W/b.txt"
[ -s "$W/a.txt" ] && cmp -s "$W/a.txt" "$W/b.txt" && ok "resume: steps 6-10 log the same losses" \
  || { paste "$W/a.txt" "$W/b.txt"; bad "resume: losses differ"; }
cmp -s "$C/adapter_model.safetensors" "$W/cut/checkpoint-10/adapter_model.safetensors" \
  && cmp -s "$C/optimizer.safetensors" "$W/cut/checkpoint-10/optimizer.safetensors" \
  && ok "resume: checkpoint-10 adapter and moments byte-identical" || bad "resume: checkpoint-10 differs"

"$MMC" merge --model $BASE --adapter "$C" --out "$W/merged" > "$W/merge.log" 2>&1 \
  && [ -f "$W/merged/model.safetensors" ] && [ -f "$W/merged/config.json" ] && [ -f "$W/merged/tokenizer.json" ] \
  && ok "mmc merge: a CLIPModel folder" || { cat "$W/merge.log"; bad "mmc merge"; }
"$MMC" embed --model "$W/merged" --image "$IMG" --text "two blue squares" > "$W/m.txt" 2>&1 \
  && "$MMC" embed --model $BASE --image "$IMG" --text "two blue squares" > "$W/b.txt" 2>&1 \
  && ! cmp -s "$W/m.txt" "$W/b.txt" && ok "mmc embed loads the merged folder; embeddings changed" \
  || { cat "$W/m.txt"; bad "mmc embed on the merged folder"; }
# the checkpoint itself as --model: its base with the adapter attached, the merged folder's embeddings
"$MMC" embed --model "$C" --image "$IMG" --text "two blue squares" > "$W/c.txt" 2>&1 \
  && paste "$W/c.txt" "$W/m.txt" | awk -F'\t' '$1 == "image" || $1 == "text" { n = split($3, a, " "); split($6, b, " "); if (n < 2) bad = 1
       for (i = 1; i <= n; i++) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > m) m = d } }
       END { printf "mmc embed on the LoRA checkpoint vs on the merged folder: max abs %.3g (tolerance 1e-5)\n", m; exit bad || !(m <= 1e-5) }' \
  && ok "mmc embed --model CHECKPOINT (adapter on its base) equals the merged folder's" || { cat "$W/c.txt"; bad "mmc embed on the checkpoint"; }

# data parallelism with gathered negatives: 2 ranks x 2 pairs from PEFT's initial adapter give PEFT's 4-pair losses
if command -v mpirun >/dev/null 2>&1; then
  MPI=(timeout -k 10 120 mpirun --oversubscribe --bind-to none -np 2)
  [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
  export OMPI_MCA_orte_tmpdir_base="$W"
  if ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${MPI[@]}" "$MMC" train $Y --set model.lora.init=tests/fixtures/contrastive_lora/clip_init \
       --set "parallel={data_parallel: 2}" --set data.micro_batch_size=2 --set training.output_dir="$W/dp" > "$W/dp.log" 2>&1; then
    grep -Eo '^step [0-9]+ loss [-0-9.e+]+' "$W/dp.log" | awk '{print $4}' > "$W/dp.txt"
    sed -n '/"losses"/,/\]/p' tests/fixtures/contrastive_lora/expected_clip.json | grep -Eo '[-0-9][0-9.e+-]*' > "$W/ref.txt"
    [ "$(wc -l < "$W/dp.txt")" -eq 10 ] && paste "$W/dp.txt" "$W/ref.txt" | awk '{ r = ($1 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r }
      END { printf "LoRA, 2 data-parallel ranks: max relative loss difference vs PEFT: %.3g (tolerance 2e-5)\n", m; exit !(m <= 2e-5) }' \
      && ok "data parallel LoRA: losses match PEFT's 4-pair steps" || { cat "$W/dp.log"; bad "data parallel LoRA: losses"; }
  else cat "$W/dp.log"; bad "data parallel LoRA: training failed"; fi
else
  echo "skip: the data-parallel LoRA check (no mpirun on PATH)"
fi

if "$PY" -c "import transformers, peft" 2> /dev/null; then
  "$PY" - "$C" "$W/merged" $BASE > "$W/py.log" 2>&1 <<'PYEOF' && ok "PEFT loads the checkpoint; transformers the merged folder, logits match" || { cat "$W/py.log"; bad "PEFT / transformers load"; }
import json, sys, torch
from PIL import Image
from peft import PeftModel
from transformers import CLIPModel, CLIPProcessor
ck, merged, base = sys.argv[1:4]
lines = [json.loads(l) for l in open("tests/fixtures/clip_model/retrieval.jsonl") if l.strip()]
p = CLIPProcessor.from_pretrained(base, backend="pil")
inp = p(text=[o.get("caption") or o["captions"][0] for o in lines], padding=True, truncation=True, return_tensors="pt",
        images=[Image.open("tests/fixtures/clip_model/" + o["image"]) for o in lines])
pm = PeftModel.from_pretrained(CLIPModel.from_pretrained(base), ck).merge_and_unload().eval()
m = CLIPModel.from_pretrained(merged).eval()
with torch.no_grad():
    d = (m(**inp).logits_per_image - pm(**inp).logits_per_image).abs().max().item()
print(f"transformers on mmc merge's folder vs PEFT's merge of the checkpoint: logits_per_image max abs {d:.3g} (tolerance 1e-5)")
sys.exit(0 if d <= 1e-5 else 1)
PYEOF
  grep "logits_per_image" "$W/py.log"
else
  echo "skip: PEFT / transformers loading of the checkpoint and merged folder ($PY lacks transformers or peft)"
fi
exit $fail
