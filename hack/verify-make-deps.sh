#!/usr/bin/env bash
# Every `make TARGET` the README or docs/ tell a reader to run works on a fresh machine: a target that needs
# Debian packages (cluster, images, tools) must run the deps step itself, so that no newcomer has to
# read an error to learn a third command. Targets that need only Go are listed below with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

# Targets that need no Debian package and no tool from `make deps`.
declare -A no_deps=(
  [deps]="is the step itself"
  [build]="go build only"
  [fuzz]="go test -fuzz only"
  [help]="prints the Makefile"
  [clean]="removes _output"
  [envtest-assets]="builds kube-apiserver and etcd from Go modules"
  [integration]="go test against the binaries envtest-assets and envtest-releases build from Go modules"
  [cluster-down]="stops what cluster-up started, which installed the packages"
)

fail=0
targets=$(grep -rhoE --include='*.md' '(^|[^a-z-])make [a-z0-9-]+' README.md docs | sed -E 's/.*make //' | sort -u)
[ -n "$targets" ] || { echo "verify-make-deps: no \`make TARGET\` found in README.md or docs/" >&2; exit 1; }
for t in $targets; do
  if ! recipe=$(make -n "$t" 2>/dev/null); then
    echo "verify-make-deps: README.md or docs/ name \`make $t\`, which the Makefile does not have" >&2
    fail=1
    continue
  fi
  [ -n "${no_deps[$t]:-}" ] && continue
  if ! grep -q 'hack/install-deps.sh' <<<"$recipe"; then
    echo "verify-make-deps: \`make $t\` (named in README.md or docs/) does not run the deps step: add 'deps' to its prerequisites in the Makefile, or list it in ${BASH_SOURCE[0]} with the reason it needs no Debian package" >&2
    fail=1
  fi
done
exit $fail
