#!/usr/bin/env bash
# The MoE sweep on one GPU, in one go: the MoE GPU tests (one GPU and over virtual ranks), `tilelink
# run moe_*` on the CUDA backend at worlds 1 to 4 against float64, layer 0 and the MLP at world 1
# with X gathered in the load path or copied ahead (`--fused gathered|ahead`), and `tilelink bench moe_*` over virtual
# ranks at worlds 2, 4, 8. Every step bounded by `timeout`; outputs under $OUT (or out/moe).
#   bash bench/moe_sweep.sh BIN_DIR [quick]
# BIN_DIR holds tilelink, gpu_test_moe_route, gpu_test_grouped_gemm, gpu_test_moe_cuda and
# gpu_test_moe_ops (built here or unpacked by bench/device_unpack.sh); `quick`: two models, 2048
# tokens. TILELINK_COMMIT names the binaries' commit in the tables where the copy has no git
# history.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: bench/moe_sweep.sh BIN_DIR [quick]}
QUICK=${2:-}
LOG=${OUT:-out/moe}
. bench/sweep_common.sh
step test_moe_route 120 "$BIN/gpu_test_moe_route"
step test_grouped_gemm 180 "$BIN/gpu_test_grouped_gemm"
step test_moe_ops 300 "$BIN/gpu_test_moe_ops"
step test_moe_cuda 120 "$BIN/gpu_test_moe_cuda"
for op in moe_ag_gemm moe_gemm_rs moe_mlp; do
  for w in 1 2 3 4; do
    step "run_${op}_w$w" 120 "$BIN/tilelink" run "$op" --backend cuda --world "$w" --tokens 512 --hidden 512 \
      --ffn 1536 --experts 8 --topk 2 --routing skewed --iters 2
  done
done
# Layer 0 at world 1 with X gathered in the GEMM's load path, and with X copied ahead of the tiles
# by the GEMM's own warps, against the gather kernel plus the contiguous GEMM (baseline (a)) in the
# same run: every model, both token counts.
for op in moe_ag_gemm moe_mlp; do
  for form in gathered ahead; do
    step "bench_${op}_w1_$form" 300 "$BIN/tilelink" bench "$op" --fused "$form" --routing uniform,skewed \
      --reps 5 --warmup 1 ${QUICK:+--models mixtral-8x7b,qwen3-30b-a3b --tokens 2048}
  done
done
# kAhead's prologue: no waves (the idle producer warps copy everything), more waves, every row first
for waves in 0 4 1000000; do
  step "bench_moe_ag_gemm_w1_ahead_waves$waves" 200 "$BIN/tilelink" bench moe_ag_gemm --fused ahead \
    --ahead-waves "$waves" --models qwen3-30b-a3b,deepseek-v3 --tokens 2048,8192 --routing uniform --reps 5 --warmup 1
done
if [ -z "$QUICK" ]; then
  models=mixtral-8x7b,deepseek-v3,qwen3-30b-a3b
  tokens=2048,8192
else
  models=mixtral-8x7b,qwen3-30b-a3b
  tokens=2048
fi
for op in moe_ag_gemm moe_gemm_rs moe_mlp; do
  for w in 2 4 8; do
    step "bench_${op}_w$w" 240 "$BIN/tilelink" bench "$op" --world "$w" --models "$models" --tokens "$tokens" \
      --routing uniform --reps 3 --warmup 1
  done
done
grep -hE '^\[  (PASSED|FAILED)|^# (check|FAIL)|median|PASS|FAIL' "$LOG"/*.txt
