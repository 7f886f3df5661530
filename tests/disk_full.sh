#!/bin/sh
# A disk that fills while a run trains (train/run_dir.h's reserve): the run
# stops at its next log step with the step saved, names the way on, and
# resumes to the uninterrupted run's end once there is room. The disk is a
# small tmpfs in a mount namespace of this test's own.
#   disk_full.sh VQDDP SOURCE_DIR
set -eu
if [ "${DISK_FULL_INSIDE:-}" != 1 ]; then
  if [ "$(id -u)" != 0 ] || ! unshare -m true 2> /dev/null; then
    echo "disk_full: needs root and mount namespaces: skipped"
    exit 77
  fi
  exec env DISK_FULL_INSIDE=1 unshare -m --propagation private sh "$0" "$@"
fi
v=$1
src=$2
work=$(mktemp -d)
# The run's stdout and stderr go off the full disk, as a terminal's would:
# the run directory's disk fills, not the one its messages go to (the dd
# below may take the room the run frees as it stops).
logs=$(mktemp -d)
trap 'status=$?; cd /; umount "$work" 2> /dev/null || true; rm -rf "$work" "$logs"; exit $status' EXIT
mount -t tmpfs -o size=48m tmpfs "$work" || { echo "disk_full: cannot mount a tmpfs: skipped"; exit 77; }
cd "$work"
fail() {
  echo "disk_full: FAIL: $*" >&2
  exit 1
}
# The main job, one rank, 60 steps of 4 examples on 20 clips a source (small:
# the sanitized build runs this too, where a step of 16 took 2 s, and the run
# and its resume each validate the held-out clips at their end), a log line
# (and so a disk check) every step.
sed -e 's/"log_every": 100/"log_every": 1/' -e 's/"world_size": 4/"world_size": 1/' \
  -e 's/"holdout_every": 10,/"holdout_every": 10, "max_files": 20,/' -e 's/"batch_size": 16/"batch_size": 4/' \
  "$src/examples/speech_codec.json" > codec.json
grep -q '"log_every": 1}' codec.json && grep -q '"max_files": 20' codec.json && grep -q '"batch_size": 4' codec.json ||
  fail "the config edit did not happen"
"$v" train codec.json --steps 60 --dir run > "$logs/out" 2> "$logs/err" &
pid=$!
tries=0
until [ "$(cat run/metrics.jsonl 2> /dev/null | grep -c '"steps_per_s"' || true)" -ge 10 ]; do
  tries=$((tries + 1))
  [ $tries -lt 3000 ] || fail "no 10 steps logged: $(cat "$logs/err")"
  kill -0 $pid 2> /dev/null || fail "the run ended before step 10: $(cat "$logs/err")"
  sleep 0.01
done
# Fill the disk to the last block, the run held still meanwhile: a filler
# writing on while the run stops would take the room its reserve frees for
# the checkpoint (a race of the test's, not the run's: it then says
# "write failed: No space left on device" and exits 1).
kill -STOP $pid
dd if=/dev/zero of=fill bs=1M 2> /dev/null || true
dd if=/dev/zero of=fill2 bs=4k 2> /dev/null || true
kill -CONT $pid
status=0
wait $pid || status=$?
[ $status -eq 1 ] || fail "the run on a full disk exited $status: $(cat "$logs/err")"
grep -q "its disk is nearly full" "$logs/err" || fail "the run did not say why it stopped: $(cat "$logs/err")"
grep -q "make room, then continue with: $v train codec.json --steps 60 --dir run --resume run/checkpoint.safetensors" "$logs/err" ||
  fail "no way on: $(cat "$logs/err")"
step=$(sed -n 's/.* the checkpoint of step \([0-9]*\) is saved.*/\1/p' "$logs/err")
[ -n "$step" ] && [ "$step" -ge 10 ] && [ "$step" -lt 60 ] || fail "stopped at step '$step': $(cat "$logs/err")"
"$v" inspect run/checkpoint.safetensors | grep -q "step $step," || fail "the checkpoint is not step $step's"
[ ! -e run/.reserve ] || fail "the reserve outlived the run"
# Room again: the run continues to its end.
rm fill fill2
# The command the message gave, as it gave it.
eval "$(sed -n 's/.*make room, then continue with: //p' "$logs/err")" > "$logs/out" 2> "$logs/err" || fail "resume: $(cat "$logs/err")"
"$v" inspect run/checkpoint.safetensors | grep -q "step 60," || fail "the resumed run did not end at step 60"
echo "disk_full: ok (stopped at step $step)"
