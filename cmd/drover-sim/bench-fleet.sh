#!/usr/bin/env bash
# `make bench-fleet`: a drover-server on loopback with a fresh data dir (the
# product's defaults otherwise), drover-sim against it at nice 19, then the
# server stopped. AGENTS is the step list, SIM_FLAGS more drover-sim flags,
# SERVER_ENV extra DROVER_* settings for the server (e.g.
# "DROVER_HTTP_MAX_CONCURRENT=20000").
set -euo pipefail
cd "$(dirname "$0")/../.."
AGENTS=${AGENTS:-1000}
SIM_FLAGS=${SIM_FLAGS:-}
SERVER_ENV=${SERVER_ENV:-}
HTTP_PORT=${HTTP_PORT:-18443}
GRPC_PORT=${GRPC_PORT:-18444}
dir=$(mktemp -d -t drover-bench-fleet.XXXXXX)
# shellcheck disable=SC2086
env $SERVER_ENV bin/drover-server --data-dir "$dir/server" \
  --http-addr "127.0.0.1:$HTTP_PORT" --grpc-addr "127.0.0.1:$GRPC_PORT" >"$dir/server.log" 2>&1 &
server=$!
cleanup() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  [[ -s "$dir/server/admin.token" ]] && curl -skf "https://127.0.0.1:$HTTP_PORT/healthz" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat "$dir/server.log"; exit 1; }
  sleep 0.2
done
echo "drover-server pid $server on 127.0.0.1:$HTTP_PORT (gRPC $GRPC_PORT); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
# shellcheck disable=SC2086
nice -n 19 bin/drover-sim --server "https://127.0.0.1:$HTTP_PORT" --server-data-dir "$dir/server" \
  --server-pid "$server" --agents "$AGENTS" $SIM_FLAGS || rc=$?
if grep -qiE 'level=(WARN|ERROR)' "$dir/server.log"; then
  echo "server warnings and errors (first 20):"
  grep -iE 'level=(WARN|ERROR)' "$dir/server.log" | head -20
fi
exit $rc
