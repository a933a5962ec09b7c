#!/usr/bin/env bash
# test_contrastive_train.sh — `mmc train` over a CLIPModel folder (src/train/trainer_contrastive.c):
# 10 steps of contrastive fine-tuning of the tiny CLIPModel and SiglipModel fixtures (examples/clip_contrastive.yaml: the 4
# pairs of tests/fixtures/clip_model/retrieval.jsonl with their first captions, AdamW lr 1e-4) give
# per-step losses within 1e-4 relative of transformers' loop (tools/ref/gen_contrastive_train.py ->
# tests/fixtures/contrastive_train/expected{,_siglip}.json; measured: CLIP 4.6e-6, SigLIP 2e-6) and the final
# exp(logit_scale) within 1e-4 relative; the written checkpoint-10 loads in `mmc embed` (and in
# transformers' CLIPModel.from_pretrained when the reference venv exists: image and text embeddings
# equal mmc embed's within 1e-4 abs; skipped with a message otherwise); --resume after a kill reproduces the
# uninterrupted run byte for byte; 2 data-parallel ranks with gathered negatives give transformers' losses;
# bad inputs fail with messages.
set -u
MMC=${MMC:-build/mmc}
PY=${MMC_REF_PYTHON:-.venv-ref/bin/python}
W=$(mktemp -d /tmp/mmc_test_contrastive_train.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
TOL=1e-4   # relative, per-step loss and the final logit scale

train_and_check() {   # FAM MODEL_DIR EXPECTED.json
local fam=$1 model=$2 EXP=$3 R=$W/run_$1
"$MMC" train examples/clip_contrastive.yaml --set model.path="$model" --set training.output_dir="$R" > "$W/out.log" 2> "$W/err.log" \
  || { cat "$W/out.log" "$W/err.log"; bad "$fam: training run"; return; }
grep -Eo '^step [0-9]+ loss [-0-9.e+]+' "$W/out.log" | awk '{print $4}' > "$W/mmc.txt"
sed -n '/"losses"/,/\]/p' "$EXP" | grep -Eo '[-0-9][0-9.e+-]*' > "$W/ref.txt"
[ "$(wc -l < "$W/mmc.txt")" -eq 10 ] && [ "$(wc -l < "$W/ref.txt")" -eq 10 ] || { cat "$W/out.log"; bad "$fam: 10 losses each"; return; }
paste "$W/mmc.txt" "$W/ref.txt" | awk -v tol=$TOL -v fam=$fam '{ r = ($1 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r }
  END { printf "%s: max relative loss difference over 10 steps: %.3g (tolerance %g)\n", fam, m, tol; exit !(m <= tol) }' \
  && ok "$fam: per-step losses match transformers" || { paste "$W/mmc.txt" "$W/ref.txt"; bad "$fam: per-step losses"; }
# the loss must fall (a loop that never updates would still match step 1)
awk 'NR == 1 { a = $1 } END { exit !($1 < 0.7 * a) }' "$W/mmc.txt" && ok "$fam: loss falls" || bad "$fam: loss does not fall"
C=$R/checkpoint-10
[ -f "$C/model.safetensors" ] && [ -f "$C/config.json" ] && ok "$fam: HF checkpoint layout" \
  || bad "$fam: checkpoint layout: $(ls "$C" 2>&1)"
"$MMC" embed --model "$C" --image "$IMG" --text "two blue squares" --json > "$W/embed.json" 2> "$W/embed.err" \
  && ok "$fam: mmc embed loads the checkpoint" || { cat "$W/embed.err"; bad "$fam: mmc embed on the checkpoint"; }
ls_ref=$(awk '/"logit_scale"[^[]*$/ { gsub(/[^-0-9.e+]/, "", $2); print $2 }' "$EXP")
ls_mmc=$(grep -Eo '"logit_scale": [-0-9.e+]+' "$W/embed.json" | awk '{print $2}')
awk -v a="$ls_mmc" -v b="$ls_ref" -v tol=$TOL -v fam=$fam 'BEGIN { e = exp(b); r = (a - e) / e; if (r < 0) r = -r;
  printf "%s: exp(logit_scale): mmc %s, transformers %.9g (rel %.3g)\n", fam, a, e, r; exit !(r <= tol) }' \
  && ok "$fam: trained logit_scale matches transformers" || bad "$fam: trained logit_scale"
"$MMC" embed --model "$model" --image "$IMG" > "$W/base.txt" 2>&1
"$MMC" embed --model "$C" --image "$IMG" > "$W/trained.txt" 2>&1
cmp -s "$W/base.txt" "$W/trained.txt" && bad "$fam: checkpoint embeddings equal the untrained model's" || ok "$fam: weights changed"
if "$PY" -c "import transformers" 2> /dev/null; then
  "$PY" - "$C" "$IMG" "$W/embed.json" "$fam" <<'PYEOF' && ok "$fam: transformers loads the checkpoint; embeddings match mmc embed" || bad "$fam: transformers load"
import json, sys, torch
from PIL import Image
from transformers import CLIPModel, CLIPProcessor, SiglipModel, SiglipProcessor
d, img, js, fam = sys.argv[1:5]
cls, pcls, kw = (CLIPModel, CLIPProcessor, {}) if fam == "clip" else (SiglipModel, SiglipProcessor, {"padding": "max_length"})
m = cls.from_pretrained(d).eval()
p = pcls.from_pretrained(d, backend="pil")
with torch.no_grad():
    i = m.get_image_features(**p(images=[Image.open(img)], return_tensors="pt"))
    t = m.get_text_features(**p(text=["two blue squares"], return_tensors="pt", **kw))
i = i if torch.is_tensor(i) else i.pooler_output
t = t if torch.is_tensor(t) else t.pooler_output
i, t = i / i.norm(dim=-1, keepdim=True), t / t.norm(dim=-1, keepdim=True)
e = json.load(open(js))
di = (i[0] - torch.tensor(e["images"][0]["embedding"])).abs().max().item()
dt = (t[0] - torch.tensor(e["texts"][0]["embedding"])).abs().max().item()
print(f"{fam}: transformers vs mmc embed on the checkpoint: image {di:.3g}, text {dt:.3g} (tolerance 1e-4)")
sys.exit(0 if max(di, dt) <= 1e-4 else 1)
PYEOF
else
  echo "skip: transformers load of the $fam checkpoint ($PY has no transformers)"
fi
}
IMG=tests/fixtures/image/rgb_37x53.png
train_and_check clip tests/fixtures/clip_model/model tests/fixtures/contrastive_train/expected.json
train_and_check siglip tests/fixtures/siglip_model/model tests/fixtures/contrastive_train/expected_siglip.json

# --resume: a run killed after its checkpoint-5 (checkpoint-10 removed, a stale temporary folder left)
# continues from step 6 to the same end: the logged losses of steps 6-10 and checkpoint-10's weights and
# moments byte-identical to the uninterrupted run's (a cosine schedule with warmup, so the step matters)
RA=(--set optimizer.schedule=cosine --set optimizer.warmup_steps=2 --set training.save_every=5)
"$MMC" train examples/clip_contrastive.yaml "${RA[@]}" --set training.output_dir="$W/full" > "$W/full.log" 2>&1 \
  && "$MMC" train examples/clip_contrastive.yaml "${RA[@]}" --set training.output_dir="$W/cut" > /dev/null 2>&1 \
  && rm -rf "$W/cut/checkpoint-10" && mkdir "$W/cut/.tmp-checkpoint-10-1" \
  && "$MMC" train examples/clip_contrastive.yaml "${RA[@]}" --set training.output_dir="$W/cut" --resume > "$W/res.log" 2> "$W/res.err" \
  && ok "resume: runs" || { cat "$W/full.log" "$W/res.log" "$W/res.err"; bad "resume: a run failed"; }
grep -q "resuming from $W/cut/checkpoint-5" "$W/res.err" && ok "resume: from checkpoint-5" || bad "resume: $(cat "$W/res.err")"
grep -E '^step ([6-9]|10) loss' "$W/full.log" > "$W/a.txt"; grep -E '^step [0-9]+ loss' "$W/res.log" > "$W/b.txt"
[ -s "$W/a.txt" ] && cmp -s "$W/a.txt" "$W/b.txt" && ok "resume: steps 6-10 log the same losses" \
  || { paste "$W/a.txt" "$W/b.txt"; bad "resume: losses differ"; }
cmp -s "$W/full/checkpoint-10/model.safetensors" "$W/cut/checkpoint-10/model.safetensors" \
  && cmp -s "$W/full/checkpoint-10/optimizer.safetensors" "$W/cut/checkpoint-10/optimizer.safetensors" \
  && ok "resume: checkpoint-10 weights and moments byte-identical" || bad "resume: checkpoint-10 differs"
"$MMC" train examples/clip_contrastive.yaml --set training.output_dir="$W/empty" --resume > /dev/null 2> "$W/e.err" \
  && bad "resume without checkpoints succeeded" || { grep -q "no complete checkpoint" "$W/e.err" && ok "resume: no checkpoint -> message" \
  || bad "resume without checkpoints: $(cat "$W/e.err")"; }

# bad inputs: messages, never a crash
expect_err() {   # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  if "$MMC" train examples/clip_contrastive.yaml --set training.output_dir="$W/bad" "$@" > "$W/b.out" 2> "$W/b.err"; then
    bad "$name: succeeded"
  elif grep -q -- "$pat" "$W/b.err"; then ok "$name"
  else cat "$W/b.err"; bad "$name: message lacks '$pat'"; fi
}
printf '{"image": "../image/rgb_37x53.png", "caption": "a"}\n{"image": "../image/rgb_37x53.png"}\n' > "$W/nocap.jsonl"
printf '{"image": "%s/tests/fixtures/image/rgb_37x53.png", "caption": "a"}\n{"image": "x.png", "caption": "b"}\n' "$PWD" > "$W/missing.jsonl"
printf '{"image": "a.png", "caption": "a"\n' > "$W/trunc.jsonl"
printf '\n[1]\n' > "$W/array.jsonl"
expect_err "caption missing" "nocap.jsonl:2: no \"caption\"" --set data.train="$W/nocap.jsonl"
expect_err "image missing" "missing.jsonl: pair 2.*x.png" --set data.train="$W/missing.jsonl"
expect_err "truncated line" "trunc.jsonl:1" --set data.train="$W/trunc.jsonl"
expect_err "line not an object" "array.jsonl:2: each line must be an object" --set data.train="$W/array.jsonl"
expect_err "no data file" "cannot open data.train" --set data.train="$W/none.jsonl"
expect_err "batch of one" "at least 2 pairs" --set data.batch_size=1 --set data.micro_batch_size=1
expect_err "data_parallel without the processes" "parallel.data_parallel is 2 but 1 process" --set parallel.data_parallel=2 --set data.micro_batch_size=2
expect_err "tensor parallelism refused" "parallelises over data only" --set parallel.tensor_parallel=2

# data parallelism, negatives gathered: 2 ranks x 2 pairs give the single-process 4-pair steps (and transformers')
if command -v mpirun >/dev/null 2>&1; then
  MPI=(timeout -k 10 120 mpirun --oversubscribe --bind-to none -np 2)
  [ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
  export OMPI_MCA_orte_tmpdir_base="$W"
  if ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${MPI[@]}" "$MMC" train examples/clip_contrastive.yaml \
       --set "parallel={data_parallel: 2}" --set data.micro_batch_size=2 --set training.output_dir="$W/dp" > "$W/dp.log" 2>&1; then
    grep -Eo '^step [0-9]+ loss [-0-9.e+]+' "$W/dp.log" | awk '{print $4}' > "$W/dp.txt"
    sed -n '/"losses"/,/\]/p' tests/fixtures/contrastive_train/expected.json | grep -Eo '[-0-9][0-9.e+-]*' > "$W/ref.txt"
    [ "$(wc -l < "$W/dp.txt")" -eq 10 ] && paste "$W/dp.txt" "$W/ref.txt" | awk -v tol=$TOL '{ r = ($1 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r }
      END { printf "clip, 2 data-parallel ranks (gathered negatives): max relative loss difference vs transformers: %.3g (tolerance %g)\n", m, tol; exit !(m <= tol) }' \
      && ok "data parallel: losses match transformers' 4-pair steps" || { cat "$W/dp.log"; bad "data parallel: losses"; }
    [ -f "$W/dp/checkpoint-10/model.safetensors" ] && ok "data parallel: rank 0 saved" || bad "data parallel: no checkpoint"
  else cat "$W/dp.log"; bad "data parallel: training failed"; fi
else
  echo "skip: the data-parallel check (no mpirun on PATH)"
fi
exit $fail
