# wan_train_cli_lib.sh — what the `mmc train` tests on the tiny Wan pipelines share (sourced by
# test_wan_train_cli.sh and test_wan_i2v_train_cli.sh, not a test itself): the counters and expectations, the
# JSONL of the two committed videos, and the checks every Wan training mode makes:
#  wan_check_resume RUN          a run resumed from RUN/checkpoint-2 (the encodings from the cache) repeats
#                                RUN's last two losses and its checkpoint-4 adapter bit for bit
#  wan_check_truncated_cache RUN a truncated cache is not trusted: the videos are encoded again, the same losses
#  wan_check_diffusers_load PIPELINE_CLASS P ADAPTER
#                                with the reference venv, diffusers' <pipeline>.load_lora_weights takes mmc's
#                                adapter whole: every lora_A / lora_B lands exactly in the transformer's PEFT
#                                layers, none left over
# RUN is an output_dir whose yaml is RUN.yaml (4 LoRA steps, checkpoints every 2).
set -u
MMC=${MMC:-build/mmc}
PY=${MMC_REF_PY:-.venv-ref/bin/python}
export LSAN_OPTIONS="suppressions=$PWD/tests/test_train_lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fail=0; n=0
ok()   { n=$((n+1)); }
bad()  { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
expect_rc() { local want=$1; shift; "$@" >"$T/out" 2>"$T/err"; local rc=$?
  if [ "$rc" = "$want" ]; then ok; else bad "'$*' exited $rc, expected $want: $(cat "$T/err")"; fi; }
expect_err() { if grep -q -- "$1" "$T/err"; then ok; else bad "stderr lacks '$1': $(cat "$T/err")"; fi; }
losses() { grep -o '"loss": [^,]*' "$1" 2>/dev/null | tail -"$2"; }

# wan_setup P: skip (77) without the pipeline fixture, the videos or video support; write $T/data.jsonl
wan_setup() {
  [ -f "$1/model_index.json" ] && [ -f tests/fixtures/video/moving.mp4 ] || { echo "fixtures absent; skipping"; exit 77; }
  "$MMC" --help 2>&1 | grep -q "generate-video" || { echo "mmc without video support; skipping"; exit 77; }
  V=$PWD/tests/fixtures/video
  cat >"$T/data.jsonl" <<J
{"video": "$V/moving.mp4", "caption": "a square moving right"}
{"video": "$V/moving.mkv", "text": "a moving square"}
J
}

wan_check_resume() {
  local run=$1
  cp -r "$run" "$run.r"; rm -rf "$run.r/checkpoint-4"
  sed "s|$run,|$run.r,|" "$run.yaml" >"$run.r.yaml"
  expect_rc 0 "$MMC" train "$run.r.yaml" --resume
  expect_err "resumed at step 2"
  expect_err "encoded videos from the cache"
  local a b
  a=$(losses "$run/metrics.jsonl" 2); b=$(losses "$run.r/metrics.jsonl" 2)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "resumed losses differ: [$a] vs [$b]"
  cmp -s "$run/checkpoint-4/pytorch_lora_weights.safetensors" "$run.r/checkpoint-4/pytorch_lora_weights.safetensors" \
    && ok || bad "resumed adapter differs from the uninterrupted run's"
}

wan_check_truncated_cache() {
  local run=$1
  cp -r "$run" "$run.t"; rm -rf "$run.t/checkpoint-"* "$run.t/metrics.jsonl" "$run.t/validation"
  head -c 100 "$run/cache/wan_data.safetensors" >"$run.t/cache/wan_data.safetensors"
  sed "s|$run,|$run.t,|" "$run.yaml" >"$run.t.yaml"
  expect_rc 0 "$MMC" train "$run.t.yaml"
  expect_err "videos encoded to"
  local a b
  a=$(losses "$run/metrics.jsonl" 4); b=$(losses "$run.t/metrics.jsonl" 4)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "losses after re-encoding a truncated cache [$b] differ from [$a]"
}

wan_check_diffusers_load() {
  [ -x "$PY" ] || { echo "no reference venv ($PY): the diffusers load of the adapter is skipped"; return; }
  "$PY" - "$@" >"$T/py" 2>&1 <<'PYEOF' && ok || bad "diffusers cannot load mmc's $1 adapter: $(tail -5 "$T/py")"
import sys, torch
import diffusers
from safetensors.torch import load_file
pipe = getattr(diffusers, sys.argv[1]).from_pretrained(sys.argv[2], torch_dtype=torch.float32)
pipe.load_lora_weights(sys.argv[3], adapter_name="mmc")
sd = load_file(sys.argv[3])
mods = dict(pipe.transformer.named_modules())
for k, v in sd.items():
    name, ab = k[len("transformer."):].rsplit(".lora_", 1)
    assert torch.equal(getattr(mods[name], "lora_" + ab[0])["mmc"].weight, v), k
n = sum(1 for m in mods.values() if hasattr(m, "lora_A") and "mmc" in m.lora_A)
assert 2 * n == len(sd), (n, len(sd))
print("loaded", len(sd), "tensors")
PYEOF
}

wan_done() { echo "$1: $((n - fail))/$n checks passed"; [ "$fail" = 0 ]; }
