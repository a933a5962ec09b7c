#!/usr/bin/env bash
# test_serve_audio.sh — `mmc serve` with audio on the tiny Qwen2.5-Omni thinker of tools/ref/gen_omni.py
# (tests/fixtures/omni/thinker), over loopback on a free port. tests/serve_audio_check.py (Python's
# standard library only) checks that the greedy answer to OpenAI input_audio parts (wav, mp3) and
# audio_url parts (a data: URI, a path under --media-root), streamed or not, two clips in one message,
# a text-only request, and 5 concurrent audio / text requests (batched decoding) each equal `mmc generate
# --audio`'s text and token counts (the prompt is transformers' 34 tokens); and 400s naming the part
# for bad base64, an unsupported format, missing data, undecodable bytes, a clip over
# --max-audio-seconds, too many clips, URLs and paths outside the media root. Then here: a model without
# an audio tower refuses audio with 400 audio_not_supported, and the server exits 0 on SIGTERM.
set -u
MMC=${MMC:-build/mmc}
M=tests/fixtures/omni/thinker
ROOT=$PWD/tests/fixtures/omni
[ -x "$MMC" ] || { echo "test_serve_audio: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_audio: skipped: no python3 (standard library client)"; exit 77; }
command -v curl >/dev/null || { echo "test_serve_audio: skipped: no curl"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve_audio.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }

start_server() {   # $1: model dir, then options
  local model=$1; shift
  rm -f "$W/err"
  "$MMC" serve --model "$model" --port 0 "$@" >"$W/out" 2>"$W/err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$W/err" 2>/dev/null)
    [ -n "$PORT" ] && return 0
    kill -0 $SPID 2>/dev/null || break
    sleep 0.1
  done
  echo "server did not start: $(cat "$W/err")" >&2
  return 1
}
stop_server() {
  kill -TERM $SPID
  for _ in $(seq 200); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
  if kill -0 $SPID 2>/dev/null; then bad "the server is still running 20 s after SIGTERM"; return; fi
  wait $SPID; local rc=$?; SPID=
  [ $rc = 0 ] && ok || bad "the server exited $rc after SIGTERM: $(tail -3 "$W/err")"
}

start_server "$M" --media-root "$ROOT" --max-audios 2 --max-audio-seconds 1 && ok || { bad "mmc serve (omni) did not start"; exit 1; }
timeout 300 python3 tests/serve_audio_check.py "$PORT" "$MMC" "$M" "$ROOT" && ok || bad "serve_audio_check.py failed"
stop_server

# a model without an audio tower: 400 audio_not_supported
start_server tests/fixtures/e2e/q2_v5 && ok || { bad "mmc serve (q2_v5) did not start"; exit 1; }
b64=$(base64 -w0 "$ROOT/audio.wav")
code=$(curl -s -o "$W/body" -w '%{http_code}' http://127.0.0.1:$PORT/v1/chat/completions -d \
  '{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"'"$b64"'","format":"wav"}},{"type":"text","text":"x"}]}],"max_tokens":2}')
[ "$code" = 400 ] && grep -q '"code":"audio_not_supported"' "$W/body" && grep -q 'no audio encoder' "$W/body" && ok \
  || bad "audio to a model without an audio tower: $code $(cat "$W/body")"
stop_server

echo "test_serve_audio: $((n - fail))/$n checks passed"
[ $fail = 0 ]
