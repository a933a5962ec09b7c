#!/usr/bin/env bash
# test_dist_train.sh — data-parallel training parity: N ranks with micro-batch b equal one
# process with batch N*b (every step's loss within 1e-5 relative, final weights within 1e-5),
# for every ZeRO stage 0-3 on 2 and 4 ranks, with and without LoRA, with buckets small enough
# that several reduce during backward; two micro-batches per rank; a frozen component with
# recompute; the per-rank bytes of parameters / gradients / optimizer state shrink as ZeRO
# says; Qwen2-VL with one rank's micro-batch text-only (mixed batches never hang, ZeRO-3
# included); and bad layouts fail on every rank before any work. Skipped when mpirun or MPI
# support is missing.
set -u
MMC=${MMC:-build/mmc}
if ! command -v mpirun >/dev/null 2>&1; then echo "test_dist_train: skipped: no mpirun on PATH"; exit 77; fi
if [ ! -x "$(dirname "$MMC")/dist_mpi_worker" ]; then echo "test_dist_train: skipped: built without MPI"; exit 77; fi
if ! command -v python3 >/dev/null 2>&1; then echo "test_dist_train: skipped: no python3 to compare"; exit 77; fi
# A hang must fail the run within minutes, naming the stuck rank (the watchdog), not stall the
# test until ctest's timeout cuts its output off: every mpirun runs under a watchdog timeout
# and `timeout`, and a failed run prints its log's tail (both ranks' lines).
export OMP_NUM_THREADS=1 MMC_DP_BUCKET_BYTES=65536 MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-120}
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPIRUN=(timeout -k 10 400 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x MMC_DP_BUCKET_BYTES
        -x MMC_DIST_TIMEOUT -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
W=$(mktemp -d)
# its own OpenMPI session directory: concurrent mpiruns (ctest -j runs the MPI tests side by
# side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to mkdir was
# unable to create the desired directory ... File exists", then orte_init fails)
export OMPI_MCA_orte_tmpdir_base="$W"
fail=0
# on failure, MMC_TEST_KEEP=DIR keeps the work directory (configs, logs, checkpoints) there
trap 'if [ $fail != 0 ] && [ -n "${MMC_TEST_KEEP:-}" ]; then mkdir -p "$MMC_TEST_KEEP" && cp -r "$W" "$MMC_TEST_KEEP/"; fi; rm -rf "$W"' EXIT
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
tail_log() { echo "--- last lines of $1.log:"; tail -n 60 "$W/$1.log"; echo "---"; }
cfg() {  # cfg NAME BATCH MB DP ZERO [extra model keys]
  cat > "$W/$1.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: ${DTYPE:-f32} $6}
data: {train: synthetic, seq_len: 16, batch_size: $2, micro_batch_size: $3}
parallel: {data_parallel: $4, zero: $5}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}
training: {steps: 6, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
compare() {  # compare REF RUN: losses from metrics.jsonl, weights from the final checkpoint
  python3 - "$W/$1" "$W/$2" "$MMC" <<'PY'
import json, struct, sys, glob, os, subprocess
def losses(d): return [json.loads(l)["loss"] for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]
def st(f):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "BF16": raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out
def weights(d):   # a bf16 run's trained weights: its fp32 masters (optimizer.safetensors "master.*")
    c = sorted(glob.glob(os.path.join(d, "checkpoint-*")))[-1]
    f = c + "/model.safetensors" if os.path.exists(c + "/model.safetensors") else c + "/adapter_model.safetensors"
    if not os.path.exists(f):   # ZeRO-3: the trained parameters are in the shards; export consolidates
        subprocess.run([sys.argv[3], "export", c, "--out", d + ".export"], check=True, stdout=subprocess.DEVNULL)
        f = d + ".export/model.safetensors"
    w = st(f)
    if os.path.exists(c + "/model.safetensors"):
        o = st(c + "/optimizer.safetensors")
        for k in w:
            if "master." + k in o: w[k] = o["master." + k]
    return w
a, b = losses(sys.argv[1]), losses(sys.argv[2])
rel = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) else 1e9
wa, wb = weights(sys.argv[1]), weights(sys.argv[2])
wd = max(max(abs(x - y) for x, y in zip(wa[k], wb[k])) for k in wa) if wa.keys() == wb.keys() else 1e9
print("steps %d, loss max rel diff %.2e (tol 1e-5), weights max abs diff %.2e (tol 1e-5)" % (len(a), rel, wd))
sys.exit(0 if rel <= 1e-5 and wd <= 1e-5 and len(a) == 6 else 1)
PY
}
# reference: one process, global batch 8 = 2 micro-batches of 4 (for 2 ranks), 4 of 2 (for 4
# ranks); every ZeRO stage on 2 and 4 ranks, with and without LoRA, must match it
LORA=", lora: {r: 4, alpha: 8, dropout: 0.0, targets: [q_proj, v_proj, down_proj]}"
cfg ref4 8 4 1 0 ""; "$MMC" train "$W/ref4.yaml" 2>"$W/ref4.log" || { cat "$W/ref4.log"; bad "reference run"; }
cfg ref2 8 2 1 0 ""; "$MMC" train "$W/ref2.yaml" 2>"$W/ref2.log" || { cat "$W/ref2.log"; bad "reference run (mb 2)"; }
cfg refL4 8 4 1 0 "$LORA"; "$MMC" train "$W/refL4.yaml" 2>"$W/refL4.log" || { cat "$W/refL4.log"; bad "LoRA reference"; }
cfg refL2 8 2 1 0 "$LORA"; "$MMC" train "$W/refL2.yaml" 2>"$W/refL2.log" || { cat "$W/refL2.log"; bad "LoRA reference (mb 2)"; }
par() {  # par NAME REF NP MB ZERO [extra model keys] [what]
  cfg $1 8 $4 $3 $5 "${6:-}"
  local t0=$SECONDS rc
  "${MPIRUN[@]}" -np $3 "$MMC" train "$W/$1.yaml" >"$W/$1.log" 2>&1; rc=$?
  if [ $rc = 0 ]; then
    r=$(compare $2 $1) && ok "$3 ranks ZeRO-$5${7:-}: $r ($((SECONDS - t0)) s)" || { tail_log $1; bad "$3 ranks ZeRO-$5${7:-}: $r"; }
  else tail_log $1; bad "$3 ranks ZeRO-$5${7:-} run: exit $rc after $((SECONDS - t0)) s"; fi
}
for z in 0 1 2 3; do
  par dp2z$z ref4 2 4 $z
  par dp4z$z ref2 4 2 $z
  par dpL2z$z refL4 2 4 $z "$LORA" ", LoRA"
  par dpL4z$z refL2 4 2 $z "$LORA" ", LoRA"
done
# two micro-batches per rank (gradient accumulation into the sharded accumulator)
par dp2z3ga ref2 2 2 3 "" ", 2 micro-batches per rank"
# frozen embeddings + recompute (parameters reached inside checkpointed blocks; ZeRO-3
# gathers them again when backward recomputes the block)
cfg refF 8 4 1 0 ", freeze: [embeddings], recompute: full"; "$MMC" train "$W/refF.yaml" 2>"$W/refF.log" || bad "frozen reference"
for z in 2 3; do par dpF$z refF 2 4 $z ", freeze: [embeddings], recompute: full" ", frozen embeddings, recompute"; done
# bf16 working weights under ZeRO-3: gathered in bf16 (half the bytes) from the fp32 master
# shards, against one process in bf16 (its fp32 masters compared). The tolerance stays 1e-5:
# each rank rounds the same master values the one process rounds (they agree to ~1e-9), so
# the bf16 weights the forward sees are the same and only the order of the fp32 gradient sums
# differs, as in f32; the LoRA case gathers the untrained bf16 base the same way
DTYPE=bf16 cfg refB4 8 4 1 0 ""; "$MMC" train "$W/refB4.yaml" 2>"$W/refB4.log" || { cat "$W/refB4.log"; bad "bf16 reference"; }
DTYPE=bf16 cfg refB2 8 2 1 0 ""; "$MMC" train "$W/refB2.yaml" 2>"$W/refB2.log" || { cat "$W/refB2.log"; bad "bf16 reference (mb 2)"; }
DTYPE=bf16 cfg refBL4 8 4 1 0 "$LORA"; "$MMC" train "$W/refBL4.yaml" 2>"$W/refBL4.log" || { cat "$W/refBL4.log"; bad "bf16 LoRA reference"; }
DTYPE=bf16 par dpB2z3 refB4 2 4 3 "" ", bf16"
DTYPE=bf16 par dpB4z3 refB2 4 2 3 "" ", bf16"
DTYPE=bf16 par dpBL2z3 refBL4 2 4 3 "$LORA" ", bf16, LoRA"
DTYPE=bf16 par dpB2z0 refB4 2 4 0 "" ", bf16"
# ZeRO >= 2 shards the gradients, ZeRO-3 the parameters too: rank 0's persistent bytes
mem() { sed -n 's/.*rank 0 holds \([0-9]*\) bytes of parameters, \([0-9]*\) of gradients (+\([0-9]*\) in buckets), \([0-9]*\) of optimizer.*/\1 \2 \3 \4/p' "$W/$1.log"; }
peak() { sed -n 's/.*peaks during steps: \([0-9]*\) of parameters.*/\1/p' "$W/$1.log"; }
frozen() { sed -n 's/.*; \([0-9]*\) bytes of untrained parameters.*/\1/p' "$W/$1.log"; }
read -r p0 g0 b0 o0 <<<"$(mem dp2z0)"; read -r p2 g2 b2 o2 <<<"$(mem dp2z2)"; read -r p3 g3 b3 o3 <<<"$(mem dp2z3)"
read -r p43 g43 b43 o43 <<<"$(mem dp4z3)"
if [ -n "${p3:-}" ] && [ -n "${p43:-}" ] && [ "$g2" -le $(( g0 / 2 + 256 )) ] && [ "$b2" = 0 ] && [ "$p2" = "$p0" ] \
   && [ "$p3" -le $(( p0 / 2 + 256 )) ] && [ "$g3" -le $(( g0 / 2 + 256 )) ] && [ "$p43" -le $(( p0 / 4 + 256 )) ] \
   && [ "$o3" -le $(( o0 / 2 + 256 )) ]; then
  ok "memory per rank: ZeRO-0 params/grads/optim $p0/$g0/$o0 B; ZeRO-2 $p2/$g2/$o2; ZeRO-3 $p3/$g3/$o3 (4 ranks: $p43/$g43/$o43)"
else bad "memory per rank: ZeRO-0 '$p0 $g0 $b0 $o0' ZeRO-2 '${p2:-} ${g2:-} ${b2:-}' ZeRO-3 '${p3:-} ${g3:-} ${o3:-}' 4 ranks '${p43:-}'"; fi
# ZeRO-3 shards the untrained parameters too (LoRA's base): 1/N of ZeRO-0's on each rank
f0=$(frozen dpL2z0); f2=$(frozen dpL2z3); f4=$(frozen dpL4z3)
if [ -n "$f0" ] && [ -n "$f2" ] && [ -n "$f4" ] && [ "$f0" -gt 0 ] && [ "$f2" -le $(( f0 / 2 + 1024 )) ] && [ "$f4" -le $(( f0 / 4 + 1024 )) ]; then
  ok "untrained (LoRA base) bytes per rank: ZeRO-0 $f0, ZeRO-3 2 ranks $f2, 4 ranks $f4"
else bad "untrained bytes per rank: ZeRO-0 '${f0:-}' ZeRO-3 '${f2:-}' '${f4:-}'"; fi
# bf16 ZeRO-3: the fp32 master shard persists (as f32's shard); the gathered units are bf16, so
# the transient parameter bytes above the shard are about half of f32's
read -r pb _ _ ob <<<"$(mem dpB2z3)"; kb=$(peak dpB2z3); k3=$(peak dp2z3)
if [ -n "${pb:-}" ] && [ -n "$kb" ] && [ -n "$k3" ] && [ "$pb" = "$p3" ] && [ "$ob" = "$o3" ] \
   && [ $(( (kb - pb) * 10 )) -le $(( (k3 - p3) * 6 )) ]; then
  ok "bf16 ZeRO-3: master shard $pb B, optimizer $ob B; gathered bytes at peak $((kb - pb)) vs f32's $((k3 - p3))"
else bad "bf16 ZeRO-3 memory: '${pb:-} ${ob:-} ${kb:-}' vs f32 '${p3:-} ${o3:-} ${k3:-}'"; fi
# mixed batches: with shuffle off and an explicit bucket_window the loader sorts each window
# by length (shuffle off alone keeps file order), so micro-batch 1 of
# every step (rank 0) holds the two text-only samples and micro-batch 2 (rank 1) the two with
# images; rank 0 still joins every collective (the vision tower's buckets included)
vlcfg() {  # vlcfg NAME TRAIN DP ZERO BATCH [extra model keys]
  cat > "$W/$1.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32 ${6:-}}
data: {train: $2, max_pixels: 3136, min_pixels: 3136, seq_len: 128, batch_size: $5, micro_batch_size: 2, num_workers: 1, shuffle: false, bucket_window: 64}
parallel: {data_parallel: $3, zero: $4}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: cosine, warmup_steps: 2, grad_clip: 1.0}
training: {steps: 6, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
MIX=tests/fixtures/data/mixed.jsonl
grep -v '"image"' "$MIX" > "$W/text.jsonl"
vlcfg vlA "$MIX" 1 0 2; "$MMC" train "$W/vlA.yaml" --set training.steps=1 --set optimizer.warmup_steps=0 2>/dev/null
vlcfg vlT "$W/text.jsonl" 1 0 2; "$MMC" train "$W/vlT.yaml" --set training.steps=1 --set optimizer.warmup_steps=0 2>/dev/null
a=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$W/vlA/metrics.jsonl" 2>/dev/null)
b=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$W/vlT/metrics.jsonl" 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "mixed data: the first micro-batch is the text-only pair (loss $a)" \
  || bad "mixed data: first micro-batch is not text-only ($a vs $b)"
vlcfg vlref "$MIX" 1 0 4; "$MMC" train "$W/vlref.yaml" 2>"$W/vlref.log" || { cat "$W/vlref.log"; bad "VL mixed reference"; }
for z in 0 2 3; do
  vlcfg vldp$z "$MIX" 2 $z 4
  if "${MPIRUN[@]}" -np 2 "$MMC" train "$W/vldp$z.yaml" >"$W/vldp$z.log" 2>&1; then
    r=$(compare vlref vldp$z) && ok "2 ranks ZeRO-$z, one rank text-only, the other with images: $r" || { tail_log vldp$z; bad "mixed ZeRO-$z: $r"; }
  else tail_log vldp$z; bad "mixed batches ZeRO-$z run (hang or error)"; fi
done
# a frozen vision tower under ZeRO-3 is sharded too and gathered in forward only (no gradient
# flows through it: the merger is the first trained parameter), one rank still text-only
FZ=", freeze: [vision_tower]"
vlcfg vlrefF "$MIX" 1 0 4 "$FZ"; "$MMC" train "$W/vlrefF.yaml" 2>"$W/vlrefF.log" || { cat "$W/vlrefF.log"; bad "VL frozen-tower reference"; }
vlcfg vldpF3 "$MIX" 2 3 4 "$FZ"
if "${MPIRUN[@]}" -np 2 "$MMC" train "$W/vldpF3.yaml" >"$W/vldpF3.log" 2>&1; then
  r=$(compare vlrefF vldpF3) && ok "2 ranks ZeRO-3, frozen vision tower sharded, one rank text-only: $r, untrained bytes on rank 0 $(frozen vldpF3)" \
    || { tail_log vldpF3; bad "frozen tower ZeRO-3: $r"; }
else tail_log vldpF3; bad "frozen tower ZeRO-3 run (hang or error)"; fi
# evaluation during a ZeRO-3 run: every rank joins the parameter gathering, rank 0 evaluates
for z in 0 3; do
  vlcfg ev$z "$MIX" 2 $z 4
  "${MPIRUN[@]}" -np 2 "$MMC" train "$W/ev$z.yaml" --set data.eval="$MIX" \
    --set training.eval_every=3 --set training.steps=3 >"$W/ev$z.log" 2>&1 || { tail_log ev$z; bad "eval run ZeRO-$z"; }
done
e0=$(grep '^eval step 3' "$W/ev0.log"); e3=$(grep '^eval step 3' "$W/ev3.log")
[ -n "$e0" ] && [ "$e0" = "$e3" ] && ok "evaluation under ZeRO-3 equals ZeRO-0 ($e3)" || bad "eval: ZeRO-0 '$e0' vs ZeRO-3 '$e3'"
[ "$(grep -c '^step ' "$W/dp2z1.log")" = 6 ] && ok "only rank 0 logs" || bad "log lines: $(grep -c '^step ' "$W/dp2z1.log")"
# bad input: every rank says why, before any work. (mpirun kills the other ranks once one exits
# non-zero; on a loaded machine that can come before a slower rank has checked its config, so
# these runs let every rank finish: what is tested is that each rank finds and names the error)
MPIRUN+=(--mca orte_abort_on_non_zero_status 0)
cfg bad1 6 2 2 0 ""
"${MPIRUN[@]}" -np 2 "$MMC" train "$W/bad1.yaml" >"$W/bad1.log" 2>&1
[ "$(grep -c 'does not divide into data_parallel 2' "$W/bad1.log")" = 2 ] && ok "batch not divisible: both ranks" \
  || bad "batch not divisible: $(cat "$W/bad1.log")"
cfg bad2 8 2 4 0 ""
"${MPIRUN[@]}" -np 2 "$MMC" train "$W/bad2.yaml" >"$W/bad2.log" 2>&1
[ "$(grep -c 'parallel.data_parallel is 4 but the job has 2 processes' "$W/bad2.log")" = 2 ] && ok "world size mismatch: both ranks" \
  || bad "world size: $(cat "$W/bad2.log")"
[ $fail = 0 ] && echo "test_dist_train: passed" || echo "test_dist_train: FAILED"
exit $fail
