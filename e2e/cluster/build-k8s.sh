#!/usr/bin/env bash
# Build the Kubernetes binaries of one release from the k8s.io/kubernetes module, in a build module
# outside the repository, cached by version. Idempotent: a binary already in the cache is kept.
# usage: build-k8s.sh 1.34.2
# K8S_BINARIES="kube-apiserver" builds only the binaries named (an API server for envtest of an
# extra release costs one binary, not the whole cluster).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

kv=${1:-$K8S_VERSION}
sv=0.${kv#1.}
mod=$CACHE/k8s-build/v$kv
bin=$(k8s_bin_dir "$kv")
mkdir -p "$mod" "$bin"

all=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl dra-test-driver)
read -r -a want <<<"${K8S_BINARIES:-${all[*]}}"
for b in "${want[@]}"; do
  [[ " ${all[*]} " == *" $b "* ]] || die "K8S_BINARIES: unknown binary $b (known: ${all[*]})"
done
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  step "Kubernetes v$kv binaries cached in $bin"
  exit 0
fi

step "building Kubernetes v$kv (${missing[*]}) from the k8s.io/kubernetes module"
note "one-time build: about 15 minutes on 2 cores with an empty Go cache, under 2 minutes warm; cached in $bin"
# staging_version MODULE VERSION: VERSION if the module proxy serves it, else the newest earlier patch
# of the same minor that it serves (the proxy refuses a few staging versions, e.g.
# k8s.io/endpointslice v0.32.13; patch releases of a staging library are interchangeable here).
staging_version() {
  local m=$1 v=$2
  if go mod download "$m@$v" >/dev/null 2>&1; then echo "$v"; return; fi
  local minor=${v%.*} alt
  alt=$(go list -m -versions "$m" 2>/dev/null | tr ' ' '\n' | grep "^$minor\.[0-9]*$" | sort -t. -k3 -n | awk -F. -v p="${v##*.}" '$3 < p' | tail -1)
  # None at all: leave it out; the build fails later only if a binary we build imports it.
  [ -n "$alt" ] || { echo "    $m@$v is not served and no earlier $minor.x is; not replaced" >&2; return 0; }
  echo "    $m@$v is not served; using $alt" >&2
  echo "$alt"
}

cd "$mod"
if [ ! -f go.sum ]; then
  timed "download k8s.io/kubernetes@v$kv" go mod download k8s.io/kubernetes@v$kv
  kmod=$(go env GOMODCACHE)/k8s.io/kubernetes@v$kv/go.mod
  replaces=""
  for m in $(grep -o 'k8s.io/[a-z0-9-]* => ./staging' "$kmod" | awk '{print $1}'); do
    v=$(cd / && staging_version "$m" "v$sv")
    [ -z "$v" ] || replaces+="	$m => $m $v"$'\n'
  done
  {
    echo "module gpu-dra.local/k8s-build"
    echo
    grep '^go ' "$kmod"
    grep '^godebug' "$kmod" || true
    echo
    echo "require k8s.io/kubernetes v$kv"
    echo
    echo "replace ("
    # Every staging module is replaced by ./staging upstream; point each at its published twin.
    printf '%s' "$replaces"
    echo ")"
  } > go.mod
  cat > tools.go <<'EOT'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
)
EOT
  timed "go mod tidy (k8s v$kv)" go mod tidy
fi
minor=$(echo "$kv" | cut -d. -f2)
ldf="-s -w -X k8s.io/component-base/version.gitVersion=v$kv -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
ldf="$ldf -X k8s.io/client-go/pkg/version.gitVersion=v$kv -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
for b in "${missing[@]}"; do
  pkg=k8s.io/kubernetes/cmd/$b
  [ "$b" = dra-test-driver ] && pkg=k8s.io/kubernetes/test/e2e/dra/test-driver
  CGO_ENABLED=0 timed "go build $b v$kv" go build -trimpath -ldflags "$ldf" -o "$bin/$b.tmp" "$pkg"
  mv "$bin/$b.tmp" "$bin/$b"
done
step "Kubernetes v$kv binaries ready in $bin"
