#!/usr/bin/env bash
# Start a single-node SLURM on localhost for the dask-jobqueue integration tests
# (tests/test_slurm.py). Idempotent: a controller that already answers with an idle node is
# left as it is. Follows shared/recipes/slurm-local.md (Debian's Slurm, no systemd, root).
#
# Environment: HMDSPT_SLURM_DIR (default /var/tmp/hmdspt-slurm) holds state, spool, pid and
# log files; HMDSPT_SLURM_CPUS (default 4) is the CPU count the node advertises, more than
# the machine's 2 cores so that a 1-core and a 2-core worker job run side by side.
set -euo pipefail

DIR=${HMDSPT_SLURM_DIR:-/var/tmp/hmdspt-slurm}
CPUS=${HMDSPT_SLURM_CPUS:-4}
NODE=hmdspt-node
CONF=/etc/slurm/slurm.conf
MARK="# written by hmdspt ci/slurm/start.sh"

log() { echo "== slurm: $*"; }

# A daemon that exited can linger as a zombie, so `kill -0` is not enough (recipe).
alive() {
  local pid=$1 stat
  stat=$(ps -o stat= -p "$pid" 2>/dev/null | tr -d ' ') || return 1
  [[ -n "$stat" && "$stat" != Z* ]]
}
alive_from() { [[ -s "$1" ]] && alive "$(cat "$1")"; }

node_state() { timeout 10 sinfo -h -N -o %T 2>/dev/null | head -n1 || true; }

if command -v sinfo >/dev/null 2>&1 && [[ "$(node_state)" == idle* ]]; then
  log "already running ($(sinfo -h -N -o '%N %T %c CPUs'))"
  exit 0
fi

# --- packages (nothing is started by the install: no systemd here)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  log "installing slurmctld slurmd slurm-client munge"
  # apt-get update does not wait for a lock held by another apt: retry it.
  for attempt in 1 2 3 4 5; do
    apt-get update -qq && break
    log "apt-get update failed (attempt $attempt), retrying"; sleep 5
  done
  for attempt in 1 2 3; do
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge >/dev/null && break
    log "apt-get install failed (attempt $attempt), retrying"; sleep 5
  done
  command -v slurmctld >/dev/null || { log "install failed"; exit 1; }
fi

mkdir -p "$DIR"/{state,spool,log,run}

# --- munge (authentication between the Slurm daemons and clients)
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating /etc/munge/munge.key"
  if command -v mungekey >/dev/null; then mungekey --create --force; else create-munge-key -f; fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
if ! alive_from /run/munge/munged.pid; then
  rm -f /run/munge/munged.pid
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged
fi

# --- slurm.conf (never overwrite one that someone else wrote)
if [[ -e "$CONF" ]] && ! grep -qF "$MARK" "$CONF"; then
  log "$CONF exists and was not written by this script: not touching it"; exit 1
fi
HOST=$(hostname -s)
# RealMemory above what slurmd detects leaves the node 'inval': take ~90 % of free -m.
MEM=$(free -m | awk '/^Mem:/ {printf "%d", $2 * 0.9}')
mkdir -p /etc/slurm
cat > "$CONF" <<CONFEOF
$MARK
ClusterName=hmdspt
# The controller name must be the real short host name; NodeAddr + slurmd -N name the node.
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# No cgroups here: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default a job that gives no --mem would take the whole node.
DefMemPerCPU=1024
# Advertise CPUs=$CPUS on ${CPUS}-less hardware (see the recipe): the node definition wins.
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
MpiDefault=none
SchedulerType=sched/backfill
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# Quick turnover for tests: cancelled or timed-out jobs are killed after 5 s, not 30.
KillWait=5
InactiveLimit=0
MinJobAge=60
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONFEOF

# --- daemons (they fork into the background themselves)
if ! alive_from "$DIR/run/slurmctld.pid"; then
  rm -f "$DIR/run/slurmctld.pid"
  log "starting slurmctld"
  slurmctld -c -i
fi
if ! alive_from "$DIR/run/slurmd.pid"; then
  rm -f "$DIR/run/slurmd.pid"
  log "starting slurmd -N $NODE"
  slurmd -N "$NODE"
fi

# --- wait for the node to come up idle
for _ in $(seq 1 60); do
  state=$(node_state)
  if [[ "$state" == idle* ]]; then
    log "up in ${SECONDS} s: $(sinfo -h -N -o '%N %T %c CPUs %m MB') ($(sinfo -V))"
    exit 0
  fi
  sleep 1
done
log "node did not become idle (state: ${state:-none}); last log lines:"
tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" 2>/dev/null || true
exit 1
