#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine (state under /tmp/rlvr-slurm). Needs root and
# scripts/slurm/install.sh. Then: export SLURM_CONF=/tmp/rlvr-slurm/etc/slurm.conf; sinfo.
set -euo pipefail
S=/tmp/rlvr-slurm
HERE=$(cd "$(dirname "$0")" && pwd)
export SLURM_CONF=$S/etc/slurm.conf
rm -rf $S/state $S/spool  # a fresh cluster: no jobs left from an earlier start
mkdir -p $S/{etc,state,spool,log,run}
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
sed -e "s/__CPUS__/$CPUS/" -e "s/__MEM__/$MEM/" "$HERE/slurm.conf" > $S/etc/slurm.conf
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
/usr/sbin/slurmctld
/usr/sbin/slurmd -N localhost
for i in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
echo "SLURM is up: export SLURM_CONF=$SLURM_CONF"
