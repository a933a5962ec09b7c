#!/usr/bin/env bash
# bench_dist.sh — data parallelism on this machine, as JSON lines (bench/run.sh runs it):
#  - dist_2x1_vs_1x2_ratio: training throughput of 2 ranks x 1 thread over 1 rank x 2 threads,
#    same global batch (higher = data parallelism pays);
#  - dist_comm_s_per_step / dist_comm_hidden_frac: gradient-reduction time per step (first
#    bucket start to last completion) and the fraction of it overlapped with backward;
#  - dist_z<S>_{params,grads,optim}_bytes: bytes rank 0 holds between steps for ZeRO stage
#    S = 0..3 (measured) and dist_z<S>_*_theory (parameters 4P (ZeRO-3: 4P/N), gradients 4P
#    (ZeRO >= 2: 4P/N), AdamW 8P (ZeRO >= 1: 8P/N)); dist_z<S>_{params,grads}_peak_bytes: the
#    high-water mark during steps, transient buffers included (ZeRO-2/3: gradient buckets in
#    flight; ZeRO-3: gathered units, the root unit — embeddings, lm_head — among them);
#    dist_z<S>_total_bytes / dist_z<S>_total_peak_bytes: parameters + gradients + buckets +
#    optimizer state at rest and at the peak during steps (ZeRO-0/1 keep DDP's flat bucket
#    copy of every gradient besides the ->grad tensors: their gradient memory is 8P, not 4P).
#    Why ZeRO-3's gradient peak exceeds ZeRO-0's 4P here (the "note" of dist_z3_grads_peak_bytes
#    gives the measured split): at rest it holds its shard, 4P/N; during backward it also holds
#    (a) the root unit's full gradients (embeddings, lm_head, final norm: written first, by
#    lm_head, and final last, by the embedding, so live for the whole backward), (b) every layer
#    unit's full gradients from its backward until its reduce-scatter completes, and (c) from
#    the second micro-batch a receive shard. (b) is the excess: ZeRO-3 never blocks on a
#    reduction inside backward (src/parallel/dp.c start_bucket: a rank that does not use a unit, e.g.
#    a vision block without an image, issues that unit's gather only at the end of its backward,
#    so a wait could deadlock). A reduction completes when the slower rank has started it and the
#    communication threads (src/parallel/comm_mpi.c, which progress MPI) have run: on 2 cores shared
#    by both ranks' compute and their two communication threads, that lags the backward by one
#    to several units. The units in flight are that lag counted in units, and the peak is the
#    worst moment of the run, so it varies run to run: 4-6 layer units with this tiny model,
#    whose units take microseconds; an 8-layer variant at hidden 512 (units of 12 MB, tens of ms
#    of backward each; one micro-batch per rank) peaked at root + 2 units (theory) once and
#    root + 3 units three times, where a trace showed one 12 MB reduce-scatter outlasting the next
#    unit's backward. FSDP's theory counts one unit being computed and one in reduction: 4P/N +
#    root + 2 units. (Polling every pending reduction after each backward node was tried: no
#    change, the communication thread already polls.) The tiny model also inflates (a): its root
#    (41k parameters) is as large as a layer (43k) and 8 layers are only 9x it, where in a real
#    model a unit is 1/28 of P and the root's share (embeddings) is what FSDP also keeps.
#  - dist_lora_z<S>_frozen_bytes (S = 0, 3): the untrained base of a LoRA run held by rank 0
#    (ZeRO-3 shards it: theory 4F/N for F base parameters in f32, 4F otherwise) and the LoRA
#    run's parameter peak (the base is gathered unit by unit);
#  - dist_bf16_z3_*: model.dtype bf16 under ZeRO-3: the persistent parameter bytes (the fp32
#    master shard, theory 4P/N), optimizer state (8P/N), and the gathered bytes above the shard
#    at the peak against f32 ZeRO-3's (bf16 weights travel and live in half the bytes).
# The model is the committed tiny Qwen2 with a larger width so the step is compute-bound.
set -uo pipefail
MMC=${MMC:-build/mmc}
command -v mpirun >/dev/null 2>&1 || { echo "bench_dist: no mpirun" >&2; exit 0; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# its own OpenMPI session directory: concurrent mpiruns (ctest -j runs the MPI tests side by
# side) race creating and removing the shared /tmp/ompi.<host>.<uid> ("A call to mkdir was
# unable to create the desired directory ... File exists", then orte_init fails)
export OMPI_MCA_orte_tmpdir_base="$W"
MPI=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
STEPS=${MMC_BENCH_DIST_STEPS:-8}
cfg() {  # cfg NAME DP ZERO [extra model keys]
  cat > "$W/$1.yaml" <<YAML
model: {path: tests/fixtures/qwen2/tiny, dtype: ${DTYPE:-f32} ${4:-}}
data: {train: synthetic, seq_len: 64, batch_size: 8, micro_batch_size: 2}
parallel: {data_parallel: $2, zero: $3}
optimizer: {type: adamw, lr: 1.0e-3}
training: {steps: $STEPS, seed: 1, log_every: 1, output_dir: $W/$1}
YAML
}
tps() {  # median tokens/s over steps after the first two
  python3 -c 'import json,sys,statistics as s; v=[j["tokens_per_s"] for j in map(json.loads,open(sys.argv[1])) if "loss" in j][2:]; print(s.median(v))' "$1/metrics.jsonl"
}
cfg one 1 0; OMP_NUM_THREADS=2 "$MMC" train "$W/one.yaml" 2>"$W/one.log" || { cat "$W/one.log" >&2; exit 1; }
cfg two 2 0; OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$MMC" train "$W/two.yaml" >"$W/two.log" 2>&1 || { cat "$W/two.log" >&2; exit 1; }
a=$(tps "$W/one"); b=$(tps "$W/two")
python3 - "$W" "$a" "$b" <<'PY'
import json, sys, statistics as st
W, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def rep(n, v, u, hb): print(json.dumps({"name": n, "mmc": round(v, 6), "unit": u, "better": "higher" if hb else "lower"}))
rep("dist_1x2_tokens_per_s", a, "tok/s", 1); rep("dist_2x1_tokens_per_s", b, "tok/s", 1)
rep("dist_2x1_vs_1x2_ratio", b / a, "x", 1)
m = [j for j in map(json.loads, open(W + "/two/metrics.jsonl")) if "comm_s" in j][2:]
c = st.median(j["comm_s"] for j in m); e = st.median(j["comm_exposed_s"] for j in m)
rep("dist_comm_s_per_step", c, "s", 0); rep("dist_comm_exposed_s_per_step", e, "s", 0)
rep("dist_comm_hidden_frac", max(0.0, 1 - e / c) if c > 0 else 0.0, "frac", 1)
PY
# memory: the tiny model made 8 layers deep (random init), 64 KiB gradient buckets, so that
# units and buckets are small next to the whole model, as in a real one
python3 - tests/fixtures/qwen2/tiny/config.json "$W/deep.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 8; c["layer_types"] = ["full_attention"] * 8
json.dump(c, open(sys.argv[2], "w"))
PY
for z in 0 1 2 3; do
  cfg z$z 2 $z; sed -i "s|path: tests/fixtures/qwen2/tiny|init: $W/deep.json|" "$W/z$z.yaml"
  OMP_NUM_THREADS=1 MMC_DP_BUCKET_BYTES=65536 "${MPI[@]}" -x MMC_DP_BUCKET_BYTES -np 2 "$MMC" train "$W/z$z.yaml" --set training.steps=2 >"$W/z$z.log" 2>&1 || { cat "$W/z$z.log" >&2; continue; }
  python3 - "$W/z$z.log" $z "$W/deep.json" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read(); z = int(sys.argv[2]); N = 2
P = int(re.search(r"(\d+) trainable parameters", t).group(1))
m = re.search(r"rank 0 holds (\d+) bytes of parameters, (\d+) of gradients \(\+(\d+) in buckets\), (\d+) of optimizer "
              r"state; peaks during steps: (\d+) of parameters, (\d+) of gradients", t)
par, gr, bk, op, ppk, gpk = map(int, m.groups())
th = {"params": 4 * P // (N if z >= 3 else 1), "grads": 4 * P // (N if z >= 2 else 1), "optim": 8 * P // (N if z >= 1 else 1)}
for k, v in (("params", par), ("grads", gr), ("optim", op)):
    print(json.dumps({"name": "dist_z%d_%s_bytes" % (z, k), "mmc": v, "unit": "B", "better": "lower"}))
    print(json.dumps({"name": "dist_z%d_%s_theory" % (z, k), "mmc": th[k], "unit": "B", "better": "lower"}))
print(json.dumps({"name": "dist_z%d_params_peak_bytes" % z, "mmc": ppk, "unit": "B", "better": "lower"}))
# ZeRO-3's gradient peak, split (see the header): root unit, layer units in flight, receive shards
cfg = json.load(open(sys.argv[3]))
h, i, v, nh, kv = (cfg[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads",
                                    "num_key_value_heads"))
kvd = kv * cfg.get("head_dim", h // nh)
layer = (h * h + h) + 2 * (h * kvd + kvd) + h * h + 3 * h * i + 2 * h
root = v * h * (1 if cfg.get("tie_word_embeddings") else 2) + h
note = None
if z == 3:
    extra = gpk - gr - 4 * root
    units = extra / (4 * layer)
    note = ("at rest 4P/N = %d B; peak adds the root unit's full gradients (%d B: embeddings, lm_head, norm, live for "
            "the whole backward) and %d B = %.2f layer units (%d B each) of full gradients awaiting their "
            "reduce-scatter plus receive shards (ZeRO-3 never blocks on a reduction inside backward: the units in "
            "flight are the reductions' lag behind the backward, counted in units: large with microsecond units "
            "on oversubscribed cores; see bench_dist.sh); FSDP theory "
            "4P/N + root + 2 units = %d B" % (gr, 4 * root, extra, units, 4 * layer, gr + 4 * root + 8 * layer))
r = {"name": "dist_z%d_grads_peak_bytes" % z, "mmc": gpk, "unit": "B", "better": "lower"}
if note: r["note"] = note
print(json.dumps(r))
if z == 3:
    print(json.dumps({"name": "dist_z3_grads_peak_theory", "mmc": gr + 4 * root + 8 * layer, "unit": "B", "better": "lower",
                      "note": "FSDP: 4P/N + the root unit's full gradients + one unit being computed + one in reduction"}))
print(json.dumps({"name": "dist_z%d_bucket_bytes" % z, "mmc": bk, "unit": "B", "better": "lower"}))
print(json.dumps({"name": "dist_z%d_total_bytes" % z, "mmc": par + gr + bk + op, "unit": "B", "better": "lower",
                  "note": "parameters + gradients + buckets + optimizer state, between steps"}))
print(json.dumps({"name": "dist_z%d_total_peak_bytes" % z, "mmc": ppk + gpk + bk + op, "unit": "B", "better": "lower",
                  "note": "parameters + gradients + buckets + optimizer state, peaks during steps"}))
PY
done
# ZeRO-3 shards a LoRA run's untrained base too; bf16 weights are gathered in bf16
LORA=", lora: {r: 8, alpha: 16, targets: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}"
for v in lora_z0 lora_z3 bf16_z3; do
  z=${v#*_z}; d=f32; x=""; [ "${v%%_*}" = lora ] && x=$LORA; [ "${v%%_*}" = bf16 ] && d=bf16
  DTYPE=$d cfg $v 2 $z "$x"; sed -i "s|path: tests/fixtures/qwen2/tiny|init: $W/deep.json|" "$W/$v.yaml"
  OMP_NUM_THREADS=1 MMC_DP_BUCKET_BYTES=65536 "${MPI[@]}" -x MMC_DP_BUCKET_BYTES -np 2 "$MMC" train "$W/$v.yaml" --set training.steps=2 >"$W/$v.log" 2>&1 || { cat "$W/$v.log" >&2; continue; }
done
python3 - "$W" <<'PY'
import json, re, os, sys
W = sys.argv[1]; N = 2
def rep(n, v, u="B"): print(json.dumps({"name": n, "mmc": v, "unit": u, "better": "lower"}))
def mem(name):
    f = os.path.join(W, name + ".log")
    if not os.path.exists(f): return None
    t = open(f).read()
    m = re.search(r"rank 0 holds (\d+) bytes of parameters, (\d+) of gradients \(\+(\d+) in buckets\), (\d+) of optimizer "
                  r"state; peaks during steps: (\d+) of parameters, (\d+) of gradients; (\d+) bytes of untrained", t)
    return (t, list(map(int, m.groups()))) if m else None
for z in (0, 3):
    r = mem("lora_z%d" % z)
    if not r: continue
    t, (par, gr, bk, op, ppk, gpk, fz) = r
    lo = re.search(r"(\d+) trainable parameters \([0-9.]+% of (\d+) total\)", t)
    F = int(lo.group(2)) - int(lo.group(1))
    rep("dist_lora_z%d_frozen_bytes" % z, fz); rep("dist_lora_z%d_frozen_theory" % z, 4 * F // (N if z == 3 else 1))
    rep("dist_lora_z%d_params_peak_bytes" % z, ppk + fz)   # base (whole or shard) + adapters + gathered units
r, r3 = mem("bf16_z3"), mem("z3")
if r and r3:
    t, (par, gr, bk, op, ppk, gpk, fz) = r
    P = int(re.search(r"(\d+) trainable parameters", t).group(1))
    rep("dist_bf16_z3_params_bytes", par); rep("dist_bf16_z3_params_theory", 4 * P // N)
    rep("dist_bf16_z3_optim_bytes", op); rep("dist_bf16_z3_optim_theory", 8 * P // N)
    rep("dist_bf16_z3_gathered_peak_bytes", ppk - par)
    rep("dist_f32_z3_gathered_peak_bytes", r3[1][4] - r3[1][0])
    rep("dist_bf16_vs_f32_z3_gathered_ratio", (ppk - par) / max(1, r3[1][4] - r3[1][0]), "x")
PY
