# A real Slurm cluster on this machine, for the tests (sourced, not run):
# Debian's slurm-wlm daemons (slurmctld, one slurmd per node: Debian builds
# Slurm with multiple-slurmd, so N nodes are N slurmd processes on
# 127.0.0.1 with their own ports) and munge for their credentials, every
# file under one directory, every daemon on ports of its own, as root.
#   slurm_cluster_start DIR NODES   start it (nodes n1..nNODES, partition "test")
#   slurm_cluster_stop              stop every daemon it started
# slurm_cluster_start exports SLURM_CONF, so srun/sbatch/scontrol in the
# caller use it. Where it cannot run (a tool missing, not root, a daemon
# that does not start or nodes that never come up: what a machine allows)
# it returns 77 with the reason in $slurm_skip_reason.
slurm_cluster_start() {
  slurm_dir=$1
  slurm_nodes=$2
  slurm_skip_reason=
  for slurm_tool in slurmctld slurmd srun sbatch scontrol munged mungekey; do
    command -v "$slurm_tool" > /dev/null 2>&1 ||
      { slurm_skip_reason="$slurm_tool is not installed (apt-get install slurm-wlm munge)"; return 77; }
  done
  [ "$(id -u)" = 0 ] || { slurm_skip_reason="slurmd must run as root to start jobs as their user"; return 77; }
  [ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || [ -e /usr/lib/slurm-wlm/mpi_pmix.so ] ||
    ls /usr/lib/*/slurm-wlm/mpi_pmix.so > /dev/null 2>&1 ||
    { slurm_skip_reason="Slurm's PMIx plugin is missing"; return 77; }
  mkdir -p "$slurm_dir/state" "$slurm_dir/munge" "$slurm_dir/log"
  chmod 700 "$slurm_dir/munge"
  # Ports: one base per cluster, from the directory's name, so clusters of
  # tests running side by side do not meet.
  # 10000-14999: below Linux's ephemeral ports and the job steps' rendezvous
  # ports (comm/slurm_env.h); 5 a cluster (slurmctld, slurmd's default, 3 nodes).
  slurm_port=$((10000 + $(printf '%s' "$slurm_dir" | cksum | cut -d' ' -f1) % 1000 * 5))
  slurm_host=$(hostname -s)
  mungekey -c -k "$slurm_dir/munge/munge.key" > /dev/null 2>&1 ||
    { slurm_skip_reason="mungekey could not make a key"; return 77; }
  munged --force -S "$slurm_dir/munge/socket" --key-file="$slurm_dir/munge/munge.key" \
    --pid-file="$slurm_dir/munge/munged.pid" --log-file="$slurm_dir/log/munged.log" \
    --seed-file="$slurm_dir/munge/seed" ||
    { slurm_skip_reason="munged does not start here: $(tail -n 2 "$slurm_dir/log/munged.log" 2>/dev/null)"; return 77; }
  cat > "$slurm_dir/slurm.conf" <<CONF
ClusterName=vqddptest
SlurmctldHost=$slurm_host(127.0.0.1)
SlurmctldPort=$slurm_port
SlurmdPort=$((slurm_port + 1))
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$slurm_dir/munge/socket,cred_expire=5
StateSaveLocation=$slurm_dir/state
SlurmdSpoolDir=$slurm_dir/spool/%n
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.%n.pid
SlurmctldLogFile=$slurm_dir/log/slurmctld.log
SlurmdLogFile=$slurm_dir/log/slurmd.%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The main scheduling pass every second (Slurm: 60 s): a requeued job, held
# back until its credentials expire, then starts at once.
SchedulerParameters=sched_interval=1
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
MessageTimeout=5
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
MailProg=/bin/true
CONF
  slurm_i=1
  while [ "$slurm_i" -le "$slurm_nodes" ]; do
    echo "NodeName=n$slurm_i NodeHostname=$slurm_host NodeAddr=127.0.0.1 Port=$((slurm_port + 1 + slurm_i)) CPUs=4 State=UNKNOWN" >> "$slurm_dir/slurm.conf"
    mkdir -p "$slurm_dir/spool/n$slurm_i"
    slurm_i=$((slurm_i + 1))
  done
  echo "PartitionName=test Nodes=n[1-$slurm_nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$slurm_dir/slurm.conf"
  export SLURM_CONF="$slurm_dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" || { slurm_skip_reason="slurmctld does not start: $(tail -n 3 "$slurm_dir/log/slurmctld.log" 2>/dev/null)"; return 77; }
  # Each slurmd reads its own copy of the configuration, beside an mpi.conf
  # of its own: Slurm's PMIx plugin makes a directory per job step under
  # PMIxCliTmpDirBase, named by the step alone, which the nodes of one
  # machine would otherwise all make in /tmp.
  slurm_i=1
  while [ "$slurm_i" -le "$slurm_nodes" ]; do
    mkdir -p "$slurm_dir/n$slurm_i/pmix"
    cp "$SLURM_CONF" "$slurm_dir/n$slurm_i/slurm.conf"
    echo "PMIxCliTmpDirBase=$slurm_dir/n$slurm_i/pmix" > "$slurm_dir/n$slurm_i/mpi.conf"
    # slurmd initialises a cgroup plugin whatever the task and process
    # tracking plugins (here none and linuxproc, which use no cgroup), and
    # autodetection fails where no cgroup file system is mounted (a chroot,
    # as the fresh-machine roots): cgroup/v1 on a directory of its own
    # starts anywhere, and nothing here ever makes a cgroup in it.
    mkdir -p "$slurm_dir/cgroup"
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s\n' "$slurm_dir/cgroup" > "$slurm_dir/n$slurm_i/cgroup.conf"
    slurmd -f "$slurm_dir/n$slurm_i/slurm.conf" -N "n$slurm_i" ||
      { slurm_skip_reason="slurmd n$slurm_i does not start: $(tail -n 3 "$slurm_dir/log/slurmd.n$slurm_i.log" 2>/dev/null)"; return 77; }
    slurm_i=$((slurm_i + 1))
  done
  # Up when every node is idle (about 2 s).
  slurm_t=0
  while [ "$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" -lt "$slurm_nodes" ]; do
    slurm_t=$((slurm_t + 1))
    [ $slurm_t -le 100 ] || {
      slurm_skip_reason="the nodes are not idle 20 s after their start: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
      tail -n 5 "$slurm_dir"/log/*.log >&2
      return 77
    }
    sleep 0.2
  done
  return 0
}

slurm_cluster_stop() {
  [ -n "${slurm_dir:-}" ] || return 0
  # Jobs first: slurmstepd and the tasks outlive a killed slurmd.
  if [ -f "$slurm_dir/slurmctld.pid" ]; then
    scancel --quiet --full $(squeue -h -o %i 2> /dev/null) 2> /dev/null
    slurm_t=0
    while [ -n "$(squeue -h -o %i 2> /dev/null)" ] && [ $slurm_t -lt 50 ]; do
      sleep 0.2
      slurm_t=$((slurm_t + 1))
    done
  fi
  for slurm_pidfile in "$slurm_dir"/slurmd.*.pid "$slurm_dir/slurmctld.pid" "$slurm_dir/munge/munged.pid"; do
    [ -f "$slurm_pidfile" ] && kill "$(cat "$slurm_pidfile")" 2> /dev/null
  done
  sleep 0.5
  for slurm_pidfile in "$slurm_dir"/slurmd.*.pid "$slurm_dir/slurmctld.pid" "$slurm_dir/munge/munged.pid"; do
    [ -f "$slurm_pidfile" ] && kill -9 "$(cat "$slurm_pidfile")" 2> /dev/null
  done
  return 0
}
