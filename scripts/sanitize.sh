#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck) over the GPU tests, one process per test.
#   bash scripts/sanitize.sh [bin-dir]
# bin-dir: a folder holding the gpu_test_* executables (default: build/tests).
# TILELINK_SANITIZE_TOOLS: the tools (default "memcheck racecheck synccheck").
# Which tests each tool runs, which none runs and which trap on purpose: tests/gpu/sanitizer.txt.
# TILELINK_SANITIZE_TESTS: a regex of Suite.Test names, to run fewer.
# TILELINK_SANITIZE_ALL=1: every test (but the skipped) under every tool, not only the lists.
# TILELINK_SANITIZE_JOBS: tests run at once (default 8; 16 ran one H200 out of memory); TILELINK_SANITIZE_TIMEOUT: seconds a test
#   may take under the tool (default 300).
# Logs go to $OUT when set, else out/sanitize: summary.txt (one line per test and tool, then the
# totals) and one log per failing test.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/tests}
LOG=${OUT:-out/sanitize}
mkdir -p "$LOG/fail"
SUMMARY=$LOG/summary.txt
: >"$SUMMARY"
TOOLS=${TILELINK_SANITIZE_TOOLS:-memcheck racecheck synccheck}
JOBS=${TILELINK_SANITIZE_JOBS:-8}
LIMIT=${TILELINK_SANITIZE_TIMEOUT:-300}
LISTS=tests/gpu/sanitizer.txt

libdirs=$(find /opt /usr /root /home -name 'libcublas.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
          xargs -r -n1 dirname | sort -u | paste -sd: -)
export LD_LIBRARY_PATH=${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
# The GPU fuzzer at a size a sanitizer run can take (gpu_test_op_registry).
export TILELINK_GPU_FUZZ_CASES=${TILELINK_GPU_FUZZ_CASES:-2}
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$SAN" ] || { echo "sanitize: no compute-sanitizer on this machine" | tee -a "$SUMMARY"; exit 1; }
"$SAN" --version | tail -1 >>"$SUMMARY"

# The tests a tool runs (tests/gpu/sanitizer.txt): those its regex matches, less the skipped ones.
pattern() { awk -v t="$1:" '$1 == t { print $2 }' "$LISTS"; }
words() { awk -v t="$1:" '$1 == t { for (i = 2; i <= NF; ++i) printf "%s ", $i }' "$LISTS"; }
skip=" $(words skip)"
expect_trap=" $(words expect-trap)"
# Time bounds of the fault tests stretched by this much (tests/support/gpu.hpp, time_scale).
export TILELINK_TEST_TIME_SCALE=${TILELINK_TEST_TIME_SCALE:-20}

jobs_file=$LOG/jobs.txt
: >"$jobs_file"
rm -f "$LOG/retry.txt"
for exe in $(find "$BIN" -maxdepth 2 -type f -name 'gpu_test_*' -perm -u+x | sort); do
  tests=$("$exe" --gtest_list_tests 2>/dev/null | awk '/^[^ ]/ { s = $1 } /^  / { print s $1 }')
  for tool in $TOOLS; do
    re=$(pattern "$tool")
    for t in $tests; do
      [[ "$skip" == *" $t "* ]] && continue
      if [ "${TILELINK_SANITIZE_ALL:-0}" != 1 ] && { [ -z "$re" ] || [[ ! "$t" =~ $re ]]; }; then continue; fi
      [[ -n "${TILELINK_SANITIZE_TESTS:-}" && ! "$t" =~ ${TILELINK_SANITIZE_TESTS} ]] && continue
      echo "$tool $exe $t" >>"$jobs_file"
    done
  done
done
[ -s "$jobs_file" ] || { echo "sanitize: no test to run" | tee -a "$SUMMARY"; exit 1; }

one() {  # tool exe test
  local tool=$1 exe=$2 t=$3 log t0 rc errors verdict
  log=$(mktemp)
  t0=$(date +%s)
  timeout "$LIMIT" "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 20 \
    "$exe" --gtest_filter="$t" >"$log" 2>&1
  rc=$?
  # memcheck and synccheck: "ERROR SUMMARY: n errors"; racecheck: "RACECHECK SUMMARY: h hazards
  # displayed (n errors, w warnings)"
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: .*\([0-9]+ errors' "$log" | tail -1 |
           grep -oE '[0-9]+( errors)?$' | grep -oE '^[0-9]+')
  if [ $rc -eq 0 ] && [ "${errors:-x}" = 0 ]; then verdict=PASS
  elif [[ "$expect_trap" == *" $t "* ]] && [ $rc -ne 124 ] &&
       ! grep -E '^========= +(Invalid|Illegal|Race|Barrier|Divergent|Uninitialized|Out-of-range|Misaligned)' "$log" >/dev/null &&
       grep -q 'PASSED' "$log" && ! grep -q 'FAILED' "$log"; then verdict=PASS-TRAP
  elif grep -qE 'cudaErrorMemoryAllocation.*(cudaSetDevice|cuCtx|cuGreenCtx|cudaFree\b)|CUDA_ERROR_OUT_OF_MEMORY' "$log" &&
       [ "${SANITIZE_PASS:-1}" = 1 ]; then
    # the device ran out of memory making this test's contexts beside the others': run it again
    # with fewer at once (below), not a finding
    verdict=RETRY
    echo "$tool $exe $t" >>"$LOG/retry.txt"
  else verdict=FAIL; fi
  [ $rc -eq 124 ] && verdict="$verdict(timeout)"
  # NOTE: the lines of a test are printed at once, so parallel tests do not interleave them.
  local out
  out=$(printf '%-10s %-9s %-15s %-60s %4ss errors=%s\n' "$verdict" "$tool" "$(basename "$exe")" "$t" \
    "$(( $(date +%s) - t0 ))" "${errors:--}"
  if [[ $verdict == FAIL* ]] || [[ $verdict == PASS-TRAP ]]; then
    cp "$log" "$LOG/fail/$tool.$t.log"
    # what the tool found (each kind once) and the test's own failures, on the summary's next line
    { grep -E '^========= +[A-Z][a-z]' "$log" | grep -vE 'COMPUTE-SANITIZER|ERROR SUMMARY|Saved host|Host Frame|Device Frame' |
        sed -E 's/^=+ +//' | sort | uniq -c | sort -rn | head -4
      grep -E 'Failure$|^Expected|^Value of|C\+\+ exception' "$log" | grep -v '^=' | head -4; } |
      sed -E 's/^ +/      /; s/^([^ ])/      \1/' | cut -c1-200
  fi)
  printf '%s\n' "$out"
  rm -f "$log"
}
export -f one
export SAN LIMIT LOG expect_trap TILELINK_TEST_TIME_SCALE SANITIZE_PASS=1
xargs -P "$JOBS" -L 1 bash -c 'one "$@"' _ <"$jobs_file" | tee -a "$SUMMARY.tmp"
# The tests whose contexts found the device out of memory, again, two at once.
if [ -s "$LOG/retry.txt" ]; then
  echo "sanitize: $(wc -l <"$LOG/retry.txt") tests again, two at once (out of device memory beside the others)" |
    tee -a "$SUMMARY.tmp"
  SANITIZE_PASS=2 xargs -P 2 -L 1 bash -c 'one "$@"' _ <"$LOG/retry.txt" | tee -a "$SUMMARY.tmp"
fi
cat "$SUMMARY.tmp" >>"$SUMMARY"  # each verdict with its digest lines below it
rm -f "$SUMMARY.tmp" "$jobs_file" "$LOG/retry.txt"
total=$(grep -cE '^(PASS|FAIL)' "$SUMMARY")  # a RETRY line is counted by its second run
failed=$(grep -cE '^FAIL' "$SUMMARY")
echo "sanitize: $total runs, $((total - failed)) clean, $failed failed ($TOOLS)" | tee -a "$SUMMARY"
[ "$failed" = 0 ]
