"""Merge bench JSON lines (mmc and peer figures by case name) into results.json and print
a table (with --update, cases already in results.json are kept and re-measured ones
replaced: a filtered run refreshes part of the file). ratio = mmc / peer when higher is better, peer / mmc when lower is better, so a
ratio above 1 always means mmc wins; "better": "none" marks a figure shown for information
(e.g. a memory baseline), without a ratio. A case may carry "peer_note" (which form of the peer was
timed, e.g. the bf16 path that won) and "note" (how the figure was measured); both go into
results.json, and the table prints them after the ratio.

results.json is {"machine": ..., "peers": ..., "cases": [...]}, so a file names the machine it
was measured on: "machine" is `mmc info --system --json` (CPU vendor/model/family, ISA flags,
caches, mmc's GEMM kernels and blocking, threads; --machine FILE) plus "measured": the FMA peak
and read bandwidths bench_gemm measured in this run (its fma_peak / mem_read_bw (DRAM) /
mem_read_bw_l3 cases, all threads and _1t); "peers" is bench/torch_config.py's object (torch version, CPU capability,
BLAS and oneDNN, other peers' library versions; --peers FILE). Older files (a bare list of
cases) are still read by --update.

usage: merge.py RAW.jsonl OUT.json [--update] [--machine FILE] [--peers FILE]"""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("raw")
ap.add_argument("out")
ap.add_argument("--update", action="store_true")
ap.add_argument("--machine")
ap.add_argument("--peers")
args = ap.parse_args()
raw, out, keep_old = args.raw, args.out, args.update


def load_obj(path):
    """A JSON object from path, or None (absent, unreadable, or not an object)."""
    if not path:
        return None
    try:
        with open(path) as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None


cases = {}
order = []
old = None
if keep_old:
    try:
        with open(out) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = None
    for r in (old.get("cases", []) if isinstance(old, dict) else old or []):
        cases[r["name"]] = {k: v for k, v in r.items() if k != "ratio"}
        order.append(r["name"])
with open(raw) as f:
    for line in f:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        name = r.get("name")
        if name not in cases:
            cases[name] = {"name": name}
            order.append(name)
        c = cases[name]
        for k in ("mmc", "peer", "unit", "better", "note", "peer_note", "mmc_baseline", "peer_baseline"):
            if k in r:
                c[k] = r[k]
rows = []
for name in order:
    c = cases[name]
    c.setdefault("better", "higher")
    m, p = c.get("mmc"), c.get("peer")
    if c["better"] == "none":   # informational (e.g. a memory baseline): no ratio
        c["ratio"] = None
    elif m is not None and p is not None and m > 0 and p > 0:
        c["ratio"] = m / p if c["better"] == "higher" else p / m
    else:
        c["ratio"] = None
    rows.append(c)
machine = load_obj(args.machine)
if machine is None and isinstance(old, dict):
    machine = old.get("machine")
if machine is not None:
    measured = dict(machine.get("measured") or {})
    for key, case in (("fma_peak_gflops", "fma_peak"), ("fma_peak_1t_gflops", "fma_peak_1t"),
                      ("mem_read_bw_gbs", "mem_read_bw"), ("mem_read_bw_1t_gbs", "mem_read_bw_1t"),
                      ("mem_read_bw_l3_gbs", "mem_read_bw_l3"), ("mem_read_bw_l3_1t_gbs", "mem_read_bw_l3_1t")):
        if case in cases and cases[case].get("mmc") is not None:
            measured[key] = cases[case]["mmc"]
    machine["measured"] = measured
peers = load_obj(args.peers)
if peers is None and isinstance(old, dict):
    peers = old.get("peers")
with open(out, "w") as f:
    json.dump({"machine": machine, "peers": peers, "cases": rows}, f, indent=1)
w = max([len(r["name"]) for r in rows] + [10])
print(f"{'case':<{w}} {'mmc':>12} {'peer':>12} {'unit':>10} {'ratio':>7}")
for r in rows:
    fm = lambda v: f"{v:12.4g}" if isinstance(v, (int, float)) else f"{'-':>12}"
    ratio = f"{r['ratio']:7.2f}" if r["ratio"] else f"{'-':>7}"
    note = "  ".join(x for x in (r.get("peer_note"), r.get("note")) if x)
    print(f"{r['name']:<{w}} {fm(r.get('mmc'))} {fm(r.get('peer'))} {r.get('unit', ''):>10} {ratio}"
          + (f"  {note}" if note else ""))
if machine:
    cpu = machine.get("cpu", {})
    g = machine.get("gemm", {})
    print(f"machine: {cpu.get('vendor')} {cpu.get('brand')} family {cpu.get('family')} model {cpu.get('model')}, "
          f"{machine.get('threads')} threads, gemm f32 {g.get('f32', {}).get('kernel')}, "
          f"bf16 {g.get('bf16', {}).get('kernel')}")
if peers and "torch" in peers:
    t = peers["torch"]
    print(f"peers: torch {t.get('version')} ({t.get('cpu_capability')}, BLAS {t.get('blas')}, {t.get('onednn')})")
print(f"wrote {out}")
