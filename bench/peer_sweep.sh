#!/usr/bin/env bash
# The sweep for a machine of several GPUs (a GPU a rank, the peer transport), in one go: every GPU
# test that needs two GPUs or more (the peer cases of AG+GEMM, the comm programs, graphs (GEMM+RS among them),
# MoE and the attention ops), then the layer ops and the GEMM ops against their NCCL baselines at
# worlds 2, 4 and 8 (as far as the GPUs go). Every step bounded by `timeout`; outputs under $OUT
# (or out/peer).
#   bash bench/peer_sweep.sh BIN_DIR [quick]
# BIN_DIR holds tilelink and the gpu_test_* binaries (built here or unpacked by
# bench/device_unpack.sh); `quick`: the tests and world 2 only.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: bench/peer_sweep.sh BIN_DIR [quick]}
QUICK=${2:-}
LOG=${OUT:-out/peer}
. bench/sweep_common.sh
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "GPUs: $gpus"
if [ "$gpus" -lt 2 ]; then
  echo "peer_sweep: needs two GPUs or more, this machine has $gpus" >&2
  exit 2
fi
worlds=2
[ -z "$QUICK" ] && [ "$gpus" -ge 4 ] && worlds=2,4
[ -z "$QUICK" ] && [ "$gpus" -ge 8 ] && worlds=2,4,8
peer_filter='*Peer*:*TwoGpus*:*SeveralGpus*'
for t in ag_gemm comm graph moe_ops sp_attn; do
  step "test_$t" 300 "$BIN/gpu_test_$t" --gtest_filter="$peer_filter"
done
step sp_attn 300 "$BIN/tilelink" bench sp_attn --transport peer --world "$worlds" --reps 3
step sp_zigzag 240 "$BIN/tilelink" bench sp_attn --transport peer --world "$worlds" --reps 3 --shard zigzag --causal yes
step ring_attn 300 "$BIN/tilelink" bench ring_attn --transport peer --world "$worlds" --reps 2
for w in ${worlds//,/ }; do
  for op in moe_ag_gemm moe_gemm_rs moe_mlp; do
    step "${op}_w$w" 300 "$BIN/tilelink" bench "$op" --transport peer --world "$w" --reps 5 \
      --models mixtral-8x7b,deepseek-v3,qwen3-30b-a3b --tokens 2048,8192 --routing uniform
  done
  for op in ag_gemm gemm_rs gemm_ar; do
    step "${op}_w$w" 300 "$BIN/tilelink" bench "$op" --transport peer --world "$w"
  done
done
grep -hE '^\[  (PASSED|FAILED|SKIPPED)|^# (check|FAIL)|median|minimum' "$LOG"/*.txt
