#!/usr/bin/env bash
# The main job: install what is missing, build (release), and run the default
# training run (examples/speech_codec.json: a convolutional residual-VQ speech
# codec on Debian's asterisk prompts, 4 thread ranks), printing progress.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build --buildtype=release
# Its directory (runs/speech_codec) belongs to this script: run again with no
# arguments, it replaces the last run (--overwrite); any argument (--resume,
# --dir) is passed on instead.
if [ $# -eq 0 ]; then set -- --overwrite; fi
exec ./build/vqddp train "$@"
