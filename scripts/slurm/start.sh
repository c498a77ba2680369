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
cp "$HERE/slurmdbd.conf" $S/etc/ && chmod 600 $S/etc/slurmdbd.conf
mkdir -p /run/munge && chown munge:munge /run/munge
[ -S /run/munge/munge.socket.2 ] || runuser -u munge -- /usr/sbin/munged
if [ ! -d $S/mysql/mysql ]; then
  mariadb-install-db --user=root --datadir=$S/mysql --auth-root-authentication-method=socket >$S/log/mariadb-install.log 2>&1
  NEWDB=1
fi
/usr/sbin/mariadbd --user=root --datadir=$S/mysql --socket=$S/run/mysql.sock --port=3306 --bind-address=127.0.0.1 \
  --pid-file=$S/run/mariadbd.pid --log-error=$S/log/mariadb.err --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
for i in $(seq 30); do [ -S $S/run/mysql.sock ] && break; sleep 1; done
if [ "${NEWDB:-0}" = 1 ]; then
  mariadb -S $S/run/mysql.sock -u root -e "CREATE DATABASE slurm_acct_db; CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
fi
/usr/sbin/slurmdbd
sleep 2
sacctmgr -i add cluster local >/dev/null 2>&1 || true
/usr/sbin/slurmctld
/usr/sbin/slurmd -N localhost
for i in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
echo "SLURM is up: export SLURM_CONF=$SLURM_CONF"
