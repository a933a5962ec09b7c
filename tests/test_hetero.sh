#!/usr/bin/env bash
# test_hetero.sh — per-modality (heterogeneous) parallel plans (mmc_hetero.h): the Qwen2-VL vision
# tower data-parallel over every rank while the language model runs at tensor_parallel x
# data_parallel, against one process on the same global batch (tiny Qwen2-VL from
# tests/fixtures/train/vl_tiny.json, 7 images of 5 sizes + 1 text sample per step, micro-batches of 4):
#   vision dp2 | LM tp2          (2 ranks: each tp rank encodes its share of the micro-batch's images)
#   vision dp4 | LM tp2 x dp2    (4 ranks, through mmc launch: MindSpeed-MM's "encoders at DP, LM at TP x DP")
#   the same with LoRA on tower and LM modules (adapters), with sequence parallelism, with ZeRO-1 / 2 / 3,
#   and with an evaluation set (data.eval: the eval loss is one process's)
#   vision dp2 | LM cp2 (Ulysses), vision dp4 | LM cp2 (ring) x dp2: the tower shared over the cp group
#   checkpoints: the 4-rank run's (2 steps) continued in one process, one process's continued at 2 ranks
#   every rank encoded images, and together every image of the run once
#   errors before any work: rank counts that do not add up, unsupported mixes, a text model
# Tolerances as test_tp.sh (`tp_worker compare`: the tower's gradients are summed over the ranks
# in another order, the row-parallel all-reduces add partial products in another order): losses
# 1e-5 relative, weights 2e-4 max / 1e-6 mean absolute (lr 3e-3), AdamW moments 1e-2 of scale.
# A run without the tower's gradient reduction fails these (checked by hand: loss 3.3e-4, weights
# 1.8e-2). Measured figures are printed. 97 s at load 28 on a 2-core VM (14 `mmc train` runs).
set -u
MMC=${MMC:-build/mmc}
CMP=$(dirname "$MMC")/tp_worker
[ -x "$MMC" ] || { echo "test_hetero: skipped: no mmc binary at $MMC"; exit 77; }
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$CMP" ]; then
  echo "test_hetero: skipped: no mpirun, or mmc built without MPI"; exit 77
fi
W=$(mktemp -d /tmp/mmc_test_hetero.XXXXXX); trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 MMC_DIST_TIMEOUT=${MMC_DIST_TIMEOUT:-60} OMPI_MCA_orte_tmpdir_base="$W"
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
. tests/train_check.sh   # ok / bad
MPIRUN=(timeout -k 10 120 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x ASAN_OPTIONS -x LSAN_OPTIONS
        -x MMC_DIST_TIMEOUT)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

q() { printf '{"image": "%s", "conversations": [{"from": "human", "value": "<image>%s"}, {"from": "gpt", "value": "%s"}]}\n' "$1" "$2" "$3"; }
{ q rgb_37x53.png "What colour is it?" "Mostly red."
  q wide_900x100.jpg "Describe the picture." "A wide strip."
  q tall_100x900.png "And this one?" "A tall strip, grey at the top."
  printf '{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}\n'
  q rgb_500x333.jpg "Describe the picture in a few words." "Smooth colour gradients."
  q rgb_640x480.jpg "What is shown?" "A test card."
  q palette_P.png "Which colours?" "A few flat ones."
  q exif6.jpg "Is it rotated?" "It was, by its EXIF tag."; } > "$W/data.jsonl"
cfg() {  # cfg NAME PARALLEL [MODEL_EXTRA]
  cat > "$W/$1.yaml" <<YAML
model: {init: tests/fixtures/train/vl_tiny.json, tokenizer: tests/fixtures/tokenizer, dtype: f32${3:-}}
data: {train: $W/data.jsonl, image_root: tests/fixtures/image, max_pixels: 12544, min_pixels: 3136, seq_len: 128, batch_size: 8, micro_batch_size: 4, num_workers: 1, shuffle: false, bucket_window: 64}
parallel: $2
optimizer: {type: adamw, lr: 3.0e-3, weight_decay: 0.01, schedule: constant, grad_clip: 1.0}
training: {steps: 3, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $W/$1}
YAML
}
run1() { "$MMC" train "$@" 2>>"$W/train.log" >/dev/null; }
runN() { local n=$1; shift; "${MPIRUN[@]}" -np "$n" "$MMC" train "$@" >>"$W/train.log" 2>&1; }
cmp_runs() {  # cmp_runs WHAT REF RUN
  if "$CMP" compare "$W/$2" "$W/$3" >"$W/cmp" 2>&1; then ok; echo "$1: $(cat "$W/cmp")"
  else bad "$1:"; cat "$W/cmp"; tail -n 30 "$W/train.log"; fi
}
# images per rank from the run's last line: each > 0, summing to the run's 21 (3 steps x 7)
shares() {  # shares WHAT LOG
  local l; l=$(grep 'images (patches) the vision tower encoded' "$2" | tail -1 | sed 's/.*per rank://')
  if echo "$l" | awk '{s = 0; for (i = 1; i <= NF; i += 2) {if ($i + 0 < 1) exit 1; s += $i} exit s != 21}'; then
    ok; echo "$1: images (patches) per rank:$l"
  else bad "$1: images per rank '$l' (each rank some, 21 in all)"; fi
}

HV2='{vision: {data_parallel: 2}, language: {tensor_parallel: 2}}'
HV4='{vision: {data_parallel: 4}, language: {tensor_parallel: 2}}'
cfg ref '{}'; cfg h2 "$HV2"; cfg h4 "$HV4"
run1 "$W/ref.yaml" || { bad "reference run"; tail "$W/train.log"; }
: > "$W/train.log"
runN 2 "$W/h2.yaml" || { bad "vision dp2 | LM tp2 run"; tail "$W/train.log"; }
grep -q 'per-modality plan: vision tower data-parallel over 2 ranks, language model tensor parallelism 2 x data parallelism 1' \
  "$W/train.log" && ok || bad "no per-modality start-up line"
shares "vision dp2 | LM tp2" "$W/train.log"
cmp_runs "vision dp2 | LM tp2 (2 ranks) vs 1 process" ref h2
# the canonical plan through mmc launch (data_parallel: 4 / tp 2 = 2 replicas)
: > "$W/train.log"
timeout -k 10 120 "$MMC" launch -n 4 "$W/h4.yaml" >>"$W/train.log" 2>&1 || { bad "vision dp4 | LM tp2 x dp2 run"; tail "$W/train.log"; }
shares "vision dp4 | LM tp2 x dp2" "$W/train.log"
cmp_runs "vision dp4 | LM tp2 x dp2 (4 ranks, mmc launch) vs 1 process" ref h4
# checkpoints are full tensors: 2 steps at the hetero plan continue in one process, and back
runN 4 "$W/h4.yaml" --set parallel.language.data_parallel=2 --set training.output_dir="$W/r41" --set training.steps=2 &&
  run1 "$W/ref.yaml" --set training.output_dir="$W/r41" --resume || bad "resume hetero -> 1 process"
cmp_runs "vision dp4 | LM tp2 x dp2, 2 steps, resumed in 1 process" ref r41
run1 "$W/ref.yaml" --set training.output_dir="$W/r12" --set training.steps=2 &&
  runN 2 "$W/h2.yaml" --set training.output_dir="$W/r12" --resume || bad "resume 1 process -> hetero"
cmp_runs "1 process 2 steps, resumed at vision dp2 | LM tp2" ref r12
# LoRA on tower (fused qkv, proj, fc1, fc2) and LM modules: the tower's adapters' gradients too
LORA=', lora: {r: 4, alpha: 8, dropout: 0.0, targets: [qkv, proj, fc1, fc2, q_proj, o_proj, up_proj, down_proj]}'
cfg refL '{}' "$LORA"; cfg h2L "$HV2" "$LORA"
run1 "$W/refL.yaml" && runN 2 "$W/h2L.yaml" || { bad "LoRA runs"; tail "$W/train.log"; }
cmp_runs "LoRA, vision dp2 | LM tp2 vs 1 process (adapters)" refL h2L
# ZeRO-1 / 2 / 3 over the LM's data-parallel replicas: the tower's gradients summed over tp on
# the ZeRO shards (mmc_dp_reduce_partial), AdamW state (ZeRO-3: and the parameters) sharded over dp
for z in 1 2 3; do
  : > "$W/train.log"
  runN 4 "$W/h4.yaml" --set parallel.language.data_parallel=2 --set parallel.zero=$z --set training.output_dir="$W/z$z" ||
    { bad "vision dp4 | LM tp2 x dp2 ZeRO-$z run"; tail "$W/train.log"; }
  cmp_runs "vision dp4 | LM tp2 x dp2 ZeRO-$z vs 1 process" ref z$z
done
# data.eval: every rank evaluates (each tp rank encodes its share of the eval images), the loss is
# one process's
EV=(--set data.eval="$W/data.jsonl" --set training.eval_every=2 --set training.steps=2)
run1 "$W/ref.yaml" "${EV[@]}" --set training.output_dir="$W/ev1" &&
  runN 4 "$W/h4.yaml" --set parallel.language.data_parallel=2 "${EV[@]}" --set training.output_dir="$W/ev4" ||
  { bad "data.eval runs"; tail "$W/train.log"; }
e1=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev1/metrics.jsonl" 2>/dev/null); e4=$(grep -o '"eval_loss": [0-9.e+-]*' "$W/ev4/metrics.jsonl" 2>/dev/null)
if [ -n "$e1" ] && python3 -c "import sys; a, b = (float(x.split()[-1]) for x in sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(a))" "$e1" "$e4"; then
  ok; echo "vision dp4 | LM tp2 x dp2 data.eval: $e4 (one process: $e1)"
else bad "vision dp4 | LM tp2 x dp2 data.eval: '$e4' vs one process '$e1'"; fi
# context parallelism: the tower shared out over the cp group instead of replicated on it (each cp
# rank encodes its share, the features all-gathered; the tower's gradients summed with the
# cp group's weight gradients), Ulysses cp2 and ring cp2 x dp2
HC2='{vision: {data_parallel: 2}, language: {context_parallel: 2}}'
HC4='{vision: {data_parallel: 4}, language: {context_parallel: 2, data_parallel: 2}}'
cfg c2 "$HC2"; cfg c4 "$HC4"
: > "$W/train.log"
runN 2 "$W/c2.yaml" || { bad "vision dp2 | LM cp2 run"; tail "$W/train.log"; }
grep -q 'per-modality plan: vision tower data-parallel over 2 ranks; each cp rank encodes its share' "$W/train.log" &&
  ok || bad "no per-modality (cp) start-up line"
shares "vision dp2 | LM cp2 (Ulysses)" "$W/train.log"
cmp_runs "vision dp2 | LM cp2 (Ulysses) vs 1 process" ref c2
: > "$W/train.log"
runN 4 "$W/c4.yaml" --set parallel.context_parallel_mode=ring || { bad "vision dp4 | LM cp2 x dp2 ring run"; tail "$W/train.log"; }
shares "vision dp4 | LM cp2 (ring) x dp2" "$W/train.log"
cmp_runs "vision dp4 | LM cp2 (ring) x dp2 vs 1 process" ref c4
# sequence parallelism in the language model (odd lengths padded)
runN 2 "$W/h2.yaml" --set training.output_dir="$W/sp" --set parallel.sequence_parallel=true ||
  { bad "sequence-parallel run"; tail "$W/train.log"; }
cmp_runs "vision dp2 | LM tp2 + sequence parallelism vs 1 process" ref sp

# errors before any work, each naming the key and what would work
err() {  # err WHAT PATTERN CMD...
  local what=$1 pat=$2; shift 2
  if "$@" >"$W/err" 2>&1; then bad "$what: accepted"
  elif grep -q -- "$pat" "$W/err"; then ok; echo "refused ($what): $(grep -m1 -- "$pat" "$W/err" | sed 's/^mmc: train: [^ ]*: //')"
  else bad "$what: unexpected message:"; cat "$W/err"; fi
}
err "ranks do not add up" "tensor_parallel 1 x data_parallel 3 = 3 ranks, but the language model's plan spans 4" \
  "$MMC" train "$W/h4.yaml" --set 'parallel.language={tensor_parallel: 2, data_parallel: 2}' --set parallel.vision.data_parallel=3
err "vision tp neither 1 nor the LM's" "tensor_parallel 2 with the language model's tensor_parallel 4" \
  "$MMC" train "$W/h4.yaml" --set 'parallel.vision={tensor_parallel: 2, data_parallel: 2}' --set parallel.language.tensor_parallel=4
err "hetero with tp and cp in one" "with context_parallel > 1: not supported yet" \
  "$MMC" train "$W/h4.yaml" --set parallel.context_parallel=2
err "the tower as a stage of its own" "pipeline_parallel 2: the vision tower as pipeline stages of its own" \
  "$MMC" train "$W/h4.yaml" --set parallel.vision.pipeline_parallel=2
err "a projector plan other than the vision's" "projector: a plan other than the vision tower's" \
  "$MMC" train "$W/h4.yaml" --set parallel.projector.tensor_parallel=2
err "audio tp" "the audio encoder trains data-parallel only" "$MMC" train "$W/ref.yaml" --set parallel.audio.tensor_parallel=2
err "language given twice" "give the language model's plan once" \
  "$MMC" train "$W/h4.yaml" --set parallel.tensor_parallel=4
err "the world is not the vision's" "but the job has 2: every component runs on all the job's ranks" \
  "${MPIRUN[@]}" -np 2 "$MMC" train "$W/h4.yaml"
cat > "$W/text.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: f32}
data: {train: synthetic, seq_len: 16, batch_size: 2, micro_batch_size: 1}
parallel: {vision: {data_parallel: 1}}
training: {steps: 1, output_dir: $W/text}
YAML
err "a text model" "parallel.vision is set but the model (a text model) has no vision tower" "$MMC" train "$W/text.yaml"

echo "test_hetero: $((n - fail))/$n checks passed"
[ "$fail" = 0 ]
