#!/usr/bin/env bash
# The GEMM engine's tiles on one GPU, in one go: gpu_test_gemm, then `tilelink bench gemm --plain
# --csv` over tensor-parallel shard shapes (M 2048, 4096, 8192 x 15 (N, K)) and the shapes that
# trail cuBLAS, once for each tile (the hooked widths 256, 192, 160, 128 and the plain engine's
# 128x176 and 256x160) and once for each pick (the hooked widths', and with --plain-tiles the plain
# engine's), and once through a GemmTuner (--tuned: each shape's tiles timed, the fastest run).
# bench/gemm_tiles_fit.py then fits the plain tiles' margins and compares the picks.
# Every step bounded by `timeout`; outputs under $OUT (or out/gemm_tiles).
#   bash bench/gemm_tiles_sweep.sh BIN_DIR [reps (20)]   (about 8 minutes on one H100 or H200)
# BIN_DIR holds tilelink, gpu_test_gemm and gpu_test_gemm_tuner (built here or unpacked by
# bench/device_unpack.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: bench/gemm_tiles_sweep.sh BIN_DIR [reps]}
REPS=${2:-20}
LOG=${OUT:-out/gemm_tiles}
. bench/sweep_common.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv >"$LOG/gpu.txt" 2>&1
step test_gemm 300 "$BIN/gpu_test_gemm"
step test_gemm_tuner 120 "$BIN/gpu_test_gemm_tuner"
shapes=8192x1376x4096,2048x7168x2048,3000x5000x7168,3000x5000x2048,1536x7168x2048,2560x5120x5120
shapes=$shapes,12288x2432x1024,6144x1024x4096
for m in 2048 4096 8192; do
  for nk in 1376x4096 2752x4096 5504x4096 4096x1376 4096x2752 1792x4096 3584x4096 7168x2048 \
    7168x8192 5000x7168 1280x8192 2560x8192 8192x2048 14336x4096 6144x4096; do
    shapes=$shapes,${m}x$nk
  done
done
bench() { step "$1" 240 "$BIN/tilelink" bench gemm --shapes "$shapes" --plain --reps "$REPS" --csv "${@:2}"; }
bench pick_hooked
bench pick_plain --plain-tiles
bench tuned --tuned
bench tile_128x176 --tile-n 176
bench tile_256x160 --tile-m 256
for w in 256 192 160 128; do bench "tile_128x$w" --tile-n "$w" --no-verify; done
grep -hE '^\[  (PASSED|FAILED)|FAIL' "$LOG"/*.txt
python3 bench/gemm_tiles_fit.py "$LOG"
