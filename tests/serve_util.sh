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
