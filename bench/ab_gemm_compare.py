#!/usr/bin/env python3
"""Compares two binaries' `tilelink bench gemm` tables from bench/ab_gemm.sh's output.

For every shape and the columns engine TFLOP/s, ratio to cuBLAS and hooks+%: A's values over its
rounds give its own spread [min, max]; B's median is compared with it. Prints one markdown table.
    python3 bench/ab_gemm_compare.py gemm_ab.log [more logs...]
"""
import re
import statistics
import sys
from collections import defaultdict

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+\|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\|\s+([\d.]+)\s+([+-][\d.]+)")


def parse(paths):
    vals = defaultdict(lambda: defaultdict(list))  # binary -> (shape, column) -> values
    order = []
    for path in paths:
        which = None
        for line in open(path, encoding="utf-8", errors="replace"):
            m = re.match(r"## ab round=(\d+) binary=(\w)", line)
            if m:
                which = m.group(2)
                continue
            m = ROW.match(line)
            if not m or which is None:
                continue
            shape = "x".join(m.group(i) for i in (1, 2, 3))
            if shape not in order:
                order.append(shape)
            vals[which][(shape, "engine TFLOP/s")].append(float(m.group(4)))
            vals[which][(shape, "ratio")].append(float(m.group(6)))
            vals[which][(shape, "hooks+%")].append(float(m.group(8)))
    return vals, order


def main():
    vals, order = parse(sys.argv[1:])
    print("| shape | column | A min..max (rounds) | B median (rounds) | verdict |")
    print("| --- | --- | --- | --- | --- |")
    for shape in order:
        for col, higher_better in (("engine TFLOP/s", True), ("ratio", True), ("hooks+%", False)):
            a, b = vals["A"][(shape, col)], vals["B"][(shape, col)]
            if not a or not b:
                continue
            bm = statistics.median(b)
            if min(a) <= bm <= max(a):
                verdict = "within A's spread"
            elif (bm > max(a)) == higher_better:
                verdict = "better"
            else:
                verdict = "worse than A's worst"
            print(f"| {shape} | {col} | {min(a):g}..{max(a):g} ({len(a)}) | {bm:g} ({len(b)}) | {verdict} |")


if __name__ == "__main__":
    main()
