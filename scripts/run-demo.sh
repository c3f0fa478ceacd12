#!/usr/bin/env bash
# `make run`: drover-server on its embedded defaults with its data in .run/,
# an agent for this host enrolled through the ordinary token path (no
# shortcut), and the demo pipe packaging/examples/hello.yaml. Ctrl-C stops all.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
run=$top/.run
http=${DROVER_RUN_HTTP:-127.0.0.1:8443}
grpc=${DROVER_RUN_GRPC:-127.0.0.1:8444}
mkdir -p "$run"
chmod 0700 "$run"

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "make run: stopping"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
# Ctrl-C: stop everything and end here (not at "a process exited" below).
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

echo "make run: starting drover-server (data in .run/server, HTTPS $http, gRPC $grpc)"
bin/drover-server --data-dir "$run/server" --http-addr "$http" --grpc-addr "$grpc" >"$run/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [ -s "$run/server/admin.token" ] && [ -s "$run/server/ca.crt" ] && bin/droverctl --server "https://$http" \
    --ca "$run/server/ca.crt" --token "$(cat "$run/server/admin.token")" get agents >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$run/server.log"; echo "make run: drover-server exited" >&2; exit 1; }
  sleep 0.2
done
export DROVER_SERVER="https://$http" DROVER_CA="$run/server/ca.crt" DROVER_TOKEN
DROVER_TOKEN=$(cat "$run/server/admin.token")

# The agent: systemd user scope when a user manager answers, else the cron
# backend (which needs no user session).
backend=cron scope=user
if systemctl --user show-environment >/dev/null 2>&1; then backend=systemd; fi
mkdir -p "$run/agent"
chmod 0700 "$run/agent"
bin/droverctl tokens create --ttl 10m --tag demo=true >"$run/agent/enroll.token.tmp"
chmod 0600 "$run/agent/enroll.token.tmp"
mv "$run/agent/enroll.token.tmp" "$run/agent/enroll.token"
echo "make run: starting drover-agent (backend $backend, scope $scope, data in .run/agent), enrolling with a one-time token"
# The control socket lives in the data dir (so `drover-agent status --data-dir`
# finds it) unless that path is too long for a unix socket. Pipe services run
# this very binary (agent_path defaults to the running drover-agent).
sock=$run/agent/data/control/agent.sock status_cmd="bin/drover-agent status --data-dir $run/agent/data"
if [ ${#sock} -gt 100 ]; then
  sock=$(mktemp -d /tmp/drover-run-XXXXXX)/agent.sock
  status_cmd="DROVER_CONTROL_SOCKET=$sock bin/drover-agent status --data-dir $run/agent/data"
fi
DROVER_CONTROL_SOCKET="$sock" \
  bin/drover-agent --server "https://$http" --data-dir "$run/agent/data" --token-file "$run/agent/enroll.token" \
  --backend "$backend" --scope "$scope" >"$run/agent.log" 2>&1 &
pids+=($!)

bin/droverctl apply -f packaging/examples/hello.yaml
cat <<MSG

Drover is running. The demo pipe "hello" runs every minute on this host.
  export DROVER_SERVER=$DROVER_SERVER DROVER_CA=$DROVER_CA DROVER_TOKEN=\$(cat $run/server/admin.token)
  bin/droverctl get agents            # the enrolled agent
  bin/droverctl get runs              # runs as they are reported
  bin/droverctl logs <run-id>         # a run's output
  $status_cmd
MSG
[ "$backend" = systemd ] && echo "  systemctl --user list-timers 'drover-pipe-*'"
echo "Logs: $run/server.log, $run/agent.log. Ctrl-C stops everything."
wait -n "${pids[@]}" || true
echo "make run: a process exited; see the logs above" >&2
