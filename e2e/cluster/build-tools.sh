#!/usr/bin/env bash
# Build the non-Kubernetes pieces of the local cluster from the Go module proxy, cached by version:
# etcd, containerd 2.x (+ shim, ctr), cfssl (for hack/local-up-cluster.sh), crictl, helm and kwok
# (fake nodes of `make scale`; not in the default set).
# usage: build-tools.sh [etcd|containerd|cfssl|crictl|helm|kwok]...   (default: all but kwok)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

bin=$(tools_bin_dir)
mkdir -p "$bin"

# gobuild NAME VERSION MODULE PKG [LDFLAGS] [TAGS]: go build PKG at MODULE@VERSION into $bin/NAME,
# inside a throwaway build module of its own so its dependency versions are the module's own.
gobuild() {
  local name=$1 ver=$2 module=$3 pkg=$4 ldf=${5:-} tags=${6:-} bin=${OUT_DIR:-$bin}
  mkdir -p "$bin"
  local stamp=$bin/.$name.version
  if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$ver" ]; then return 0; fi
  local mod=$CACHE/tools-build/$name-$ver
  mkdir -p "$mod"
  if [ ! -f "$mod/go.sum" ]; then
    (cd "$mod" && rm -f go.mod && go mod init "gpu-dra.local/build-$name" >/dev/null 2>&1)
    (cd "$mod" && timed "go get $module@$ver" go get "$pkg@$ver")
  fi
  (cd "$mod" && CGO_ENABLED=0 timed "go build $name $ver" go build -trimpath -tags "$tags" -ldflags "-s -w $ldf" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "$ver" > "$stamp"
}

build_etcd() {
  OUT_DIR=$(etcd_bin_dir) gobuild etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
}
build_containerd() {
  local ldf="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  for c in containerd containerd-shim-runc-v2 ctr; do
    gobuild "$c" "$CONTAINERD_VERSION" github.com/containerd/containerd/v2 "github.com/containerd/containerd/v2/cmd/$c" "$ldf" "no_btrfs no_devmapper no_zfs"
  done
}
build_cfssl() {
  gobuild cfssl "$CFSSL_VERSION" github.com/cloudflare/cfssl github.com/cloudflare/cfssl/cmd/cfssl
  gobuild cfssljson "$CFSSL_VERSION" github.com/cloudflare/cfssl github.com/cloudflare/cfssl/cmd/cfssljson
}
build_crictl() {
  gobuild crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools sigs.k8s.io/cri-tools/cmd/crictl "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
}
build_kwok() {
  gobuild kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok
}
build_helm() {
  gobuild helm "$HELM_VERSION" helm.sh/helm/v4 helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
}

what=("$@")
[ ${#what[@]} -gt 0 ] || what=(etcd containerd cfssl crictl helm)
step "building cluster tools (${what[*]}) into $bin"
for w in "${what[@]}"; do "build_$w"; done
step "cluster tools ready"
