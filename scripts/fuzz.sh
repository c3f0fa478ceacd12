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
  ok=0
  for try in 1 2; do
    if go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" >/tmp/drover-fuzz.$$ 2>&1; then
      ok=1; break
    fi
    # Go's fuzzing engine sometimes ends a run that found nothing with
    # "context deadline exceeded" when the time is up mid-input; that is
    # the engine, not a finding (a finding writes testdata/fuzz/...), so
    # such a run is tried once more. Anything else fails at once.
    grep -q 'Failing input written to' /tmp/drover-fuzz.$$ && break
    grep -q 'context deadline exceeded' /tmp/drover-fuzz.$$ || break
    echo "fuzz: $name: the engine stopped at its deadline without a finding; once more"
  done
  if [ "$ok" = 0 ]; then
    cat /tmp/drover-fuzz.$$
    status=1
  fi
done < <(grep -rHoE --include='*_test.go' '^func (Fuzz[A-Za-z0-9_]+)' . | sed -E 's/func //; s#^\./##' | sort)
rm -f /tmp/drover-fuzz.$$
exit $status
