# train_check.sh — helpers (ok / bad, tensors as text, column comparisons, dp2_check, resume_check) the `mmc train` parity tests source (test_llava_train.sh, test_llama_train.sh,
# test_llava_train_anyres.sh, test_internvl_train.sh, test_omni_train.sh, test_moe_train.sh, test_moe_tp.sh, test_moe_pp.sh): pass / fail counting, a tensor of a
# .safetensors as text, and comparisons of number columns.
fail=0; n=0
# mpi_train2 ARGS...: `$MMC train ARGS` on 2 ranks (mpirun, at most 120 s), OpenMPI's session directory in
# $W; no leak check across mpirun (Open MPI's own allocations outlive MPI_Finalize, as test_dist_train)
mpi_train2() {
  local mpi=(timeout -k 10 120 mpirun --oversubscribe --bind-to none -np 2)
  [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
  OMPI_MCA_orte_tmpdir_base="$W" ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 "${mpi[@]}" "$MMC" train "$@"
}
ok()  { n=$((n+1)); }
# dp2_check YAML STEPS WHAT [TIMEOUT]: STEPS steps of YAML at a global batch of 2 in one process ($W/d1) and on 2
# ranks at ZeRO-2 ($W/d2, mpirun within TIMEOUT s, default 200): the same losses within 1e-5. Without an MPI build it
# says the check is skipped and returns 1 (a caller's further multi-rank checks can hang on it).
dp2_check() {
  if [ ! -x "$(dirname "$MMC")/dist_mpi_worker" ] || ! command -v mpirun > /dev/null; then
    echo "${T:-$(basename "$0" .sh)}: skipped: the data-parallel check (built without MPI)"; return 1
  fi
  "$MMC" train "$1" --set training.steps="$2" --set data.batch_size=2 --set training.save_every=0 \
    --set training.output_dir="$W/d1" 2> "$W/d1.log"
  timeout -k 10 "${4:-200}" mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$MMC" train "$1" \
    --set training.steps="$2" --set data.batch_size=2 --set parallel.data_parallel=2 --set parallel.zero=2 \
    --set training.save_every=0 --set training.output_dir="$W/d2" > "$W/d2.log" 2>&1
  losses "$W/d1.log" > "$W/d1.txt"; losses "$W/d2.log" > "$W/d2.txt"
  local d; d=$(maxdiff "$W/d1.txt" "$W/d2.txt")
  echo "$3: max |loss - single process| = $d"
  [ "$(wc -l < "$W/d2.txt")" = "$2" ] && within "$d" 1e-5 && ok || { tail -5 "$W/d2.log"; bad "$3: DP losses differ ($d)"; }
}
# resume_check YAML FULL: the 20-step run in $W/FULL (its log $W/FULL.log) resumed from its checkpoint-10
# into $W/res must say "resumed at step 10" and print steps 11-20 exactly as the uninterrupted run did
resume_check() {
  cp -r "$W/$2" "$W/res" && rm -rf "$W/res/checkpoint-20"
  if "$MMC" train "$1" --set training.output_dir="$W/res" --resume 2> "$W/res.log"; then
    grep -q "resumed at step 10" "$W/res.log" && ok || bad "no 'resumed at step 10' message"
    grep '^step ' "$W/$2.log" | sed 's/ tok\/s.*//' | tail -n 10 > "$W/a.lines"
    grep '^step ' "$W/res.log" | sed 's/ tok\/s.*//' > "$W/b.lines"
    cmp -s "$W/a.lines" "$W/b.lines" && [ "$(wc -l < "$W/b.lines")" = 10 ] && ok \
      || { diff "$W/a.lines" "$W/b.lines" | head; bad "resumed steps 11-20 differ from the uninterrupted run"; }
  else cat "$W/res.log"; bad "resume failed"; fi
}
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }

# floats of one tensor of a .safetensors, one per line (header data_offsets, then od)
st_floats() {
  local f=$1 name=$2 hlen hdr off
  hlen=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  hdr=$(dd if="$f" bs=1 skip=8 count="$hlen" 2>/dev/null)
  off=$(printf '%s' "$hdr" | sed -E "s/.*\"$name\": *\{[^}]*\"data_offsets\": *\[ *([0-9]+), *([0-9]+) *\].*/\1 \2/")
  case "$off" in ""|*[!0-9\ ]*) echo "no $name in $f" >&2; return 1 ;; esac
  set -- $off
  od -An -v -tf4 -w4 -j $((8 + hlen + $1)) -N $(($2 - $1)) "$f" | tr -d ' '
}
# max |a - b| over two files of one number per line ("nan" when their lengths differ or both are empty)
maxdiff() { paste "$1" "$2" | awk 'NF != 2 {bad = 1} {d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d}
                                  END {if (bad || NR == 0) print "nan"; else printf "%.3g\n", m}'; }
within() { awk -v d="$1" -v t="$2" 'BEGIN {exit !(d != "nan" && d + 0 <= t + 0)}'; }
# max |a - b| / |b| over two files of one number per line ("nan" as maxdiff)
maxrel() { paste "$1" "$2" | awk 'NF != 2 {bad = 1} {d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d}
                                 END {if (bad || NR == 0) print "nan"; else printf "%.3g\n", m}'; }
# the per-step losses of an `mmc train` log
losses() { sed -n 's/^step \([0-9]*\)\/[0-9]* loss \([0-9.]*\).*/\2/p' "$1"; }
# |a - b| / |b - c| (2-norms) over three files of one number per line: how far a trained tensor a
# lies from the reference's b, relative to the reference's update from the start c
relupdate() { paste "$1" "$2" "$3" | awk 'NF != 3 {bad = 1} {d = $1 - $2; e = $2 - $3; s += d * d; t += e * e}
                                          END {if (bad || t == 0) print "nan"; else printf "%.3g\n", sqrt(s / t)}'; }
# the larger of two numbers ("nan" when either is)
maxof() { awk -v a="$1" -v b="$2" 'BEGIN {print (a == "nan" || b == "nan") ? "nan" : (b + 0 > a + 0 ? b : a)}'; }
# max |a - b| over two safetensors files with the same f32 tensors (python3's standard library only)
stdiff() {
  python3 - "$1" "$2" <<'PYEOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k != "__metadata__":
            s, e = v["data_offsets"]
            out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e]) if v["dtype"] == "F32" else None
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if sorted(a) != sorted(b) or any(v is None for v in a.values()):
    print("nan"); sys.exit()
print("%.3g" % max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a))
PYEOF
}
