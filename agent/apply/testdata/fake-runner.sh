#!/bin/sh
# Test stand-in for `drover-agent run <name>`, used as AgentPath by this
# package's tests only: the real runner is agent/runner's. It appends one line per run to <data dir>/runs.log, then runs the
# payload's inline script, if any.
name="$2"
dir=$(cd "$DROVER_PIPE_DIR" && pwd -P) || exit 90
data=$(dirname "$(dirname "$dir")")
req=""
f="${XDG_RUNTIME_DIR:-/run}/drover/requests/$name.json"
[ -f "$f" ] && req=$(sed -n 's/.*"request_id":"\([^"]*\)".*/\1/p' "$f")
[ -z "$req" ] && req=${DROVER_REQUEST_ID:-}
echo "$name $(date +%s) inv=${INVOCATION_ID:-} run=${DROVER_RUN_ID:-} trigger=${DROVER_TRIGGER:-} req=$req" >> "$data/runs.log"
[ -f "$dir/payload/script" ] && exec /bin/sh "$dir/payload/script"
exit 0
