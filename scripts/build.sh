#!/usr/bin/env bash
# Configures (once) and builds one build directory.
# usage: scripts/build.sh DIR [meson setup options...]
set -euo pipefail
dir=$1
shift
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "$@"
fi
ninja -C "$dir"
