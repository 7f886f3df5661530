#!/bin/sh
# Step graphs for steps that choose their launches on the host
# (engine/step_graph.h): the shipped examples with quantize dropout and the
# GAN, on sim as a world of one, replay step graphs (each choice's segment
# issued once, captured, then replayed) and end in the checkpoint of the
# same run with graphs off, byte for byte.
#   variant_graphs.sh VQDDP SOURCE_DIR STEPS
set -eu
v=$1
src=$2
steps=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "variant_graphs: FAIL: $*" >&2
  exit 1
}
for example in speech_codec_mlp speech_codec_fsq speech_codec_lfq speech_codec_gan; do
  config=$src/examples/$example.json
  grep -q '"quantize_dropout": true\|"gan"' "$config" || fail "$example chooses nothing on the host any more"
  for mode in on off; do
    "$v" train "$config" --device sim --world 1 --steps "$steps" --step-graphs "$mode" --dir "$work/$example-$mode" \
      > "$work/$example-$mode.out" 2>&1 || { cat "$work/$example-$mode.out"; fail "$example with graphs $mode failed"; }
  done
  replayed=$(sed -n 's/^step graphs: \([0-9]*\) steps of this run replayed$/\1/p' "$work/$example-on.out")
  [ -n "$replayed" ] && [ "$replayed" -gt 0 ] || { cat "$work/$example-on.out"; fail "$example replayed no step"; }
  ! grep -q 'step graphs off' "$work/$example-on.out" || fail "$example: $(grep 'step graphs off' "$work/$example-on.out")"
  cmp -s "$work/$example-on/checkpoint.safetensors" "$work/$example-off/checkpoint.safetensors" ||
    fail "$example: the graphed run's checkpoint differs from the issued run's"
  echo "variant_graphs: $example: $replayed of $steps steps replayed, the checkpoint of the issued run"
done
