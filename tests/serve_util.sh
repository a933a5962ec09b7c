# serve_util.sh — shared by the tests/test_serve_*.sh that start `mmc serve` (source it; it runs nothing).
# serve_start LOG_PREFIX ARGS...: start "$MMC" serve --port 0 ARGS in the background (stdout LOG_PREFIX.out,
# stderr LOG_PREFIX.err); sets SPID and PORT (the port it printed), or PORT empty when it exited or did not
# print one within 60 s.
serve_start() {
  local log=$1; shift
  rm -f "$log.err"   # else a previous server's port could be read
  "$MMC" serve --port 0 "$@" >"$log.out" 2>"$log.err" &
  SPID=$!
  PORT=
  for _ in $(seq 600); do
    PORT=$(sed -n 's/^listening on http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$log.err" 2>/dev/null)
    [ -n "$PORT" ] && return 0
    kill -0 $SPID 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

# serve_check CHECKER MODEL IMAGE|- [checker flags] -- [serve flags]: a server on MODEL with the serve flags
# (logs $W/s.out / $W/s.err), then `python3 CHECKER PORT $MMC MODEL IMAGE [checker flags]` against it, then
# SIGTERM, which must end the server with status 0; each failure adds one to $fail and says why on stderr.
serve_check() {
  local checker=$1 model=$2 img=$3; shift 3
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  if ! serve_start "$W/s" --model "$model" "$@"; then
    echo "FAIL: the server did not start: $(cat "$W/s.err")" >&2; fail=$((fail+1)); return
  fi
  timeout 300 python3 "$checker" "$PORT" "$MMC" "$model" "$img" "${flags[@]}" \
    || { fail=$((fail+1)); echo "FAIL: $model $*" >&2; }
  kill -TERM $SPID; wait $SPID; local rc=$?; SPID=
  [ $rc -eq 0 ] || { fail=$((fail+1)); echo "FAIL: the server exited $rc: $(tail -3 "$W/s.err")" >&2; }
}
