#!/usr/bin/env bash
# Two builds of the command line, A and B, alternated on one GPU: `tilelink bench <op>` of each op at
# each world, ROUNDS rounds, the order of A and B swapped every round, so drift of the GPU's clocks
# and temperature falls on both alike. bench/ab_compare.py then compares B's rows with A's own
# round-to-round spread.
#   bash bench/ab_binaries.sh A-bin-dir B-bin-dir [rounds (3)] [ops ("ag_gemm gemm_rs")] [worlds ("2 4")]
#                            [shapes (4096x8192x4096,8192x14336x4096)]
set -uo pipefail
A=$1
B=$2
ROUNDS=${3:-3}
OPS=${4:-"ag_gemm gemm_rs"}
WORLDS=${5:-"2 4"}
SHAPES=${6:-4096x8192x4096,8192x14336x4096}
libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
status=0
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for which in $order; do
    if [ "$which" = A ]; then bin=$A; else bin=$B; fi
    for op in $OPS; do
      for w in $WORLDS; do
        echo "## ab round=$round binary=$which op=$op world=$w"
        echo "\$ tilelink bench $op --world $w --shapes $SHAPES --warmup 3 --bench-iters 10"
        "$bin/tilelink" bench "$op" --world "$w" --shapes "$SHAPES" --warmup 3 --bench-iters 10 || status=1
      done
    done
  done
done
exit $status
