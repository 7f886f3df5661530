#!/usr/bin/env bash
# Configures (once) and builds one build directory: every target, or only
# the ninja targets given after "--".
# usage: scripts/build.sh DIR [meson setup options...] [-- TARGETS...]
set -euo pipefail
dir=$1
shift
setup=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  setup+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${setup[@]}"
fi
ninja -C "$dir" "$@"
