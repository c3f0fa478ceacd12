#!/usr/bin/env bash
# Runs every fuzz target in the module for the given time each (default 3s).
# `make test` runs it briefly; `make fuzz` runs it longer.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-3s}
status=0
while IFS=: read -r file name; do
  pkg="./$(dirname "$file")"
  echo "fuzz: $name in $pkg for $fuzztime"
  if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" >/tmp/drover-fuzz.$$ 2>&1; then
    cat /tmp/drover-fuzz.$$
    status=1
  fi
done < <(grep -rHoE --include='*_test.go' '^func (Fuzz[A-Za-z0-9_]+)' . | sed -E 's/func //; s#^\./##' | sort)
rm -f /tmp/drover-fuzz.$$
exit $status
