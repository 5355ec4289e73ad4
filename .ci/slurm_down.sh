#!/usr/bin/env bash
# Stop the single-node Slurm cluster that .ci/slurm_up.sh started.
#
#   bash .ci/slurm_down.sh [--quiet]
#
# Cancels the cluster's jobs, then stops slurmd, slurmctld and (only if
# slurm_up started it) munged, each by the pid in its pid file: SIGTERM, then
# SIGKILL after 10 s. Safe to call twice, or when nothing was started; it
# always exits 0 so it can run from a trap after a failure. The logs stay in
# $SPDNN_SLURM_DIR/log for inspection.
#
# Parameters (environment):
#   SPDNN_SLURM_DIR   the directory slurm_up used   [/tmp/spdnn-slurm]
set -uo pipefail

DIR=${SPDNN_SLURM_DIR:-/tmp/spdnn-slurm}
QUIET=0
[[ ${1:-} == --quiet ]] && QUIET=1

log() { ((QUIET)) || printf '[slurm_down %(%H:%M:%S)T] %s\n' -1 "$*"; }

# stop_pid NAME PID: TERM, wait up to 10 s, then KILL
stop_pid() {
    local name=$1 pid=$2
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    log "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.2
}

# only a cluster whose configuration slurm_up wrote is ours to touch
ours=0
grep -qF "written by .ci/slurm_up.sh" /etc/slurm/slurm.conf 2>/dev/null && ours=1

if ((ours)) && command -v scancel >/dev/null 2>&1 && [[ -f $DIR/run/slurmctld.pid ]] &&
   kill -0 "$(cat "$DIR/run/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
    if [[ -n $(timeout 10 squeue -h -o %i 2>/dev/null) ]]; then
        log "cancelling jobs: $(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
        timeout 10 scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 1 30); do
            [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
fi

for d in slurmd slurmctld; do
    if [[ -f $DIR/run/$d.pid ]]; then
        stop_pid "$d" "$(cat "$DIR/run/$d.pid" 2>/dev/null)"
        rm -f "$DIR/run/$d.pid"
    fi
done

if [[ -f $DIR/run/munged.ours ]]; then
    stop_pid munged "$(cat /run/munge/munged.pid 2>/dev/null)"
    rm -f "$DIR/run/munged.ours"
fi
log "stopped (logs in $DIR/log)"
exit 0
