"""Merge bench JSON lines (mmc and peer figures by case name) into results.json and print
a table (with --update, cases already in results.json are kept and re-measured ones
replaced: a filtered run refreshes part of the file). ratio = mmc / peer when higher is better, peer / mmc when lower is better, so a
ratio above 1 always means mmc wins; "better": "none" marks a figure shown for information
(e.g. a memory baseline), without a ratio. A case may carry "peer_note" (which form of the peer was
timed, e.g. the bf16 path that won) and "note" (how the figure was measured); both go into
results.json, and the table prints them after the ratio."""
import json
import sys

raw, out = sys.argv[1], sys.argv[2]
keep_old = len(sys.argv) > 3 and sys.argv[3] == "--update"
cases = {}
order = []
if keep_old:
    try:
        with open(out) as f:
            for r in json.load(f):
                cases[r["name"]] = {k: v for k, v in r.items() if k != "ratio"}
                order.append(r["name"])
    except (OSError, ValueError):
        pass
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
with open(out, "w") as f:
    json.dump(rows, f, indent=1)
w = max([len(r["name"]) for r in rows] + [10])
print(f"{'case':<{w}} {'mmc':>12} {'peer':>12} {'unit':>10} {'ratio':>7}")
for r in rows:
    fm = lambda v: f"{v:12.4g}" if isinstance(v, (int, float)) else f"{'-':>12}"
    ratio = f"{r['ratio']:7.2f}" if r["ratio"] else f"{'-':>7}"
    note = "  ".join(x for x in (r.get("peer_note"), r.get("note")) if x)
    print(f"{r['name']:<{w}} {fm(r.get('mmc'))} {fm(r.get('peer'))} {r.get('unit', ''):>10} {ratio}"
          + (f"  {note}" if note else ""))
print(f"wrote {out}")
