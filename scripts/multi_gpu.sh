#!/usr/bin/env bash
# The multi-GPU sweep on a multi-GPU machine, in one go: topology, NCCL bandwidth at the shapes' message sizes,
# `tilelink bench ag_gemm|gemm_rs` over the peer and ipc transports at world W = the GPU count
# (fused vs cuBLAS+NCCL vs the ideal bound), and PyTorch's async-TP fused ops on the same shapes.
#   bash scripts/multi_gpu.sh [bin-dir]
# bin-dir: a folder holding a prebuilt `tilelink` (e.g. .carry/hB); default build/ (built here by
# scripts/setup.sh). MODE=quick: a first look (tools, topology, checks with the float64 reference on
# small and ragged shapes, one bench row per op and transport, torch on one shape each); MODE=full
# (default): every shape below. W=<n> runs on the first n GPUs instead of all of them.
# PARTS: the steps, in order (default "checks_peer ag_peer rs_peer checks_ipc ag_ipc rs_ipc torch").
# BENCH_ARGS: extra options of every tilelink bench (default "--warmup 3 --bench-iters 10");
# AG_ARGS / RS_ARGS: extra options of the ag_gemm / gemm_rs benches (e.g. --baseline-only);
# TORCH_ARGS: extra options of bench/torch_async_tp.py (default "--warmup 3 --iters 10").
# Every step has a time limit (STEP_LIMIT=<s> caps them all); a step that fails or times out is
# reported and the next one runs. TILELINK_CLI_TRACE=1 traces each shape's steps on stderr.
# Output in $OUT when set (the device machine's result folder), else out/multi_gpu: summary.md (every
# table and verdict, with the commands), env.log, peer.log, ipc.log, torch.log.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [ -z "$BIN" ]; then
  bash scripts/setup.sh build >/dev/null || exit 1
  BIN=build
fi
TL=$(find "$BIN" -maxdepth 3 -type f -name tilelink -perm -u+x | head -1)
[ -n "$TL" ] || { echo "no tilelink executable under $BIN"; exit 1; }
MODE=${MODE:-full}
LOG=${OUT:-out/multi_gpu}
mkdir -p "$LOG"
SUMMARY=$LOG/summary.md
: >"$SUMMARY"

# Never NVLink multicast on shared machines (it can take the host's GPUs down): NCCL, torch, NVSHMEM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# cuBLAS and NCCL live in the Python environment on the GPU machines: torch's own first (its NCCL is
# the version tilelink is built against), then anything else found.
pylibs=$(python3 - <<'PY' 2>/dev/null
import os, site
dirs = []
for sp in site.getsitepackages():
    for lib in ("nvidia/nccl/lib", "nvidia/cublas/lib", "nvidia/cu13/lib"):
        d = os.path.join(sp, lib)
        if os.path.isdir(d):
            dirs.append(d)
print(":".join(dirs))
PY
)
found=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
        xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${pylibs}${found:+:$found}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
W=${W:-$GPUS}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$W" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE
        -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc_per_node="$W")
say() { echo "$*" | tee -a "$SUMMARY"; }
status=0
# run <log> <timeout s> <command...>: the command's output into the log; its tables, verdicts and
# errors into the summary too.
run() {
  local log=$1 limit=$2; shift 2
  [ -n "${STEP_LIMIT:-}" ] && [ "$STEP_LIMIT" -lt "$limit" ] && limit=$STEP_LIMIT
  local t0=$(date +%s)
  echo "\$ $*" >>"$log"
  say ""
  say "\`\$ $*\`"
  timeout "$limit" "$@" >>"$log.tmp" 2>&1
  local rc=$?
  cat "$log.tmp" >>"$log"
  grep -E '^\||^(ag_gemm|gemm_rs) backend=|^(check passed|CHECK FAILED)|shapes (passed|SOME)|rel\. (error|difference)|error|Error|ERROR|Traceback|^\[trace|PyTorch|NCCL [0-9]|float64 reference skipped' \
    "$log.tmp" >>"$SUMMARY"
  rm -f "$log.tmp"
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then say "-> ok (${dt}s)"; else say "-> FAILED rc=$rc (${dt}s)"; status=1; fi
}

# ---- the machine -------------------------------------------------------------------------------
{
  date -u; nvidia-smi -L; nvidia-smi topo -m
  echo "mpirun: $(command -v mpirun || echo none)"; mpirun --version 2>&1 | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$TL" | grep -E 'nccl|cublas|mpi'
} >"$LOG/env.log" 2>&1
say "# multi_gpu.sh MODE=$MODE: world $W of $GPUS GPUs, $(date -u +%FT%TZ)"
say ""
say '```'
nvidia-smi -L | tee -a "$SUMMARY" >/dev/null
nvidia-smi topo -m 2>&1 | tee -a "$SUMMARY" >/dev/null
say '```'
[ "$W" -ge 2 ] || { say "needs 2 GPUs or more, found $GPUS"; exit 1; }
HAVE_MPI=1
command -v mpirun >/dev/null || { HAVE_MPI=0; say "NOTE: no mpirun here: the ipc transport is NOT run"; }

# ---- the shapes: MxNxK, N and K totals over the ranks ---------------------------------
AG_BIG="8192x11008x4096,8192x14336x4096,8192x28672x8192,8192x53248x16384"
AG_SMALL_M="1024x11008x4096,2048x11008x4096,1024x28672x8192,2048x28672x8192"
RS_BIG="8192x4096x11008,8192x4096x14336,8192x8192x28672,8192x8192x29568"
RS_SMALL_M="1024x4096x11008,2048x4096x11008,1024x8192x28672,2048x8192x28672"
# The checks' shapes: small enough for the float64 reference; RAGGED_M makes the baseline's NCCL
# collectives the grouped broadcasts / reduces of uneven segments.
CHECK_AG="1024x2048x1024"
CHECK_RS="1024x1024x2048"
RAGGED_M=$(( 1000 + W / 2 ))  # not a multiple of W (W >= 2)

if [ "$MODE" = quick ]; then
  AG="$CHECK_AG,8192x11008x4096"
  RS="$CHECK_RS,8192x4096x11008"
  TORCH_AG="8192x11008x4096"; TORCH_RS="8192x4096x11008"
else
  AG="$AG_BIG,$AG_SMALL_M"
  RS="$RS_BIG,$RS_SMALL_M"
  TORCH_AG=$AG; TORCH_RS=$RS
fi

PARTS=${PARTS:-checks_peer ag_peer rs_peer checks_ipc ag_ipc rs_ipc torch}
BENCH_ARGS=${BENCH_ARGS:---warmup 3 --bench-iters 10}
TORCH_ARGS=${TORCH_ARGS:---warmup 3 --iters 10}
[ $HAVE_MPI = 1 ] || PARTS=$(echo " $PARTS " | sed 's/ checks_ipc / /; s/ ag_ipc / /; s/ rs_ipc / /')

# ---- tilelink: peer (one process, W GPUs) then ipc (mpirun, one process per GPU) ----------------
# shellcheck disable=SC2086  # BENCH_ARGS, AG_ARGS and RS_ARGS are lists of options
for part in $PARTS; do
  case $part in
    checks_peer)
      say ""; say "## tilelink, peer transport: checks against float64 (ragged M)"
      run "$LOG/peer.log" 90 "$TL" run ag_gemm --backend cuda --transport peer --world "$W" -m "$RAGGED_M" -n 2048 -k 1024 ${AG_ARGS:-}
      run "$LOG/peer.log" 90 "$TL" run gemm_rs --backend cuda --transport peer --world "$W" -m "$RAGGED_M" -n 1024 -k 2048 ${RS_ARGS:-} ;;
    ag_peer)
      say ""; say "## tilelink bench ag_gemm, peer transport"
      run "$LOG/peer.log" 300 "$TL" bench ag_gemm --transport peer --world "$W" --shapes "$AG" $BENCH_ARGS ${AG_ARGS:-} ;;
    rs_peer)
      say ""; say "## tilelink bench gemm_rs, peer transport"
      run "$LOG/peer.log" 300 "$TL" bench gemm_rs --transport peer --world "$W" --shapes "$RS" $BENCH_ARGS ${RS_ARGS:-} ;;
    checks_ipc)
      say ""; say "## tilelink, ipc transport (mpirun -np $W): checks against float64 (ragged M)"
      run "$LOG/ipc.log" 90 "${MPIRUN[@]}" "$TL" run ag_gemm --backend cuda --transport ipc --world "$W" -m "$RAGGED_M" -n 2048 -k 1024 ${AG_ARGS:-}
      run "$LOG/ipc.log" 90 "${MPIRUN[@]}" "$TL" run gemm_rs --backend cuda --transport ipc --world "$W" -m "$RAGGED_M" -n 1024 -k 2048 ${RS_ARGS:-} ;;
    ag_ipc)
      say ""; say "## tilelink bench ag_gemm, ipc transport (mpirun -np $W)"
      run "$LOG/ipc.log" 300 "${MPIRUN[@]}" "$TL" bench ag_gemm --transport ipc --world "$W" --shapes "$AG" $BENCH_ARGS ${AG_ARGS:-} ;;
    rs_ipc)
      say ""; say "## tilelink bench gemm_rs, ipc transport (mpirun -np $W)"
      run "$LOG/ipc.log" 300 "${MPIRUN[@]}" "$TL" bench gemm_rs --transport ipc --world "$W" --shapes "$RS" $BENCH_ARGS ${RS_ARGS:-} ;;
    virtual)  # one GPU, W ranks as green contexts (the build still runs there with NCCL linked in)
      say ""; say "## tilelink, virtual transport (one GPU)"
      run "$LOG/peer.log" 90 "$TL" run ag_gemm --backend cuda --transport virtual --world "$W" -m "$RAGGED_M" -n 2048 -k 1024 ;;
    torch)  # NCCL bandwidth at the shapes' sizes, async-TP fused ops vs matmul + NCCL
      say ""; say "## PyTorch (torch.distributed, NCCL; torch.ops.symm_mem fused ops)"
      run "$LOG/torch.log" 300 "${TORCHRUN[@]}" bench/torch_async_tp.py --nccl-bw --ag "$TORCH_AG" --rs "$TORCH_RS" $TORCH_ARGS ;;
    *) say "unknown part '$part'"; status=1 ;;
  esac
done

say ""
say "multi_gpu.sh: $([ $status = 0 ] && echo 'every step ok' || echo 'SOME STEPS FAILED') (logs: env.log, peer.log, ipc.log, torch.log)"
exit $status
