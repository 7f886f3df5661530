#!/bin/bash
# By hand, not in the suite (it takes about 4 minutes: Slurm's time limits
# are whole minutes): a job whose time limit (1 minute) is far shorter than
# its run. examples/slurm/train.sbatch as shipped, with --time=1 and
# --signal=TERM@50: at each limit Slurm signals the tasks, vqddp saves and
# exits 143, the script requeues the job, and the next start resumes; the
# run ends in the uninterrupted 1-rank run's checkpoint, bit for bit.
#   bash tests/slurm_time_limit.sh [VQDDP] [STEPS]
set -u
src=$(realpath "$(dirname "$0")/..")
v=$(realpath "${1:-$src/build/vqddp}")
steps=${2:-1500}
work=$(mktemp -d /tmp/vqddp-slurm-limit.XXXXXX)
. "$src/tests/slurm/cluster.sh"
trap 'slurm_cluster_stop; rm -rf "$work"' EXIT
trap 'exit 143' TERM INT
cd "$work" || exit 1
slurm_cluster_start "$work/cluster" 3
rc=$?
[ $rc -eq 0 ] || { echo "slurm_time_limit: no cluster: $slurm_skip_reason"; exit $rc; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
config=$src/examples/speech_codec.json
start=$(date +%s)
job=$(VQDDP=$v sbatch --parsable -N 3 --ntasks-per-node=1 --time=1 --signal=TERM@50 -o job.log \
  "$src/examples/slurm/train.sbatch" "$config" --steps "$steps" --dir "$work/run") || exit 1
"$v" train "$config" --world 1 --steps "$steps" --dir one > one.out 2>&1 || { cat one.out; exit 1; }
while [ -n "$(squeue -h -j "$job" -o %T)" ]; do sleep 2; done
grep -E "^vqddp.sbatch: job|^vqddp: stopped by|^train: resumed|^done:" job.log
starts=$(grep -c "^vqddp.sbatch: job" job.log)
if cmp -s one/checkpoint.safetensors run/checkpoint.safetensors; then
  echo "slurm_time_limit: $steps steps under a 1-minute limit: $starts starts in $(( $(date +%s) - start )) s, 1 rank's checkpoint"
else
  echo "slurm_time_limit: FAIL: the requeued job ended in another checkpoint than 1 rank" >&2
  exit 1
fi
