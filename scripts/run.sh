#!/usr/bin/env bash
# The main job: set up, build, then run both fused ops with verification on the best backend here
# (CUDA when a GPU is present and the op exists there, the CPU backend otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
./build/tilelink info
echo
./build/tilelink run ag_gemm --world 3 -m 1000 -n 384 -k 256 --m-split 400,333,267 --comm-tile 64
echo
./build/tilelink run gemm_rs --world 3 -m 1000 -n 384 -k 256 --m-split 400,333,267 --variant push
