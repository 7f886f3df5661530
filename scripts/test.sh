#!/usr/bin/env bash
# The whole test suite: install what is missing, then build and test three
# times: a release build (with CUDA when the toolkit is there; the GPU suite
# skips without a GPU), a CPU-only AddressSanitizer+UBSan build, and a
# ThreadSanitizer build of the multi-rank suites (findings are fatal in both).
# VQDDP_TEST_QUICK=1 skips the sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

start=$SECONDS
# Sanitizer builds: -O1 with line tables, about 40% faster to build than
# debugoptimized, same findings. CUDA off: host code is what they check, and
# nvcc stays out of the slower builds. Unity builds (four sources a
# translation unit: every header parsed once per four files): the ASan
# build in 124 s instead of about 185 on two cores. The price: two
# file-local helpers of one name in one target clash there, so give each
# shared helper one home (tests/engine/same_bits.h) and local ones their own
# names.
sanitized=(--buildtype=plain -Doptimization=1 -Dcpp_args=-g1 -Dcuda=disabled --unity on)

# Each phase's seconds, printed at the end: where the suite's time goes.
phases=()
phase() { phases+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; }
mark=$SECONDS

bash scripts/build.sh build --buildtype=release
phase "release build"
meson test -C build --print-errorlogs
phase "release tests"
logs=(build/meson-logs/testlog.txt)
if [ "${VQDDP_TEST_QUICK:-0}" != 1 ]; then
  # AddressSanitizer + UBSan, every test but the invariance suite (numerics,
  # covered above). This build is also the CPU-only configuration: a build
  # without the toolkit must work and pass.
  bash scripts/build.sh build-asan "${sanitized[@]}" -Db_sanitize=address,undefined
  phase "asan build"
  ASAN_OPTIONS=detect_leaks=1 meson test -C build-asan --print-errorlogs --no-suite invariance
  phase "asan tests"
  # ThreadSanitizer on the multi-rank suites (comm, vq, train: every rank a
  # thread of one process), findings fatal. Only their executables are
  # built. OpenBLAS runs single-threaded: its own threads are not
  # instrumented and would be reported as races with themselves.
  bash scripts/build.sh build-tsan "${sanitized[@]}" -Dtsan=true -- tests/test_comm tests/test_vq tests/test_train
  phase "tsan build"
  OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
    meson test -C build-tsan --no-rebuild --print-errorlogs --timeout-multiplier 2 comm vq train "train ddp" "train codec" "train examples"
  phase "tsan tests"
  logs+=(build-asan/meson-logs/testlog.txt build-tsan/meson-logs/testlog.txt)
fi
# One closing line with the doctest case counts of every suite that ran.
# (No skipped count: doctest counts the cases a run filters out as skipped,
# and the train suite runs as four filtered parts.)
awk '/\[doctest\] test cases:/ { p += $6; f += $9 }
     END { printf "doctest: %d passed, %d failed\n", p, f }' "${logs[@]}"
echo "phases: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g')"
echo "test suite finished in $((SECONDS - start)) s"
