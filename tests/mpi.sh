#!/bin/sh
# The MPI backend's multi-process tests: mpirun on this machine
# (127.0.0.1, as root in CI, more processes than cores), each under a time
# limit so that a hang fails instead of stalling the suite.
#   mpi.sh HAVE_MPI peer NP MPI_PEER          the doctest cases on NP ranks
#   mpi.sh HAVE_MPI skip NP MPI_PEER          a skipped collective: TimeoutError on the others, job ended
#   mpi.sh HAVE_MPI late NP MPI_PEER          a process 4 s late: TimeoutError from the creation, job ended
#   mpi.sh HAVE_MPI desync NP MPI_PEER        a desync with the check on: DesyncError on every rank
#   mpi.sh HAVE_MPI train NP VQDDP CONFIG     30 steps on NP processes == --backend thread --world NP
#                                            == --world 1 (exact data parallelism), the mpi and
#                                            thread runs adding the ranks in other orders
#                                            (VQDDP_REDUCE_ORDER)
#   mpi.sh HAVE_MPI graphs NP VQDDP CONFIG REPLAYS   8 steps on NP processes on sim with step graphs
#                                            (their collectives launches of the step): captured at
#                                            step 3, REPLAYS steps replayed, the checkpoint of the
#                                            issued run (--step-graphs off) and of 1 rank
#   mpi.sh HAVE_MPI check-ddp NP VQDDP CONFIG BROKEN   check-ddp --backend mpi passes CONFIG, fails BROKEN
#   mpi.sh HAVE_MPI refused NP VQDDP CONFIG   a run directory rank 0 cannot create: every rank prints
#                                            the error and exits 1 (no MPI_Abort, which exits 3)
# Exits 77 (skip) only when the build has no MPI (HAVE_MPI is meson's).
set -u
[ "$1" = true ] || { echo "mpi: skipped, this build has no MPI"; exit 77; }
mode=$2
np=$3
shift 3
command -v mpirun > /dev/null || { echo "mpi: the build has MPI but mpirun is not on PATH (apt-get install openmpi-bin)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "mpi $mode: $*" >&2; [ -f "$tmp/out" ] && cat "$tmp/out" >&2; exit 1; }

# Open MPI refuses root without these; the shared-memory transport (vader)
# without the single-copy mechanism, which containers often forbid (ptrace).
run() {
  timeout 240 mpirun --allow-run-as-root --oversubscribe --bind-to none --host "127.0.0.1:$np" -np "$np" \
    --mca btl self,vader --mca btl_vader_single_copy_mechanism none "$@" > "$tmp/out" 2>&1
}

case $mode in
  peer)
    run "$1"
    rc=$?
    cat "$tmp/out"
    exit $rc ;;
  skip)
    start=$(date +%s)
    run "$1" --scenario skip
    rc=$?
    took=$(( $(date +%s) - start ))
    [ $rc -ne 124 ] || fail "the job did not end (killed after 240 s)"
    [ $rc -ne 0 ] || fail "the job exited 0 after a timeout"
    [ "$(grep -c "TimeoutError after" "$tmp/out")" -eq $((np - 1)) ] || fail "expected $((np - 1)) ranks with a TimeoutError"
    [ "$(grep -c "TimeoutError after .*all_reduce(sum) float32 x8 #1 did not complete within its deadline of 2000 ms" "$tmp/out")" -eq $((np - 1)) ] ||
      fail "the TimeoutErrors do not name all_reduce #1 and its deadline"
    [ "$(grep -c "the next call raised it again" "$tmp/out")" -eq $((np - 1)) ] || fail "a later call did not raise"
    # At the deadline, not before; up to 2 s late on a machine busy with other tests.
    if grep "TimeoutError after" "$tmp/out" | grep -qv "after [23]\.[0-9] s"; then fail "a TimeoutError came early or late"; fi
    cat "$tmp/out"
    echo "mpi skip: $((np - 1)) ranks timed out at the 2 s deadline; the job ended with status $rc after $took s" ;;
  late)
    run "$1" --scenario late
    rc=$?
    [ $rc -ne 124 ] || fail "the job did not end (killed after 240 s)"
    [ $rc -ne 0 ] || fail "the job exited 0 after a timeout"
    # Every rank on time times out at the deadline. The late one is ended
    # by the job, or, on a machine busy with other tests, reaches its own
    # deadline first: both are right, so it is not counted.
    for r in $(seq 0 $((np - 2))); do
      grep -q "^rank $r: TimeoutError after [23]\.[0-9] s: .*the communicator.s creation .*did not complete within its deadline of 2000 ms" "$tmp/out" ||
        fail "expected rank $r (of the $((np - 1)) on time) to time out creating the communicator at the 2 s deadline"
    done
    cat "$tmp/out"
    echo "mpi late: $((np - 1)) ranks timed out creating the communicator; the job ended with status $rc" ;;
  desync)
    run "$1" --scenario desync || fail "exit status $?"
    [ "$(grep -c "DesyncError: mpi rank .*#1: ranks called different collectives" "$tmp/out")" -eq "$np" ] ||
      fail "expected a DesyncError on each of the $np ranks"
    grep -q "rank 0: #1 all_reduce(sum)" "$tmp/out" && grep -q "rank $((np - 1)): #1 all_reduce(max)" "$tmp/out" ||
      fail "the DesyncError does not list every rank's call"
    [ "$(grep -c "the next call raised it again" "$tmp/out")" -eq "$np" ] || fail "a later call did not raise"
    cat "$tmp/out" ;;
  train)
    vqddp=$1
    config=$2
    # The ranks added in descending order (mpi) and rotated (threads), as
    # NCCL may add them: exact sums give the ascending 1-rank bits anyway.
    run -x VQDDP_REDUCE_ORDER=descending "$vqddp" train "$config" --backend mpi --steps 30 --dir "$tmp/mpi" ||
      fail "the mpi run failed"
    grep -q "$np ranks (mpi, cpu)" "$tmp/out" || fail "the mpi run did not report $np mpi ranks"
    [ "$(grep -c "^train:" "$tmp/out")" -eq 1 ] || fail "not only rank 0 printed"
    VQDDP_REDUCE_ORDER=rotate:1 "$vqddp" train "$config" --backend thread --world "$np" --steps 30 --dir "$tmp/thread" > "$tmp/thread.out" 2>&1 ||
      { cat "$tmp/thread.out" >&2; fail "the thread run failed"; }
    "$vqddp" train "$config" --backend thread --world 1 --steps 30 --dir "$tmp/one" > "$tmp/one.out" 2>&1 ||
      { cat "$tmp/one.out" >&2; fail "the 1-rank run failed"; }
    for b in mpi thread one; do
      "$vqddp" inspect "$tmp/$b/checkpoint.safetensors" | grep '^tensor ' > "$tmp/$b.tensors" ||
        fail "inspect of the $b checkpoint failed"
    done
    [ -s "$tmp/mpi.tensors" ] || fail "no tensors listed"
    diff "$tmp/mpi.tensors" "$tmp/thread.tensors" || fail "the checkpoints' tensors differ"
    diff "$tmp/mpi.tensors" "$tmp/one.tensors" || fail "the mpi checkpoint's tensors differ from 1 rank's"
    echo "mpi train: 30 steps on $np mpi processes (ranks added in descending order) == $np thread ranks (rotated) == 1 rank, $(wc -l < "$tmp/mpi.tensors") tensors bit-identical" ;;
  graphs)
    vqddp=$1
    config=$2
    replays=$3
    run "$vqddp" train "$config" --backend mpi --device sim --step-graphs on --steps 8 --dir "$tmp/on" ||
      fail "the graphed mpi run failed"
    grep -q "$np ranks (mpi, sim:0)" "$tmp/out" || fail "the run did not report $np mpi ranks on sim"
    grep -q "^train: step graphs on: step 3 captured" "$tmp/out" || fail "step 3 was not captured"
    ! grep -q "step graphs off" "$tmp/out" || fail "$(grep "step graphs off" "$tmp/out")"
    grep -q "^step graphs: $replays steps of this run replayed$" "$tmp/out" ||
      fail "expected $replays steps replayed: $(grep "replayed" "$tmp/out")"
    cp "$tmp/out" "$tmp/on.out"
    run "$vqddp" train "$config" --backend mpi --device sim --step-graphs off --steps 8 --dir "$tmp/off" ||
      fail "the issued mpi run failed"
    "$vqddp" train "$config" --world 1 --device sim --step-graphs off --steps 8 --dir "$tmp/one" > "$tmp/out" 2>&1 ||
      fail "the 1-rank run failed"
    cmp "$tmp/on/checkpoint.safetensors" "$tmp/off/checkpoint.safetensors" ||
      fail "the graphed run's checkpoint differs from the issued run's"
    cmp "$tmp/on/checkpoint.safetensors" "$tmp/one/checkpoint.safetensors" ||
      fail "the graphed run's checkpoint differs from 1 rank's"
    grep "step graphs" "$tmp/on.out"
    echo "mpi graphs: 8 steps on $np mpi processes on sim, graphed ($replays replayed) == issued == 1 rank, byte for byte" ;;
  check-ddp)
    vqddp=$1
    run "$vqddp" check-ddp "$2" --backend mpi --steps 3 || fail "check-ddp --backend mpi failed"
    [ "$(grep -c "^check-ddp: PASSED" "$tmp/out")" -eq 1 ] || fail "expected one PASSED line (rank 0's)"
    grep -q "on 1 rank and on $np mpi ranks" "$tmp/out" || fail "the check did not report $np mpi ranks"
    cat "$tmp/out"
    run "$vqddp" check-ddp "$3" --backend mpi --steps 2 && fail "check-ddp --backend mpi passed a broken config"
    grep -q "^check-ddp: FAILED" "$tmp/out" || fail "no FAILED line"
    grep -q "check-ddp: mpi rank [0-9]*: step 1: 'buffer.quantizer.codebook" "$tmp/out" ||
      fail "no rank named the first step and tensor that differ"
    echo "mpi check-ddp: a whole run on $np mpi processes == 1 rank; the unsynced codebook fails at step 1" ;;
  refused)
    # An error every rank raises alike (comm/errors.h AgreedError) ends each
    # process on its own: no rank waits, so no MPI_Abort, whose teardown
    # has crashed mpirun and lost the other ranks' messages.
    touch "$tmp/file"
    run "$1" train "$2" --backend mpi --steps 5 --dir "$tmp/file/run"
    rc=$?
    [ $rc -eq 1 ] || fail "exit status $rc, expected 1 (3 would be MPI_Abort's)"
    [ "$(grep -c "^vqddp: error: rank 0: run directory $tmp/file/run: cannot create it" "$tmp/out")" -eq "$np" ] ||
      fail "expected the error on all $np ranks"
    grep -q "MPI_ABORT" "$tmp/out" && fail "the job was aborted"
    echo "mpi refused: all $np ranks printed the error and exited 1, without MPI_Abort" ;;
  *) fail "unknown mode" ;;
esac
