#!/usr/bin/env bash
# test_cp.sh — context parallelism, DeepSpeed-Ulysses and ring attention (mmc_cp.h), on 2, 3 and 4
# ranks against one process. Unit checks (tests/cp_worker.c): the all-to-all re-sharding moves every element to
# its place (exact) and attention through it equals unsplit attention (1e-6; measured 0), with
# gradients (1e-5; measured 4.8e-7 with replicated KV heads, else 0); cp=2 activation memory <= 0.6x. Then `mmc train` with parallel.context_parallel on the tiny
# Qwen2: losses (1e-5 relative; measured ~1e-7), final weights (2e-4 absolute, mean 1e-6) and
# AdamW moments (1e-2 of scale) equal the single-process run's (`tp_worker compare`); a
# sequence length not divisible by cp (padded and masked); cp=4 over 2 KV heads (replicated); cp2 x dp2 on 4 ranks; resume at
# cp2 and across layouts; LoRA; the layout errors before any work, and Qwen2.5-Omni refused (Qwen2-VL / Qwen2.5-VL: test_cp_vl.sh;
# LLaVA / InternVL: test_llava_parallel.sh, test_internvl_parallel.sh).
# Ring attention (parallel.context_parallel_mode: ring, src/parallel/cp_ring.c): cp_worker checks it
# against unsplit mmc_attention on causal, full and packed rows (GQA, one KV head for any C), output
# within 2e-6 and q/k/v gradients within 1e-5 absolute (measured 4.8e-7 / 1.4e-6: another kernel,
# another summation order), and that the zigzag shards give every rank equal causal work at every
# ring step; then `mmc train` at ring cp=2, 3 (which Ulysses refuses over 4 heads), 4, seq_len 15,
# cp2 x dp2, recompute and LoRA against one process with the same tolerances as Ulysses (measured:
# losses 2e-7 relative, weights <= 9.4e-5 absolute, mean 1.7e-7: AdamW turns the kernels' 1e-6
# gradient differences into that on weights whose gradients are near 0). Skipped (exit 77) when
# mpirun or the workers (built only when CMake finds MPI) are missing.
set -u
MMC=${MMC:-build/mmc}
BIN=$(dirname "$MMC")
CPW=$BIN/cp_worker; CMP=$BIN/tp_worker
if ! command -v mpirun >/dev/null 2>&1; then echo "test_cp: skipped: no mpirun on PATH"; exit 77; fi
if [ ! -x "$CPW" ] || [ ! -x "$CMP" ]; then echo "test_cp: skipped: no $CPW (built without MPI)"; exit 77; fi
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPIRUN=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
fail=0
W=$(mktemp -d); out=$W/out; trap 'rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W"   # its own OpenMPI session directory (see test_dist_mpi.sh)
for np in 2 3 4; do
  if timeout 60 "${MPIRUN[@]}" -np $np "$CPW" >"$out" 2>&1 && [ "$(grep -c 'all .* cp checks passed' "$out")" = $np ]; then
    grep 'cp unit\|cp zigzag' "$out"
  else
    echo "FAIL: cp_worker on $np ranks:"; cat "$out"; fail=1
  fi
done
# per-rank activation memory of a T=4096 row (forward + backward): cp=2 must hold at most 0.6 of
# the single process's arena peak (attention, MLP and logits all scale with T/C), same loss (1e-5 rel)
timeout 300 "$CPW" mem tests/fixtures/qwen2/tiny 4096 >"$out" 2>&1 && timeout 300 "${MPIRUN[@]}" -np 2 "$CPW" mem tests/fixtures/qwen2/tiny 4096 >>"$out" 2>&1
if awk '/cp memory/ { for (i = 1; i <= NF; i++) { if ($i == "peak") p[$6] = $(i + 1); if ($i == "loss") l[$6] = $(i + 1) } }
        END { d = l["1,"] - l["2,"]; if (d < 0) d = -d; exit !(p["1,"] > 0 && p["2,"] <= 0.6 * p["1,"] && d <= 1e-5 * l["1,"]) }' "$out"; then
  grep 'cp memory' "$out" | grep -v 'rank 1'
else
  echo "FAIL: cp memory:"; cat "$out"; fail=1
fi
# ring attention at cp=2: at most 0.55 of the single process's peak (it keeps no head-sharded copies),
# same loss (1e-5 rel); every rank sent exactly the ring's K/V + dK/dV blocks (the README's figure)
timeout 300 "${MPIRUN[@]}" -np 2 "$CPW" mem tests/fixtures/qwen2/tiny 4096 ring >"$W/ring.out" 2>&1
if cat "$out" "$W/ring.out" | awk '/cp memory/ { for (i = 1; i <= NF; i++) { if ($i == "peak") pk = $(i + 1); if ($i == "loss") ls = $(i + 1)
                                                   if ($i == "sent") { md = $(i - 1); by = $(i + 1) } }
                                    k = $6 md; p[k] = pk; l[k] = ls; b[k] = by }
     END { d = l["1,ulysses"] - l["2,ring"]; if (d < 0) d = -d
           exit !(p["1,ulysses"] > 0 && p["2,ring"] <= 0.55 * p["1,ulysses"] && d <= 1e-5 * l["1,ulysses"] && b["2,ring"] == 4) }'; then
  grep 'cp memory' "$W/ring.out" | grep -v 'rank 1'
else
  echo "FAIL: ring cp memory:"; cat "$out" "$W/ring.out"; fail=1
fi

cfg() {  # cfg NAME CP SEQ_LEN
  cat > "$W/$1.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: $3, batch_size: 4, micro_batch_size: 2}
parallel: {context_parallel: $2}
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 6, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
run1() { "$MMC" train "$@" 2>>"$W/train.log" >/dev/null; }
runN() { local n=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$n" "$MMC" train "$@" >>"$W/train.log" 2>&1; }
cmp_runs() {  # cmp_runs WHAT REF RUN
  if "$CMP" compare "$W/$2" "$W/$3" >"$out" 2>&1; then echo "$1: $(cat "$out")"
  else echo "FAIL: $1:"; cat "$out"; tail -n 30 "$W/train.log"; fail=1; fi
}
cfg ref 1 16; cfg cp2 2 16; cfg ref15 1 15; cfg cp15 2 15
run1 "$W/ref.yaml" || { echo "FAIL: reference run"; tail "$W/train.log"; fail=1; }
runN 2 "$W/cp2.yaml" || { echo "FAIL: cp=2 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train cp=2 vs 1 process" ref cp2
run1 "$W/ref15.yaml" && runN 2 "$W/cp15.yaml" || { echo "FAIL: seq_len 15 runs"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train cp=2, seq_len 15 (padded to 16, masked) vs 1 process" ref15 cp15
# cp=4 over the 2 KV heads: each replicated over 2 ranks (mmc_cp_expand_kv)
runN 4 "$W/cp2.yaml" --set training.output_dir="$W/cp4" --set parallel.context_parallel=4 || { echo "FAIL: cp=4 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train cp=4 (2 KV heads replicated) vs 1 process" ref cp4
# through `mmc launch -n 4` (it sets data_parallel = 4 / context_parallel)
timeout 120 "$MMC" launch -n 4 "$W/cp2.yaml" --set training.output_dir="$W/cpdp" >>"$W/train.log" 2>&1 ||
  { echo "FAIL: cp2 x dp2 run (mmc launch -n 4)"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc launch -n 4: cp=2 x dp=2 vs 1 process" ref cpdp
runN 2 "$W/cp2.yaml" --set training.output_dir="$W/r22" --set training.steps=3 &&
  cp -r "$W/r22" "$W/r21" && runN 2 "$W/cp2.yaml" --set training.output_dir="$W/r22" --resume || fail=1
cmp_runs "cp=2 3 steps, resumed at cp=2" ref r22
run1 "$W/ref.yaml" --set training.output_dir="$W/r21" --resume || fail=1
cmp_runs "cp=2 3 steps, resumed at cp=1" ref r21
# activation recompute: the all-to-alls run again inside backward, in the same order on every rank
runN 2 "$W/cp2.yaml" --set training.output_dir="$W/rc" --set model.recompute=full || { echo "FAIL: cp=2 recompute run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train cp=2 + model.recompute full vs 1 process" ref rc
LORA='lora: {r: 4, alpha: 8, dropout: 0.0, targets: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}'
for n in ref cp2; do sed "s/dtype: f32}/dtype: f32, $LORA}/; s#output_dir: $W/$n}#output_dir: $W/${n}L}#" "$W/$n.yaml" > "$W/${n}L.yaml"; done
run1 "$W/refL.yaml" && runN 2 "$W/cp2L.yaml" || { echo "FAIL: LoRA runs"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train LoRA cp=2 vs 1 process (adapters)" refL cp2L

# ring attention (parallel.context_parallel_mode: ring): zigzag shards, K/V blocks round the ring
RING='--set parallel.context_parallel_mode=ring'
runN 2 "$W/cp2.yaml" --set training.output_dir="$W/ring2" $RING || { echo "FAIL: ring cp=2 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train ring cp=2 vs 1 process" ref ring2
runN 4 "$W/cp2.yaml" --set training.output_dir="$W/ring4" --set parallel.context_parallel=4 $RING ||
  { echo "FAIL: ring cp=4 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train ring cp=4 (any number of ranks: 2 KV heads, none replicated) vs 1 process" ref ring4
runN 3 "$W/cp2.yaml" --set training.output_dir="$W/ring3" --set parallel.context_parallel=3 $RING ||
  { echo "FAIL: ring cp=3 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train ring cp=3 (Ulysses refuses 3 over 4 heads; row padded 16 -> 18) vs 1 process" ref ring3
runN 2 "$W/cp15.yaml" --set training.output_dir="$W/ring15" $RING || { echo "FAIL: ring seq_len 15 run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train ring cp=2, seq_len 15 (padded to 16, masked) vs 1 process" ref15 ring15
timeout 120 "$MMC" launch -n 4 "$W/cp2.yaml" --set training.output_dir="$W/ringdp" $RING >>"$W/train.log" 2>&1 ||
  { echo "FAIL: ring cp2 x dp2 run (mmc launch -n 4)"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc launch -n 4: ring cp=2 x dp=2 vs 1 process" ref ringdp
runN 2 "$W/cp2.yaml" --set training.output_dir="$W/ringrc" --set model.recompute=full $RING ||
  { echo "FAIL: ring cp=2 recompute run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train ring cp=2 + model.recompute full (the ring runs again inside backward) vs 1 process" ref ringrc
runN 2 "$W/cp2L.yaml" --set training.output_dir="$W/ring2L" $RING || { echo "FAIL: ring LoRA run"; tail "$W/train.log"; fail=1; }
cmp_runs "mmc train LoRA ring cp=2 vs 1 process (adapters)" refL ring2L

expect_err() {  # expect_err WHAT PATTERN NP YAML...
  local what=$1 pat=$2 np=$3; shift 3
  if [ "$np" = 1 ]; then "$MMC" train "$@" >"$out" 2>&1; else timeout 60 "${MPIRUN[@]}" -np "$np" "$MMC" train "$@" >"$out" 2>&1; fi
  local rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "$pat" "$out"; then echo "error ($what): $(grep -m1 "$pat" "$out" | cut -c1-300)"
  else echo "FAIL: $what: rc $rc, no '$pat':"; cat "$out"; fail=1; fi
}
expect_err "cp 3 over 4 query heads" "context_parallel 3 does not divide num_attention_heads 4" 3 "$W/cp2.yaml" --set parallel.context_parallel=3
expect_err "unknown context_parallel_mode" "context_parallel_mode.*expected one of ulysses, ring" 1 "$W/cp2.yaml" --set parallel.context_parallel_mode=rings
expect_err "cp larger than the world" "context_parallel 2 is larger than the job's 1 process" 1 "$W/cp2.yaml"
expect_err "world not divisible by cp" "3 processes do not divide into context-parallel groups of 2" 3 "$W/cp2.yaml"
expect_err "cp with tp" "context_parallel: 2 with tensor_parallel > 1 is not supported yet" 1 "$W/cp2.yaml" --set parallel.tensor_parallel=2
expect_err "cp with ZeRO" "context_parallel: 2 with ZeRO (parallel.zero > 0) is not supported yet" 1 "$W/cp2.yaml" --set parallel.zero=1
# a non-finite loss on the group stops every rank at the same step (no rank left in a collective)
MMC_TRAIN_TEST_NAN_STEP=2 timeout 60 "$MMC" launch -n 4 "$W/cp2.yaml" --set training.output_dir="$W/nan" >"$out" 2>&1
if [ "$(grep -c 'the loss is not finite on some context-parallel rank' "$out")" = 4 ]; then
  echo "error (NaN loss at cp2 x dp2): every rank: $(grep -m1 'not finite' "$out" | cut -c1-160)"
else echo "FAIL: NaN loss under cp:"; cat "$out"; fail=1; fi
cat > "$W/omni.yaml" <<YAML
model: {path: tests/fixtures/omni/thinker, dtype: f32}
data: {train: tests/fixtures/omni_train/data.jsonl, seq_len: 512, batch_size: 2, micro_batch_size: 1, num_workers: 0}
parallel: {context_parallel: 2}
training: {steps: 1, output_dir: $W/omni}
YAML
expect_err "cp on Qwen2.5-Omni (Qwen2-VL / Qwen2.5-VL: test_cp_vl.sh; LLaVA / InternVL: test_llava_parallel.sh, test_internvl_parallel.sh)" "parallel.context_parallel is implemented for the text decoders (Qwen2, Llama, Mistral), Qwen2-VL, Qwen2.5-VL, LLaVA and InternVL only so far (this model is a Qwen2.5-Omni)" 2 "$W/omni.yaml"

[ $fail = 0 ] && echo "test_cp: passed" || echo "test_cp: FAILED"
exit $fail
