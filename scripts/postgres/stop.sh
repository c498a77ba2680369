#!/usr/bin/env bash
# Stop the PostgreSQL server started by start.sh, by the PID in its data folder.
D=${RLVR_PG_DIR:-/tmp/rlvr-postgres}
if [ -f "$D/data/postmaster.pid" ]; then
  P=$(head -1 "$D/data/postmaster.pid")
  kill -INT "$P" 2>/dev/null && echo "stopped PostgreSQL ($P)"  # SIGINT: PostgreSQL's fast shutdown
  for _ in $(seq 30); do kill -0 "$P" 2>/dev/null || break; sleep 1; done
fi
exit 0
