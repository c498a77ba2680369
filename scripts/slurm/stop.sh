#!/usr/bin/env bash
# Stop the daemons started by start.sh, by PID.
S=/tmp/rlvr-slurm
for f in slurmd slurmctld; do
  if [ -f $S/run/$f.pid ]; then P=$(cat $S/run/$f.pid); kill -TERM "$P" 2>/dev/null && echo "stopped $f ($P)"; fi
done
sleep 3
if [ -f /run/munge/munged.pid ]; then P=$(cat /run/munge/munged.pid); kill -TERM "$P" 2>/dev/null && echo "stopped munged ($P)"; fi
exit 0
