#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine, for CI and for trying
# the job scripts in jobs/ for real.
#
#   bash .ci/slurm_up.sh        # install (if needed), configure, start, wait
#   bash .ci/slurm_down.sh      # stop it again (safe to call twice)
#
# What it does (idempotent; run as root):
#   1. installs Debian's slurm-wlm and munge with apt-get when slurmctld,
#      slurmd, sbatch or munged is missing (no daemon is started by the
#      packages: a policy-rc.d that forbids it is put in place if none exists);
#   2. stops a cluster an earlier run of this script left running;
#   3. writes /etc/slurm/slurm.conf (a copy stays in $SPDNN_SLURM_DIR/etc):
#      controller and node daemon on this host (NodeName = `hostname -s`,
#      address 127.0.0.1), select/cons_tres with CR_CPU, proctrack/linuxproc,
#      task/none (no cgroups needed), MpiDefault=pmi2 (what the mpich wheel
#      speaks under srun), no accounting; all state, pid and log files under
#      $SPDNN_SLURM_DIR;
#   4. starts munged (unless one already answers), slurmctld and slurmd, and
#      waits until `sinfo` shows the node idle and `srun -n1 true` runs.
#      On failure it prints the daemon logs, stops what it started and
#      exits non-zero.
#
# Parameters (environment):
#   SPDNN_SLURM_DIR      state/log/pid directory      [/tmp/spdnn-slurm]
#   SPDNN_SLURM_CPUS     CPUs the node advertises     [max(4, 2 x nproc)]
#                        (more than the real cores on purpose, so that a job
#                        with several MPI ranks fits on a 2-core CI machine)
#   SPDNN_SLURM_TIMEOUT  seconds to wait for the node [90]
#   SPDNN_SLURM_PORT     slurmctld port; slurmd uses PORT+1 [6817]
#   SPDNN_SLURM_FAKE_GPUS  N > 0: give the node N "GPUs" (GRES gpu backed by
#                        character devices aliasing /dev/null) to try the GPU
#                        requests and per-task binding without GPUs      [0]
set -euo pipefail

DIR=${SPDNN_SLURM_DIR:-/tmp/spdnn-slurm}
TIMEOUT=${SPDNN_SLURM_TIMEOUT:-90}
PORT=${SPDNN_SLURM_PORT:-6817}
CONF=/etc/slurm/slurm.conf
MARKER="# spdnn_mpi single-node CI cluster, written by .ci/slurm_up.sh"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { printf '[slurm_up %(%H:%M:%S)T] %s\n' -1 "$*"; }
STARTED=0
die() {
    printf '[slurm_up] ERROR: %s\n' "$*" >&2
    if ((STARTED)); then
        # leave nothing half-started behind
        SPDNN_SLURM_DIR=$DIR bash "$HERE/slurm_down.sh" --quiet || true
    fi
    exit 1
}

diagnostics() {
    {
        echo "---------------- slurm_up diagnostics ----------------"
        echo "--- sinfo"; timeout 10 sinfo -N -l 2>&1 || true
        echo "--- scontrol show node"; timeout 10 scontrol show node 2>&1 || true
        echo "--- munge check"; timeout 10 bash -c 'munge -n | unmunge' 2>&1 | head -5 || true
        for f in "$DIR"/log/slurmctld.log "$DIR"/log/slurmd.log "$DIR"/log/munged.log \
                 "$DIR"/log/slurmctld.stderr "$DIR"/log/slurmd.stderr; do
            [[ -f $f ]] || continue
            echo "--- tail -n 60 $f"; tail -n 60 "$f"
        done
        echo "--- $CONF"; cat "$CONF" 2>/dev/null || true
        echo "------------------------------------------------------"
    } >&2
}

[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages, starts daemons as root)"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "SPDNN_SLURM_TIMEOUT must be a number of seconds, got '$TIMEOUT'"
[[ $PORT =~ ^[0-9]+$ ]] || die "SPDNN_SLURM_PORT must be a port number, got '$PORT'"
FAKE_GPUS=${SPDNN_SLURM_FAKE_GPUS:-0}
[[ $FAKE_GPUS =~ ^[0-9]+$ ]] || die "SPDNN_SLURM_FAKE_GPUS must be a number, got '$FAKE_GPUS'"
T0=$SECONDS

# ---------------------------------------------------------------- 1. install
need_install=0
for cmd in slurmctld slurmd sbatch srun sinfo munged munge; do
    command -v "$cmd" >/dev/null 2>&1 || need_install=1
done
if ((need_install)); then
    command -v apt-get >/dev/null || die "slurm/munge missing and no apt-get to install them"
    log "installing slurm-wlm and munge from Debian's packages"
    added_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        # keep the packages' maintainer scripts from starting daemons
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    apt_log=$(mktemp /tmp/spdnn-slurm-apt.XXXXXX)
    ok=0
    for attempt in 1 2 3; do
        if DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
               -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
               slurm-wlm munge >"$apt_log" 2>&1; then
            ok=1; break
        fi
        log "apt-get failed (attempt $attempt), retrying in 5 s"; sleep 5
    done
    if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
    if ((!ok)); then
        tail -n 40 "$apt_log" >&2 || true
        die "could not install slurm-wlm and munge with apt-get (log: $apt_log)"
    fi
    rm -f "$apt_log"
fi
log "slurm $(slurmd -V | awk '{print $2}'), munge $(munged -V 2>&1 | awk '{print $1}' | head -1)"

# ------------------------------------------------ 2. stop an earlier cluster
SPDNN_SLURM_DIR=$DIR bash "$HERE/slurm_down.sh" --quiet || true

# ------------------------------------------------------------ 3. configure
HOST=$(hostname -s)
[[ -n $HOST ]] || die "hostname -s printed nothing"
NPROC=$(nproc)
CPUS=${SPDNN_SLURM_CPUS:-$((NPROC * 2 > 4 ? NPROC * 2 : 4))}
[[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "SPDNN_SLURM_CPUS must be a positive integer, got '$CPUS'"
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
REAL_MB=$((MEM_MB * 9 / 10))          # a bit under the machine's memory

if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script; not overwriting a real cluster's configuration"
fi
mkdir -p "$DIR"/{etc,state/ctld,state/d,run,log} /etc/slurm
GRES_LINE="" NODE_GRES=""
rm -f /etc/slurm/gres.conf
if ((FAKE_GPUS > 0)); then
    mkdir -p "$DIR/fakegpu"
    for ((g = 0; g < FAKE_GPUS; g++)); do
        # a character device (like /dev/null: 1,3) is all slurmd checks for
        rm -f "$DIR/fakegpu/nvidia$g"
        if ! mknod "$DIR/fakegpu/nvidia$g" c 1 3 2>/dev/null; then
            log "WARNING: mknod not allowed here: no fake GPUs, the node has none"
            FAKE_GPUS=0
            break
        fi
    done
fi
if ((FAKE_GPUS > 0)); then
    GRES_LINE="GresTypes=gpu"
    NODE_GRES=" Gres=gpu:$FAKE_GPUS"
    printf '%s\nNodeName=%s Name=gpu File=%s/fakegpu/nvidia[0-%d]\n' "$MARKER" "$HOST" \
        "$DIR" $((FAKE_GPUS - 1)) >/etc/slurm/gres.conf
fi
# keep the previous run's logs apart, so the diagnostics show this run's
for f in "$DIR"/log/*.log "$DIR"/log/*.stderr; do
    if [[ -f $f ]]; then mv -f "$f" "$f.prev"; fi
done
cat >"$DIR/etc/slurm.conf" <<EOF
$MARKER
# (regenerated on every run; do not edit)
ClusterName=spdnnci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups in a container: track processes by parent pid, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# PMI-2 server in slurmstepd: the mpich wheel's PMI client talks to it
MpiDefault=pmi2
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# advertise the CPUs below even if the hardware has fewer (oversubscription)
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
$GRES_LINE
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
# sbatch --wait polls every 2 s while 2 >= MinJobAge/2, else every 8, then 32 s
# (Slurm 22.05 sbatch.c); 5 keeps it at 2 s and finished jobs known for 5 s
MinJobAge=5
Waittime=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MB$NODE_GRES State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
cp "$DIR/etc/slurm.conf" "$CONF"
log "wrote $CONF: node $HOST, CPUs=$CPUS (nproc $NPROC), RealMemory=${REAL_MB} MB${NODE_GRES:+, fake$NODE_GRES}"

# -------------------------------------------------------------- 4. start
STARTED=1
# munge: reuse one that already answers, else start ours
if timeout 10 bash -c 'munge -n | unmunge' >/dev/null 2>&1; then
    log "munged already running"
else
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key --force
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    touch "$DIR/log/munged.log" && chown munge:munge "$DIR/log/munged.log"
    runuser -u munge -- /usr/sbin/munged --log-file="$DIR/log/munged.log" ||
        { diagnostics; die "munged did not start"; }
    echo started >"$DIR/run/munged.ours"
    ok=0
    for _ in $(seq 1 50); do
        if timeout 5 bash -c 'munge -n | unmunge' >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.2
    done
    ((ok)) || { diagnostics; die "munged started but does not answer (munge -n | unmunge)"; }
    log "munged started"
fi

slurmctld -c >"$DIR/log/slurmctld.stderr" 2>&1 || { diagnostics; die "slurmctld failed to start"; }
slurmd -N "$HOST" >"$DIR/log/slurmd.stderr" 2>&1 || { diagnostics; die "slurmd failed to start"; }
log "slurmctld and slurmd started; waiting up to ${TIMEOUT}s for node $HOST to be idle"

deadline=$((SECONDS + TIMEOUT))
state=""
while ((SECONDS < deadline)); do
    state=$(timeout 10 sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -1 || true)
    case $state in
        idle | mixed | allocated) break ;;
        down* | drain* | fail*)
            # a node that registered before the controller was ready: resume it
            timeout 10 scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    for p in slurmctld slurmd; do
        pid=$(cat "$DIR/run/$p.pid" 2>/dev/null || true)
        if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
            # pid file written a moment after the fork: give it one more second
            sleep 1
            pid=$(cat "$DIR/run/$p.pid" 2>/dev/null || true)
            if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
                diagnostics; die "$p is not running"
            fi
        fi
    done
    sleep 1
done
case $state in
    idle | mixed | allocated) ;;
    *) diagnostics; die "node $HOST not idle after ${TIMEOUT}s (state: '${state:-no answer}')" ;;
esac

if ! out=$(timeout 60 srun -N1 -n1 --mpi=none true 2>&1); then
    diagnostics; die "srun -n1 true failed: $out"
fi
# let that step's completion clear, so the first real job starts at once
for _ in $(seq 1 20); do
    [[ $(timeout 10 sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -1) == idle ]] && break
    sleep 0.5
done
log "cluster up in $((SECONDS - T0))s: $(sinfo -h -o '%P %D nodes %C (A/I/O/T cpus) %T')"
