#!/usr/bin/env bash
# The attention sweep on one GPU, in one go: the engine's and the sequence-parallel ops' GPU tests,
# the engine against torch SDPA, and sp_attn / ring_attn on virtual ranks at worlds 1, 2, 4, 8
# (contiguous and zigzag). Every step bounded by `timeout`; outputs under $OUT (or out/attention).
#   bash bench/attention_sweep.sh BIN_DIR [quick]
# BIN_DIR holds tilelink, gpu_test_attention and gpu_test_sp_attn (built here or unpacked by
# bench/device_unpack.sh); `quick`: the smaller shapes only. TILELINK_COMMIT names the binaries'
# commit in the tables where the copy has no git history.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: bench/attention_sweep.sh BIN_DIR [quick]}
QUICK=${2:-}
LOG=${OUT:-out/attention}
. bench/sweep_common.sh
step test_attention 90 "$BIN/gpu_test_attention"
step test_sp_attn 300 "$BIN/gpu_test_sp_attn"
if [ -z "$QUICK" ]; then
  step attention 120 "$BIN/tilelink" bench attention --out "$LOG/ours.tsv"
  # torch's cuDNN clashes with the CUDA libraries found above: torch runs with the caller's path
  step sdpa 150 env LD_LIBRARY_PATH="$py_ld" python3 bench/torch_sdpa.py --ours "$LOG/ours.tsv"
  step sp_contiguous 240 "$BIN/tilelink" bench sp_attn --world 1,2,4,8 --reps 3
  step sp_zigzag 180 "$BIN/tilelink" bench sp_attn --world 2,4,8 --reps 3 --shard zigzag --causal yes
  step sp_long 420 "$BIN/tilelink" bench sp_attn --world 1,2,4,8 --reps 2 --warmup 1 --shapes 1x131072x32x8x128,2x131072x32x32x128
  step ring 300 "$BIN/tilelink" bench ring_attn --world 2,4,8 --reps 2
else
  step sp_contiguous 120 "$BIN/tilelink" bench sp_attn --world 2,8 --reps 2 --shapes 1x8192x32x8x128
  step ring 120 "$BIN/tilelink" bench ring_attn --world 2,8 --reps 2 --shapes 1x12288x16x16x128,1x49152x16x16x128
fi
grep -hE '^\[  (PASSED|FAILED)|^# (check|FAIL)|median|minimum' "$LOG"/*.txt
