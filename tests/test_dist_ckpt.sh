#!/usr/bin/env bash
# test_dist_ckpt.sh — sharded, reshardable checkpoints (ZeRO >= 1): every rank writes its own
# optimizer shard (ZeRO-3: and parameter shard) plus a manifest; a resume with the same layout
# continues bit-identically; a resume with another rank count or ZeRO stage (resharding, into
# and out of ZeRO-3) continues within 1e-5 of the uninterrupted run; a checkpoint missing a
# shard is refused naming the file (resume and export); `mmc export` writes a Hugging Face
# directory (consolidating ZeRO-3 shards). Skipped without mpirun / MPI.
set -u
MMC=${MMC:-build/mmc}
if ! command -v mpirun >/dev/null 2>&1; then echo "test_dist_ckpt: skipped: no mpirun on PATH"; exit 77; fi
if [ ! -x "$(dirname "$MMC")/dist_mpi_worker" ]; then echo "test_dist_ckpt: skipped: built without MPI"; exit 77; fi
if ! command -v python3 >/dev/null 2>&1; then echo "test_dist_ckpt: skipped: no python3 to read the checkpoints"; exit 77; fi
export OMP_NUM_THREADS=1 MMC_DP_BUCKET_BYTES=65536 MMC_DIST_TIMEOUT=120
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x MMC_DP_BUCKET_BYTES -x MMC_DIST_TIMEOUT -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# its own OpenMPI session directory: concurrent mpiruns (ctest -j runs the MPI tests side by
# side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to mkdir was
# unable to create the desired directory ... File exists", then orte_init fails)
export OMPI_MCA_orte_tmpdir_base="$W"
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
cat > "$W/run.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 8, micro_batch_size: 2}
parallel: {data_parallel: 2, zero: 1}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}
training: {steps: 6, seed: 7, log_every: 1, save_every: 3, keep_last: 0, output_dir: $W/A}
YAML
run() {  # run NP OUT [--set ...]: mmc train on NP ranks (1 = no mpirun)
  local np=$1 out=$2; shift 2
  if [ "$np" = 1 ]; then "$MMC" train "$W/run.yaml" --set parallel.data_parallel=1 --set training.output_dir="$W/$out" "$@" > "$W/$out.log" 2>&1
  else "${MPIRUN[@]}" -np "$np" "$MMC" train "$W/run.yaml" --set parallel.data_parallel="$np" --set training.output_dir="$W/$out" "$@" > "$W/$out.log" 2>&1; fi
}
close() {  # close REF RUN: the run's losses (steps 4-6) and final weights vs the reference's
  python3 - "$W/$1" "$W/$2" "$MMC" <<'PY'
import json, struct, sys, os, subprocess
def losses(d): return {j["step"]: j["loss"] for j in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if "loss" in j}
def st(f):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "BF16": raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out
def weights(d):   # a bf16 run's trained weights: its fp32 masters ("master.*" in optimizer.safetensors)
    c = os.path.join(d, "checkpoint-6"); f = os.path.join(c, "model.safetensors")
    if not os.path.exists(f):   # ZeRO-3: the parameters are in the shards; export consolidates them
        x = d + ".export"
        if not os.path.exists(x): subprocess.run([sys.argv[3], "export", c, "--out", x], check=True, stdout=subprocess.DEVNULL)
        return st(os.path.join(x, "model.safetensors"))
    w = st(f); o = st(os.path.join(c, "optimizer.safetensors"))
    for k in w:
        if "master." + k in o: w[k] = o["master." + k]
    return w
a, b = losses(sys.argv[1]), losses(sys.argv[2])
rel = max(abs(a[s] - b[s]) / abs(a[s]) for s in (4, 5, 6)) if all(s in b for s in (4, 5, 6)) else 1e9
wa, wb = weights(sys.argv[1]), weights(sys.argv[2])
wd = max(max(abs(x - y) for x, y in zip(wa[k], wb[k])) for k in wa) if wa.keys() == wb.keys() else 1e9
print("steps 4-6 loss max rel diff %.2e (tol 1e-5), final weights max abs diff %.2e (tol 1e-5)" % (rel, wd))
sys.exit(0 if rel <= 1e-5 and wd <= 1e-5 else 1)
PY
}
resume_from() {  # resume_from NAME: a fresh output dir holding only A's checkpoint-3
  mkdir -p "$W/$1"; cp -r "$W/A/checkpoint-3" "$W/$1/"
}
run 2 A || { cat "$W/A.log"; bad "2-rank ZeRO-1 run"; }
C=$W/A/checkpoint-3
[ -f "$C/optimizer.rank0-of-2.safetensors" ] && [ -f "$C/optimizer.rank1-of-2.safetensors" ] && [ -f "$C/optimizer_manifest.json" ] \
  && python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); sys.exit(not (m["world_size"] == 2 and m["zero"] == 1 and len(m["buckets"]) > 1))' "$C/optimizer_manifest.json" \
  && ok "one optimizer shard per rank + manifest (world 2, ZeRO-1, several buckets)" || bad "shard files: $(ls "$C")"
ls -a "$W/A" | grep -q tmp && bad "temporary directory left behind: $(ls -a "$W/A")" || ok "no temporary directory left"
# same layout: bit-identical
resume_from B; run 2 B --resume || { cat "$W/B.log"; bad "same-layout resume"; }
for f in model.safetensors optimizer.rank0-of-2.safetensors optimizer.rank1-of-2.safetensors optimizer.safetensors; do
  cmp -s "$W/A/checkpoint-6/$f" "$W/B/checkpoint-6/$f" || { bad "same-layout resume: $f differs"; continue; }
done
grep "^step [456]/" "$W/A.log" | sed 's/ tok\/s.*//' > "$W/a.l"; grep "^step " "$W/B.log" | sed 's/ tok\/s.*//' > "$W/b.l"
cmp -s "$W/a.l" "$W/b.l" && [ "$(wc -l < "$W/b.l")" = 3 ] && ok "same layout (2 ranks ZeRO-1): resume bit-identical (weights, shards, losses)" \
  || { bad "same-layout losses differ"; diff "$W/a.l" "$W/b.l"; }
# other layouts: resharded
for lay in "1 0" "1 1" "4 2" "2 2" "2 0" "2 3" "4 3"; do
  set -- $lay; n=R$1z$2
  resume_from $n; run $1 $n --resume --set parallel.zero=$2 || { cat "$W/$n.log"; bad "resume on $1 ranks ZeRO-$2"; continue; }
  r=$(close A $n) && ok "resume 2 ranks ZeRO-1 -> $1 rank(s) ZeRO-$2: $r" || bad "reshard to $1 ranks ZeRO-$2: $r"
done
# and back: a 4-rank ZeRO-2 checkpoint resumed on 2 ranks ZeRO-1
mkdir -p "$W/Q"; run 4 Q --set parallel.zero=2 --set training.steps=6 || { cat "$W/Q.log"; bad "4-rank ZeRO-2 run"; }
[ -f "$W/Q/checkpoint-3/optimizer.rank3-of-4.safetensors" ] && ok "4 ranks write 4 shards" || bad "4-rank shards: $(ls "$W/Q/checkpoint-3")"
mkdir -p "$W/Q2"; cp -r "$W/Q/checkpoint-3" "$W/Q2/"; run 2 Q2 --resume --set parallel.zero=1 || { cat "$W/Q2.log"; bad "4->2 resume"; }
r=$(close Q Q2) && ok "resume 4 ranks ZeRO-2 -> 2 ranks ZeRO-1: $r" || bad "4->2: $r"
# ZeRO-3: every rank writes its parameter shard with its moments; no model.safetensors (the
# untrained parameters go to model.frozen.safetensors); export consolidates
mkdir -p "$W/Z"; run 2 Z --set parallel.zero=3 --set model.freeze=[embeddings] || { cat "$W/Z.log"; bad "2-rank ZeRO-3 run"; }
mkdir -p "$W/AF"; run 2 AF --set model.freeze=[embeddings] || { cat "$W/AF.log"; bad "2-rank ZeRO-1 run, frozen embeddings"; }
C=$W/Z/checkpoint-3
python3 - "$C" <<'PY' && ok "ZeRO-3 checkpoint: parameter + moment shards per rank, manifest (zero 3, params sharded, shapes), frozen weights apart, no model.safetensors" || bad "ZeRO-3 checkpoint layout: $(ls "$C")"
import json, struct, sys, os
c = sys.argv[1]; m = json.load(open(c + "/optimizer_manifest.json"))
def names(f):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; return [k for k in json.loads(b[8:8 + n]) if k != "__metadata__"]
r0 = names(c + "/optimizer.rank0-of-2.safetensors"); r1 = names(c + "/optimizer.rank1-of-2.safetensors")
fz = names(c + "/model.frozen.safetensors")
ok = (m["zero"] == 3 and m["params_sharded"] and m["world_size"] == 2 and all("shape" in p and "unit" in p for p in m["params"])
      and any(k.startswith("param.") for k in r0) and any(k.startswith("param.") for k in r1)
      and not os.path.exists(c + "/model.safetensors") and fz == ["model.embed_tokens.weight"]
      and all(p["unit"] >= 0 for p in m["params"] if ".layers." in p["name"]))
sys.exit(0 if ok else 1)
PY
r=$(close AF Z) && ok "2 ranks ZeRO-3 (exported) matches 2 ranks ZeRO-1: $r" || bad "ZeRO-3 vs ZeRO-1: $r"
mkdir -p "$W/Z2"; cp -r "$W/Z/checkpoint-3" "$W/Z2/"; run 2 Z2 --resume --set parallel.zero=3 --set model.freeze=[embeddings] || { cat "$W/Z2.log"; bad "ZeRO-3 same-layout resume"; }
cmp -s "$W/Z/checkpoint-6/optimizer.rank0-of-2.safetensors" "$W/Z2/checkpoint-6/optimizer.rank0-of-2.safetensors" \
  && cmp -s "$W/Z/checkpoint-6/optimizer.rank1-of-2.safetensors" "$W/Z2/checkpoint-6/optimizer.rank1-of-2.safetensors" \
  && ok "same layout (2 ranks ZeRO-3): resume bit-identical (parameter and moment shards)" || bad "ZeRO-3 same-layout resume differs"
for lay in "1 0" "4 1" "4 3"; do
  set -- $lay; n=Z$1z$2
  mkdir -p "$W/$n"; cp -r "$W/Z/checkpoint-3" "$W/$n/"
  run $1 $n --resume --set parallel.zero=$2 --set model.freeze=[embeddings] || { cat "$W/$n.log"; bad "ZeRO-3 checkpoint resumed on $1 ranks ZeRO-$2"; continue; }
  r=$(close Z $n) && ok "resume 2 ranks ZeRO-3 -> $1 rank(s) ZeRO-$2: $r" || bad "reshard ZeRO-3 to $1 ranks ZeRO-$2: $r"
done
"$MMC" export "$W/Z/checkpoint-6" --out "$W/zx" --json > "$W/zx.json" 2>&1 && grep -q '"zero": 3' "$W/zx.json" \
  && [ -f "$W/zx/config.json" ] && ! ls "$W/zx" | grep -q "optimizer\|frozen\|trainer_state" && "$MMC" info "$W/zx" > /dev/null 2>&1 \
  && ok "export consolidates a ZeRO-3 checkpoint into an HF directory ($(cat "$W/zx.json"))" || bad "ZeRO-3 export: $(cat "$W/zx.json"); $(ls "$W/zx")"
rm "$W/Z2/checkpoint-3/optimizer.rank0-of-2.safetensors"
"$MMC" export "$W/Z2/checkpoint-3" --out "$W/zm" > "$W/zm.log" 2>&1 && bad "export of a ZeRO-3 checkpoint missing a shard succeeded"
grep -q "optimizer.rank0-of-2.safetensors, is missing" "$W/zm.log" && ok "ZeRO-3 export refuses a missing shard" || bad "ZeRO-3 missing shard: $(cat "$W/zm.log")"
# bf16 under ZeRO-3: the shards hold the fp32 masters; same-layout resume bit-identical, and
# resharded into ZeRO-2 / one process (bf16 weights rounded from the masters) and back
mkdir -p "$W/ZB"; run 2 ZB --set parallel.zero=3 --set model.dtype=bf16 || { cat "$W/ZB.log"; bad "2-rank ZeRO-3 bf16 run"; }
mkdir -p "$W/ZB2"; cp -r "$W/ZB/checkpoint-3" "$W/ZB2/"; run 2 ZB2 --resume --set parallel.zero=3 --set model.dtype=bf16 || { cat "$W/ZB2.log"; bad "ZeRO-3 bf16 same-layout resume"; }
cmp -s "$W/ZB/checkpoint-6/optimizer.rank0-of-2.safetensors" "$W/ZB2/checkpoint-6/optimizer.rank0-of-2.safetensors" \
  && cmp -s "$W/ZB/checkpoint-6/optimizer.rank1-of-2.safetensors" "$W/ZB2/checkpoint-6/optimizer.rank1-of-2.safetensors" \
  && ok "same layout (2 ranks ZeRO-3 bf16): resume bit-identical" || bad "ZeRO-3 bf16 same-layout resume differs"
for lay in "1 0" "2 2"; do
  set -- $lay; n=ZB$1z$2
  mkdir -p "$W/$n"; cp -r "$W/ZB/checkpoint-3" "$W/$n/"
  run $1 $n --resume --set parallel.zero=$2 --set model.dtype=bf16 || { cat "$W/$n.log"; bad "ZeRO-3 bf16 checkpoint resumed on $1 ranks ZeRO-$2"; continue; }
  r=$(close ZB $n) && ok "resume 2 ranks ZeRO-3 bf16 -> $1 rank(s) ZeRO-$2 bf16: $r" || bad "reshard ZeRO-3 bf16 to $1 ranks ZeRO-$2: $r"
done
mkdir -p "$W/ZBb"; cp -r "$W/ZB2z2/checkpoint-3" "$W/ZBb/" 2>/dev/null
run 2 ZBb --resume --set parallel.zero=3 --set model.dtype=bf16 || { cat "$W/ZBb.log"; bad "ZeRO-2 bf16 checkpoint resumed under ZeRO-3"; }
r=$(close ZB ZBb) && ok "resume 2 ranks ZeRO-2 bf16 -> 2 ranks ZeRO-3 bf16: $r" || bad "ZeRO-2 bf16 -> ZeRO-3: $r"
# LoRA under ZeRO-3 (the base sharded, gathered for the save): same-layout resume bit-identical
LO=(--set parallel.zero=3 --set model.lora.r=4 --set model.lora.alpha=8 --set 'model.lora.targets=[q_proj,v_proj]')
mkdir -p "$W/ZL"; run 2 ZL "${LO[@]}" || { cat "$W/ZL.log"; bad "2-rank ZeRO-3 LoRA run"; }
mkdir -p "$W/ZL2"; cp -r "$W/ZL/checkpoint-3" "$W/ZL2/"; run 2 ZL2 --resume "${LO[@]}" || { cat "$W/ZL2.log"; bad "ZeRO-3 LoRA resume"; }
cmp -s "$W/ZL/checkpoint-6/adapter_model.safetensors" "$W/ZL2/checkpoint-6/adapter_model.safetensors" \
  && ok "same layout (2 ranks ZeRO-3 LoRA, base sharded): resume bit-identical adapters" || bad "ZeRO-3 LoRA resume: adapters differ ($(ls "$W/ZL2/checkpoint-6" 2>&1))"
"$MMC" export "$W/ZL/checkpoint-6" --out "$W/zlx" --json > "$W/zlx.json" 2>&1 && grep -q '"lora": true' "$W/zlx.json" \
  && ok "export of a ZeRO-3 LoRA checkpoint: the adapters" || bad "ZeRO-3 LoRA export: $(cat "$W/zlx.json")"
# a missing shard: refused on every rank, naming the file
resume_from M; rm "$W/M/checkpoint-3/optimizer.rank1-of-2.safetensors"
run 2 M --resume && bad "resume with a missing shard succeeded"
grep -q 'optimizer.rank1-of-2.safetensors, is missing' "$W/M.log" && ok "missing shard refused, naming the file" \
  || bad "missing shard message: $(cat "$W/M.log")"
"$MMC" export "$W/M/checkpoint-3" --out "$W/xm" > "$W/xm.log" 2>&1 && bad "export of an incomplete checkpoint succeeded"
grep -q "optimizer.rank1-of-2.safetensors, is missing" "$W/xm.log" && [ ! -e "$W/xm" ] && ok "export refuses it too" || bad "export: $(cat "$W/xm.log")"
# export: an HF directory without the training state
"$MMC" export "$W/A/checkpoint-6" --out "$W/hf" --json > "$W/hf.json" 2>&1 || bad "export: $(cat "$W/hf.json")"
cmp -s "$W/A/checkpoint-6/model.safetensors" "$W/hf/model.safetensors" && [ -f "$W/hf/config.json" ] \
  && ! ls "$W/hf" | grep -q "optimizer\|trainer_state" && grep -q '"world_size": 2' "$W/hf.json" \
  && ok "export writes model + config, no optimizer/trainer state" || bad "export dir: $(ls "$W/hf"); $(cat "$W/hf.json")"
"$MMC" info "$W/hf" > /dev/null 2>&1 && ok "mmc info reads the export" || bad "mmc info on export"
"$MMC" export "$W/A/checkpoint-6" --out "$W/hf" > /dev/null 2>&1 && bad "export over a non-empty dir" || ok "export refuses a non-empty --out"
[ $fail = 0 ] && echo "test_dist_ckpt: passed" || echo "test_dist_ckpt: FAILED"
exit $fail
