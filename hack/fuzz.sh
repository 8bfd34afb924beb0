#!/usr/bin/env bash
# Run every fuzz target of the module for a bounded time each (go test allows one target per run).
set -euo pipefail
t=${1:-10s}
found=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)\(' "$dir"/*_test.go 2>/dev/null | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | sort -u); do
    found=$((found + 1))
    echo "==> fuzz $pkg $f for $t"
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$pkg"
  done
done
echo "fuzz: $found targets ran without a failure"
