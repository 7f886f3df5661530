#!/usr/bin/env bash
# What a step could reach if every convolution ran at the GEMM floor, from a
# `vqddp train --profile` log: the convolutions' FLOPs at the floor plus
# the measured time of every other op (elementwise, norms, losses,
# collectives, the optimizer: next to no FLOPs, so no GEMM makes them
# faster). The share of the floor such a step reaches bounds what faster
# conv kernels alone can give; the last figure is the time the other ops
# would have to fit in for a target share.
# usage: scripts/floor_bound.sh PROFILE_LOG [TARGET_SHARE (default 0.6)]
set -euo pipefail
log=$1 target=${2:-0.6}
floor=$(grep "^the world's step:" "$log" | tail -1 | sed -E 's/.*\(([0-9.]+) GFLOP\/s\).*/\1/')
[ -n "$floor" ] || { echo "floor_bound: $log has no --profile table" >&2; exit 1; }
# Columns after the op's name: ms/step share GFLOP/step GFLOP/s floor calls/step launches layout-kB.
awk -v F="$floor" -v T="$target" '
  /^op \(rank 0\)/ { on = 1; next }
  on && /^total/ { on = 0 }
  on && NF >= 9 { ms = $(NF-7); gf = $(NF-5); if ($1 ~ /^conv/) { cm += ms; cg += gf } else { om += ms; og += gf } }
  END {
    at = cg / F * 1000
    printf "convolutions: %.2f ms, %.3f GFLOP a step; every other op: %.2f ms, %.3f GFLOP; floor %s GFLOP/s\n", cm, cg, om, og, F
    printf "convolutions at the floor: %.2f ms, a step of %.2f ms: %.1f%% of the floor at most\n", at, at + om, (cg + og) / F * 1000 / (at + om) * 100
    printf "%.0f%% of the floor: a step of %.2f ms, so every other op in %.2f ms (now %.2f)\n", T * 100, (cg + og) / F * 1000 / T, (cg + og) / F * 1000 / T - at, om
  }' "$log"
