#!/usr/bin/env bash
# The one script that runs every GPU test and the primitive benchmark on a machine with a GPU.
#   bash scripts/gpu_check.sh [bin-dir]
# bin-dir: a folder of prebuilt executables (gpu_test_*, gpu_ipc_*, tilelink), e.g. the
# .carry/cuda folder built on another machine; default: build/ (built here by scripts/setup.sh).
# TILELINK_GPU_TESTS: a regex of test executables to run (default: all).
# Logs go to $OUT when set (the device machine's result folder), else out/gpu_check; at most a few
# files: summary.txt, tests.log, bench_prim.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [ -z "$BIN" ]; then
  bash scripts/setup.sh build >/dev/null || exit 1
  BIN=build
fi
LOG=${OUT:-out/gpu_check}
mkdir -p "$LOG"
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
: >"$LOG/tests.log"

# The CUDA libraries (cuBLAS, NCCL) live in the Python environment on the GPU machines.
libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Never NVLink multicast on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi -L >>"$SUMMARY" 2>&1 || echo "no nvidia-smi" >>"$SUMMARY"
status=0
run() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  echo "===== $name: $*" >>"$LOG/tests.log"
  timeout "${TILELINK_TEST_TIMEOUT:-300}" "$@" >>"$LOG/tests.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then echo "PASS $name (${dt}s)" | tee -a "$SUMMARY"
  else echo "FAIL $name rc=$rc (${dt}s)" | tee -a "$SUMMARY"; status=1; fi
}

for t in $(find "$BIN" -maxdepth 3 -type f -name 'gpu_test_*' -perm -u+x | sort); do
  name=$(basename "$t")
  [[ -n "${TILELINK_GPU_TESTS:-}" && ! "$name" =~ ${TILELINK_GPU_TESTS} ]] && continue
  run "$name" "$t"
done
ipcs=$(find "$BIN" -maxdepth 3 -type f -name 'gpu_ipc_*' -perm -u+x | sort)
if [ -n "$ipcs" ] && command -v mpirun >/dev/null; then
  for ipc in $ipcs; do
    name=$(basename "$ipc")
    [[ -n "${TILELINK_GPU_TESTS:-}" && ! "$name" =~ ${TILELINK_GPU_TESTS} ]] && continue
    # NOTE: each rank takes GPU (node-local rank % GPUs) (runtime/world.hpp): on a machine of two GPUs
    # or more the two ranks sit on GPUs 0 and 1 (ipc_allgather checks it), on one GPU they share it.
    run "$name" mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS "$ipc"
  done
  grep -h "^ipc_allgather: [0-9]* ranks" "$LOG/tests.log" | tail -1 >>"$SUMMARY"
else
  echo "SKIP gpu_ipc_* (no binary or no mpirun)" | tee -a "$SUMMARY"
fi
# The Python package on the GPU: tests/python/test_cuda.py (torch tensors on virtual ranks), the
# virtual-rank MLP example, and under torchrun (two processes, one per GPU where there are two GPUs,
# else sharing one) tests/python/torchrun_check.py and the MLP example against torch.distributed.
# From $BIN/python (a tilelink folder holding the _tilelink module built with CUDA for this machine's
# python3, e.g. build/ after a CMake build with -DTILELINK_PYTHON=ON, copied beside python/tilelink's
# sources), else an installed one (pip install .).
py=()
if [ -d "$BIN/python/tilelink" ]; then
  py=(env PYTHONPATH="$BIN/python${PYTHONPATH:+:$PYTHONPATH}")
fi
if [ -d "$BIN/python/tilelink" ] ||
   python3 -c "import tilelink, sys; sys.exit(0 if tilelink.has_cuda else 1)" 2>/dev/null; then
  torchrun=(python3 -m torch.distributed.run --standalone --nproc-per-node 2)
  run python_cuda "${py[@]}" python3 -m pytest -q -s tests/python/test_cuda.py
  run python_tp_mlp_1 "${py[@]}" python3 examples/python/tp_mlp_virtual.py --world 1 --backend cuda
  run python_tp_mlp_2 "${py[@]}" python3 examples/python/tp_mlp_virtual.py --world 2 --backend cuda
  run python_torchrun "${py[@]}" "${torchrun[@]}" tests/python/torchrun_check.py
  grep -h "^torchrun_check: " "$LOG/tests.log" | tail -1 >>"$SUMMARY"
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  mlp_args=(--tokens 1024 --hidden 1024 --ffn 2048 --iters 3)  # ranks sharing one GPU: correctness only
  [ "$gpus" -ge 2 ] && mlp_args=()                              # one GPU each: Llama-3-8B's MLP, timed
  run python_tp_mlp_torchrun "${py[@]}" "${torchrun[@]}" examples/python/tp_mlp.py "${mlp_args[@]}"
  grep -h "^tp_mlp: world" "$LOG/tests.log" | tail -2 >>"$SUMMARY"
else
  echo "SKIP python_cuda (no tilelink package with CUDA: pip install . here, or a built one in $BIN/python)" |
    tee -a "$SUMMARY"
fi
cli=$(find "$BIN" -maxdepth 3 -type f -name 'tilelink' -perm -u+x | head -1)
if [ -n "$cli" ]; then
  echo "\$ tilelink bench prim ${TILELINK_BENCH_PRIM_ARGS:-}" >"$LOG/bench_prim.txt"
  timeout 300 "$cli" bench prim ${TILELINK_BENCH_PRIM_ARGS:-} >>"$LOG/bench_prim.txt" 2>&1 &&
    echo "PASS bench prim" | tee -a "$SUMMARY" || { echo "FAIL bench prim" | tee -a "$SUMMARY"; status=1; }
  cat "$LOG/bench_prim.txt"
fi
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]|^\[  SKIPPED \]" "$LOG/tests.log" >>"$SUMMARY"
echo "== summary ==" && cat "$SUMMARY"
exit $status
