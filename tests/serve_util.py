"""serve_util.py — helpers of the tests/serve_*_check.py clients (standard library only): failed checks
are counted and printed, /metrics read into a dict."""
import http.client
import sys

fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what, file=sys.stderr)


def metrics(port, key=None):
    """/metrics of the server on 127.0.0.1:port: {name: value} of the unlabelled samples"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics", headers={"Authorization": "Bearer " + key} if key else {})
    m = c.getresponse().read().decode()
    c.close()
    return {k: float(v) for k, v in (ln.split() for ln in m.splitlines() if ln and ln[0] != "#" and "{" not in ln)}
