#!/usr/bin/env bash
# Every Kubernetes binary an integration test runs (testapiserver.ReleaseBinary, StartScheduler) is
# built by `make integration` on a fresh machine. A machine that ran an e2e cluster before has the
# release's whole bin directory cached, so a missing one shows only on a cold CI run.
set -euo pipefail
cd "$(dirname "$0")/.."

wanted=$( { git grep -hoE 'ReleaseBinary\(t, [^,]+, "[a-z-]+"\)' -- '*.go' | sed -E 's/.*"([a-z-]+)"\)/\1/'
            git grep -qE '\.StartScheduler\(' -- '*_test.go' && echo kube-scheduler
            git grep -qE '\.StartControllerManager\(' -- '*_test.go' && echo kube-controller-manager
          } | sort -u)
built=$(sed -n 's/^NEWEST_TEST_BINARIES := //p' Makefile)
[ -n "$built" ] || { echo "verify-test-binaries: NEWEST_TEST_BINARIES not found in the Makefile" >&2; exit 1; }
fail=0
for b in $wanted; do
  if ! grep -qw -- "$b" <<<"$built"; then
    echo "verify-test-binaries: a test runs $b, which \`make integration\` does not build: add it to NEWEST_TEST_BINARIES in the Makefile" >&2
    fail=1
  fi
done
exit $fail
