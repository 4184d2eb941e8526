#!/bin/sh
# A private single-node Slurm for the opt-in test (RATCHET_TEST_SLURM=1), no systemd:
# Debian's slurm-wlm + munge, daemons started directly. Safe on a shared host:
# everything lives in its own directory ($RATCHET_SLURM_DIR, default
# /tmp/ratchet-slurm): its own slurm.conf (found through SLURM_CONF, /etc/slurm is not
# touched), its own munge key and socket, state and spool dirs, free ports for
# slurmctld and slurmd; `stop` stops only the daemons it started, by their pid files.
# Clients reach it with `export SLURM_CONF=$RATCHET_SLURM_DIR/slurm.conf` (`env` prints it).
# Needs root (slurmd). No accounting: `sacct` answers "accounting storage is disabled".
# Usage: scripts/slurm_local.sh install|start|stop|env
set -eu
dir=${RATCHET_SLURM_DIR:-/tmp/ratchet-slurm}
host=$(hostname -s)
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
case "${1:-}" in
install)
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge ;;
env)
    echo "export SLURM_CONF=$dir/slurm.conf" ;;
start)
    if running "$dir/slurmctld.pid"; then
        echo "already running (SLURM_CONF=$dir/slurm.conf)"; exit 0
    fi
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    chmod 700 "$dir/munge"
    [ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
    chmod 400 "$dir/munge/munge.key"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=ratchet
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=30
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF="$dir/slurm.conf"
    running "$dir/munged.pid" || munged --force --socket="$dir/munge/munge.sock" \
        --key-file="$dir/munge/munge.key" --pid-file="$dir/munged.pid" \
        --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"
    slurmctld
    slurmd
    for _ in $(seq 60); do
        if sinfo -h -o %t 2>/dev/null | grep -q idle; then
            echo "slurm is up: export SLURM_CONF=$dir/slurm.conf"; exit 0
        fi
        sleep 1
    done
    echo "slurm did not come up; see $dir/*.log" >&2; exit 1 ;;
stop)
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
        if running "$pidfile"; then kill "$(cat "$pidfile")" || true; fi
    done ;;
*)
    echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac
