#!/bin/bash
# vqddp under a real Slurm (tests/slurm/cluster.sh: slurmctld, three slurmd
# nodes and munge on this machine):
#  - `srun -N 3 -n 3 vqddp train --backend mpi` ends in 1 rank's checkpoint;
#  - srun of 3 tasks with thread ranks is refused on every task, by name;
#  - examples/slurm/train.sbatch as shipped, on 3 nodes: with one node
#    drained mid-job and the job preempted at a random step (scancel
#    --signal=TERM), it requeues itself; given the 2 nodes left, it starts
#    again with 2 tasks and resumes from its run directory (--resume auto) and ends in
#    the uninterrupted 1-rank run's checkpoint, bit for bit.
# Exits 77 where no Slurm can run (not installed, not root).
#   slurm_jobs.sh VQDDP SOURCE_DIR
set -u
v=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d /tmp/vqddp-slurm.XXXXXX)
. "$src/tests/slurm/cluster.sh"
trap 'slurm_cluster_stop; [ -n "${VQDDP_KEEP:-}" ] || rm -rf "$work"' EXIT
trap 'exit 143' TERM INT
fail() {
  echo "slurm_jobs: FAIL: $*" >&2
  exit 1
}
wait_for() {  # SECONDS CONDITION...
  local limit=$(( $(date +%s) + $1 ))
  shift
  until "$@"; do
    [ "$(date +%s)" -lt "$limit" ] || return 1
    sleep 0.1
  done
}
slurm_cluster_start "$work/cluster" 3
rc=$?
[ $rc -eq 77 ] && { echo "slurm_jobs: skipped: $slurm_skip_reason"; exit 77; }
[ $rc -eq 0 ] || fail "the test cluster did not start"
# Open MPI as root, on one machine's three "nodes" (no single-copy: ptrace
# is often forbidden in containers).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
config=$src/examples/speech_codec.json
cd "$work" || exit 1

# 1. srun -n 3 on 3 nodes, mpi, == 1 rank.
steps=8
"$v" train "$config" --world 1 --steps $steps --dir one > one.out 2>&1 || { cat one.out; fail "1 rank failed"; }
timeout 120 srun -N 3 -n 3 "$v" train "$config" --backend mpi --steps $steps --dir srun3 > srun3.out 2>&1 ||
  { cat srun3.out; fail "srun -N 3 -n 3 --backend mpi failed"; }
grep -q "3 ranks (mpi" srun3.out || { cat srun3.out; fail "the srun job did not run as 3 mpi ranks"; }
cmp -s one/checkpoint.safetensors srun3/checkpoint.safetensors || fail "srun -n 3 ended in another checkpoint than 1 rank"
echo "slurm_jobs: srun -N 3 -n 3 --backend mpi: 1 rank's checkpoint"

# 2. Thread ranks in every task of a 3-task step: refused on each.
timeout 60 srun -n 3 "$v" train "$config" --steps 2 --dir thread3 > thread3.out 2>&1 && fail "srun -n 3 with thread ranks ran"
[ "$(grep -c "is task [0-2] of 3 of a Slurm job step, but the backend is \"thread\"" thread3.out)" -eq 3 ] ||
  { cat thread3.out; fail "srun -n 3 with thread ranks: not refused by name on each task"; }
echo "slurm_jobs: srun -n 3 with thread ranks: refused on every task"

# 3. The shipped batch script, preempted and requeued on fewer tasks.
steps=100
"$v" train "$config" --world 1 --steps $steps --dir one100 > one100.out 2>&1 || { cat one100.out; fail "1 rank failed"; }
all_idle() { [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq 3 ]; }
wait_for 30 all_idle || { sinfo -N; fail "the nodes did not become idle after the srun jobs"; }
job=$(VQDDP=$v sbatch --parsable -N 3 --ntasks-per-node=1 -o job.log "$src/examples/slurm/train.sbatch" "$config" --steps $steps \
  --dir "$work/requeued") || fail "sbatch failed"
state() { squeue -h -j "$job" -o %T 2> /dev/null; }
training() { grep -q "^train: .* 3 ranks (mpi" job.log 2> /dev/null; }
wait_for 60 training || { cat job.log; fail "job $job did not start training"; }
sleep "$((1 + RANDOM % 2)).$((RANDOM % 10))"  # a random step: it runs 100 steps in about 7 s
# A node drained mid-job (the job runs on), then the preemption: the job
# requeues itself.
scontrol update NodeName=n3 State=DRAIN Reason=slurm_jobs || fail "n3 could not be drained"
scancel --signal=TERM "$job" || fail "scancel --signal=TERM $job failed"
# Requeued, it waits for 3 nodes; given 2, it starts with 2 tasks.
pending() { [ "$(state)" = PENDING ]; }
wait_for 60 pending || { cat job.log; fail "job $job was not requeued (state $(state))"; }
scontrol update JobId="$job" NumNodes=2 NumTasks=2 || fail "job $job could not be given 2 nodes"
done_() { [ -z "$(state)" ]; }
wait_for 120 done_ || { cat job.log; scontrol show job "$job"; fail "job $job did not end"; }
cat job.log
stopped=$(sed -n 's/^vqddp: stopped by SIGTERM after step \([0-9]*\);.*/\1/p' job.log)
[ -n "$stopped" ] && [ "$stopped" -lt $steps ] || fail "job $job was not stopped by its SIGTERM before step $steps"
grep -q "^train: resumed at step $stopped from " job.log || fail "the requeued job did not resume at step $stopped"
grep -q "2 ranks (mpi" job.log || fail "the requeued job did not run on 2 tasks"
cmp -s one100/checkpoint.safetensors requeued/checkpoint.safetensors ||
  fail "preempted at step $stopped and requeued on 2 tasks, the job ended in another checkpoint than 1 rank"
echo "slurm_jobs: train.sbatch preempted after step $stopped, requeued on 2 tasks: 1 rank's checkpoint"
