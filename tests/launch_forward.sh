#!/bin/sh
# SIGTERM to `vqddp launch` is forwarded to every process, and a process
# that answers it by exiting 143 is doing what was asked: the launcher must
# not then SIGTERM the others (for a vqddp rank still writing its
# checkpoint that would be a second signal, which stops it at once). Here
# rank 1 exits at once and rank 0 takes a second to "save": the launch must
# exit 143 with rank 0's save complete and no "stopping the others".
#   launch_forward.sh VQDDP
set -u
vqddp=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Each rank: on TERM, rank 0 saves for a second, then both exit 143.
"$vqddp" launch --nproc 2 -- /bin/sh -c '
  trap "[ \$RANK = 0 ] && sleep 1 && echo saved-by-rank-0; exit 143" TERM
  echo started-$RANK
  while :; do sleep 0.05; done' > "$out" 2>&1 &
pid=$!
waited=0
until [ "$(grep -c started- "$out")" -eq 2 ]; do
  sleep 0.05
  waited=$((waited + 1))
  [ $waited -lt 400 ] || { kill -9 $pid; cat "$out"; echo "launch_forward: the ranks did not start" >&2; exit 1; }
done
kill -TERM $pid
wait $pid
rc=$?
cat "$out"
[ $rc -eq 143 ] || { echo "launch_forward: exit status $rc, expected 143" >&2; exit 1; }
grep -q saved-by-rank-0 "$out" || { echo "launch_forward: rank 0 was stopped before its save finished" >&2; exit 1; }
if grep -q "stopping the others" "$out"; then echo "launch_forward: a forwarded stop was taken for a failure" >&2; exit 1; fi
echo "launch_forward: both ranks stopped as asked, rank 0's save complete"
