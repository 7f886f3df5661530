#!/bin/sh
# SIGTERM through the real executable: `vqddp train` stopped mid-run must
# finish the step, checkpoint it, print how to resume and exit 143; the
# printed command must finish the run so that its checkpoint is byte for
# byte the one of a run that was never stopped, and metrics.jsonl must list
# no step twice.
#   sigterm_resume.sh VQDDP CONFIG [STEPS]
# STEPS (default 600) must leave time after the first logged step for the
# signal to land mid-run.
set -u
vqddp=$1
config=$2
steps=${3:-600}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "sigterm_resume: $*" >&2; [ -f "$tmp/out" ] && cat "$tmp/out" >&2; exit 1; }

"$vqddp" train "$config" --steps $steps --dir "$tmp/straight" > /dev/null || fail "the uninterrupted run failed"

"$vqddp" train "$config" --steps $steps --dir "$tmp/stopped" > "$tmp/out" 2>&1 &
pid=$!
# Stop it once it has logged a step (log_every steps in), well before the end.
waited=0
until grep -q '"loss"' "$tmp/stopped/metrics.jsonl" 2>/dev/null; do
  sleep 0.05
  waited=$((waited + 1))
  [ $waited -lt 2400 ] || { kill -9 $pid; fail "no metrics line after 120 s"; }
done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "exit status $rc after SIGTERM, expected 143"
grep -q "vqddp: stopped by SIGTERM after step" "$tmp/out" || fail "no 'stopped by SIGTERM' line"
resume=$(sed -n 's/^resume with: //p' "$tmp/out")
[ -n "$resume" ] || fail "no 'resume with:' line"
case "$resume" in *"--resume $tmp/stopped/checkpoint.safetensors"*) ;; *) fail "resume command '$resume'" ;; esac
stopped_at=$(sed -n 's/.*stopped by SIGTERM after step \([0-9]*\).*/\1/p' "$tmp/out")
[ "$stopped_at" -lt $steps ] || fail "stopped at step $stopped_at, the run has only $steps"

eval "$resume" > "$tmp/resumed" 2>&1 || { cat "$tmp/resumed" >&2; fail "the resume command failed: $resume"; }
cmp "$tmp/straight/checkpoint.safetensors" "$tmp/stopped/checkpoint.safetensors" ||
  fail "the resumed run's checkpoint differs from the uninterrupted run's"
dups=$(grep -o '"step":[0-9]*,"[a-z_]*"' "$tmp/stopped/metrics.jsonl" | sort | uniq -d)
[ -z "$dups" ] || fail "metrics.jsonl lists these twice: $dups"
echo "sigterm_resume: stopped after step $stopped_at, resumed to $steps, checkpoint identical"
