#!/usr/bin/env bash
# The whole test suite: install what is missing, then build and test twice,
# a release build (with CUDA when the toolkit is there; the GPU suite skips
# without a GPU) and a CPU-only AddressSanitizer+UBSan build (findings are fatal).
# VQDDP_TEST_QUICK=1 skips the sanitizer build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

start=$SECONDS
run_suite() {
  local dir=$1
  shift
  bash scripts/build.sh "$dir" "$@"
  meson test -C "$dir" --print-errorlogs
}

run_suite build --buildtype=release
if [ "${VQDDP_TEST_QUICK:-0}" != 1 ]; then
  # -O1 with line tables: about 40% faster to build than debugoptimized, same findings.
  # CUDA off here: this build is also the CPU-only configuration (a build
  # without the toolkit must work and pass), host code is what ASan checks,
  # and nvcc stays out of the slower build.
  ASAN_OPTIONS=detect_leaks=1 run_suite build-asan --buildtype=plain -Doptimization=1 -Dcpp_args=-g1 \
    -Db_sanitize=address,undefined -Dcuda=disabled
fi
# One closing line with the doctest case counts of every suite that ran.
awk '/\[doctest\] test cases:/ { p += $6; f += $9; s += $12 }
     END { printf "doctest: %d passed, %d failed, %d skipped\n", p, f, s }' \
  build/meson-logs/testlog.txt $( [ -f build-asan/meson-logs/testlog.txt ] && [ "${VQDDP_TEST_QUICK:-0}" != 1 ] && echo build-asan/meson-logs/testlog.txt )
echo "test suite finished in $((SECONDS - start)) s"
