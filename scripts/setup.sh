#!/usr/bin/env bash
# Installs what tilelink needs on a fresh Debian machine and configures + builds it.
#   bash scripts/setup.sh [build-dir]      (default: build)
# Installs only what is missing: Debian packages (compiler, CMake, GoogleTest, Google Benchmark,
# OpenMPI for the ipc transport) and the CuTe/CUTLASS headers from PyPI's nvidia-cutlass wheel into
# third_party/ (ignored by git). nvcc is optional: without it only the CPU parts are built.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
CUTLASS_VERSION=4.2.0.0

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev libgmock-dev)
[ -f /usr/include/benchmark/benchmark.h ] || need_apt+=(libbenchmark-dev)
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev openmpi-bin)
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

JOBS=$(nproc)
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${TILELINK_CMAKE_ARGS:-} >/dev/null
# TILELINK_BUILD_TARGETS: build only these targets (the ThreadSanitizer pass of scripts/test.sh).
cmake --build "$BUILD" -j "$JOBS" ${TILELINK_BUILD_TARGETS:+--target $TILELINK_BUILD_TARGETS}
