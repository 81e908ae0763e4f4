#!/usr/bin/env bash
# The main job: set up, build, then run both fused ops with verification on the best backend here
# (CUDA when a GPU is present and the op exists there, the CPU backend otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
./build/tilelink info
echo
# Shapes valid on both backends (the CUDA ones need N and K multiples of 8 per rank).
./build/tilelink run ag_gemm --world 3 -m 1000 -n 768 -k 384 --m-split 400,333,267 --comm-tile 64
echo
./build/tilelink run gemm_rs --world 3 -m 1000 -n 768 -k 384 --m-split 400,333,267
