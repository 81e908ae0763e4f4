#!/usr/bin/env python3
"""Compares two binaries' `tilelink bench` tables from bench/ab_binaries.sh's output.

For every row (op, world, M, N, K) and every timed column (baseline, the parts, fused), A's values over
its rounds give its own spread [min, max]; B passes where its median lies within A's spread widened
by nothing, or is faster. Prints one table and exits 1 when any fused row of B is slower than A's
slowest round.
    python3 bench/ab_compare.py ab.log
"""
import re
import statistics
import sys
from collections import defaultdict

COLS = ["baseline ms", "T_comm ms", "T_gemm ms", "fused ms"]


def parse(path):
    runs = defaultdict(lambda: defaultdict(list))  # (binary) -> (key, col) -> [values]
    which = None
    header = None
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"## ab round=(\d+) binary=(\w) op=(\w+) world=(\d+)", line)
        if m:
            which, header = m.group(2), None
            continue
        if not line.startswith("|") or which is None:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "op":
            header = cells
            continue
        if header is None or cells[0].startswith("---") or len(cells) != len(header):
            continue
        row = dict(zip(header, cells))
        key = (row["op"], int(row["world"]), int(row["M"]), int(row["N"]), int(row["K"]))
        for col in COLS:
            try:
                runs[which][(key, col)].append(float(row[col]))
            except (KeyError, ValueError):
                pass
    return runs


def main():
    runs = parse(sys.argv[1])
    a, b = runs.get("A", {}), runs.get("B", {})
    keys = sorted({k for k, _ in a.keys()})
    print("| op | world | M | N | K | column | A min..max (rounds) | B median (rounds) | B / A median | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0
    for key in keys:
        for col in COLS:
            va, vb = a.get((key, col), []), b.get((key, col), [])
            if not va or not vb:
                continue
            lo, hi = min(va), max(va)
            mb = statistics.median(vb)
            ratio = mb / statistics.median(va)
            ok = mb <= hi
            verdict = "within A's spread" if lo <= mb <= hi else ("faster" if mb < lo else "SLOWER than A's slowest")
            if col == "fused ms" and not ok:
                worst = 1
            op, w, m, n, k = key
            print(f"| {op} | {w} | {m} | {n} | {k} | {col} | {lo:.3f}..{hi:.3f} ({len(va)}) | {mb:.3f} ({len(vb)}) "
                  f"| {ratio:.3f} | {verdict} |")
    if not keys:
        print("no rows parsed", file=sys.stderr)
        return 2
    return worst


if __name__ == "__main__":
    sys.exit(main())
