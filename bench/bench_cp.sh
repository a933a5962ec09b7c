#!/usr/bin/env bash
# bench_cp.sh — context parallelism: ring attention against Ulysses (mmc_cp.h) on this machine, as
# JSON lines (bench/run.sh runs it; MMC_BENCH_FILTER=bench_cp for this case alone). No PyTorch peer
# runs context parallelism on CPU, so the "peer" column is mmc's own Ulysses (all-to-all over
# heads), the layout a user would otherwise pick:
#  - cp_ring_c<C>_sent_bytes: bytes one rank sends for one forward + backward of a T=4096 row of
#    the tiny Qwen2 (2 layers, 4 heads, 2 KV heads, D 16) at cp=C: the ring's K/V blocks and dK/dV
#    accumulators against the part of Ulysses' all-to-alls that leaves the rank ((C-1)/C of what
#    the communicator counts, which includes the block a rank keeps);
#  - cp_ring_c<C>_act_peak_bytes: the activation arena's high-water mark per rank over the same
#    forward + backward (Ulysses keeps head-sharded copies next to the sequence shards);
#  - cp_ring_kernel_cpu_s: one thread's CPU time of a causal forward + backward over a T=4096 row,
#    ring attention's block kernel (one rank, one block) against mmc_attention's tiled kernels.
# Skipped (nothing printed) without mpirun or cp_worker (built only with MPI).
set -uo pipefail
MMC=${MMC:-build/mmc}
CPW=$(dirname "$MMC")/cp_worker
command -v mpirun >/dev/null 2>&1 || { echo "bench_cp: no mpirun" >&2; exit 0; }
[ -x "$CPW" ] || { echo "bench_cp: no $CPW (built without MPI)" >&2; exit 0; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
export OMPI_MCA_orte_tmpdir_base="$W" OMP_NUM_THREADS=1   # one thread per rank: the ranks share the cores
MPI=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
T=4096
for c in 2 4; do
  for m in ulysses ring; do
    "${MPI[@]}" -np $c "$CPW" mem tests/fixtures/qwen2/tiny $T $([ $m = ring ] && echo ring) >"$W/$m$c.out" 2>&1 ||
      { cat "$W/$m$c.out" >&2; exit 1; }
  done
done
"$CPW" kernel $T >"$W/kernel.out" 2>&1 || { cat "$W/kernel.out" >&2; exit 1; }
python3 - "$W" $T <<'PY'
import json, re, sys
W, T = sys.argv[1], int(sys.argv[2])
def mem(path):   # rank 0's line of `cp_worker mem`
    line = next(l for l in open(path) if l.startswith("cp memory") and "rank 0:" in l)
    peak = float(re.search(r"peak ([0-9.]+) MiB", line).group(1)) * 2**20
    sent = float(re.search(r"sent ([0-9.]+) MiB", line).group(1)) * 2**20
    return peak, sent
for c in (2, 4):
    up, us = mem(f"{W}/ulysses{c}.out")
    rp, rs = mem(f"{W}/ring{c}.out")
    print(json.dumps({"name": f"cp_ring_c{c}_sent_bytes", "mmc": rs, "peer": us * (c - 1) / c, "unit": "B",
                      "better": "lower", "peer_note": "mmc Ulysses, bytes leaving the rank",
                      "note": f"T {T}, tiny Qwen2, one forward + backward per rank"}))
    print(json.dumps({"name": f"cp_ring_c{c}_act_peak_bytes", "mmc": rp, "peer": up, "unit": "B",
                      "better": "lower", "peer_note": "mmc Ulysses", "note": f"T {T}, activation arena peak per rank"}))
k = open(f"{W}/kernel.out").read()
a, r = (float(x) for x in re.search(r"mmc_attention ([0-9.]+) s, ring block kernel ([0-9.]+) s", k).groups())
print(json.dumps({"name": "cp_ring_kernel_cpu_s", "mmc": r, "peer": a, "unit": "s", "better": "lower",
                  "peer_note": "mmc_attention (tiled, AVX-512)",
                  "note": f"causal fwd+bwd T {T}, 4 heads / 2 KV, D 16, thread CPU time, min of 3"}))
PY
