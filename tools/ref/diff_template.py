#!/usr/bin/env python3
"""diff_template.py — differential test of mmc's Jinja engine against jinja2 as transformers
configures it: random templates (expressions with every operator, filter, test and method;
whitespace control with every -/+ modifier, raw, comments, \r\n; statement programs with
macros, call blocks, set blocks, namespaces, loops, break/continue), rendered by
transformers' own environment, written as "units" that tests/test_template.c replays:

    /work/main/.venv-ref/bin/python tools/ref/diff_template.py --seed 1 --n 3000 --out /tmp/d.json
    build/test_template /tmp/d.json      # prints every difference, exit 1 if any

Not part of `make test` (random, and needs Python); the fixed corpus is gen_template.py.
Differences left on purpose: printing a generator / dict view (Python shows an address),
errors a lazy generator would raise only when consumed, jinja2's constant folding of
slices of literals ((0)[1:] renders as empty).
"""
import argparse
import json
import random

from transformers.utils.chat_template_utils import _compile_jinja_template

ATOMS = ["0", "1", "-3", "7", "2.5", "-0.5", "1e3", "'abc'", "'A b C'", "''", "' x '", "'héllo'", "none", "true", "false",
         "[1, 2, 3]", "[]", "['b', 'a', 'C']", "{'k': 1, 'a': 'x'}", "{}", "(1, 'a')", "x", "y", "s", "d", "l", "undef", "d.k", "l[1]", "s[0]"]
BIN = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"]
FILT = ["length", "first", "last", "list", "string", "lower", "upper", "title", "capitalize", "trim", "reverse", "sort",
        "unique", "join", "join(',')", "tojson", "int", "float", "abs", "round", "round(1)", "default('D')", "default('D', true)",
        "items", "dictsort", "sum", "min", "max", "map('string')", "select", "reject('none')", "indent(2)", "replace('a', 'Z')",
        "count", "wordcount", "e", "batch(2)", "map('upper')", "selectattr('k')", "tojson(indent=1)", "center(9)", "truncate(5, true, '~', 0)"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "boolean",
         "true", "false", "odd", "even", "divisibleby 2", "eq 1", "lower", "upper", "in [1, 'abc']", "callable", "sameas none"]
METH = ["strip()", "upper()", "split()", "split('b')", "startswith('a')", "endswith('c')", "replace('b', 'Q')", "title()",
        "items()", "keys()", "values()", "get('k')", "get('zz', 5)", "lstrip('a')", "rstrip()", "count('a')", "find('b')", "capitalize()", "splitlines()", "isdigit()"]
def expr(d=0):
    r = random.random()
    if d > 2 or r < 0.3: return random.choice(ATOMS)
    if r < 0.5: return f"({expr(d+1)} {random.choice(BIN)} {expr(d+1)})"
    if r < 0.65: return f"({expr(d+1)} | {random.choice(FILT)})"
    if r < 0.75: return f"({expr(d+1)} is {random.choice(['', 'not '])}{random.choice(TESTS)})"
    if r < 0.85: return f"{random.choice(ATOMS)}.{random.choice(METH)}"
    if r < 0.9: return f"({expr(d+1)})[{random.choice(['1', '-1', '::-1', '1:', ':2', '::2', '0'])}]"
    if r < 0.95: return f"({expr(d+1)} if {expr(d+1)} else {expr(d+1)})"
    return f"(not {expr(d+1)})"
TXT = ["", " ", "  ", "\n", "\n  ", "  \n", "a", "b ", " c", "\t", "\n\n", "x\n ", " \t\n", "\r\n", "y\r\n  "]
def mod(): return random.choice(["", "", "-", "+"])
def wtag(body):
    return "{%" + mod() + " " + body + " " + mod() + "%}"
def wblock(d=0):
    out = []
    for _ in range(random.randint(1, 4)):
        r = random.random()
        out.append(random.choice(TXT))
        if r < 0.25: out.append("{{" + random.choice(["", "-"]) + " v " + random.choice(["", "-"]) + "}}")
        elif r < 0.4 and d < 2: out.append(wtag("if v") + wblock(d+1) + (wtag("else") + wblock(d+1) if random.random() < 0.5 else "") + wtag("endif"))
        elif r < 0.55 and d < 2: out.append(wtag("for i in [1, 2]") + wblock(d+1) + wtag("endfor"))
        elif r < 0.65: out.append("{#" + mod() + " c " + mod() + "#}")
        elif r < 0.72: out.append(wtag("set z = 1"))
        elif r < 0.78: out.append("{%" + mod() + " raw " + mod() + "%}" + random.choice(TXT) + "{{ r }}" + random.choice(TXT) + "{%" + mod() + " endraw " + mod() + "%}")
        out.append(random.choice(TXT))
    return "".join(out)
NAMES = ["a", "b", "ns.x", "ns.y"]
SEX = ["a", "b", "ns.x", "ns.y", "1", "'s'", "a ~ b", "loop.index", "loop.first", "loop.previtem", "loop.nextitem", "loop.length",
      "i", "k", "v", "caller()", "m(1)", "m(a, b=2)", "varargs", "kwargs", "loop.revindex", "loop.cycle('p', 'q')", "(a or 0) + 1",
      "[1, 2][1:]", "d.get('x', 3)", "d|dictsort", "ns", "undefined_name", "a is defined", "range(3)|list", "x"]
def sex(): return random.choice(SEX)
def stmt(d=0):
    r = random.random()
    if d > 2 or r < 0.3: return "{{ " + sex() + " }}"
    if r < 0.4: return "{% set " + random.choice(NAMES) + " = " + sex() + " %}"
    if r < 0.5: return "{% if " + sex() + " %}" + sbody(d+1) + "{% elif " + sex() + " %}" + sbody(d+1) + "{% else %}" + sbody(d+1) + "{% endif %}"
    if r < 0.6: return "{% for i in " + random.choice(["[1, 2, 3]", "range(2)", "[]", "'ab'", "d", "a"]) + (" if i" if random.random() < 0.2 else "") + " %}" + sbody(d+1) + ("{% else %}E" if random.random() < 0.3 else "") + "{% endfor %}"
    if r < 0.65: return "{% for k, v in d.items() %}" + sbody(d+1) + "{% endfor %}"
    if r < 0.72: return "{% macro m(p, q=2) %}" + sbody(d+1) + "{% endmacro %}"
    if r < 0.77: return "{% call m(3) %}" + sbody(d+1) + "{% endcall %}"
    if r < 0.82: return "{% set a %}" + sbody(d+1) + "{% endset %}"
    if r < 0.86: return "{% filter upper %}" + sbody(d+1) + "{% endfilter %}"
    if r < 0.9: return "{% with a = " + sex() + " %}" + sbody(d+1) + "{% endwith %}"
    if r < 0.95: return "{% break %}" if random.random() < .5 else "{% continue %}"
    return "{{ x }}"
def sbody(d):
    return "|".join(stmt(d) for _ in range(random.randint(1, 3)))

VARS = {"x": 3, "y": -2.5, "s": "Hello World", "d": {"k": "v", "n": 2, "x": 1, "z": 2}, "l": [3, 1, 2], "v": "V"}
PRELUDE = "{% set ns = namespace(x=0, y='y') %}{% macro m(p, q=2) %}[{{ p }}{{ q }}]{% endmacro %}"


def one():
    r = random.random()
    if r < 0.35:
        return "{{ " + expr() + " }}"
    if r < 0.45:
        return "{% for i in " + expr(1) + " %}[{{ i }}:{{ loop.index }}]{% else %}E{% endfor %}"
    if r < 0.7:
        return wblock()
    return PRELUDE + sbody(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    random.seed(a.seed)
    units = []
    for _ in range(a.n):
        t = one()
        try:
            res = {"expected": _compile_jinja_template(t).render(**VARS)}
        except Exception as e:  # any error: mmc must fail too
            res = {"error": f"{type(e).__name__}: {e}", "raised": False}
        units.append(dict(template=t, vars=VARS, **res))
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"units": units}, f, ensure_ascii=False)
    print(f"wrote {len(units)} random cases to {a.out}")


if __name__ == "__main__":
    main()
