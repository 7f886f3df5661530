#!/usr/bin/env bash
# The main job: install what is missing, build (release), run the default job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build --buildtype=release
exec ./build/vqddp demo "$@"
