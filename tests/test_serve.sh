#!/usr/bin/env bash
# test_serve.sh — `mmc serve` over loopback on the tiny Qwen2-VL checkpoint of test_e2e_cli
# (tests/fixtures/e2e/q2_v5): the server starts on a free port (--port 0) with an API key, a
# media root and small limits; tests/serve_check.py (Python's standard library only) checks
# health, models, 401s, a greedy chat completion with an image (data: URI and media-root path)
# equal to `mmc generate`'s text and usage, streaming chunks that concatenate to the same text
# and end with [DONE] (include_usage), stop sequences, n=2 with a seed, completions and
# logprobs, 400s for malformed JSON / wrong types / deep JSON / too many images, 413 for a large
# body, 404 / 405, a client that disconnects mid-stream (generation cancelled, the server keeps
# serving) and 8 concurrent clients each getting its sequential answer. Then here: curl without
# the key, and SIGTERM during a stream: the stream ends with [DONE] and the server exits 0.
set -u
MMC=${MMC:-build/mmc}
M=tests/fixtures/e2e/q2_v5
IMG=$PWD/tests/fixtures/e2e/shapes_160x120.png
[ -x "$MMC" ] || { echo "test_serve: skipped: no mmc binary at $MMC"; exit 77; }
command -v python3 >/dev/null || { echo "test_serve: skipped: no python3 (standard library client)"; exit 77; }
command -v curl >/dev/null || { echo "test_serve: skipped: no curl"; exit 77; }
W=$(mktemp -d /tmp/mmc_test_serve.XXXXXX)
SPID=
cleanup() { [ -n "$SPID" ] && kill -9 "$SPID" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fail=0; n=0
ok()  { n=$((n+1)); }
bad() { n=$((n+1)); fail=$((fail+1)); echo "FAIL: $*" >&2; }
KEY=sk-test-$$

# start: --port 0, wait for the "listening on" line (at most 60 s)
start_server() {
  rm -f "$W/err"
  "$MMC" serve --model "$M" --port 0 --api-key "$KEY" --media-root "$(dirname "$IMG")" --max-images 2 \
    --max-body-bytes 1048576 --max-tokens 2048 "$@" >"$W/out" 2>"$W/err" &
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
start_server || { bad "mmc serve did not start"; echo "test_serve: $fail of $n checks failed"; exit 1; }
ok

timeout 300 python3 tests/serve_check.py "$PORT" "$KEY" "$MMC" "$M" "$IMG" && ok || bad "serve_check.py failed"

# curl: /health needs no key; the rest do
[ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200 ] && ok || bad "curl /health"
code=$(curl -s -o "$W/body" -w '%{http_code}' http://127.0.0.1:$PORT/v1/models)
[ "$code" = 401 ] && grep -q '"type":"invalid_request_error"' "$W/body" && ok || bad "curl /v1/models without a key: $code $(cat "$W/body")"

# SIGTERM during a long stream: the stream ends with [DONE], the server exits 0
curl -sN http://127.0.0.1:$PORT/v1/chat/completions -H "Authorization: Bearer $KEY" \
  -d '{"messages":[{"role":"user","content":"Tell a story."}],"max_tokens":2000,"temperature":1,"seed":3,"stream":true}' \
  >"$W/stream" 2>/dev/null &
CPID=$!
for _ in $(seq 100); do grep -q '"content"' "$W/stream" 2>/dev/null && break; sleep 0.05; done
kill -TERM $SPID
rc=0
for _ in $(seq 200); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
if kill -0 $SPID 2>/dev/null; then bad "the server is still running 20 s after SIGTERM"; else wait $SPID; rc=$?; SPID=; fi
[ "$rc" = 0 ] && ok || bad "the server exited $rc after SIGTERM: $(tail -3 "$W/err")"
wait $CPID
tail -c 200 "$W/stream" | grep -q '^data: \[DONE\]' && ok || bad "the stream cut by SIGTERM did not end with [DONE]: $(tail -c 300 "$W/stream")"
grep -q 'stopped' "$W/err" && ok || bad "no 'stopped' line: $(tail -3 "$W/err")"

# limits, on a second server: image pixels, prompt tokens, n, connections (503), a full queue (429),
# the request time (5 s for n=4 x 2000 tokens: 8 s at the fastest rate seen here; 5 s leave a slow
# machine time for the checks that need the stream running)
start_server --max-image-pixels 10000 --max-prompt-tokens 40 --max-queue 1 --request-timeout 5 --max-n 4 \
  --max-connections 2 ||
  { bad "mmc serve (limits) did not start"; echo "test_serve: $fail of $n checks failed"; exit 1; }
post() { curl -s -o "$W/body" -w '%{http_code}' http://127.0.0.1:$PORT/v1/chat/completions -H "Authorization: Bearer $KEY" -d "$1"; }
b64=$(base64 -w0 "$IMG")
code=$(post '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,'"$b64"'"}},{"type":"text","text":"x"}]}],"max_tokens":2}')
[ "$code" = 400 ] && grep -q '"code":"invalid_image"' "$W/body" && grep -q 'pixels' "$W/body" && ok || bad "an image over --max-image-pixels: $code $(cat "$W/body")"
code=$(post '{"messages":[{"role":"user","content":"'"$(printf 'word %.0s' $(seq 60))"'"}],"max_tokens":2}')
[ "$code" = 400 ] && grep -q '"code":"context_length_exceeded"' "$W/body" && ok || bad "a prompt over --max-prompt-tokens: $code $(cat "$W/body")"
code=$(post '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"n":5}')
[ "$code" = 400 ] && grep -q '"param":"n"' "$W/body" && ok || bad "n over --max-n: $code $(cat "$W/body")"
# a slow client holds a request open (headers sent, body not), a stream runs: a third request is
# over --max-connections 2 (503); with the slow client gone, one more is over --max-queue 1 (429)
exec 3<>/dev/tcp/127.0.0.1/$PORT
printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{' "$KEY" >&3
curl -sN http://127.0.0.1:$PORT/v1/chat/completions -H "Authorization: Bearer $KEY" \
  -d '{"messages":[{"role":"user","content":"Tell a story."}],"max_tokens":2000,"n":4,"temperature":1,"seed":3,"stream":true,"stream_options":{"include_usage":true}}' \
  >"$W/stream2" 2>/dev/null 3>&- &
CPID=$!
for _ in $(seq 100); do grep -q '"content"' "$W/stream2" 2>/dev/null && break; sleep 0.05; done
code=$(post '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')
[ "$code" = 503 ] && grep -q '"code":"too_many_connections"' "$W/body" && ok || bad "a request beyond --max-connections 2: $code $(cat "$W/body")"
exec 3>&-
sleep 0.3
code=$(post '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')
[ "$code" = 429 ] && grep -q '"type":"rate_limit_exceeded"' "$W/body" && ok || bad "a request beyond --max-queue 1: $code $(cat "$W/body")"
wait $CPID
grep -q '"finish_reason":"length"' "$W/stream2" && ok || bad "the stream over --request-timeout has no finish_reason length"
toks=$(sed -n 's/.*"completion_tokens":\([0-9]*\).*/\1/p' "$W/stream2")
[ -n "$toks" ] && [ "$toks" -lt 8000 ] && ok || bad "--request-timeout 5 did not stop generation: $toks of 4 x 2000 tokens"
code=$(post '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}')
[ "$code" = 200 ] && ok || bad "after the queue drained: $code $(cat "$W/body")"
kill -TERM $SPID; wait $SPID; rc=$?; SPID=
[ "$rc" = 0 ] && ok || bad "the limits server exited $rc after SIGTERM"

echo "test_serve: $((n - fail)) of $n checks passed"
[ $fail = 0 ]
