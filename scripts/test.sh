#!/usr/bin/env bash
# Sets up, builds and runs every test that this machine can run:
#   the CPU test suite (ctest, label cpu), a project outside the tree built against the installed
#   package (tests/consumer: find_package(tilelink)), the same threaded tests under ThreadSanitizer,
#   and the GPU suite (label gpu) when a GPU is present. Without a GPU the CUDA sources are still compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
JOBS=$(nproc)

echo "== ctest (cpu) =="
ctest --test-dir build -L cpu --output-on-failure -j "$JOBS"

echo "== the installed package, from a project outside the tree (tests/consumer) =="
rm -rf build/install build/consumer
cmake --install build --prefix build/install >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/consumer -j "$JOBS" >/dev/null
build/consumer/consumer

echo "== the Python package (pip install ., the CPU backend), pytest =="
# A virtual environment of its own; the CPU parts only (TILELINK_CUDA=OFF), through ccache like the
# rest. tests/python/test_cuda.py needs a GPU and a CUDA build (scripts/gpu_check.sh runs it).
python3 -m venv build/python-venv
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
build/python-venv/bin/python -m pip install -q --upgrade pip >/dev/null
build/python-venv/bin/python -m pip install -q ".[test]" -Ccmake.define.TILELINK_CUDA=OFF
(cd build && python-venv/bin/python -m pytest -q ../tests/python/test_cpu.py)

echo "== ctest (cpu, ThreadSanitizer) =="
# Only the threaded executables (label tsan) are built here.
TILELINK_CMAKE_ARGS="-DTILELINK_TSAN=ON" \
  TILELINK_BUILD_TARGETS=tsan_tests \
  bash scripts/setup.sh build-tsan >/dev/null
TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-tsan -L tsan --output-on-failure -j "$JOBS"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== ctest (gpu) =="
  ctest --test-dir build -L gpu --output-on-failure
else
  echo "== no GPU here: CUDA sources compiled, GPU tests (label gpu) not run =="
fi
