#!/usr/bin/env bash
# A SLURM cluster of one machine, for development and tests: munged, slurmctld and slurmd from Debian's packages
# (apt-get install slurm-wlm munge), run as root, with their key, configuration, state and logs under DIR.
#
#   scripts/local_slurm.sh start DIR      # prints the line that points sbatch/srun/squeue at it:
#   export SLURM_CONF=DIR/slurm.conf
#   sbatch --nodes 1 --ntasks-per-node 2 scripts/train.sbatch --trainer.accelerator cpu
#   scripts/local_slurm.sh stop DIR
#
# One node named localhost with this machine's cores (one task per core), one partition. SLURMCTLD_PORT and
# SLURMD_PORT (default 16817 and 16818) keep it apart from another cluster on the same machine.
set -euo pipefail
action=$1 dir=$(realpath -m "$2")

stop() {
  for daemon in slurmd slurmctld munged; do
    [ -f "$dir/$daemon.pid" ] && kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
  done
}

if [ "$action" = stop ]; then
  stop
  exit 0
fi
[ "$action" = start ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

mkdir -p "$dir/state" "$dir/spool"
chmod 700 "$dir"
[ -f "$dir/munge.key" ] || (umask 077 && head -c 1024 /dev/urandom >"$dir/munge.key")
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"

# CPUs: the machine's cores, whatever OMP_NUM_THREADS says (nproc honours it, and the tests set it to 1: a node of
# one CPU never ran a job of two tasks).
cat >"$dir/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=${SLURMCTLD_PORT:-16817}
SlurmdPort=${SLURMD_PORT:-16818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName=localhost NodeHostname=$(hostname) CPUs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF=$dir/slurm.conf
trap 'stop; echo "local_slurm: the cluster did not come up; see $dir/*.log" >&2' ERR
slurmctld -i
slurmd -N localhost
for _ in $(seq 60); do
  [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = idle ] && { echo "export SLURM_CONF=$dir/slurm.conf"; exit 0; }
  sleep 0.5
done
false
