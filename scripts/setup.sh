#!/usr/bin/env bash
# Installs what tilelink needs on a fresh Debian machine and configures + builds it.
#   bash scripts/setup.sh [build-dir]      (default: build)
# Installs only what is missing: Debian packages (compiler, CMake, GoogleTest, Google Benchmark,
# OpenMPI for the ipc transport, ccache), the CuTe/CUTLASS headers from PyPI's nvidia-cutlass wheel and NCCL
# (header and library, for the fused ops' cuBLAS+NCCL baselines) from PyPI's nvidia-nccl-cu13 wheel,
# both into third_party/ (ignored by git). nvcc is optional: without it only the CPU parts are built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
CUTLASS_VERSION=4.2.0.0
# NOTE: the NCCL of torch 2.11 (cu130) on the GPU machines, whose libnccl.so.2 the binaries load there.
NCCL_VERSION=2.28.9

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev libgmock-dev)
[ -f /usr/include/benchmark/benchmark.h ] || need_apt+=(libbenchmark-dev)
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev openmpi-bin)
command -v ccache >/dev/null || need_apt+=(ccache)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# CuTe / CUTLASS headers (header-only), pinned, from PyPI.
if [ ! -f third_party/cutlass/include/cute/tensor.hpp ] || \
   [ "$(cat third_party/cutlass/VERSION 2>/dev/null)" != "$CUTLASS_VERSION" ]; then
  echo "setup: fetching CUTLASS/CuTe headers (nvidia-cutlass==$CUTLASS_VERSION) from PyPI"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$CUTLASS_VERSION" -d "$tmp"
  rm -rf third_party/cutlass && mkdir -p third_party/cutlass
  python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nvidia_cutlass-*.whl")[0]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = "third_party/cutlass/include/" + name[len(prefix):]
            import os; os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f: f.write(z.read(name))
PY
  echo "$CUTLASS_VERSION" > third_party/cutlass/VERSION
  rm -rf "$tmp"
fi

# NCCL (nccl.h and libnccl.so.2), pinned, from PyPI; CMake requires it when it builds the CUDA parts.
if [ ! -f third_party/nccl/include/nccl.h ] || [ ! -f third_party/nccl/lib/libnccl.so.2 ] || \
   [ "$(cat third_party/nccl/VERSION 2>/dev/null)" != "$NCCL_VERSION" ]; then
  echo "setup: fetching NCCL (nvidia-nccl-cu13==$NCCL_VERSION) from PyPI"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-nccl-cu13==$NCCL_VERSION" -d "$tmp"
  rm -rf third_party/nccl && mkdir -p third_party/nccl/include third_party/nccl/lib
  python3 - "$tmp" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nvidia_nccl_cu13-*.whl")[0]
prefix = "nvidia/nccl/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        rel = name[len(prefix):]
        if name.startswith(prefix) and (rel.startswith("include/") or rel == "lib/libnccl.so.2") \
                and not name.endswith("/"):
            out = "third_party/nccl/" + rel
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f: f.write(z.read(name))
PY
  ln -sf libnccl.so.2 third_party/nccl/lib/libnccl.so
  echo "$NCCL_VERSION" > third_party/nccl/VERSION
  rm -rf "$tmp"
fi

JOBS=$(nproc)
# A compiler cache (ccache, in $HOME/.cache/ccache): a rebuild of what did not change takes seconds
# instead of the CUDA build's half hour. A fresh checkout at the same path hits for every source; at
# another path (CCACHE_BASEDIR) only the host C++ sources hit (nvcc's preprocessed output holds the
# headers' absolute paths). TILELINK_NO_CCACHE=1 builds without it.
launcher=()
if command -v ccache >/dev/null && [ -z "${TILELINK_NO_CCACHE:-}" ]; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" ${TILELINK_CMAKE_ARGS:-} >/dev/null
# TILELINK_BUILD_TARGETS: build only these targets (the ThreadSanitizer pass of scripts/test.sh).
cmake --build "$BUILD" -j "$JOBS" ${TILELINK_BUILD_TARGETS:+--target $TILELINK_BUILD_TARGETS}
