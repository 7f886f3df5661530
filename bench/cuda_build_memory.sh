#!/bin/sh
# Peak resident memory of a CUDA build against a CPU-only build of the same
# tree, on the CPU: `vqddp --help` and the main job for STEPS steps (with its
# validation at the end), the two builds alternating, ROUNDS times. Prints
# each run's peak (GNU time's maximum resident set) and the ratios
# CUDA / CPU-only; the CUDA code is loaded only when a cuda device is used
# (engine/cuda_module.h), so both should be ~1.
#   bench/cuda_build_memory.sh CPU_BUILD CUDA_BUILD [STEPS] [ROUNDS]
# e.g. bench/cuda_build_memory.sh build build-cuda 300 3
set -eu
cpu=$1
cuda=$2
steps=${3:-300}
rounds=${4:-3}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -x /usr/bin/time ] || { echo "needs GNU time (apt-get install time)" >&2; exit 1; }
peak() {  # peak KB of the command
  /usr/bin/time -f '%M' -o "$work/peak" "$@" > /dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }
  cat "$work/peak"
}
for r in $(seq "$rounds"); do
  for b in "$cpu" "$cuda"; do
    h=$(peak "$b/vqddp" --help)
    t=$(peak "$b/vqddp" train "$src/examples/speech_codec.json" --steps "$steps" --dir "$work/run" --overwrite)
    echo "round $r $b: --help $h KB, main job ($steps steps) $t KB"
    echo "$b $h $t" >> "$work/all"
  done
done
awk -v cpu="$cpu" -v cuda="$cuda" '
  $1 == cpu { ch += $2; ct += $3; n++ }
  $1 == cuda { gh += $2; gt += $3 }
  END { printf "CUDA build / CPU-only build, mean of %d rounds: --help %.3f, main job %.3f\n", n, gh / ch, gt / ct }' "$work/all"
