#!/usr/bin/env python3
"""Per-kernel time table from `ncu --metrics gpu__time_duration.sum --csv` output (run.sh's NCU=1):
launches, total and mean microseconds and share per kernel name (template arguments kept, call
arguments dropped), largest first.   Usage: ncu_table.py ncu.csv"""
import collections
import csv
import re
import sys

UNIT_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def main(path):
    header, agg = None, collections.OrderedDict()
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if "Kernel Name" in row and "Metric Value" in row:
                header = row
                continue
            if not header or len(row) != len(header):
                continue
            d = dict(zip(header, row))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            name = re.sub(r"\(.*", "", d["Kernel Name"])[:90]
            us = float(d["Metric Value"].replace(",", "")) * UNIT_US.get(d.get("Metric Unit", "nsecond"), 1e-3)
            n, t = agg.get(name, (0, 0.0))
            agg[name] = (n + 1, t + us)
    total = sum(t for _, t in agg.values()) or 1.0
    print("| kernel | launches | total us | mean us | share |")
    print("|---|---:|---:|---:|---:|")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {n} | {t:.1f} | {t / n:.2f} | {100 * t / total:.1f}% |")
    print(f"| total | {sum(n for n, _ in agg.values())} | {total:.1f} | | |")


if __name__ == "__main__":
    main(sys.argv[1])
