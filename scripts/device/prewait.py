#!/usr/bin/env python3
"""Checks, in the SASS of a lily binary, that the decode kernels issue their weight loads before the PDL wait.

The batch-1 decode kernels load their weights before `griddepcontrol.wait` (SASS `ACQBULK`) so that the
fetch overlaps the previous kernel. ptxas may hoist the wait above those loads (it did once: the batch-1
step lost ~10% on an H100, docs/perf/2026-12-05-pdl-wait.md); nothing but the SASS shows it.

Usage: cuobjdump -sass lily | prewait.py
Prints, per kernel that has a PDL wait, the loads (LDG, LDGSTS) issued before it and its instruction count;
exits 1 when a kernel listed in MUST has none before its wait.
"""
import re
import sys

# Kernels that must issue loads before their PDL wait (regexes on the mangled name): the batch-1 GEMVs and
# expert kernels, whose prologue is straight-line code, so the order in the binary is the order they run.
# (Not qgemm's dense tiles: their prologue loads sit in loops whose blocks ptxas may lay out after the
# wait, so this count cannot judge them: it reads 0 for them, with or without pdl_wait_after_loads.)
MUST = [re.compile(p) for p in [r"gemv_tc_kernel", r"gemv_q4_cu", r"gate_up_kernel", r"down_tc_kernel",
                                 r"gate_up_tc_kernel"]]

INSTR = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?);")
LOAD = re.compile(r"\b(LDG|LDGSTS)\b")


def kernels(lines):
    name, ins = None, []
    for line in lines:
        if "Function : " in line:
            if name:
                yield name, ins
            name, ins = line.split("Function : ", 1)[1].strip(), []
        elif name:
            m = INSTR.match(line)
            if m:
                ins.append(m.group(1))
    if name:
        yield name, ins


def main():
    bad = 0
    rows = []
    for name, ins in kernels(sys.stdin):
        wait = next((i for i, x in enumerate(ins) if "ACQBULK" in x), None)
        if wait is None:
            continue
        before = sum(1 for x in ins[:wait] if LOAD.search(x))
        total = sum(1 for x in ins if LOAD.search(x))
        must = any(k.search(name) for k in MUST) and total > 0
        flag = "MISSING" if must and before == 0 else ""
        bad += flag != ""
        rows.append((flag, before, total, len(ins), name))
    print("| loads before wait | loads | instructions | kernel | |")
    print("|---:|---:|---:|---|---|")
    for flag, before, total, n, name in sorted(rows, key=lambda r: (r[0] == "", r[4])):
        print(f"| {before} | {total} | {n} | {name[:140]} | {flag} |")
    print(f"pre-wait loads: {len(rows)} kernels with a PDL wait, {bad} required ones with none before it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
