#!/usr/bin/env bash
# Stop the single-node SLURM that ci/slurm/start.sh started: cancel every job first (a killed
# client leaves slurmstepd and its workers running until their death timeout), then the
# daemons by the PIDs in their pid files. Never kills by process name: the machine is shared.
set -uo pipefail

DIR=${HMDSPT_SLURM_DIR:-/var/tmp/hmdspt-slurm}

log() { echo "== slurm: $*"; }
alive() {
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null | tr -d ' ') || return 1
  [[ -n "$stat" && "$stat" != Z* ]]
}

if command -v squeue >/dev/null 2>&1 && timeout 10 squeue -h >/dev/null 2>&1; then
  jobs=$(squeue -h -o %i | tr '\n' ' ')
  if [[ -n "${jobs// /}" ]]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    scancel $jobs || true
    for _ in $(seq 1 30); do
      [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 1
    done
  fi
fi

stop_pid_file() {
  local name=$1 file=$2 pid
  [[ -s "$file" ]] || return 0
  pid=$(cat "$file")
  if alive "$pid"; then
    log "stopping $name (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do alive "$pid" || break; sleep 0.5; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$file"
}

stop_pid_file slurmd "$DIR/run/slurmd.pid"
stop_pid_file slurmctld "$DIR/run/slurmctld.pid"
stop_pid_file munged /run/munge/munged.pid
log "stopped"
