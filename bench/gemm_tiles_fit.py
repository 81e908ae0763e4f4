#!/usr/bin/env python3
"""Fits the plain engine's tile margins (kFitTileGain, kTallTileGain in gemm.hpp) on the CSVs of
bench/gemm_tiles_sweep.sh and compares the picks.

    python3 bench/gemm_tiles_fit.py LOG_DIR [--sms 132]

Reads LOG_DIR/tile_<rows>x<width>.txt (one `bench gemm --csv` per tile), pick_hooked.txt and
pick_plain.txt. Prints, per shape, each tile's ratio to cuBLAS (cuBLAS timed in the same run as the
tile), the fastest tile and what each pick took; then, over a grid of the two margins, the mean of
the pick's time over the fastest tile's time, and the best pair. The pick is gemm.hpp's, mirrored
here (the hooked widths' pick is checked against the tile each pick_hooked row reports)."""
import csv
import math
import os
import sys

# gemm.hpp's constants (keep in step)
TILE_M, TILE_K = 128, 64
SPLIT_MIN_K_TILES, SPLIT_MIN_PART_K_TILES, SPLIT_FEW_ROWS = 8, 32, 64
SPLIT_MIN_PART_K_TILES_FEW_ROWS, SPLIT_MAX_PARTS, SPLIT_WAVE_COST = 8, 4, 0.1
NARROW, NARROW_FEW, LEAN, SLIM = 0.965, 0.9, 0.975, 0.91
MANY_ROWS, MANY_ROWS_SLIM, NARROW_MANY, SLIM_MANY = 2048, 3072, 0.985, 0.96
PLAIN_MIN_ROWS = 1024


def split(tiles, blocks, k, rows):
    tail, k_tiles = tiles % blocks, (k + TILE_K - 1) // TILE_K
    if tail == 0 or 2 * tail > blocks or k_tiles < SPLIT_MIN_K_TILES:
        return 0, 1
    min_part = SPLIT_MIN_PART_K_TILES_FEW_ROWS if rows <= SPLIT_FEW_ROWS else SPLIT_MIN_PART_K_TILES
    parts = min(blocks // tail, SPLIT_MAX_PARTS)
    while parts > 2 and k_tiles < min_part * parts:
        parts -= 1
    return tail, parts


def tiles_of(m, n, tm, tn):
    return math.ceil(m / tm) * math.ceil(n / tn)


def wave_cost(m, n, k, blocks, tn):
    tiles = tiles_of(m, n, TILE_M, tn)
    st, parts = split(tiles, blocks, k, min(m, TILE_M))
    waves = tiles // blocks + 1.0 / parts + SPLIT_WAVE_COST if st else math.ceil(tiles / blocks)
    return waves * tn


def hooked_pick(m, n, k, blocks):
    margin = NARROW_FEW if m <= SPLIT_FEW_ROWS else NARROW_MANY if m > MANY_ROWS else NARROW
    wide, narrow = wave_cost(m, n, k, blocks, 256), wave_cost(m, n, k, blocks, 192) / margin
    pick, best = (192, narrow) if narrow < wide else (256, wide)
    if m > SPLIT_FEW_ROWS:
        lean = wave_cost(m, n, k, blocks, 160) / LEAN
        if lean < best:
            pick, best = 160, lean
        slim = wave_cost(m, n, k, blocks, 128) / (SLIM_MANY if m > MANY_ROWS_SLIM else SLIM)
        if slim < best:
            pick, best = 128, slim
    return (TILE_M, pick), best


def plain_pick(m, n, k, blocks, fit_gain, tall_gain):
    tile, best = hooked_pick(m, n, k, blocks)
    if m < PLAIN_MIN_ROWS:
        return tile
    for t, gain in (((128, 176), fit_gain), ((256, 160), tall_gain)):
        tiles = tiles_of(m, n, *t)
        if split(tiles, blocks, k, TILE_M)[0]:  # the hooked widths would split; these never do
            continue
        cost = math.ceil(tiles / blocks) * (t[0] / TILE_M) * t[1] / gain
        if cost < best:
            tile, best = t, cost
    return tile


def read(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        lines = [l for l in f if l[:1].isdigit() or l.startswith("m,n,k")]
    for r in csv.DictReader(lines):
        rows[(int(r["m"]), int(r["n"]), int(r["k"]))] = r
    return rows


def main():
    log = sys.argv[1]
    sms = int(sys.argv[sys.argv.index("--sms") + 1]) if "--sms" in sys.argv else 132
    tiles = [(128, 256), (128, 192), (128, 176), (128, 160), (128, 128), (256, 160)]
    runs = {t: read(os.path.join(log, f"tile_{t[0]}x{t[1]}.txt")) for t in tiles}
    hooked, plain = read(os.path.join(log, "pick_hooked.txt")), read(os.path.join(log, "pick_plain.txt"))
    tuned = read(os.path.join(log, "tuned.txt"))
    shapes = sorted({s for r in runs.values() for s in r})
    if not shapes:
        sys.exit(f"no bench rows under {log}")
    print("shape | " + " ".join(f"{t[0]}x{t[1]:<4}" for t in tiles) +
          " | fastest | hooked pick (ratio) | plain pick (ratio) | tuned (ratio)")
    fast = {}
    for s in shapes:
        tf = {t: float(runs[t][s]["engine_tflops"]) for t in tiles if s in runs[t]}
        ratio = {t: float(runs[t][s]["ratio"]) for t in tiles if s in runs[t]}
        fast[s] = tf
        best = max(tf, key=tf.get)
        hp, _ = hooked_pick(*s, sms)
        if s in hooked:
            got = (int(hooked[s].get("tile_m", 128)), int(hooked[s]["tile_n"]))
            assert got == hp, f"{s}: the mirrored hooked pick {hp} != the engine's {got}"
        cells = " ".join(f"{ratio[t]:8.3f}" if t in ratio else "       -" for t in tiles)
        hr = f"{float(hooked[s]['ratio']):.3f}" if s in hooked else "-"
        pr = plain[s] if s in plain else None
        pt = f"{pr['tile_m']}x{pr['tile_n']} ({float(pr['ratio']):.3f})" if pr else "-"
        tr = f"{float(tuned[s]['ratio']):.3f}" if s in tuned else "-"
        print(f"{s[0]}x{s[1]}x{s[2]} | {cells} | {best[0]}x{best[1]} | {hp[0]}x{hp[1]} ({hr}) | {pt} | {tr}")

    def score(fit_gain, tall_gain):
        q = []
        for s, tf in fast.items():
            t = plain_pick(*s, sms, fit_gain, tall_gain)
            if t in tf:
                q.append(tf[t] / max(tf.values()))
        return sum(q) / len(q), min(q)

    for name, run in (("hooked pick", hooked), ("plain pick", plain), ("tuned", tuned)):
        r = sorted(float(run[s]["ratio"]) for s in shapes if s in run)
        if r:
            print(f"ratio to cuBLAS, {name}: median {r[len(r) // 2]:.3f}, min {r[0]:.3f} ({len(r)} shapes)")
    hooked_q = [fast[s][hooked_pick(*s, sms)[0]] / max(fast[s].values()) for s in fast
                if hooked_pick(*s, sms)[0] in fast[s]]
    print(f"\nthe hooked widths' pick: mean {sum(hooked_q) / len(hooked_q):.4f} of the fastest tile, "
          f"min {min(hooked_q):.4f} ({len(hooked_q)} shapes)")
    grid = [round(0.90 + 0.005 * i, 3) for i in range(31)]
    best = max(((score(f, t), f, t) for f in grid for t in grid), key=lambda x: (x[0][0], x[0][1]))
    (mean, worst), f, t = best
    print(f"the plain pick, best margins: fit {f}, tall {t}: mean {mean:.4f}, min {worst:.4f}")
    for f0, t0 in ((0.975, 0.99), (1.0, 1.0)):
        mean, worst = score(f0, t0)
        print(f"the plain pick at fit {f0}, tall {t0}: mean {mean:.4f}, min {worst:.4f}")


if __name__ == "__main__":
    main()
