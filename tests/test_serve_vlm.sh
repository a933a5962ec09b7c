#!/usr/bin/env bash
# test_serve_vlm.sh — the image prefix cache and per-request LoRA of `mmc serve` on every VLM family it serves
# besides Qwen2-VL (test_serve_image_prefix / test_serve_lora): the tiny LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision
# and InternVL fixtures, each with a PEFT adapter (tests/fixtures/serve_vlm, tools/ref/gen_serve_vlm.py).
# Per family:
#   1. `mmc generate --image --greedy` without and with --adapter gives exactly transformers + PEFT's greedy ids
#      for the fixture chat (expected.json);
#   2. tests/serve_image_prefix_check.py: a repeated image with another question takes cached blocks and runs
#      no vision encode, another image of its size does not take them, answers equal a --no-prefix-cache
#      server's token for token;
#   3. tests/serve_vlm_check.py: two images in one prompt cached; the adapter (served as "a") answers as
#      `mmc generate --adapter`, with its own encoder-cache entries, cached on the next question, and mixed
#      with the base in one batch, equal to the uncached server.
set -u
MMC=${MMC:-build/mmc}
. tests/serve_util.sh
F=tests/fixtures/serve_vlm
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
[ -x "$MMC" ] || { echo "test_serve_vlm: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_vlm: skipped: no python3"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_vlm.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
start() {   # NAME [serve flags]: sets PORT
  local name=$1; shift
  serve_start "$W/$name" --model $M --lora a=$F/$fam/lora --max-tokens 32 "$@"; local ok=$?
  PIDS+=($SPID)
  [ $ok = 0 ] || { echo "FAIL: the server ($fam, $name) did not start: $(cat "$W/$name.err")" >&2; exit 1; }
}
Q=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["question"])' $F/expected.json)
rc=0
for fam in llava llava_next llava_onevision internvl; do
  M=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["families"][sys.argv[2]]["base_dir"])' $F/expected.json $fam)
  for who in base lora; do
    ad=(); [ $who = base ] || ad=(--adapter $F/$fam/lora)
    "$MMC" generate --model $M "${ad[@]}" --image "$IMG" --prompt "$Q" --greedy --max-new-tokens 10 --json \
      >"$W/$who.json" 2>"$W/g.err" || { echo "FAIL: $fam: mmc generate ${ad[*]}: $(tail -2 "$W/g.err")" >&2; rc=1; continue 2; }
  done
  python3 - "$W" $fam $F/expected.json >"$W/cases.json" <<'PY' || { rc=1; continue; }
import json, sys
w, fam, ref = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
want = ref["families"][fam]["new_ids"]
g = {who: json.load(open("%s/%s.json" % (w, who))) for who in ("base", "lora")}
for who in g:
    if g[who]["tokens"] != want[who]:
        sys.exit("FAIL: %s: mmc generate (%s) tokens %s != transformers+PEFT's %s" % (fam, who, g[who]["tokens"], want[who]))
print(json.dumps({"base_id": ref["families"][fam]["base_dir"].rstrip("/").split("/")[-1],
                  "question": ref["question"], "lora_text": g["lora"]["text"], "lora_tokens": g["lora"]["tokens"]}))
PY
  start cached; PA=$PORT
  start fresh --no-prefix-cache; PB=$PORT
  (cd tests && timeout 120 python3 serve_image_prefix_check.py "$PA" "$PB" "$IMG") || { echo "FAIL: $fam: image prefix" >&2; rc=1; }
  (cd tests && timeout 120 python3 serve_vlm_check.py "$PA" "$PB" "$IMG" "$W/cases.json") || { echo "FAIL: $fam: cache + LoRA" >&2; rc=1; }
  for p in "${PIDS[@]}"; do kill -TERM "$p"; wait "$p" || { echo "FAIL: $fam: a server exited $? after SIGTERM" >&2; rc=1; }; done
  PIDS=()
  echo "test_serve_vlm: $fam done"
done
[ $rc -eq 0 ] && echo "test_serve_vlm: passed"
exit $rc
