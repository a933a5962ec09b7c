"""serve_util.py — helpers of the tests/serve_*_check.py clients (standard library only): failed checks
are counted and printed, /metrics read into a dict, a request's status / JSON / body, OpenAI-style errors."""
import http.client
import json
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


def request(port, method, path, body=None, raw=None, headers=None, timeout=120):
    """method path on 127.0.0.1:port with body as JSON (or the bytes raw): (status, parsed JSON or None, bytes)"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    out = r.read()
    c.close()
    try:
        j = json.loads(out)
    except ValueError:
        j = None
    return r.status, j, out


def is_error(j, param=None, code=None):
    """j is an OpenAI error object {"error": {message, type, param, code}} (with that param / code if given)"""
    if not isinstance(j, dict) or set(j) != {"error"}:
        return False
    e = j["error"]
    if set(e) != {"message", "type", "param", "code"} or not e["message"]:
        return False
    return (param is None or e["param"] == param) and (code is None or e["code"] == code)
