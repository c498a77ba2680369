#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for an MLflow tracking server (Debian's PostgreSQL 15; data under
# $RLVR_PG_DIR (default /tmp/rlvr-postgres; as root, a folder the postgres user can reach); port $RLVR_PG_PORT, default 55432; local connections only, trust
# authentication), with an empty database "mlflow". Prints the SQLAlchemy URI MLflow takes and writes it to
# $RLVR_PG_DIR/uri. Stop it with stop.sh (by PID). A real cluster keeps its database elsewhere: docs/cluster.md.
set -euo pipefail
D=${RLVR_PG_DIR:-/tmp/rlvr-postgres}
PORT=${RLVR_PG_PORT:-55432}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$BIN" ] || BIN=$(dirname "$(command -v pg_ctl)")
[ -x "$BIN/pg_ctl" ] || { echo "start.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
bash "$(dirname "$0")/stop.sh" >/dev/null 2>&1 || true
rm -rf "$D" && mkdir -p "$D"
# PostgreSQL refuses to run as root: as root, the server runs as the postgres user
AS=()
if [ "$(id -u)" = 0 ]; then chown postgres "$D"; AS=(runuser -u postgres --); fi
"${AS[@]}" "$BIN/initdb" -D "$D/data" -A trust -U postgres >"$D/initdb.log" 2>&1 \
  || { cat "$D/initdb.log" >&2; exit 1; }
# max_connections: every sweep job holds a small pool through the MLflow server's workers
"${AS[@]}" "$BIN/pg_ctl" -D "$D/data" -l "$D/server.log" -w -t 60 \
  -o "-p $PORT -k $D -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null \
  || { cat "$D/server.log" >&2; exit 1; }
"${AS[@]}" "$BIN/psql" -h "$D" -p "$PORT" -U postgres -q -c "CREATE DATABASE mlflow" >/dev/null
URI="postgresql+psycopg://postgres@127.0.0.1:$PORT/mlflow"
echo "$URI" > "$D/uri"
echo "PostgreSQL is up: $URI"
