#!/bin/sh
# Step graphs for W thread ranks on one device (engine/step_graph.h,
# comm/thread_group.cpp: on sim a collective of a graphed step is a launch
# of the step). Every shipped example, as it ships (4 thread ranks), on sim:
#  - with graphs on, a step that chooses nothing on the host replays from
#    the fourth step on (captured at the third); a step that chooses
#    (quantize dropout, the GAN) graphs without stopping;
#  - its checkpoint is the issued run's (--step-graphs off), byte for byte;
#  - the main job's is also one rank's (docs/design.md section 7).
#   thread_rank_graphs.sh VQDDP SOURCE_DIR
set -eu
v=$1
src=$2
steps=6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "thread_rank_graphs: FAIL: $*" >&2
  exit 1
}
train() {  # NAME CONFIG OUT_DIR ARGS...
  name=$1 config=$2 dir=$3
  shift 3
  "$v" train "$config" --device sim --steps "$steps" --dir "$dir" "$@" > "$dir.out" 2>&1 ||
    { cat "$dir.out"; fail "$name ($*) failed"; }
}
for config in "$src"/examples/*.json; do
  example=$(basename "$config" .json)
  if grep -q '"path": "runs/' "$config"; then  # data made by `vqddp convert` first
    echo "thread_rank_graphs: $example: not run here, its data is made by vqddp convert (tests/flac_example.sh trains it)"
    continue
  fi
  grep -q '"backend": "thread", "world_size": 4' "$config" || fail "$example does not ship as 4 thread ranks any more"
  train "$example" "$config" "$work/$example-on" --step-graphs on
  train "$example" "$config" "$work/$example-off" --step-graphs off
  out=$work/$example-on.out
  ! grep -q 'step graphs off' "$out" || fail "$example: $(grep 'step graphs off' "$out")"
  grep -q '^train: step graphs on: step 3 captured' "$out" || { cat "$out"; fail "$example: step 3 was not captured"; }
  replayed=$(sed -n 's/^step graphs: \([0-9]*\) steps of this run replayed$/\1/p' "$out")
  if grep -q '"quantize_dropout": true\|"gan"' "$config"; then
    what="chooses on the host: ${replayed:-0} of $steps steps replayed"
  else
    [ "${replayed:-0}" -eq $((steps - 3)) ] || { cat "$out"; fail "$example replayed ${replayed:-0} steps, not steps 4-$steps"; }
    what="steps 4-$steps replayed"
  fi
  cmp -s "$work/$example-on/checkpoint.safetensors" "$work/$example-off/checkpoint.safetensors" ||
    fail "$example: the graphed run's checkpoint differs from the issued run's"
  echo "thread_rank_graphs: $example: 4 thread ranks graphed, $what, the checkpoint of the issued run"
done
train speech_codec "$src/examples/speech_codec.json" "$work/one-rank" --world 1 --step-graphs off
cmp -s "$work/speech_codec-on/checkpoint.safetensors" "$work/one-rank/checkpoint.safetensors" ||
  fail "speech_codec: 4 graphed thread ranks end in another checkpoint than 1 rank"
echo "thread_rank_graphs: speech_codec: 4 graphed thread ranks end in 1 rank's checkpoint"
