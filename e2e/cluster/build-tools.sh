#!/usr/bin/env bash
# Build the non-Kubernetes pieces of the local cluster from the Go module proxy, cached by version:
# etcd, containerd 2.x (+ shim, ctr), cfssl (for hack/local-up-cluster.sh), crictl, helm, and for
# `make scale` only (not in the default set) kwok (fake nodes) and dra-example-webhook (the upstream
# example driver's webhook, a load target the harness compares ours with).
# usage: build-tools.sh [etcd|containerd|cfssl|crictl|helm|kwok|dra-example-webhook]...   (default: etcd to helm)
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
# The webhook of kubernetes-sigs/dra-example-driver (module sigs.k8s.io/dra-example-driver), built
# outside the repository as a load target of `make scale`: nothing of it is linked into gpu-dra. Not
# every module proxy serves that module; DRA_EXAMPLE_DRIVER_SRC then names a clone of the repository
# (a work tree or a bare git directory) holding the tag, which is built with its own go.mod and go.sum
# (its dependencies come from the module proxy).
build_dra-example-webhook() {
  local name=dra-example-webhook ver=$DRA_EXAMPLE_DRIVER_VERSION module=sigs.k8s.io/dra-example-driver
  local src=${DRA_EXAMPLE_DRIVER_SRC:-} stamp=$bin/.$name.version
  if [ -x "$bin/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$ver" ]; then return 0; fi
  if [ -z "$src" ]; then
    go list -m "$module@$ver" >/dev/null 2>&1 ||
      die "the module proxy does not serve $module@$ver: set DRA_EXAMPLE_DRIVER_SRC to a clone of kubernetes-sigs/dra-example-driver that has the tag $ver"
    gobuild "$name" "$ver" "$module" "$module/cmd/$name"
    return
  fi
  git -C "$src" rev-parse --verify --quiet "$ver^{commit}" >/dev/null ||
    die "DRA_EXAMPLE_DRIVER_SRC=$src: no commit $ver there (want a clone of kubernetes-sigs/dra-example-driver with its tags)"
  local dir=$CACHE/tools-build/$name-$ver
  rm -rf "$dir" && mkdir -p "$dir"
  git -C "$src" archive "$ver" | tar -x -C "$dir"
  [ "$(cd "$dir" && go list -m)" = "$module" ] || die "DRA_EXAMPLE_DRIVER_SRC=$src: $ver is not the module $module"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly timed "go build $name $ver" go build -trimpath -ldflags "-s -w" -o "$bin/$name.tmp" "./cmd/$name")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "$ver" > "$stamp"
}

what=("$@")
[ ${#what[@]} -gt 0 ] || what=(etcd containerd cfssl crictl helm)
step "building cluster tools (${what[*]}) into $bin"
for w in "${what[@]}"; do "build_$w"; done
step "cluster tools ready"
