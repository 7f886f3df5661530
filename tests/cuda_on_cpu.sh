#!/bin/sh
# A CUDA build on CPUs (engine/cuda_module.h): `vqddp --help` and a CPU run
# map no CUDA library; a cuda device loads every CUDA module (a missing
# library or symbol named at the start); and where the CUDA runtime is
# gone, CPU runs still work and a cuda device names what is missing.
# The loader's own trace (LD_DEBUG=files) says what was mapped.
#   cuda_on_cpu.sh VQDDP SOURCE_DIR CUDA_BUILT(true|false)
set -eu
v=$1
src=$2
built=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "cuda_on_cpu: FAIL: $*" >&2
  exit 1
}
cuda_libs='libcudart|libcublas|libnccl|libcuda\.so|libvqddp_cuda|libvqddp_nccl'
# The main job on one rank, 2 steps of 4 examples on 20 clips a source.
sed -e 's/"world_size": 4/"world_size": 1/' -e 's/"holdout_every": 10,/"holdout_every": 10, "max_files": 20,/' \
  -e 's/"batch_size": 16/"batch_size": 4/' "$src/examples/speech_codec.json" > "$work/codec.json"
grep -q '"max_files": 20' "$work/codec.json" || fail "the config edit did not happen"

# 1. Nothing of CUDA is mapped by --help or by a CPU run.
LD_DEBUG=files "$v" --help > /dev/null 2> "$work/help.trace"
grep -q 'file=libfmt' "$work/help.trace" || fail "LD_DEBUG gave no trace (is the loader glibc's?)"
! grep -E "$cuda_libs" "$work/help.trace" || fail "vqddp --help mapped a CUDA library"
LD_DEBUG=files "$v" train "$work/codec.json" --steps 2 --dir "$work/cpu" > "$work/cpu.out" 2> "$work/cpu.trace" ||
  { tail -5 "$work/cpu.trace"; fail "the CPU run failed"; }
! grep -E "$cuda_libs" "$work/cpu.trace" || fail "a CPU run mapped a CUDA library"
echo "cuda_on_cpu: --help and a CPU run map no CUDA library"

# 2. A cuda device: every module loads (or the build says it has no CUDA).
status=0
LD_DEBUG=files "$v" train "$work/codec.json" --steps 1 --device cuda --dir "$work/gpu" > "$work/gpu.out" \
  2> "$work/gpu.trace" || status=$?
message=$(grep '^vqddp: error' "$work/gpu.trace" || true)
if [ "$built" != true ]; then
  grep -q 'built without CUDA' "$work/gpu.trace" || fail "a CPU-only build's cuda device said: $message"
  echo "cuda_on_cpu: a CPU-only build refuses cuda: $message"
  exit 0
fi
for m in libvqddp_cuda.so libvqddp_cuda_vq.so libvqddp_nccl.so; do
  grep -q "file=.*/$m .*dynamically loaded" "$work/gpu.trace" || fail "--device cuda did not load $m: $message"
done
[ "$status" = 0 ] || grep -q 'has no CUDA device' "$work/gpu.trace" ||
  fail "--device cuda failed other than for want of a GPU: $message"
echo "cuda_on_cpu: --device cuda loads the three modules (${message:-a GPU ran it})"

# 3. The CUDA runtime gone (the toolkit's folder hidden by an empty one in a
# mount namespace of this test's own): the CPU run still works, and a cuda
# device names the missing library.
if [ "$(id -u)" != 0 ] || ! unshare -m true 2> /dev/null; then
  echo "cuda_on_cpu: no mount namespace here: the missing-runtime case skipped"
  exit 0
fi
toolkit=$(realpath "${CUDA_PATH:-/usr/local/cuda}")
mkdir "$work/empty"
unshare -m --propagation private sh -c '
  mount --bind "$1" "$2" || exit 9
  unset LD_LIBRARY_PATH
  for lib in $(ldconfig -p | sed -n "s/.*libcudart\.so.* => //p"); do [ -e "$lib" ] && exit 8; done
  "$3" train "$4/codec.json" --steps 2 --dir "$4/hidden-cpu" > "$4/hidden-cpu.out" 2>&1 || exit 7
  "$3" train "$4/codec.json" --steps 1 --device cuda --dir "$4/hidden-gpu" > "$4/hidden-gpu.out" 2>&1 && exit 6
  exit 0' sh "$work/empty" "$toolkit" "$v" "$work" || case $? in
  9) echo "cuda_on_cpu: cannot bind-mount here: the missing-runtime case skipped"; exit 0 ;;
  8) echo "cuda_on_cpu: the CUDA runtime is also on the system's library path: the missing-runtime case skipped"; exit 0 ;;
  7) cat "$work/hidden-cpu.out"; fail "without the CUDA runtime, the CPU run failed" ;;
  6) fail "without the CUDA runtime, --device cuda ran" ;;
  *) fail "the namespace failed" ;;
esac
missing=$(grep '^vqddp: error' "$work/hidden-gpu.out" || true)
echo "$missing" | grep -q 'CUDA cannot be used: .*libvqddp_cuda.so could not be loaded: libcudart.so.*cannot open' ||
  fail "without the CUDA runtime, --device cuda said: $missing"
echo "cuda_on_cpu: without the CUDA runtime the CPU run works, and cuda says: $missing"
