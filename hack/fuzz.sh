#!/usr/bin/env bash
# Run every fuzz target of the module for a bounded time each (go test allows one target per run).
set -uo pipefail
t=${1:-10s}
found=0
fuzz() { go test -run '^$' -fuzz "^$2\$" -fuzztime "$3" "$1" 2>&1 | tee "$log"; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)\(' "$dir"/*_test.go 2>/dev/null | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | sort -u); do
    found=$((found + 1))
    echo "==> fuzz $pkg $f for $t"
    fuzz "$pkg" "$f" "$t" && continue
    # The toolchain itself can stop a run with "context deadline exceeded" when -fuzztime ends while
    # it minimizes a new interesting input; that is not a finding (a finding writes a failing input
    # under testdata/fuzz and says so). Run such a target once more; a real failure still fails.
    if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
      echo "==> fuzz $pkg $f: the run ended at its deadline without a finding; running it once more"
      fuzz "$pkg" "$f" "$t" && continue
    fi
    echo "fuzz: $pkg $f failed"
    exit 1
  done
done
echo "fuzz: $found targets ran without a failure"
