#!/usr/bin/env bash
# GEMM+AR on virtual ranks of one GPU: `tilelink bench gemm_ar` over M = 1..8192 and four (N, K)
# pairs of tensor-parallel layers, at each world of WORLDS, with the floor column; then the
# collectives on their own (bench allgather|reduce_scatter|allreduce). The tables of
# bench/notes/gemm_ar.md come from this script.
#   bash bench/gemm_ar_sweep.sh [bin-dir (build)] [worlds ("2 4 8")] [what: all|gemm_ar|collectives]
set -uo pipefail
BIN=${1:-build}
WORLDS=${2:-"2 4 8"}
WHAT=${3:-all}
libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
shapes=""
for nk in 4096x14336 8192x28672 5120x25600 7168x4096; do
  for m in 1 16 64 256 1024 4096 8192; do shapes+="${m}x${nk%x*}x${nk#*x},"; done
done
status=0
if [ "$WHAT" = all ] || [ "$WHAT" = gemm_ar ]; then
  for w in $WORLDS; do
    echo "\$ tilelink bench gemm_ar --world $w --shapes ${shapes%,} --ref-limit 2e9 --warmup 2 --bench-iters 5"
    "$BIN/tilelink" bench gemm_ar --world "$w" --shapes "${shapes%,}" --ref-limit 2e9 --warmup 2 --bench-iters 5 ||
      status=1
  done
fi
if [ "$WHAT" = all ] || [ "$WHAT" = collectives ]; then
  for c in allgather reduce_scatter allreduce; do
    for w in $WORLDS; do
      echo "\$ tilelink bench $c --world $w --warmup 1 --iters 5"
      "$BIN/tilelink" bench "$c" --world "$w" --warmup 1 --iters 5 || status=1
    done
  done
  for w in $WORLDS; do
    echo "\$ tilelink bench allreduce --world $w --variant one-shot --max-bytes 16777216 --warmup 1 --iters 5"
    "$BIN/tilelink" bench allreduce --world "$w" --variant one-shot --max-bytes 16777216 --warmup 1 --iters 5 ||
      status=1
  done
fi
exit $status
