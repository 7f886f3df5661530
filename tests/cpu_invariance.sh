#!/usr/bin/env bash
# The batch-invariance checks under each of our instruction sets and every
# OpenBLAS core this CPU can execute, with 1 and 2 threads, and check-ddp on
# the shipped examples: none of these may change a forward bit
# (engine/cpu/fixed_gemm.h), so every run must pass. OpenBLAS picks its core
# when it loads, so each setting is its own process. And the backward: a
# short exact training run (engine/exact_batch.h) ends in the same
# checkpoint tensors under every core and thread count (check-ddp proves
# W ranks == 1 rank within one setting; this, one setting == another).
# usage: cpu_invariance.sh TEST_ENGINE TEST_VQ VQDDP EXAMPLES_DIR
set -euo pipefail
test_engine=$1 test_vq=$2 vqddp=$3 examples=$4
log=$(mktemp)
trap 'rm -f "$log"' EXIT

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
cores=(Prescott)
has avx && cores+=(Sandybridge)
has avx2 && has fma && cores+=(Haswell Zen)
has avx512f && cores+=(SkylakeX)
isas=(scalar)
has avx2 && has fma && isas+=(avx2)
has avx512f && has fma && isas+=(avx512)

engine_cases='*fixed_gemm*,*forward matmul*,*encoder*,*forward conv*,*col2im*'
vq_cases='*assign*,*bitwise*'
# doctest passes a filter that matches nothing: insist on the cases we mean.
selected() { "$1" -tc="$2" --count | sed -n 's/.*passing the current filters: //p'; }
[ "$(selected "$test_engine" "$engine_cases")" -ge 7 ] || { echo "FAILED: '$engine_cases' selects too few engine cases"; exit 1; }
[ "$(selected "$test_vq" "$vq_cases")" -ge 10 ] || { echo "FAILED: '$vq_cases' selects too few vq cases"; exit 1; }

# Which setting can move which bits: VQDDP_CPU_ISA picks our own kernels
# (engine/cpu/fixed_gemm.h), the OpenBLAS core and thread count only OpenBLAS's
# (products outside an exact step). So the forward cases run under every
# instruction set with 1 and 2 threads on the first core, and under every
# other core once (the widest instruction set, 1 thread): a core that leaked
# into a forward product shows there, and the cross product of the two
# would add runs, not coverage.
runs=0
check() {  # core threads isa
  echo "== OPENBLAS_CORETYPE=$1 threads=$2 VQDDP_CPU_ISA=$3"
  export OPENBLAS_CORETYPE=$1 OPENBLAS_NUM_THREADS=$2 VQDDP_CPU_ISA=$3 VQDDP_NO_REEXEC=1
  "$test_engine" -tc="$engine_cases" >/dev/null ||
    { echo "FAILED: engine invariance under $1/$2/$3"; "$test_engine" -tc="$engine_cases" | tail -20; exit 1; }
  "$test_vq" -tc="$vq_cases" >/dev/null ||
    { echo "FAILED: vq under $1/$2/$3"; "$test_vq" -tc="$vq_cases" | tail -20; exit 1; }
  runs=$((runs + 1))
}
for isa in "${isas[@]}"; do
  for threads in 1 2; do check "${cores[0]}" "$threads" "$isa"; done
done
for core in "${cores[@]:1}"; do check "$core" 1 "${isas[-1]}"; done

# 3 training steps of the main MLP codec with ARGS (after --steps 3 --dir):
# their checkpoint's tensors must be the first such run's since
# `reference` was cleared. WHAT names the setting in a failure.
reference=""
same_checkpoint() {  # WHAT ARGS...
  local what=$1 run_dir tensors
  shift
  run_dir=$(mktemp -d)
  "$vqddp" train "$examples/speech_codec_mlp.json" --steps 3 --dir "$run_dir" "$@" >"$log" 2>&1 ||
    { echo "FAILED: training under $what"; tail -30 "$log"; exit 1; }
  tensors=$("$vqddp" inspect "$run_dir/checkpoint.safetensors" | grep '^tensor')
  rm -rf "$run_dir"
  [ -n "$reference" ] || { reference=$tensors; reference_what=$what; }
  [ "$tensors" = "$reference" ] ||
    { echo "FAILED: the checkpoint of 3 training steps under $what differs from $reference_what's:";
      diff <(echo "$reference") <(echo "$tensors") | head; exit 1; }
}

# The backward: 3 exact training steps end in the same checkpoint tensors
# under every core and thread count.
for core in "${cores[@]}"; do
  for threads in 1 2; do
    export OPENBLAS_CORETYPE=$core OPENBLAS_NUM_THREADS=$threads
    unset VQDDP_CPU_ISA
    same_checkpoint "$core/$threads" --world 3
  done
done

# run.precision (engine/precision.h): tf32 and bf16 products keep one
# reduction order too, so each ends in one checkpoint under every
# instruction set of ours with 3 ranks, and with 1 rank (the widest set).
precision_runs=0
export OPENBLAS_CORETYPE=${cores[0]} OPENBLAS_NUM_THREADS=2
for precision in tf32 bf16; do
  reference=""
  for setting in "${isas[@]/%/:3}" "${isas[-1]}:1"; do
    export VQDDP_CPU_ISA=${setting%:*}
    same_checkpoint "$precision, instruction set:ranks $setting" --world "${setting#*:}" --precision "$precision"
    precision_runs=$((precision_runs + 1))
  done
done
unset VQDDP_CPU_ISA

# check-ddp (W ranks == 1 rank) on every shipped example under the first
# core; the release suite's "train examples" runs it under the CPU's own.
# The other cores move no bit of an exact step (just compared), so each
# runs it on the main job alone.
export OPENBLAS_CORETYPE=${cores[0]} OPENBLAS_NUM_THREADS=1
for ex in "$examples"/*.json; do
  # speech_codec's model on FLAC copies its test makes (flac_example.sh)
  case $ex in */speech_codec_flac.json) continue ;; esac
  "$vqddp" check-ddp "$ex" --world 4 --steps 1 >"$log" 2>&1 ||
    { echo "FAILED: check-ddp $ex under ${cores[0]}/1"; tail -30 "$log"; exit 1; }
done
for core in "${cores[@]:1}"; do
  export OPENBLAS_CORETYPE=$core
  "$vqddp" check-ddp "$examples/speech_codec.json" --world 4 --steps 1 >"$log" 2>&1 ||
    { echo "FAILED: check-ddp speech_codec.json under $core/1"; tail -30 "$log"; exit 1; }
done
echo "cpu invariance: ${#isas[@]} instruction sets (${isas[*]}) x 2 thread counts, ${#cores[@]} OpenBLAS cores (${cores[*]}): $runs forward runs, $((${#cores[@]} * 2)) training runs, $precision_runs tf32/bf16 runs passed"
