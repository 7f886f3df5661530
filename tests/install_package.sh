#!/usr/bin/env bash
# The installed package as a user sees it: `meson install` into a temporary
# root, then programs built with pkg-config alone (no include path into the
# source tree, no build directory):
#   1. tests/package/umbrella.cpp: includes only <vqddp/vqddp.h>, links the
#      shared library (g++ and `pkg-config --cflags --libs vqddp`);
#   2. examples/embed: its own meson.build (dependency('vqddp')), trained
#      for a few steps on 2 thread ranks, then resumed from its checkpoint
#      (which must end where an uninterrupted run ends);
#   3. a parent meson project that takes vqddp as a subproject (configured).
# Also: every header of the library's folders is installed and included by
# the umbrella header, and vqddp.pc names its requirements.
# usage: install_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install_package: $*" >&2; exit 1; }

root=$tmp/root
meson install -C "$build" --destdir "$root" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "meson install failed"; }
pc=$(find "$root" -name vqddp.pc)
[ -n "$pc" ] || fail "no vqddp.pc installed"
prefix=$(sed -n 's/^prefix=//p' "$pc")
# Relocate: the .pc file names the configured prefix; the files are under
# the temporary root. Only vqddp.pc is rewritten (its Requires are the
# system's own .pc files).
sed -i "s#^prefix=.*#prefix=$root$prefix#" "$pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir vqddp)
export LD_LIBRARY_PATH=$libdir
inc=$root$prefix/include/vqddp

# Requirements the issue promises (CUDA and NCCL appear as libraries: the
# toolkit ships no .pc file).
requires=$(pkg-config --print-requires vqddp)
for r in fmt nlohmann_json openblas; do
  grep -qw "$r" <<<"$requires" || fail "vqddp.pc does not require $r (Requires: $requires)"
done
[ -f "$libdir/libvqddp.a" ] || fail "no static library in $libdir"
ls "$libdir"/libvqddp.so* >/dev/null 2>&1 || fail "no shared library in $libdir"
# The library links no CUDA library (engine/cuda_module.h). A CUDA build
# installs its modules in <libdir>/vqddp, each keeping the toolkit's lib64
# as its run path (no loader path of a fresh machine has it; meson install
# would drop it).
dynamic=$(readelf -d "$libdir/libvqddp.so")  # whole, as ldd's below: no SIGPIPE under pipefail
! grep -Eq 'NEEDED.*(cuda|cublas|nccl)' <<<"$dynamic" ||
  fail "the installed libvqddp.so links a CUDA library: $(grep NEEDED <<<"$dynamic")"
if [ "$(pkg-config --variable=cuda vqddp)" = true ]; then
  for m in libvqddp_cuda.so libvqddp_cuda_vq.so libvqddp_nccl.so; do
    [ -f "$libdir/vqddp/$m" ] || fail "the CUDA module $m is not installed in $libdir/vqddp"
    dynamic=$(readelf -d "$libdir/vqddp/$m")
    grep -q 'RUNPATH.*cuda' <<<"$dynamic" ||
      fail "the installed $m has no run path to the CUDA toolkit: $(grep -i path <<<"$dynamic")"
  done
fi

# Every header of the library's folders is installed and in the umbrella,
# but those marked "Internal header" (and the CUDA launch headers,
# *_launch.h), which are neither; and no installed header includes one that
# is not installed (a public header may not lean on an internal one).
for d in engine engine/core comm vq vq/kernels train data; do
  for h in "$src/$d"/*.h; do
    case "$h" in *_launch.h) continue ;; esac
    name=$d/$(basename "$h")
    if grep -q '^// Internal header: not installed' "$h"; then
      [ ! -f "$inc/$name" ] || fail "$name is marked internal but installed (remove it from $d/meson.build's install_headers)"
      ! grep -q "#include \"$name\"" "$inc/vqddp.h" || fail "$name is marked internal but included by vqddp/vqddp.h"
    else
      [ -f "$inc/$name" ] || fail "$name is not installed (add it to $d/meson.build's install_headers, or mark it internal)"
      grep -q "#include \"$name\"" "$inc/vqddp.h" || fail "$name is not included by vqddp/vqddp.h"
    fi
  done
done
while IFS= read -r installed; do
  rel=${installed#"$inc"/}
  { grep -o '^#include "[^"]*"' "$installed" || true; } | sed 's/#include "\(.*\)"/\1/' | while IFS= read -r dep; do
    [ -f "$inc/$dep" ] || fail "the installed $rel includes $dep, which is not installed"
  done
done < <(find "$inc" -name '*.h')

# 1. The umbrella header alone, the shared library, pkg-config alone.
mkdir "$tmp/umbrella"
(cd "$tmp/umbrella" &&
  g++ -std=c++20 -O1 "$src/tests/package/umbrella.cpp" -o umbrella $(pkg-config --cflags --libs vqddp)) ||
  fail "the umbrella program did not build against the installed package"
# Output taken whole before grep -q reads it: under pipefail, `ldd | grep
# -q` fails when grep exits at the match and ldd's next write gets SIGPIPE
# (it did, once, on a fresh root).
linked=$(ldd "$tmp/umbrella/umbrella")
grep -q "libvqddp.so.*$libdir" <<<"$linked" || fail "the umbrella program does not link the installed shared library"
out=$("$tmp/umbrella/umbrella")
echo "$out"
grep -q "umbrella: quantized 32x8, 32 indices, loss finite 1" <<<"$out" || fail "unexpected umbrella output"
# Where the library was moved (the temporary root), its CUDA modules are
# still found beside it and load against it.
if [ "$(pkg-config --variable=cuda vqddp)" = true ]; then
  grep -q "umbrella: cuda usable" <<<"$out" || fail "the installed library cannot load its CUDA modules: $out"
else
  grep -q "umbrella: cuda .*built without CUDA" <<<"$out" || fail "unexpected umbrella output: $out"
fi

# 2. examples/embed: built by its own meson.build against the package.
cp -r "$src/examples/embed" "$tmp/embed"
meson setup "$tmp/embed-build" "$tmp/embed" >"$tmp/embed-setup.log" 2>&1 ||
  { cat "$tmp/embed-setup.log" >&2; fail "examples/embed: meson setup failed"; }
ninja -C "$tmp/embed-build" >"$tmp/embed-build.log" 2>&1 ||
  { cat "$tmp/embed-build.log" >&2; fail "examples/embed did not build"; }
ckpt=$tmp/embed.safetensors
first=$("$tmp/embed-build/embed" --world 2 --steps 6 --log-every 3 --checkpoint "$ckpt")
echo "$first"
[ -f "$ckpt" ] || fail "examples/embed wrote no checkpoint"
grep -Eq '^step 6 .*perplexity [0-9.]+ .*codes used [0-9]+/' <<<"$first" || fail "examples/embed did not log step 6"
second=$("$tmp/embed-build/embed" --world 2 --steps 9 --log-every 3 --checkpoint "$ckpt" --resume)
echo "$second"
grep -q 'resumed from step 6' <<<"$second" || fail "examples/embed did not resume from step 6"
grep -Eq '^step 9 ' <<<"$second" || fail "the resumed run did not reach step 9"
grep -Eq '^step [1-6] ' <<<"$second" && fail "the resumed run repeated steps it had checkpointed"
# The resumed run ends where an uninterrupted 9-step run ends, bit for bit
# (the printed loss and perplexity of step 9 are equal).
whole=$("$tmp/embed-build/embed" --world 2 --steps 9 --log-every 3 --checkpoint "$tmp/whole.safetensors")
[ "$(grep '^step 9 ' <<<"$whole")" = "$(grep '^step 9 ' <<<"$second")" ] ||
  fail "the resumed run's step 9 differs from an uninterrupted run's: $(grep '^step 9 ' <<<"$whole")"
cmp -s "$ckpt" "$tmp/whole.safetensors" || fail "the resumed run's checkpoint differs from an uninterrupted run's"
# 3. As a meson subproject: a parent project's dependency('vqddp') resolves
# to the library this tree overrides (configured only: building it would
# repeat this build).
mkdir -p "$tmp/parent/subprojects"
ln -s "$src" "$tmp/parent/subprojects/vqddp"
cat >"$tmp/parent/meson.build" <<'PARENT'
project('parent', 'cpp', default_options: ['cpp_std=c++20'])
vqddp_dep = dependency('vqddp', fallback: 'vqddp')
executable('app', 'app.cpp', dependencies: vqddp_dep)
PARENT
cp "$src/tests/package/umbrella.cpp" "$tmp/parent/app.cpp"
meson setup "$tmp/parent-build" "$tmp/parent" --force-fallback-for=vqddp -Dvqddp:cuda=disabled \
  >"$tmp/parent.log" 2>&1 || { cat "$tmp/parent.log" >&2; fail "a parent project could not use vqddp as a subproject"; }
grep -q "Dependency vqddp found: YES .* (overridden)" "$tmp/parent.log" ||
  { cat "$tmp/parent.log" >&2; fail "the parent did not take vqddp from the subproject"; }
echo "install_package: ok"
