#!/usr/bin/env python3
"""Differential fuzzing of lily's Jinja interpreter against jinja2 (HF's configuration).

Random templates (whitespace-control soup, or expression soup over filters/tests/methods/operators)
are rendered by `lily render --model DIR` (template in DIR/chat_template.jinja, variables passed as
chat_template_kwargs) and by jinja2 via make_template_goldens.render(); outputs must be identical
and errors must coincide. Known, accepted differences are skipped: printing Python iterator objects
(reversed(), generators) and jinja2 parsing the keyword `not` as a variable name in operand position.

  python3 tools/jinja_fuzz.py --lily build-jinja/lily [--mode ws|expr] [--n 500] [--seed 1]
Failing cases are worth turning into tools/template_golden_cases.py unit cases.
"""
import argparse
import copy
import json
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_template_goldens import openai_to_context, render  # noqa: E402

CTX = {"s": "Héllo World", "n": 7, "f": 2.5, "l": [3, 1, 2], "d": {"b": 1, "a": [1, 2]}, "e": "", "z": None,
       "t": True, "m": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " x "}]}
TXT = ["", " ", "  ", "\n", "\n\n", "\t", " \n ", "a", "b c", "\n  ", "  \n", "x\n", "\u3000", "\r\n"]
ATOMS = ["s", "n", "f", "l", "d", "e", "z", "t", "m", "nope", "0", "1", "-3", "2.0", "0.1", "'a'", "'ab c'", "''",
         "[1, 'x']", "[]", "{'k': 1}", "none", "true", "false", "(1, 2)", "m[0]", "d.a", "d['b']", "s[1:3]", "l[::-1]"]
FILTERS = ["length", "trim", "string", "int", "float", "list", "items|list", "join(',')", "default('D')", "first",
           "last", "upper", "lower", "title", "capitalize", "replace('l', 'L')", "tojson", "safe", "sort",
           "unique|list", "min", "max", "sum", "abs", "round", "indent(2)", "map(attribute='role')|list",
           "select('odd')|list", "reject|list", "selectattr('role', 'eq', 'user')|list", "count", "d(1)", "join",
           "tojson(indent=1)", "trim('H')", "escape", "select('odd')", "items", "map(attribute='role')", "reverse",
           "unique", "reject"]
TESTS = ["defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
         "boolean", "true", "false", "odd", "even", "divisibleby 2", "in [1, 2]", "eq 1", "lower", "upper", "callable"]
METHODS = ["startswith('H')", "endswith('d')", "split()", "split('l')", "rsplit(' ', 1)", "strip()", "lstrip('H')",
           "upper()", "lower()", "title()", "find('l')", "count('l')", "replace('o', '0')", "format(1)", "splitlines()"]
OPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]


LAZY = re.compile(r"\|(select|reject|selectattr|rejectattr|map|items|unique|reverse)\b(\([^)]*\))?(?!\|list)")


def ws_piece(r, depth=0):
    mod = lambda: r.choice(["", "", "-", "+"])  # noqa: E731
    x = r.random()
    if x < 0.3:
        return r.choice(TXT)
    if x < 0.45:
        return "{{" + r.choice(["", "-"]) + " 'v' " + r.choice(["", "-"]) + "}}"
    if x < 0.55:
        return "{#" + r.choice(["", "-"]) + " c " + r.choice(["", "-"]) + "#}"
    if x < 0.6:
        return ("{%" + mod() + " raw " + r.choice(["", "-"]) + "%}" + r.choice(TXT) + "{{x}}" + r.choice(TXT) +
                "{%" + mod() + " endraw " + mod() + "%}")
    if x < 0.7:
        return "{%" + mod() + " set q = 1 " + mod() + "%}"
    if depth < 3:
        body = "".join(ws_piece(r, depth + 1) for _ in range(r.randint(0, 4)))
        kw = r.choice(["if true", "for i in [1, 2]", "if false"])
        end = "endif" if kw.startswith("if") else "endfor"
        els = ""
        if r.random() < 0.3:
            els = r.choice(TXT) + "{%" + mod() + " else " + mod() + "%}" + "".join(ws_piece(r, depth + 1) for _ in range(2))
        return "{%" + mod() + " " + kw + " " + mod() + "%}" + body + els + r.choice(TXT) + "{%" + mod() + " " + end + " " + mod() + "%}"
    return r.choice(TXT)


def expr(r, d=0):
    x = r.random()
    if d > 2 or x < 0.3:
        return r.choice(ATOMS)
    if x < 0.5:
        return expr(r, d + 1) + "|" + r.choice(FILTERS)
    if x < 0.6:
        return "(" + expr(r, d + 1) + " is " + r.choice(["", "not "]) + r.choice(TESTS) + ")"
    if x < 0.7:
        return "s." + r.choice(METHODS)
    if x < 0.78:
        return "not (" + expr(r, d + 1) + ")"
    if x < 0.85:
        return "(" + expr(r, d + 1) + " if " + expr(r, d + 1) + " else " + expr(r, d + 1) + ")"
    return "(" + expr(r, d + 1) + " " + r.choice(OPS) + " " + expr(r, d + 1) + ")"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lily", required=True)
    ap.add_argument("--mode", choices=["ws", "expr"], default="expr")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    r = random.Random(a.seed)
    bad = lazy = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.n):
            t = ("".join(ws_piece(r) for _ in range(r.randint(1, 6))) if a.mode == "ws"
                 else "{{ " + expr(r) + " }}")
            with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(t)
            request = {"messages": [], "chat_template_kwargs": CTX if a.mode == "expr" else {}}
            exp = render(t, openai_to_context(copy.deepcopy(request), {}))
            if " at 0x" in exp.get("output", ""):  # a printed Python object address
                continue
            p = subprocess.run([a.lily, "render", "--model", d], input=json.dumps(request).encode(), capture_output=True)
            got_ok = p.returncode == 0
            if got_ok != ("output" in exp) or (got_ok and p.stdout.decode("utf-8") != exp["output"]):
                if not got_ok and "output" in exp and LAZY.search(t):
                    lazy += 1  # documented: lily's generator filters run eagerly
                    continue
                bad += 1
                print(repr(t), "\n  jinja2:", repr(exp)[:200], "\n  lily:  ",
                      repr(p.stdout.decode("utf-8", "replace") if got_ok else p.stderr.decode())[:200])
    print(f"{bad} mismatches in {a.n} {a.mode} templates (seed {a.seed}); {lazy} eager-vs-lazy generator errors skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
