#!/bin/sh
# A real single-node Slurm for the opt-in test (RATCHET_TEST_SLURM=1), no systemd:
# Debian's slurm-wlm + munge, daemons started directly, state under /tmp/ratchet-slurm.
# Needs root (munge key, /etc/slurm). Usage: scripts/slurm_local.sh install|start|stop
set -eu
dir=/tmp/ratchet-slurm
host=$(hostname -s)
case "${1:-}" in
install)
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge ;;
start)
    mkdir -p "$dir/state" "$dir/spool" /etc/slurm /etc/munge /run/munge /var/lib/munge /var/log/munge
    cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ratchet
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    [ -f /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chmod 400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || munged --force
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 30); do sinfo -h -o %t 2>/dev/null | grep -q idle && exit 0; sleep 1; done
    echo "slurm did not come up; see $dir/*.log" >&2; exit 1 ;;
stop)
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done ;;
*)
    echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
