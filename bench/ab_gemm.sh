#!/usr/bin/env bash
# Two builds of the command line, A and B, alternated on one GPU: `tilelink bench gemm` of each,
# ROUNDS rounds, the order of A and B swapped every round, so drift of the GPU's clocks and
# temperature falls on both alike. Compare each shape's ratio and hooks columns of B with A's own
# round-to-round spread.
#   bash bench/ab_gemm.sh A-bin-dir B-bin-dir [rounds (3)] [extra bench gemm flags...]
set -uo pipefail
A=$1
B=$2
ROUNDS=${3:-3}
shift 3 2>/dev/null || shift $#
libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for which in $order; do
    if [ "$which" = A ]; then bin=$A; else bin=$B; fi
    echo "## ab round=$round binary=$which"
    echo "\$ tilelink bench gemm $*"
    "$bin/tilelink" bench gemm "$@" || status=1
  done
done
exit $status
